"""`train()` end to end on a tiny model saved as an HF folder (no vLLM): GRPO and OPSD offline
from recorded turns, SFT from demonstrations; adapters registered with their guard and data."""

import json
from pathlib import Path

import pytest

from pipecat_rl.errors import NoTrainingSignalError
from pipecat_rl.gate.lineage import ledger_lineage
from pipecat_rl.ledger import Ledger, SessionRecord, TurnRecord
from pipecat_rl.training import TrainConfig, train
from pipecat_rl.training.opsd import opsd_row, session_hint
from tests.train_helpers import sample_turn

pytestmark = pytest.mark.slow  # trains a tiny model many times (~45 s on 2 cores), no vLLM


def _record(ledger: Ledger, model, scenario: str, repeat: int, verifier: float, **meta) -> str:
    sid = f"{scenario}-{repeat}"
    turn = sample_turn(model, [1, 2, 3, 4], 5, session_id=sid, seed=hash(sid) % 1000)
    session = SessionRecord(
        id=sid, source="simulate", started_at=float(repeat), ended_at=repeat + 0.5,
        scenario_id=scenario, scenario_hash=f"hash-{scenario}", split="pool", policy="base",
        outcome="pass" if verifier == 1 else "fail",
        reward_parts={"verifier": verifier, "tool_credit": 0.1 * repeat,
                      "checks_held": 0.0 if verifier == 1 else 0.25 * repeat},
        failure_labels=[] if verifier == 1 else ["tool_error"], metadata=meta,
    )  # fmt: skip
    ledger.write_session(session, [turn])
    return sid


@pytest.fixture
def ledger(tmp_path, tiny_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    checks = {"checks": [{"check": "exists appointments", "passed": False, "detail": "none"}]}
    with Ledger(tmp_path / "l.db") as store:
        for repeat, verifier in enumerate((1.0, 0.0, 1.0, 0.0)):
            _record(store, model, "booking", repeat, verifier, **checks)
        for repeat in range(2):  # always fails: zero variance under the outcome
            _record(store, model, "cancel", repeat, 0.0, **checks)
        yield store


def test_grpo_offline_trains_registers_and_logs(ledger, tiny_dir, tmp_path):
    config = TrainConfig(algo="grpo", base_model=str(tiny_dir), out_dir=tmp_path / "a", steps=2)
    result = train(ledger, config)
    assert result.adapter.startswith("policy-grpo-v1-") and not result.loaded
    assert result.guard["passed"] and result.guard["source"] == "ledger"
    rows = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    steps = config.mini_batches * config.ppo_epochs  # optimiser steps per batch, a row each
    assert [(r["step"], r["optimizer_step"]) for r in rows] == [
        (step, k) for step in (1, 2) for k in range(1, steps + 1)
    ]
    for name in ("reward", "reward_std", "frac_reward_zero_std", "policy_loss", "kl", "clip_ratio",
                 "sampling_logp_difference/mean", "importance_ratio/max", "grad_norm", "entropy",
                 "num_tokens", "tokens_per_s", "step_time"):  # fmt: skip
        assert name in rows[0], name
    # a failed call's checks held differ by repeat, so both groups carry gradient (tool credit
    # alone would not: its positive side pays only on a pass); outcome-only, one of two
    assert rows[0]["frac_reward_zero_std/shaped"] == 0.0
    assert rows[0]["frac_reward_zero_std/outcome"] == 0.5
    assert rows[0]["importance_ratio/mean"] == pytest.approx(1.0, abs=1e-4)  # on-policy at step 1
    record = ledger.adapter(result.adapter)
    assert record.training_data == sorted(result.session_ids) and len(result.session_ids) == 6
    assert ledger_lineage(ledger, result.adapter, result.adapter).guard == "passed"
    meta = json.loads((result.path / "pipecat-rl-adapter.json").read_text())
    assert meta["training_run"]["guard"]["passed"] and meta["parent"] is None


def test_outcome_only_reward_with_no_variance_stops_at_once(ledger, tiny_dir, tmp_path):
    for sid in ("booking-1", "booking-3"):
        ledger.update_session(sid, excluded_from_training=True)  # booking: only passes left
    config = TrainConfig(
        algo="grpo", base_model=str(tiny_dir), out_dir=tmp_path, shaped_reward=False
    )
    with pytest.raises(NoTrainingSignalError, match="2 of 2 groups have equal rewards"):
        train(ledger, config)


def test_opsd_offline_distils_from_hinted_teacher(ledger, tiny_dir, tmp_path):
    config = TrainConfig(algo="opsd", base_model=str(tiny_dir), out_dir=tmp_path, lr=1e-3)
    result = train(ledger, config)
    rows = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    assert len(rows) == config.mini_batches  # an optimiser step each, over 6 hinted turns
    assert sum(r["hinted_turns"] for r in rows) == 6 and all(r["grad_norm"] > 0 for r in rows)
    assert result.metrics["hinted_turns"] == 6
    assert ledger.adapter(result.adapter).training_run["algo"] == "opsd"


def test_hint_goes_into_the_teachers_prompt_only(smollm2_dir):
    """By default the hint joins the system message (re-rendered with the request's tools, the
    recorded ids after it); `turn`, or a prompt without a system message, gets it as an extra
    user message before the reply. The student's row is the recorded turn either way."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    tools = [{"type": "function", "function": {"name": "book", "parameters": {
        "type": "object", "properties": {"slot_id": {"type": "integer"}}}}}]  # fmt: skip
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    later = TurnRecord(session_id="s", index=1, adapter="base", created_at=0, request={
        "messages": [*messages, {"role": "assistant", "content": "Hello."},
                     {"role": "user", "content": "Book me for Tuesday."}]})  # fmt: skip
    failed = {"check": "exists appointments where slot_id=12", "passed": False, "detail": "0 rows"}
    session = SessionRecord(id="s", source="simulate", started_at=0, failure_labels=["timeout"],
                            metadata={"checks": [failed]})  # fmt: skip

    def turn(messages: list[dict]) -> TurnRecord:
        rendered = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True
        )
        prompt = list(rendered["input_ids"])
        return TurnRecord(session_id="s", index=0, adapter="base", created_at=0,
                          request={"messages": messages, "tools": tools},
                          prompt_token_ids=prompt, completion_token_ids=[28, 2],
                          logprobs=[0.0, 0.0], token_exact=True)  # fmt: skip

    first = turn(messages)
    hint = session_hint(session, [first, later], 0)
    assert "Book me for Tuesday." in hint and "timeout" in hint
    assert "exists appointments where slot_id=12 (0 rows)" in hint  # what failed, and how
    reply = tokenizer.decode([28, 2])
    row = opsd_row(first, tokenizer, hint)
    assert row.student_ids == [*first.prompt_token_ids, 28, 2]
    assert hint not in tokenizer.decode(row.student_ids)
    told = {"role": "system", "content": "Be brief.\n\n" + hint}
    expected = tokenizer.apply_chat_template(
        [told, messages[1]], tools=tools, add_generation_prompt=True, tokenize=False
    )
    assert tokenizer.decode(row.teacher_ids) == expected + reply
    assert row.teacher_mask.count(True) == 2 and row.teacher_mask[-2:] == [True, True]

    before_reply = "<|im_start|>user\n" + hint + "<|im_end|>\n<|im_start|>assistant\n" + reply
    no_system = turn(messages[1:])
    for hinted in (opsd_row(first, tokenizer, hint, "turn"), opsd_row(no_system, tokenizer, hint)):
        teacher = tokenizer.decode(hinted.teacher_ids)
        assert teacher.endswith(before_reply) and teacher.count(hint) == 1


def test_cli_trains_and_prints_the_adapter_name(ledger, tiny_dir, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from pipecat_rl.cli import app
    from pipecat_rl.cli.common import EXIT_NO_SIGNAL

    args = ["train", "--algo", "grpo", "--model", str(tiny_dir), "--ledger", str(ledger.path),
            "--out", str(tmp_path)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    name = result.stdout.strip().splitlines()[-1]
    assert name.startswith("policy-grpo-v1-") and ledger.adapter(name).training_run["guard"]
    for sid in ("booking-0", "booking-1", "booking-2", "booking-3", "cancel-1"):
        ledger.update_session(sid, excluded_from_training=True)

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded for a run without signal")

    monkeypatch.setattr("pipecat_rl.training.trainer.load_policy", never)  # said at once
    failed = CliRunner().invoke(app, [*args, "--json"])
    assert failed.exit_code == EXIT_NO_SIGNAL
    assert "no training signal: 1 of 1 groups" in failed.output


def test_turns_of_too_old_adapters_are_dropped(tmp_path):
    from pipecat_rl.ledger import AdapterRecord
    from pipecat_rl.training.trainer import recent_policies

    with Ledger(tmp_path / "l.db") as store:
        for name, parent in (("a1", None), ("a2", "a1"), ("a3", "a2")):
            record = AdapterRecord(
                name=name, path=str(tmp_path), base_model="m", parent=parent, created_at=0.0
            )
            store.register_adapter(record)

        def names(steps: int) -> set[str]:
            config = TrainConfig(parent="a3", max_off_policy_steps=steps)
            return recent_policies(store, Path("tiny"), config)

        assert names(0) == {"a3"} and names(1) == {"a3", "a2"}
        assert names(3) == {"a3", "a2", "a1", "base", "tiny"}
