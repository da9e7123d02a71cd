"""Preparing packaged weights: GGUF -> HF folder, cached, with our tool-call chat template."""

import json

import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.cli.common import EXIT_DATA
from pipecat_rl.errors import ModelError
from pipecat_rl.serving.weights import MARKER, chat_template, prepare_model

pytestmark = pytest.mark.slow  # the first preparation converts a 100 MB GGUF


def test_prepare_is_idempotent_and_complete(smollm2_dir):
    assert prepare_model("smollm2") == smollm2_dir
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json",
                 MARKER):  # fmt: skip
        assert (smollm2_dir / name).is_file(), name
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    assert (smollm2_dir / "chat_template.jinja").read_text() == chat_template()


def test_template_renders_tools_and_tool_calls(smollm2_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    tools = [{"type": "function", "function": {"name": "book", "parameters": {}}}]
    call = {"id": "c1", "type": "function",
            "function": {"name": "book", "arguments": '{"slot": 3}'}}  # fmt: skip
    text = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "You are a receptionist."},
            {"role": "user", "content": "Book slot 3"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"ok": true}'},
        ],
        tools=tools,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text.startswith("<|im_start|>system\nYou are a receptionist.\n\n# Tools")
    assert '{"name": "book", "parameters": {}}' in text
    assert '<tool_call>\n{"name": "book", "arguments": {"slot": 3}}\n</tool_call><|im_end|>' in text
    assert '<|im_start|>user\n<tool_response>\n{"ok": true}\n</tool_response><|im_end|>' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_local_folders_pass_through_and_bad_specs_are_named(smollm2_dir, tmp_path):
    assert prepare_model(str(smollm2_dir)) == smollm2_dir
    with pytest.raises(ModelError, match="unknown model 'nope'"):
        prepare_model("nope")
    with pytest.raises(ModelError, match="no config.json"):
        prepare_model(tmp_path)


def test_cli_prints_the_path(smollm2_dir):
    result = CliRunner().invoke(app, ["models", "prepare", "smollm2", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["path"] == str(smollm2_dir)
    bad = CliRunner().invoke(app, ["models", "prepare", "nope"])
    assert bad.exit_code == EXIT_DATA and "unknown model" in bad.output


def test_template_separates_several_tool_calls_and_results(smollm2_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)

    def call(i):
        return {"id": f"c{i}", "type": "function", "function": {"name": f"f{i}", "arguments": "{}"}}

    text = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "Sure.", "tool_calls": [call(1), call(2)]},
            {"role": "tool", "tool_call_id": "c1", "content": "a"},
            {"role": "tool", "tool_call_id": "c2", "content": "b"},
        ],
        tokenize=False,
    )
    assert (
        "<|im_start|>assistant\nSure.\n<tool_call>\n"
        '{"name": "f1", "arguments": {}}\n</tool_call>\n<tool_call>\n'
        '{"name": "f2", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\na\n</tool_response>\n"
        "<tool_response>\nb\n</tool_response><|im_end|>\n"
    ) in text
