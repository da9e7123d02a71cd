"""The logprob guard on a tiny model: agreement passes; wrong space, stale weights, template
drift and missing logprobs fail with the cause named; and the registry's names never repeat."""

from pathlib import Path

import pytest
import torch

from pipecat_rl.errors import GuardError
from pipecat_rl.ledger import AdapterRecord, Ledger
from pipecat_rl.training.config import TrainConfig
from pipecat_rl.training.guard import run_guard
from pipecat_rl.training.registry import next_name
from tests.train_helpers import sample_turn, tiny_policy

CONFIG = TrainConfig()


def _turns(policy, temperature: float, n: int = 3, **kw):
    with policy.model.disable_adapter():
        return [
            sample_turn(policy.model, [1, 2, 3 + i], 6, temperature=temperature, seed=i,
                        index=i, **kw)
            for i in range(n)
        ]  # fmt: skip


def _perturb_lora(policy) -> None:
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p) * 0.5)


def test_guard_agrees_with_what_the_sampler_recorded():
    policy = tiny_policy()
    result = run_guard(policy, _turns(policy, 0.7), CONFIG)
    assert result["passed"] and result["compared_turns"] == 3 and result["compared_tokens"] == 18
    assert result["mean_abs_diff"] < 1e-4 and result["per_adapter"]["base"]["tokens"] == 18


def test_wrong_temperature_space_is_caught_and_named():
    policy = tiny_policy()
    turns = _turns(policy, 0.5, space="raw_logprobs")  # a server without our --logprobs-mode
    assert CONFIG.logprobs_mode == "processed_logprobs"
    with pytest.raises(GuardError, match="temperature / logprobs mode") as info:
        run_guard(policy, turns, CONFIG)
    assert info.value.result["passed"] is False and info.value.result["mean_abs_diff"] > 0.02
    raw = CONFIG.model_copy(update={"logprobs_mode": "raw_logprobs"})
    assert run_guard(policy, turns, raw)["passed"]


def test_stale_weights_are_caught():
    policy = tiny_policy(parent="clinic-sft-v1")
    turns = _turns(policy, 1.0, adapter="clinic-sft-v1")  # sampled by the adapter before training
    _perturb_lora(policy)  # ... but the trainer holds other weights under that name
    with pytest.raises(GuardError, match="stale or different adapter"):
        run_guard(policy, turns, CONFIG)


def test_missing_logprobs_fail_the_run():
    policy = tiny_policy()
    turns = [
        t.model_copy(update={"logprobs": None, "token_exact": False}) for t in _turns(policy, 1.0)
    ]
    with pytest.raises(GuardError, match="nothing to compare.*without them"):
        run_guard(policy, turns, CONFIG)
    with pytest.raises(GuardError, match="nothing to compare"):
        run_guard(policy, [], CONFIG)


def test_template_drift_is_caught(smollm2_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    policy = tiny_policy(vocab=len(tokenizer), tokenizer=tokenizer)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt = list(tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True)["input_ids"])  # fmt: skip
    request = {"model": "base", "messages": messages}
    with policy.model.disable_adapter():
        good = sample_turn(policy.model, prompt, 4, request=request)
        # the server rendered the prompt with another template (no newline after the role)
        drifted = sample_turn(policy.model, [t for t in prompt if t != 198], 4, request=request)
    assert run_guard(policy, [good], CONFIG)["template_mismatches"] == 0
    with pytest.raises(GuardError, match="template drift"):
        run_guard(policy, [drifted], CONFIG)


def test_adapter_names_are_versioned_and_never_reused(tmp_path: Path):
    with Ledger(tmp_path / "l.db") as ledger:
        first = next_name(ledger, tmp_path / "adapters", "clinic", "sft")
        assert first.startswith("clinic-sft-v1-")
        ledger.register_adapter(AdapterRecord(
            name=first, path=str(tmp_path), base_model="m", created_at=0.0))  # fmt: skip
        (tmp_path / "adapters" / "clinic-grpo-v7-abc").mkdir(parents=True)
        second = next_name(ledger, tmp_path / "adapters", "clinic", "sft")
        assert second.startswith("clinic-sft-v8-") and second != first


def test_vllm_cpu_serves_in_the_trainers_precision(tmp_path: Path):
    from pipecat_rl.serving.server import VLLMServer, running_on_cpu

    (tmp_path / "config.json").write_text("{}")
    command = VLLMServer(tmp_path, port=1).command()
    if running_on_cpu():  # bf16 by default there: ~0.15 logprob drift against the fp32 trainer
        assert command[command.index("--dtype") + 1] == "float32"


def test_the_server_returns_logprobs_in_the_space_the_trainer_scores(tmp_path: Path):
    from pipecat_rl.serving.server import VLLMServer

    (tmp_path / "config.json").write_text("{}")
    command = VLLMServer(tmp_path, port=1).command()
    assert command[command.index("--logprobs-mode") + 1] == TrainConfig().logprobs_mode
    assert TrainConfig().logprobs_mode == "processed_logprobs"  # after temperature, as sampled
    # sampling is what each request says: no defaults from the model folder's generation config
    assert command[command.index("--generation-config") + 1] == "vllm"
