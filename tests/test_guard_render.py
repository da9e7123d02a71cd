"""The guard re-renders a recorded prompt as vLLM did: a tool call's arguments that are not a JSON
object (free text, invalid JSON, an array) read `{}`, a valid object is re-serialised, so a
policy's malformed call is no template drift; real drift still fails. The rule is checked against
vLLM's own function where vLLM is installed (slow: importing it takes ~10 s)."""

import copy
import json

import pytest

from pipecat_rl.errors import GuardError
from pipecat_rl.training.chat import rendered_prompt, server_arguments, server_messages
from pipecat_rl.training.config import TrainConfig
from pipecat_rl.training.guard import run_guard
from tests.train_helpers import sample_turn, tiny_policy

FREE_TEXT = "I'd like to book a routine checkup on Fridays"
ARGUMENTS = {
    "bare string": FREE_TEXT,
    "JSON string": json.dumps(FREE_TEXT),  # what the hermes parser makes of `"arguments": "..."`
    "invalid JSON": '{"date": "2026-03-06", "time":',
    "JSON array": '["2026-03-06", "09:00"]',
    "JSON number": "42",
    "empty": "",
    "null": None,
    "compact object": '{"date":"2026-03-06","time":"09:00"}',
    "object": {"date": "2026-03-06", "time": "09:00"},
}
SERVED = {  # what vLLM hands the template
    **dict.fromkeys(ARGUMENTS, {}),
    "compact object": {"date": "2026-03-06", "time": "09:00"},
    "object": {"date": "2026-03-06", "time": "09:00"},
}
TOOLS = [{"type": "function", "function": {
    "name": "book_appointment", "description": "Book a visit.",
    "parameters": {"type": "object", "properties": {"date": {"type": "string"}}},
}}]  # fmt: skip


def history_with_call(arguments) -> list[dict]:
    """A call whose earlier tool call carried `arguments`, its result, and the caller's reply."""
    call = {"id": "call_1", "type": "function",
            "function": {"name": "book_appointment", "arguments": arguments}}  # fmt: skip
    return [
        {"role": "system", "content": "You are a clinic receptionist."},
        {"role": "user", "content": "Can I come in on Friday?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"error": "missing date"}'},
        {"role": "user", "content": "Friday the sixth, please."},
    ]


@pytest.mark.parametrize("case", list(ARGUMENTS))
def test_arguments_that_are_no_json_object_reach_the_template_as_an_empty_object(case):
    assert server_arguments(ARGUMENTS[case]) == SERVED[case]
    sent = history_with_call(ARGUMENTS[case])
    before = copy.deepcopy(sent)
    shown = server_messages(sent)
    assert shown[2]["tool_calls"][0]["function"]["arguments"] == SERVED[case]
    assert sent == before  # the recorded request is never changed
    assert [m for i, m in enumerate(shown) if i != 2] == [m for i, m in enumerate(sent) if i != 2]


def test_an_empty_tool_call_list_is_dropped_and_other_roles_are_left_alone():
    messages = [
        {"role": "assistant", "content": "Hello.", "tool_calls": []},
        {"role": "user", "content": "{not json", "tool_calls": [{"function": {}}]},
    ]
    assert server_messages(messages) == [{"role": "assistant", "content": "Hello."}, messages[1]]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def test_the_prompt_renders_malformed_arguments_as_the_server_does(tokenizer):
    def text(case: str) -> str:
        request = {"messages": history_with_call(ARGUMENTS[case]), "tools": TOOLS}
        return tokenizer.decode(rendered_prompt(tokenizer, request))

    for case in ("bare string", "JSON string", "invalid JSON", "JSON array"):
        assert '"arguments": {}' in text(case) and FREE_TEXT not in text(case), case
    assert '"arguments": {"date": "2026-03-06", "time": "09:00"}' in text("compact object")
    assert rendered_prompt(tokenizer, {"prompt": [1, 2, 3]}) is None


def test_the_guard_passes_a_malformed_call_and_still_catches_drift(tokenizer):
    policy = tiny_policy(vocab=len(tokenizer), tokenizer=tokenizer)
    config = TrainConfig()
    sent = history_with_call(json.dumps(FREE_TEXT))
    request = {"model": "base", "messages": sent, "tools": TOOLS, "temperature": 1.0}
    served = rendered_prompt(tokenizer, request)  # the ids vLLM recorded for this request
    as_sent = list(tokenizer.apply_chat_template(  # the template fed the request as it was sent
        sent, tools=TOOLS, add_generation_prompt=True, tokenize=True)["input_ids"])  # fmt: skip
    assert served != as_sent  # the case the old guard called drift
    with policy.model.disable_adapter():
        good = sample_turn(policy.model, served, 4, request=request, session_id="malformed")
        drifted = sample_turn(policy.model, as_sent, 4, request=request, session_id="drifted")
    result = run_guard(policy, [good], config)
    assert result["passed"] and result["template_mismatches"] == 0
    with pytest.raises(GuardError, match=r"template drift.*1 of 1 .*first: turn drifted#0"):
        run_guard(policy, [drifted], config)


@pytest.mark.slow
def test_the_rule_is_vllms_own():
    """vLLM's `_postprocess_messages` on the same cases: an upgrade that changes it fails here."""
    chat_utils = pytest.importorskip("vllm.renderers.chat_utils")
    for case, arguments in ARGUMENTS.items():
        theirs = history_with_call(arguments)
        chat_utils._postprocess_messages(theirs)
        assert server_messages(history_with_call(arguments)) == theirs, case
    theirs = [{"role": "assistant", "content": "Hello.", "tool_calls": []}]
    chat_utils._postprocess_messages(theirs)
    assert server_messages([{"role": "assistant", "content": "Hello.", "tool_calls": []}]) == theirs
