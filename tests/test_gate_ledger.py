"""`pipecat-rl gate --from-ledger`: held-out sessions, lineage and the training guard."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.cli.common import EXIT_USAGE
from pipecat_rl.errors import GateError
from pipecat_rl.gate import load_ledger_runs
from pipecat_rl.ledger import (
    AdapterRecord,
    LatencyRecord,
    Ledger,
    ScoreRecord,
    SessionRecord,
    TurnRecord,
)

GUARD_OK = {"id": "run-1", "guard": {"passed": True, "logprob_agreement": 0.998}}


def add_run(
    ledger: Ledger,
    policy: str,
    scenario: int,
    repeat: int,
    reward: float,
    *,
    started: float = 1000.0,
    set_id: str = "heldout-A",
    scenario_hash: str | None = None,
    split: str = "heldout",
    source: str = "gate",
    labels: tuple[str, ...] = (),
    v2v_ms: float = 700.0,
    score_writes: float | None = None,
) -> str:
    sid = f"{policy}-{scenario}-{repeat}-{started}-{set_id}-{source}"
    t0 = started + scenario * 100 + repeat
    session = SessionRecord(
        id=sid,
        source=source,
        started_at=t0,
        ended_at=t0 + 30.0,
        scenario_id=f"scn-{scenario:02d}",
        scenario_hash=scenario_hash or f"hash-{scenario}",
        split=split,
        heldout_set_id=set_id,
        policy=policy,
        seed=10 * scenario + repeat,
        repeat=repeat,
        reward=reward,
        failure_labels=list(labels),
    )
    turns = [
        TurnRecord(
            session_id=sid,
            index=i,
            adapter=policy,
            created_at=t0 + i,
            request={"messages": []},
            usage={"prompt_tokens": 500, "completion_tokens": 40},
        )
        for i in range(2)
    ]
    latencies = [
        LatencyRecord.from_timestamps(
            sid,
            i,
            user_stopped_at=t0 + 5 * i,
            bot_started_at=t0 + 5 * i + (v2v_ms + 10 * i + repeat) / 1000,
            bot_stopped_at=t0 + 5 * i + 3.0,
            stt_ms=120.0,
            llm_ttft_ms=300.0,
        )
        for i in range(3)
    ]
    scores = (
        []
        if score_writes is None
        else [ScoreRecord(session_id=sid, name="unauthorized_writes", value=score_writes)]
    )
    ledger.write_session(session, turns=turns, latencies=latencies, scores=scores)
    return sid


def adapter(ledger: Ledger, name: str, tmp_path: Path, training_run: dict | None) -> None:
    folder = tmp_path / "adapters" / name
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    ledger.register_adapter(
        AdapterRecord(
            name=name,
            path=str(folder),
            base_model="smollm2-135m",
            parent="base",
            created_at=1.0,
            training_run=training_run,
            training_data=["s1", "s2"],
        )
    )


def populate(ledger: Ledger, cand: str = "v2", inc: str = "v1", scenarios: int = 6, **kw) -> None:
    for s in range(scenarios):
        for r in range(4):
            add_run(ledger, cand, s, r, 1.0, **kw)
            add_run(ledger, inc, s, r, float(r % 2), **kw)


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.db") as store:
        yield store


def gate(ledger: Ledger, tmp_path: Path, *args: str, candidate: str = "v2"):
    result = CliRunner().invoke(
        app,
        ["gate", "--from-ledger", "--ledger", str(ledger.path), "--candidate", candidate,
         "--out", str(tmp_path / "r"), "--json", *args],
    )  # fmt: skip
    return result, (json.loads(result.stdout) if result.stdout.strip() else None)


def check(receipt: dict, name: str) -> dict:
    return next(c for c in receipt["checks"] if c["name"] == name)


def test_promote_against_the_live_adapter_with_lineage(ledger, tmp_path):
    adapter(ledger, "v1", tmp_path, GUARD_OK)
    adapter(ledger, "v2", tmp_path, {"id": "run-2", "guard": {"passed": True}})
    ledger.move_live("v1")
    populate(ledger)
    result, receipt = gate(ledger, tmp_path)
    assert result.exit_code == 0, result.output
    assert receipt["verdict"] == "PROMOTE"
    assert receipt["incumbent"]["requested"] == "live"
    assert receipt["incumbent"]["name"] == "v1"
    cand = receipt["candidate"]
    assert (cand["kind"], cand["parent"], cand["training_run_id"]) == ("adapter", "base", "run-2")
    assert cand["guard"] == "passed"
    assert check(receipt, "training_guard")["status"] == "pass"
    assert receipt["input"]["heldout_set_id"] == "heldout-A"
    assert receipt["input"]["scenario_hashes"]["scn-00"] == "hash-0"
    assert receipt["paired"]["n_pairs"] == 24
    v2v = receipt["latency"]["v2v_p95"]
    assert 700 <= v2v["candidate"]["estimate"] <= 730
    stages = receipt["latency"]["stages"]["candidate"]
    assert stages["stt_ms"]["p50"] == 120.0 and stages["endpointing_ms"]["n"] == 0


def test_usage_comes_from_turns_session_length_and_spoken_audio(ledger, tmp_path):
    adapter(ledger, "v2", tmp_path, GUARD_OK)
    populate(ledger, inc="base", scenarios=2)
    runs = load_ledger_runs(ledger, "v2", "base").runs
    usage = runs[0].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (1000, 80)
    assert usage.stt_seconds == pytest.approx(30.0)
    assert usage.tts_seconds == pytest.approx(3 * (3.0 - (700 + runs[0].run) / 1000) - 0.03)


@pytest.mark.parametrize(
    ("training_run", "guard", "status"),
    [
        ({"id": "run-9", "guard": {"passed": False, "logprob_agreement": 0.7}}, "failed", "fail"),
        ({"id": "run-9", "guard": None}, "missing", "fail"),
        ({"id": "run-9"}, "missing", "fail"),
        (None, "unavailable", "unavailable"),
    ],
)
def test_training_guard_states(ledger, tmp_path, training_run, guard, status):
    adapter(ledger, "v2", tmp_path, training_run)
    populate(ledger, inc="base")
    result, receipt = gate(ledger, tmp_path, "--incumbent", "base")
    assert receipt["candidate"]["guard"] == guard
    assert check(receipt, "training_guard")["status"] == status
    assert result.exit_code == (1 if status == "fail" else 0)
    assert receipt["incumbent"]["kind"] == "base"
    if guard == "missing":
        assert "recorded no guard value" in receipt["reason"]
    if guard == "unavailable":
        assert "imported adapter" in check(receipt, "training_guard")["detail"]
        result, receipt = gate(ledger, tmp_path, "--incumbent", "base", "--require-guard")
        assert result.exit_code == 1


def test_an_unregistered_candidate_has_no_guard_to_read(ledger, tmp_path):
    populate(ledger, inc="base")
    result, receipt = gate(ledger, tmp_path, "--incumbent", "base")
    assert receipt["candidate"]["kind"] == "unknown"
    assert check(receipt, "training_guard")["status"] == "unavailable"


def test_the_base_model_as_candidate_needs_no_guard(ledger, tmp_path):
    adapter(ledger, "v1", tmp_path, GUARD_OK)
    populate(ledger, cand="base", inc="v1")
    result, receipt = gate(ledger, tmp_path, "--incumbent", "v1", candidate="base")
    assert receipt["candidate"]["kind"] == "base"
    assert check(receipt, "training_guard")["status"] == "pass"
    assert "base model" in receipt["candidate"]["guard_detail"]


def test_unauthorised_write_labels_and_scores_reject(ledger, tmp_path):
    adapter(ledger, "v2", tmp_path, GUARD_OK)
    populate(ledger, inc="base", scenarios=4)
    add_run(ledger, "v2", 4, 0, 1.0, labels=("unauthorised_write", "unauthorised_write"))
    add_run(ledger, "v2", 5, 0, 1.0, score_writes=1)
    add_run(ledger, "base", 4, 0, 0.0)
    add_run(ledger, "base", 5, 0, 0.0)
    result, receipt = gate(ledger, tmp_path, "--incumbent", "base")
    assert result.exit_code == 1
    assert "3 unauthorised write(s)" in check(receipt, "unauthorized_writes")["detail"]


def test_the_newest_session_of_a_repeated_run_counts(ledger, tmp_path):
    populate(ledger, inc="base", scenarios=3)
    add_run(ledger, "v2", 0, 0, 0.0, started=5000.0)  # re-run of scn-00 repeat 0, newer
    data = load_ledger_runs(ledger, "v2", "base")
    run = next(r for r in data.runs if r.policy == "v2" and r.scenario == "scn-00" and r.run == 0)
    assert run.reward == 0.0
    assert any("older session" in n for n in data.source.notes)


def test_several_heldout_sets_need_a_choice(ledger, tmp_path):
    populate(ledger, inc="base", scenarios=3)
    populate(ledger, inc="base", scenarios=3, set_id="heldout-B")
    with pytest.raises(GateError, match="--heldout-set"):
        load_ledger_runs(ledger, "v2", "base")
    data = load_ledger_runs(ledger, "v2", "base", heldout_set="heldout-B")
    assert data.source.heldout_set_id == "heldout-B"
    assert len(data.runs) == 24


def test_only_heldout_sessions_of_the_chosen_source_are_read(ledger, tmp_path):
    populate(ledger, inc="base", scenarios=2)
    populate(ledger, inc="base", scenarios=2, split="pool", set_id=None)
    populate(ledger, inc="base", scenarios=3, source="simulate", started=2000.0)
    assert len(load_ledger_runs(ledger, "v2", "base", source="gate").runs) == 16
    data = load_ledger_runs(ledger, "v2", "base", source="simulate")
    assert {r.scenario for r in data.runs} == {"scn-00", "scn-01", "scn-02"}


def test_a_scenario_edited_between_runs_does_not_pair(ledger, tmp_path):
    populate(ledger, inc="base", scenarios=3)
    add_run(ledger, "v2", 7, 0, 1.0, scenario_hash="old")
    add_run(ledger, "base", 7, 0, 0.0, scenario_hash="new")
    result, receipt = gate(ledger, tmp_path, "--incumbent", "base")
    assert receipt["paired"]["n_scenarios"] == 3
    assert sum("scn-07" in n for n in receipt["notes"]) == 2


def test_live_without_a_pointer_is_an_error(ledger, tmp_path):
    populate(ledger, inc="base", scenarios=2)
    result, _ = gate(ledger, tmp_path)
    assert result.exit_code != 0
    assert "no live adapter" in result.stderr


def test_a_missing_ledger_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(
        app,
        ["gate", "--from-ledger", "--ledger", str(tmp_path / "none.db"), "--candidate", "v2"],
    )
    assert result.exit_code == EXIT_USAGE
    assert not (tmp_path / "none.db").exists()
