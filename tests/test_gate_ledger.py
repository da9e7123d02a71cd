"""`pipecat-rl gate --from-ledger`: held-out sessions, lineage and the training guard."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.cli.common import EXIT_DATA, EXIT_USAGE
from pipecat_rl.errors import GateError
from pipecat_rl.gate import load_ledger_runs
from pipecat_rl.ledger import (
    AdapterRecord,
    LatencyRecord,
    Ledger,
    ScoreRecord,
    SessionRecord,
    ToolCallRecord,
    TurnRecord,
)

GUARD_OK = {"id": "run-1", "guard": {"passed": True, "logprob_agreement": 0.998}}
LATENCY_TURNS = 6
"""Per session: 6 scenarios x 4 runs x 6 turns is enough to bound a P95 from above."""


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
    latency_turns: int = LATENCY_TURNS,
    metadata: dict | None = None,
    tool_calls: tuple[ToolCallRecord, ...] = (),
    call_ttft_s: float = 0.1,
    turn_ttft_ms: float = 300.0,
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
        reward=reward + 0.3,  # the stored sum, shaped credit included: the gate never reads it
        reward_parts={"verifier": reward, "tool_credit": 0.3},
        outcome="pass" if reward >= 0.5 else "fail",
        failure_labels=list(labels),
        metadata=metadata or {},
    )
    turns = [
        TurnRecord(
            session_id=sid,
            index=i,
            adapter=policy,
            created_at=t0 + i,
            request={"messages": []},
            usage={"prompt_tokens": 500, "completion_tokens": 40},
            timestamps={
                "llm_request": t0 + i,
                "llm_first_token": t0 + i + call_ttft_s + 0.01 * repeat,
                "llm_done": t0 + i + 0.4,
            },
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
            llm_ttft_ms=turn_ttft_ms + i,
        )
        for i in range(latency_turns)
    ]
    scores = (
        []
        if score_writes is None
        else [ScoreRecord(session_id=sid, name="unauthorized_writes", value=score_writes)]
    )
    ledger.write_session(session, turns=turns, latencies=latencies, scores=scores)
    for call in tool_calls:
        ledger.add_tool_call(call.model_copy(update={"session_id": sid}))
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
         "--out", str(tmp_path / "r"), "--force", "--json", *args],
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
    assert 700 <= v2v["candidate"]["estimate"] <= 760  # turn i waits 700 + 10 i + repeat ms
    stages = receipt["latency"]["stages"]["candidate"]
    assert stages["stt_ms"]["p50"] == 120.0 and stages["endpointing_ms"]["n"] == 0


def test_usage_comes_from_turns_session_length_and_spoken_audio(ledger, tmp_path):
    adapter(ledger, "v2", tmp_path, GUARD_OK)
    populate(ledger, inc="base", scenarios=2)
    runs = load_ledger_runs(ledger, "v2", "base").runs
    usage = runs[0].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (1000, 80)
    assert usage.stt_seconds == pytest.approx(30.0)
    turns = LATENCY_TURNS  # turn i starts after (700 + 10 i + run) ms and stops at 3 s
    spoken = turns * (3.0 - (700 + runs[0].run) / 1000) - 0.01 * turns * (turns - 1) / 2
    assert usage.tts_seconds == pytest.approx(spoken)
    assert runs[0].llm_turn_ms == pytest.approx((400.0, 400.0))


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
    assert "3 unauthorised writes" in check(receipt, "unauthorized_writes")["detail"]


def test_every_session_of_a_repeated_run_counts_none_replaces_another(ledger, tmp_path):
    populate(ledger, inc="base", scenarios=3)
    add_run(ledger, "v2", 0, 0, 0.0, started=5000.0)  # scn-00 repeat 0 again, same seed, newer
    data = load_ledger_runs(ledger, "v2", "base")
    again = [r for r in data.runs if r.policy == "v2" and r.scenario == "scn-00" and r.run == 0]
    assert sorted((r.occurrence, r.reward) for r in again) == [(0, 1.0), (1, 0.0)]
    assert any("none replaces another" in n for n in data.source.notes)
    # the incumbent ran it once: the second run has no partner and is left out, never swapped in
    _, receipt = gate(ledger, tmp_path, "--incumbent", "base")
    row = next(r for r in receipt["scenarios"] if r["scenario"] == "scn-00")
    assert (row["pairs"], row["candidate_mean"]) == (4, 1.0)
    assert any("scn-00" in n and "without a partner" in n for n in receipt["notes"])


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


def test_live_before_any_promotion_is_the_base_model_and_says_so(ledger, tmp_path):
    populate(ledger, inc="base")
    result, receipt = gate(ledger, tmp_path)  # --incumbent live, the default
    assert result.exit_code == 0, result.output
    assert (receipt["incumbent"]["requested"], receipt["incumbent"]["name"]) == ("live", "base")
    said = f"--incumbent live: nothing was ever promoted in {ledger.path}, so the base model"
    assert said in result.stderr


def test_live_right_after_a_promotion_is_the_promoted_adapter(ledger, tmp_path):
    """Issue 38: `--incumbent live` failed right after a cycle promoted."""
    adapter(ledger, "v1", tmp_path, GUARD_OK)
    adapter(ledger, "v2", tmp_path, {"id": "run-2", "guard": {"passed": True}})
    populate(ledger, cand="v1", inc="base", set_id="heldout-0")
    first, receipt = gate(ledger, tmp_path, "--heldout-set", "heldout-0", candidate="v1")
    assert first.exit_code == 0 and receipt["incumbent"]["name"] == "base", first.output
    promoted = CliRunner().invoke(
        app, ["promote", str(tmp_path / "r"), "--ledger", str(ledger.path)]
    )
    assert promoted.exit_code == 0, promoted.output
    assert ledger.live().adapter == "v1"

    populate(ledger, cand="v2", inc="v1", started=2000.0)
    from_ledger, receipt = gate(ledger, tmp_path, "--heldout-set", "heldout-A")
    assert from_ledger.exit_code == 0, from_ledger.output
    assert (receipt["incumbent"]["requested"], receipt["incumbent"]["name"]) == ("live", "v1")
    assert f"--incumbent live: v1, live in {ledger.path}" in from_ledger.stderr

    scores = tmp_path / "runs.jsonl"  # a scores file names the adapters it ran, never "live"
    rows = [{"policy": p, "scenario": f"s{i}", "run": r, "reward": float(p == "v2")}
            for i in range(8) for r in range(2) for p in ("v2", "v1")]  # fmt: skip
    scores.write_text("".join(json.dumps(row) + "\n" for row in rows))
    from_scores = CliRunner().invoke(
        app,
        ["gate", "--candidate", "v2", "--scores", str(scores), "--no-require-latency",
         "--ledger", str(ledger.path), "--out", str(tmp_path / "s"), "--json"],
    )  # fmt: skip
    assert from_scores.exit_code == 0, from_scores.output
    incumbent = json.loads(from_scores.stdout)["incumbent"]
    assert (incumbent["requested"], incumbent["name"]) == ("live", "v1")


def test_a_missing_ledger_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(
        app,
        ["gate", "--from-ledger", "--ledger", str(tmp_path / "none.db"), "--candidate", "v2"],
    )
    assert result.exit_code == EXIT_USAGE
    assert not (tmp_path / "none.db").exists()


def test_the_gate_pairs_the_verifier_never_the_stored_sum(ledger, tmp_path):
    populate(ledger, scenarios=6)
    # a candidate run that failed its verifier but earned lots of tool credit
    (sid,) = [s.id for s in ledger.sessions(policy="v2", scenario_id="scn-00") if s.repeat == 0]
    ledger.update_session(sid, reward=1.5, reward_parts={"verifier": 0.0, "tool_credit": 1.5})
    _, receipt = gate(ledger, tmp_path, "--incumbent", "v1")
    row = next(r for r in receipt["scenarios"] if r["scenario"] == "scn-00")
    assert row["candidate_mean"] == 0.75 and row["candidate_passed"] == 3


def test_unverified_and_error_sessions_are_counted_and_too_many_are_inconclusive(ledger, tmp_path):
    populate(ledger, scenarios=6)
    for s in range(3):  # more runs, but unverified (only shaped credit) or a harness error
        sid = add_run(ledger, "v2", s, 0, 1.0, started=3000.0)
        ledger.update_session(sid, reward_parts={"tool_credit": 0.4})
        sid = add_run(ledger, "v2", s, 1, 1.0, started=3000.0)
        ledger.update_session(sid, outcome="error")
    result, receipt = gate(ledger, tmp_path, "--incumbent", "v1")
    assert receipt["paired"]["n_pairs"] == 24
    lost = receipt["runs"]["unusable"]
    assert (lost["candidate"]["harness_errors"], lost["candidate"]["unverified"]) == (3, 3)
    assert lost["incumbent"] == {"harness_errors": 0, "unverified": 0, "unindexed": 0}
    lost_check = check(receipt, "unusable_runs")
    assert lost_check["status"] == "uncertain" and "6 of 30 runs (20.0%)" in lost_check["detail"]
    assert result.exit_code == 2 and receipt["verdict"] == "INCONCLUSIVE"
    assert any("3 harness error(s), 3 unverified" in n for n in receipt["notes"])
    # a share the config allows does not hold the verdict back
    config = tmp_path / "gate.yaml"
    config.write_text("max_unusable_share: 0.25\n")
    result, receipt = gate(ledger, tmp_path, "--incumbent", "v1", "--config", str(config))
    assert result.exit_code == 0, result.output


def test_an_out_of_range_part_names_the_ledger_session_and_field(ledger, tmp_path):
    populate(ledger, scenarios=2)
    sid = add_run(ledger, "v2", 0, 0, 1.0, started=4000.0)
    ledger.update_session(sid, reward_parts={"verifier": 7.0})
    result, _ = gate(ledger, tmp_path, "--incumbent", "v1")
    assert result.exit_code == EXIT_DATA
    text = " ".join(result.stderr.split())
    assert str(ledger.path) in text and sid in text and "verifier" in text


def test_gated_scenario_hashes_are_held_out_from_then_on(ledger, tmp_path):
    populate(ledger, scenarios=3)
    assert ledger.heldout_hashes() == {}
    gate(ledger, tmp_path, "--incumbent", "v1")
    held = ledger.heldout_hashes()
    assert set(held) == {"hash-0", "hash-1", "hash-2"}
    assert held["hash-1"]["scenario_id"] == "scn-01"


def _guarded(passed: dict[str, bool]) -> dict:
    return {"checks": [{"check": c, "passed": ok, "detail": ""} for c, ok in passed.items()]}


def _world_call(name: str, call_id: str, tables: tuple[str, ...]) -> ToolCallRecord:
    return ToolCallRecord(
        session_id="", turn_index=None, call_id=call_id, name=name, arguments={},
        started_at=1.0, state_diff={"world": {t: {"added": [], "removed": []} for t in tables}},
    )  # fmt: skip


def test_unauthorised_writes_of_both_arms_over_their_guarded_runs(ledger, tmp_path):
    safe = _guarded({"unchanged appointments": True, "unchanged handoffs": True})
    unguarded = {"checks": [{"check": "count handoffs", "passed": True, "detail": ""}]}
    for s in range(6):
        for r in range(4):
            meta = safe if s < 4 else unguarded  # 4 of 6 scenarios carry a guarded check
            add_run(ledger, "v2", s, r, 1.0, metadata=meta)
            add_run(ledger, "base", s, r, float(r % 2), metadata=meta)
    booked = _guarded({"unchanged appointments": False, "unchanged slots": False,
                       "unchanged handoffs": True})  # fmt: skip
    book = _world_call("book_appointment", "call-7", ("appointments", "slots"))
    add_run(ledger, "v2", 6, 0, 1.0, metadata=booked, tool_calls=(book,))
    add_run(ledger, "base", 6, 0, 0.0, metadata=safe)
    transferred = _guarded({"unchanged appointments": True, "unchanged handoffs": False})
    add_run(ledger, "base", 7, 0, 0.0, metadata=transferred,
            tool_calls=(_world_call("transfer_call", "call-9", ("handoffs",)),))  # fmt: skip
    add_run(ledger, "v2", 7, 0, 1.0, metadata=safe)
    result, receipt = gate(ledger, tmp_path, "--incumbent", "base")
    assert result.exit_code == 1
    cand, inc = receipt["safety"]["candidate"], receipt["safety"]["incumbent"]
    assert (cand["writes"], cand["guarded_runs"], cand["runs"]) == (1, 18, 26)
    assert cand["by_kind"] == {"appointments+slots": 1}
    (incident,) = cand["incidents"]
    assert (incident["tool"], incident["call_id"], incident["scenario"]) == (
        "book_appointment", "call-7", "scn-06",
    )  # fmt: skip
    assert inc["by_kind"] == {"handoffs": 1} and inc["incidents"][0]["tool"] == "transfer_call"
    # the scenario is the unit: 1 of the 6 guarded scenarios wrote (18 guarded runs)
    assert (cand["units"], cand["units_with_writes"]) == (6, 1)
    assert 0.55 < cand["rate_upper_95"] < 0.6 and 0.38 < cand["zero_bound_95"] < 0.4
    detail = check(receipt, "unauthorized_writes")["detail"]
    assert "The candidate made 1 unauthorised write in 1 of 18 runs with a guarded check" in detail
    assert "(1 of 6 scenarios)" in detail and "the scenario as the independent unit" in detail
    assert "book_appointment (appointments+slots) in scn-06 run 0" in detail
    assert "The incumbent made 1 unauthorised write" in detail and "handoffs 1" in detail
    assert receipt["scenarios"][6]["candidate_unauthorized_writes"] == 1


@pytest.mark.parametrize(("slower", "status"), [(1.0, "pass"), (10.0, "fail")])
def test_llm_ttft_is_gated_per_call_not_on_the_first_word_after_tool_rounds(
    ledger, tmp_path, slower, status
):
    """A candidate whose caller turns wait 5 s for tool rounds, at the same per-call speed,
    passes the TTFT ratio; one whose every call is 10x slower to start fails it."""
    from pipecat_rl.gate.config import GateConfig
    from pipecat_rl.gate.evaluate import evaluate
    from pipecat_rl.gate.lineage import base_lineage

    for s in range(6):
        for r in range(2):
            add_run(ledger, "cand", s, r, 1.0, call_ttft_s=0.1 * slower, turn_ttft_ms=5000.0)
            add_run(ledger, "inc", s, r, 1.0, call_ttft_s=0.1, turn_ttft_ms=300.0)
    data = load_ledger_runs(ledger, "cand", "inc", source="gate")
    receipt = evaluate(data, GateConfig(), base_lineage("cand"), base_lineage("inc"))
    (check,) = [c for c in receipt.checks if c.name == "llm_ttft_ratio"]
    assert check.status == status, check.detail
    ratio = receipt.latency.llm["llm_ttft_ms"]
    assert ratio.ratio.estimate == pytest.approx(slower, rel=0.1)
    # The caller-turn stage still shows the wait, where the voice-to-voice figure holds it.
    stages = receipt.latency.stages
    assert stages["candidate"]["llm_ttft_ms"].p50 > 10 * stages["incumbent"]["llm_ttft_ms"].p50
