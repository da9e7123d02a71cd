"""Turn-taking and the caller-perceived gap on the gate: statistics, checks, receipt, gate.yaml.

Runs are written here by hand (the simulator fills `TurnTaking` in audio mode; text mode says why
it cannot), so the gate side is tested on the record's contract alone.
"""

from pathlib import Path

import numpy as np
import pytest

from pipecat_rl.errors import GateError
from pipecat_rl.gate import GateConfig, GateData, InputSource, RunResult, evaluate
from pipecat_rl.gate.config import TurnTakingConfig, load_gate_config
from pipecat_rl.gate.evaluate import recheck
from pipecat_rl.gate.inputs import load_ledger_runs
from pipecat_rl.gate.lineage import base_lineage
from pipecat_rl.gate.receipt import GateReceipt, load_receipt, render_markdown
from pipecat_rl.gate.report_html import render_html
from pipecat_rl.gate.turntaking import (
    compare_rates,
    rate_interval,
    turn_taking_checks,
    turn_taking_stats,
)
from pipecat_rl.ledger import LatencyRecord, Ledger, SessionRecord
from pipecat_rl.scoring import TurnTaking
from pipecat_rl.scoring.turntaking import text_mode

SCENARIOS, REPEATS, BARGE_INS, BACKCHANNELS = 8, 4, 3, 4
"""8 held-out scenarios (the size the clinic gates at), 4 repeats, per call 3 barge-ins and 4
backchannels."""

ALL_CHECKS = TurnTakingConfig(
    time_to_yield_p95_ratio=1.2, time_to_yield_p95_ms=2000.0, false_interruption_rate_diff=0.05,
    false_interruption_rate=0.5,
)  # fmt: skip


def _calls(
    rng: np.random.Generator,
    scenario_effect: np.ndarray,
    false_p: np.ndarray,
    *,
    slower: float = 1.0,
    more_false: float = 0.0,
) -> list[list[TurnTaking]]:
    """Per scenario, per repeat, one audio call's record: lognormal yields around 400 ms with
    scenario and call effects, false interruptions binomial per backchannel."""
    out = []
    for j, effect in enumerate(scenario_effect):
        calls = []
        for _ in range(REPEATS):
            call = rng.normal(0, 0.1)
            yields = 400 * slower * np.exp(effect + call + rng.normal(0, 0.4, size=BARGE_INS))
            false = int(rng.binomial(BACKCHANNELS, min(1, false_p[j] + more_false)))
            calls.append(TurnTaking(
                channel="audio", caller_turns=6, barge_ins=BARGE_INS,
                time_to_yield_ms=yields.round(1).tolist(), backchannels=BACKCHANNELS,
                false_interruptions=false,
                overlap_ms=1500.0, talk_ms=60_000.0, awkward_silences=int(rng.integers(0, 2)),
            ))  # fmt: skip
        out.append(calls)
    return out


def _trial(seed: int, **candidate) -> tuple[list, list]:
    rng = np.random.default_rng(seed)
    effect, false_p = rng.normal(0, 0.2, size=SCENARIOS), rng.beta(2, 10, size=SCENARIOS)
    return _calls(rng, effect, false_p, **candidate), _calls(rng, effect, false_p)


def _statuses(trials: int, **candidate) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for seed in range(trials):
        cand, inc = _trial(seed, **candidate)
        stats = turn_taking_stats(cand, inc, resamples=2000, seed=seed)
        for check in turn_taking_checks(stats, ALL_CHECKS):
            out.setdefault(check.name, []).append(check.status)
    return out


def test_identical_arms_fail_no_more_than_the_nominal_rate_and_a_2x_slower_yield_fails():
    same = _statuses(200)
    for name in ("time_to_yield_ratio", "false_interruption_diff"):
        assert same[name].count("fail") / 200 <= 0.025, (name, same[name].count("fail"))
    slow = _statuses(200, slower=2.0)
    assert slow["time_to_yield_ratio"].count("fail") / 200 >= 0.9
    assert slow["false_interruption_diff"].count("fail") / 200 <= 0.025  # only the yield moved
    worse = _statuses(100, more_false=0.4)
    assert worse["false_interruption_diff"].count("fail") / 100 >= 0.9


def test_the_rate_difference_covers_zero_for_identical_arms_and_zero_events_are_no_evidence():
    covered = 0
    for seed in range(400):
        rng = np.random.default_rng(seed)
        p, n = rng.beta(2, 10, size=SCENARIOS), rng.integers(4, 17, size=SCENARIOS)
        d = compare_rates((rng.binomial(n, p), n), (rng.binomial(n, p), n))
        assert d is not None
        covered += d.low <= 0 <= d.high
    assert covered / 400 >= 0.95
    none = rate_interval([0] * SCENARIOS, [5] * SCENARIOS)
    assert none is not None and none.estimate == 0 and none.high > 0.05  # 0 of 40 bounds little
    assert rate_interval([1], [5]) is None  # one scenario: no interval over scenarios


def _runs(policy: str, records: list[list[TurnTaking | None]], gap_ms: float = 800.0,
          channel: str = "audio", seed: int = 0) -> list[RunResult]:  # fmt: skip
    """The candidate passes every run, the base every other one: the score alone promotes."""
    rng = np.random.default_rng(seed)
    return [
        RunResult(
            scenario=f"scn-{j:02d}",
            policy=policy,
            run=r,
            seed=100 * j + r,
            reward=1.0 if policy == "cand" else float(r % 2),
            channel=channel,
            turn_taking=record,
            llm_call_ttft_ms=(200.0, 210.0),
            llm_turn_ms=(400.0, 420.0),
            response_gap_ms=tuple((gap_ms * rng.lognormal(0, 0.3, size=6)).round(1)),
        )  # fmt: skip
        for j, calls in enumerate(records)
        for r, record in enumerate(calls)
    ]


def _receipt(cand: list[RunResult], inc: list[RunResult], config: GateConfig) -> GateReceipt:
    data = GateData("cand", "base", (*cand, *inc), InputSource(kind="scores", path="runs.jsonl"))
    return evaluate(data, config, base_lineage("cand"), base_lineage("base"))


def _check(receipt: GateReceipt, name: str):
    return next(c for c in receipt.checks if c.name == name)


def test_a_planted_2x_slower_yield_rejects_the_candidate_and_renders(tmp_path):
    cand, inc = _trial(3, slower=2.0)
    config = GateConfig(turn_taking=ALL_CHECKS)
    receipt = _receipt(_runs("cand", cand), _runs("base", inc, seed=1), config)
    assert receipt.verdict == "REJECT"
    assert _check(receipt, "time_to_yield_ratio").status == "fail"
    assert "time to yield" in receipt.reason
    t = receipt.turn_taking
    assert t is not None and t.unavailable is None
    assert t.candidate.time_to_yield.p95 > 1.5 * t.incumbent.time_to_yield.p95
    assert t.candidate.false_interruptions is not None and t.candidate.overlap_ratio == 0.025
    md = render_markdown(receipt)
    assert "## Turn-taking" in md and "Time to yield P95, candidate / incumbent" in md
    page = render_html(receipt)
    assert 'id="turn-taking"' in page and 'id="check-time_to_yield_ratio"' in page
    again = GateReceipt.model_validate_json(receipt.model_dump_json())
    assert again.model_dump_json() == receipt.model_dump_json()  # headlines are not stored
    verdict, problems = recheck(again)
    assert problems == [] and verdict.decision == "REJECT"


def test_unmeasured_turn_taking_is_unavailable_with_its_reason_never_a_pass():
    texts = [[text_mode() for _ in range(REPEATS)] for _ in range(SCENARIOS)]
    receipt = _receipt(_runs("cand", texts, channel="text"), _runs("base", texts, channel="text"),
                       GateConfig(turn_taking=ALL_CHECKS))  # fmt: skip
    names = ["time_to_yield_ratio", "time_to_yield_budget", "false_interruption_diff",
             "false_interruption_rate"]  # fmt: skip
    for name in names:
        check = _check(receipt, name)
        assert check.status == "unavailable" and "text mode" in check.detail, check
    assert receipt.verdict == "PROMOTE" and "turn-taking not checked" in receipt.reason
    assert receipt.turn_taking is not None and "text mode" in (
        receipt.turn_taking.unavailable or ""
    )
    assert "Turn-taking unavailable: neither policy's runs measured it" in render_markdown(receipt)
    # runs without any record (a scores file, older sessions) say so, and one arm alone too
    bare = [[None] * REPEATS] * SCENARIOS
    receipt = _receipt(_runs("cand", bare), _runs("base", bare), GateConfig(turn_taking=ALL_CHECKS))
    assert "no run carries a turn-taking record" in _check(receipt, "time_to_yield_ratio").detail
    cand, _ = _trial(0)
    receipt = _receipt(_runs("cand", cand), _runs("base", texts, channel="text"),
                       GateConfig(turn_taking=ALL_CHECKS))  # fmt: skip
    assert _check(receipt, "time_to_yield_ratio").status == "unavailable"
    assert (
        "the incumbent's runs did not measure it" in _check(receipt, "time_to_yield_ratio").detail
    )
    assert _check(receipt, "time_to_yield_budget").status != "unavailable"  # the candidate's own


def test_turn_taking_and_the_caller_gap_are_off_by_default():
    cand, inc = _trial(0, slower=3.0)
    receipt = _receipt(_runs("cand", cand, gap_ms=19_000), _runs("base", inc), GateConfig())
    names = {c.name for c in receipt.checks}
    assert not names & {"caller_gap_budget", "time_to_yield_ratio", "time_to_yield_budget",
                        "false_interruption_diff", "false_interruption_rate"}  # fmt: skip
    assert receipt.turn_taking is not None  # described, not gated


def test_the_caller_gap_is_on_the_receipt_per_arm_and_a_budget_catches_silent_lookups(tmp_path):
    """Same speed per LLM call, but the candidate's caller waits ~19 s where the base's ~2 s."""
    records = [[None] * REPEATS] * SCENARIOS
    cand, inc = _runs("cand", records, gap_ms=12_000), _runs("base", records, gap_ms=1_300)
    receipt = _receipt(cand, inc, GateConfig(caller_gap_p95_budget_ms=5000.0))
    gap = receipt.latency.caller_gap
    assert gap["candidate"].p95 > 15_000 and gap["incumbent"].p95 < 2_500
    assert gap["candidate"].n == SCENARIOS * REPEATS * 6
    assert _check(receipt, "llm_ttft_ratio").status == "pass"  # per call, nothing changed
    assert _check(receipt, "caller_gap_budget").status == "fail"
    assert receipt.verdict == "REJECT" and "caller-perceived gap" in receipt.reason
    md, page = render_markdown(receipt), render_html(receipt)
    for text in (md, page):
        assert "Caller-perceived gap" in text and "tool rounds included" in text
    assert "the caller-perceived gap P95 within the 5,000 ms budget (failed)" in md
    quick = _receipt(
        _runs("cand", records, gap_ms=600), inc, GateConfig(caller_gap_p95_budget_ms=5000.0)
    )
    assert _check(quick, "caller_gap_budget").status == "pass"
    no_gap = [r.model_copy(update={"response_gap_ms": ()}) for r in cand]
    missing = _receipt(no_gap, inc, GateConfig(caller_gap_p95_budget_ms=5000.0))
    assert _check(missing, "caller_gap_budget").status == "uncertain"  # require_latency: on


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("gate:\n  turn_taking:\n    time_to_yield_p95_ratio: 0.5\n",
         ":3: turn_taking.time_to_yield_p95_ratio: Input should be greater than or equal to 1"),
        ("turn_taking:\n  yield_ratio: 1.2\n", ":2: turn_taking.yield_ratio: unknown field"),
        ("turn_taking:\n  false_interruption_rate_diff: 1.5\n",
         "turn_taking.false_interruption_rate_diff"),
        ("caller_gap_p95_budget_ms: -5\n", ":1: caller_gap_p95_budget_ms: Input should be greater"),
    ],
)  # fmt: skip
def test_gate_yaml_errors_name_the_file_line_and_field(tmp_path, text, said):
    path = tmp_path / "gate.yaml"
    path.write_text(text)
    with pytest.raises(GateError) as e:
        load_gate_config(path)
    assert f"{path}{said}" in str(e.value) or said in str(e.value), str(e.value)


def test_gate_yaml_sets_the_new_limits(tmp_path):
    path = tmp_path / "gate.yaml"
    path.write_text(
        "gate:\n  caller_gap_p95_budget_ms: 4000\n  turn_taking:\n"
        "    time_to_yield_p95_ratio: 1.2\n    false_interruption_rate_diff: 0.05\n"
    )
    config = load_gate_config(path)
    assert config.caller_gap_p95_budget_ms == 4000
    assert config.turn_taking.time_to_yield_p95_ratio == 1.2 and config.turn_taking.configured
    assert not GateConfig().turn_taking.configured


def test_ledger_sessions_carry_their_response_gaps_and_turn_taking(tmp_path):
    measured = TurnTaking(channel="audio", barge_ins=2, time_to_yield_ms=[300.0, 500.0])
    with Ledger(tmp_path / "l.db") as ledger:
        for policy in ("cand", "base"):
            for j in range(2):
                sid = f"{policy}-{j}"
                ledger.write_session(
                    SessionRecord(
                        id=sid, source="gate", started_at=1000.0 + j, ended_at=1010.0 + j,
                        scenario_id=f"scn-{j}", scenario_hash=f"h{j}", split="heldout",
                        heldout_set_id="set", policy=policy, seed=j, repeat=0,
                        reward_parts={"verifier": 1.0}, outcome="pass",
                        metadata={"mode": "audio", "turn_taking": measured.model_dump()},
                    ),
                    latencies=[LatencyRecord(session_id=sid, user_turn=k, response_gap_ms=900.0 + k)
                               for k in range(3)],
                )  # fmt: skip
        runs = load_ledger_runs(ledger, "cand", "base").runs
    assert {r.response_gap_ms for r in runs} == {(900.0, 901.0, 902.0)}
    assert all(r.turn_taking == measured for r in runs)


@pytest.mark.parametrize("run", ["cycle-clinic-2bfb815", "cycle-clinic-035c76b"])  # schema 5 and 3
def test_a_receipt_from_before_turn_taking_still_loads_renders_and_rechecks(run):
    old = load_receipt(Path(__file__).parents[1] / "docs" / "results" / run / "receipt")
    assert old.turn_taking is None and old.latency.caller_gap == {}
    assert old.thresholds.caller_gap_p95_budget_ms is None
    assert "## Turn-taking" not in render_markdown(old)
    assert 'id="turn-taking"' not in render_html(old)
    assert recheck(old)[1] == []
