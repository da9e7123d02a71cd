"""What may train (the one eligibility definition) and demonstrations from the scripted expert."""

import asyncio
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from pipecat_rl.ledger import Ledger, SessionRecord, TurnRecord
from pipecat_rl.recording.demonstration import render_demonstration
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate
from pipecat_rl.training.rows import TrainableTurn, build_sequences

CLINIC = Path(__file__).resolve().parent.parent / "examples" / "clinic"


def _remember_heldout(ledger: Ledger, scenario_hash: str, scenario_id: str) -> None:
    """What the gate does with every held-out hash it sees (`Ledger.record_heldout_hashes`)."""
    with sqlite3.connect(ledger.path) as conn:
        conn.execute(
            "INSERT OR IGNORE INTO heldout_hashes VALUES (?, ?, ?, ?)",
            (scenario_hash, scenario_id, "hs", 0.0),
        )


def _turn(sid: str, index: int = 0, **kw) -> TurnRecord:
    fields = dict(
        session_id=sid, index=index, adapter="base", created_at=1.0,
        request={"model": "base", "messages": [{"role": "user", "content": "hi"}]},
        prompt_token_ids=[1, 2, 3], completion_token_ids=[4, 5], logprobs=[-0.1, -0.2],
        token_exact=True, usage={"completion_tokens": 2},
    )  # fmt: skip
    fields.update(kw)
    return TurnRecord(**fields)


def test_eligibility_excludes_every_route_named_in_one_query(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        cases = {
            "ok": ({}, {}),
            "heldout-hash": ({"scenario_hash": "H"}, {}),
            "never-ended": ({"ended_at": None}, {}),
            "harness-error": ({"outcome": "error"}, {}),
            "interrupted": ({"outcome": "interrupted"}, {}),
            "not-run": ({"outcome": "not_run"}, {}),
            "gate": ({"source": "gate"}, {}),
            "usage-mismatch": ({}, {"usage": {"completion_tokens": 3}}),
            "usage-less": ({}, {"usage": {}}),  # a stream cancelled before its last chunk
            "barge-in": ({}, {"interrupted": True}),
            "length-cut": ({}, {"finish_reason": "length"}),
            "top-p": ({}, {"request": {"model": "base", "top_p": 0.9}}),
            "top-k": ({}, {"request": {"model": "base", "extra_body": {"top_k": 20}}}),
            "not-exact": ({}, {"token_exact": False}),
            "demo": ({}, {"demonstration": True, "token_exact": False, "logprobs": None,
                          "prompt_token_ids": None, "completion_token_ids": None}),
        }  # fmt: skip
        for i, (sid, (session_kw, turn_kw)) in enumerate(cases.items()):
            fields = {"source": "simulate", "started_at": float(i), "ended_at": i + 0.5,
                      "split": "pool", "outcome": "pass", **session_kw}  # fmt: skip
            ledger.write_session(SessionRecord(id=sid, **fields), [_turn(sid, **turn_kw)])
        _remember_heldout(ledger, "H", "copied")
        assert [t.session_id for t in ledger.training_turns()] == ["ok"]
        assert [t.session_id for t in ledger.training_turns(purpose="sft")] == ["ok", "demo"]
        stats = ledger.stats()
        assert stats["eligible_turns"]["rl"] == 1
        # per reason, among the sampled turns of trainable sessions (the demonstration is not one)
        assert stats["dropped_turns"] == {
            "not_token_exact": 1, "usage_less": 1, "usage_mismatch": 1, "truncated_sampling": 2,
            "interrupted": 1, "length_cut": 1,
        }  # fmt: skip


def test_expert_demonstrations_render_with_the_served_template(tmp_path, smollm2_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    scenarios = load_scenarios([CLINIC / "handwritten" / "pool" / "routine_booking.yaml"])
    with Ledger(tmp_path / "l.db") as ledger:
        report = asyncio.run(simulate(
            scenarios, load_bot(str(CLINIC / "expert.py")),
            SimulationConfig(persona="scripted"), ledger,
        ))  # fmt: skip
        assert report.episodes[0].outcome == "pass"
        turns = ledger.turns(report.episodes[0].session_id)
        assert turns and all(t.demonstration and not t.token_exact for t in turns)
        assert ledger.training_turns() == []  # demonstrations never train RL
        first = turns[0].request
        assert first["messages"][0]["role"] == "system"
        assert first["messages"][0]["content"].startswith("You are the receptionist")
        assert {t["function"]["name"] for t in first["tools"]} >= {"lookup_patient", "book"}
        assert any(t.tool_calls and t.tool_calls[0]["name"] == "book" for t in turns)
        rows = [TrainableTurn.from_turn(t, tokenizer) for t in ledger.training_turns(purpose="sft")]
    sequences, stats = build_sequences(rows)
    # A reply that speaks and calls a tool (the holding line before a lookup) is one completion,
    # but Pipecat's context keeps its text and its call as two assistant messages, so the next
    # prompt no longer extends it: the call splits there, and only there.
    spoken_calls = sum(bool(t.tool_calls and t.generated_text) for t in turns)
    assert spoken_calls == 1 and stats.split == spoken_calls
    assert stats.sequences == 1 + spoken_calls and stats.merged == len(rows) - 1 - spoken_calls
    learned = tokenizer.decode([
        i for seq in sequences for i, m in zip(seq.input_ids, seq.loss_mask, strict=True) if m
    ])
    assert '<tool_call>\n{"name": "book", "arguments": {"patient_id": 1, "slot_id": 11}}' in learned
    assert "Thank you for calling" in learned and "<tool_response>" not in learned
    # each demonstration is rendered exactly as the server renders the request
    prompt, completion = render_demonstration(turns[1], tokenizer)
    served = tokenizer.apply_chat_template(
        turns[1].request["messages"], tools=turns[1].request["tools"],
        add_generation_prompt=True, tokenize=True,
    )["input_ids"]  # fmt: skip
    assert prompt == list(served) and completion[-1] == tokenizer.eos_token_id


def test_a_heldout_scenario_copied_into_the_pool_never_trains(tmp_path):
    source = CLINIC / "handwritten" / "heldout" / "heldout_handoff.yaml"
    pool = tmp_path / "scenarios" / "pool"
    pool.mkdir(parents=True)
    shutil.copy(CLINIC / "handwritten" / "world.yaml", tmp_path / "scenarios" / "world.yaml")
    shutil.copy(CLINIC / "world.py", tmp_path / "world.py")  # the pack's code is in the hash
    shutil.copy(CLINIC / "intents.yaml", tmp_path / "intents.yaml")  # the pack's shared intents
    shutil.copy(source, pool / source.name)
    original = load_scenarios([source]).scenarios[0]
    copied = load_scenarios([pool]).scenarios[0]
    assert copied.split == "pool"  # by its folder it looks like a training scenario
    assert copied.content_hash() == original.content_hash()  # split is not in the hash
    with Ledger(tmp_path / "l.db") as ledger:
        _remember_heldout(ledger, original.content_hash(), original.id)
        report = asyncio.run(simulate(
            load_scenarios([pool]), load_bot(str(CLINIC / "expert.py")),
            SimulationConfig(persona="scripted"), ledger,
        ))  # fmt: skip
        sid = report.episodes[0].session_id
        assert ledger.turns(sid)  # recorded ...
        assert sid not in {
            t.session_id for t in ledger.training_turns(purpose="sft")
        }  # ... never trained


def test_training_api_imports_without_torch():
    code = (
        "import sys; from pipecat_rl.training import TrainConfig, TrainResult; "
        "import pipecat_rl.recording.recorder; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
