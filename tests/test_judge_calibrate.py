"""Judge calibration: Cohen's κ and its interval as a statistic (known values, seeded coverage),
the judge against people's labels in the ledger, and the cycle's refusal of judge-scored calls."""

import random

import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.duels.calibration import JudgeCalibrationSettings, calibrate, judge_trust
from pipecat_rl.duels.kappa import cohen_kappa
from pipecat_rl.duels.make import find_moments, make_duels
from pipecat_rl.ledger import Ledger, LiveTrust, ScoreIn, SessionRecord
from pipecat_rl.loop.config import LiveSettings
from pipecat_rl.loop.cycle import live_trust
from tests.test_duels import LengthSampler
from tests.test_ledger_scores import turn


def test_kappa_matches_a_worked_example_and_its_edges():
    # 50 items: both "yes" 20, both "no" 15, 5 and 10 split (a textbook 2x2)
    first = ["yes"] * 20 + ["yes"] * 5 + ["no"] * 10 + ["no"] * 15
    second = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    k = cohen_kappa(first, second, labels=["yes", "no"])
    p_o, p_e = 35 / 50, (25 / 50) * (30 / 50) + (25 / 50) * (20 / 50)
    assert k.kappa == pytest.approx((p_o - p_e) / (1 - p_e)) == pytest.approx(0.4)
    assert k.confusion == [[20, 5], [10, 15]] and k.low < 0.4 < k.high
    assert cohen_kappa(["a"] * 9, ["a"] * 9).kappa is None  # one label: no evidence
    one_sided = cohen_kappa(["a"] * 9, ["a"] * 4 + ["b"] * 5)
    assert one_sided.kappa == 0.0 and one_sided.low is None
    perfect = cohen_kappa(["a", "b"] * 10, ["a", "b"] * 10)
    assert perfect.kappa == 1.0 and perfect.high == 1.0
    with pytest.raises(ValueError, match="same items"):
        cohen_kappa(["a"], [])


@pytest.mark.parametrize("n", [50, 100])
@pytest.mark.parametrize(("base_rate", "accuracy"), [(0.5, 0.85), (0.3, 0.9)])
def test_the_interval_covers_the_true_kappa_at_its_level(n, base_rate, accuracy):
    """Two raters who each see the truth with `accuracy`: κ's interval holds ~95% (seeded)."""
    rng = random.Random(n * 7 + int(base_rate * 10))

    def draw(m):
        truth = [rng.random() < base_rate for _ in range(m)]
        seen = [[t if rng.random() < accuracy else not t for t in truth] for _ in range(2)]
        return [["pass" if x else "fail" for x in s] for s in seen]

    true = cohen_kappa(*draw(200_000)).kappa
    hits = trials = 0
    for _ in range(800):
        k = cohen_kappa(*draw(n))
        if k.low is not None:
            trials += 1
            hits += k.low <= true <= k.high
    assert 0.915 <= hits / trials <= 0.975


def _live(ledger: Ledger, sid: str, **scores: float) -> None:
    ledger.write_session(SessionRecord(id=sid, source="live", started_at=1.0, ended_at=2.0,
                                       outcome="completed"), [turn(sid)])  # fmt: skip
    for source, value in scores.items():
        ledger.post_score(sid, ScoreIn(metric="success", value=value, source=source,
                                       explanation=f"{source} on {sid}"))  # fmt: skip


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "l.db") as store:
        yield store


def test_the_judge_is_compared_with_people_on_the_same_calls_scores_and_duels(ledger):
    _live(ledger, "agree-pass", judge=1.0, human=1.0)
    _live(ledger, "agree-fail", judge=0.0, human=0.0)
    _live(ledger, "judge-too-kind", judge=1.0, human=0.0)
    _live(ledger, "judge-only", judge=1.0)
    _live(ledger, "duelled", judge=1.0)
    (duel,) = make_duels(ledger, find_moments(ledger, ["duelled"]), ("short", "long"),
                         LengthSampler(), n=1)  # fmt: skip
    ledger.vote(duel.id, "alice", "both_bad", "neither books")
    report = calibrate(ledger)
    assert (report.judged, report.human_labelled, report.kappa.n) == (5, 4, 4)
    assert report.kappa.confusion == [[1, 2], [0, 1]]  # rows judge, columns people: pass, fail
    assert [(d.session_id, d.human_via, d.human_explanation) for d in report.disagreements] == [
        ("duelled", "duel", "neither books"), ("judge-too-kind", "score", "human on judge-too-kind")
    ]  # fmt: skip


def test_the_cycle_refuses_judge_scored_calls_until_the_judge_agrees_with_people(ledger):
    live = LiveSettings(sources=["human", "judge"], judge={"min_labels": 6, "min_kappa": 0.3})
    for i in range(4):
        _live(ledger, f"c{i}", judge=1.0, human=float(i % 2))
    trust, why = live_trust(ledger, live)
    assert trust.sources == ("human",)
    assert why == ("judge-scored calls refused for training: 4 call(s) labelled by both the "
                   "judge and a person, under min_labels 6 (label more: `pipecat-rl ledger score "
                   "CALL_ID --source human`, or duels)")  # fmt: skip
    for i in range(4, 40):  # a judge that agrees with people on 36 more calls
        _live(ledger, f"c{i}", judge=float(i % 2), human=float(i % 2))
    assert live_trust(ledger, live) == (live.trust(), None)
    strict = JudgeCalibrationSettings(min_labels=6, min_kappa=0.95)
    trust, why = judge_trust(ledger, live.trust(), strict)
    assert trust.sources == ("human",) and "lower bound under min_kappa 0.95" in why
    untrusting = LiveTrust(sources=("human",))
    assert judge_trust(ledger, untrusting, strict) == (untrusting, None)  # nothing to refuse


def test_judge_calibrate_prints_kappa_the_table_and_the_rule(ledger):
    for i in range(8):
        _live(ledger, f"c{i}", judge=1.0, human=1.0 if i == 0 else 0.0)
    result = CliRunner().invoke(app, ["judge", "calibrate", "--labels", "human", "--ledger",
                                      str(ledger.path)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "8 call(s) judged, 8 labelled by people, 8 by both" in result.output
    assert "agreement 12% (1 of 8)" in result.output
    # the judge said pass 8 times: κ is 0 and has no interval
    assert "Cohen's κ 0.000, no interval (one of them used one label only)" in result.output
    assert "disagree c1: judge pass, people fail (by score): human on c1" in result.output
    assert result.output.strip().endswith("under min_labels 50 (label more: `pipecat-rl ledger "
                                          "score CALL_ID --source human`, or duels)")  # fmt: skip
