"""A Pipecat scenario's `success` and `metrics`, scored as Pipecat's own eval runner scores them.

- a measured metric (`measure:`) is computed from the call, no judge involved: `turns` (the
  caller's lines), `duration` (seconds from the first line to the hang-up), `words` (the longest
  agent reply), `latency` (the slowest reply, seconds from the caller's line to the agent's first
  text); each scores 1 inside its `min_value`..`max_value` and 0 outside. `function_calls`
  compares the bot's calls with `calls:` (each a name, or a name with a subset of `args`, in any
  order): every listed call must happen and no unlisted one; a cancelled call did not happen;
- a judged metric (`criterion:`) scores the share of agent turns the judge said met it, and
  fails below its `min_score`; one without `min_score` is reported and never fails; one the
  judge could not score (no judge, no answer in time) is unscored, with the reason, and never
  fails;
- the run passes only when the judge says the goal (`success`) was achieved and no metric fell
  short; a run that `max_turns`, `max_duration_s` or `max_silence_s` ended has not succeeded
  (its metrics are still scored, for what they say about the turns it had).

Every metric becomes its own reward part and ledger score: `judge:<name>` for a judged one,
`metric:<name>` for a measured one, and the run's verdict is `judge:success` (1 or 0).
"""

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pipecat.evals.simulation_judge import EvalSimulationJudgement

from pipecat_rl.scenarios.scenario import Metric, Scenario
from pipecat_rl.scoring.outcome import JUDGED_SUCCESS
from pipecat_rl.simulator.judge import ToolCallSeen
from pipecat_rl.simulator.transport import EndReason, Line

SUCCESS_PART = JUDGED_SUCCESS
BACKSTOPS = ("max_turns", "max_duration", "silence")
"""End reasons of a run a limit ended: Pipecat never counts such a run as a success."""


@dataclass(frozen=True)
class MetricOutcome:
    """One metric of one run: its score (None when there was nothing to score) and verdict."""

    name: str
    part: str
    score: float | None
    passed: bool
    reason: str
    value: float | None = None
    min_score: float | None = None


def _call_matches(spec: str | dict[str, Any], call: ToolCallSeen) -> bool:
    name, args = (spec, None) if isinstance(spec, str) else (spec.get("name"), spec.get("args"))
    if call.name != name:
        return False
    return all(call.arguments.get(k) == v for k, v in (args or {}).items())


def _calls_outcome(metric: Metric, calls: Sequence[ToolCallSeen]) -> MetricOutcome:
    made = [c for c in calls if not c.cancelled]
    expected = metric.calls or []
    missing = [s for s in expected if not any(_call_matches(s, c) for c in made)]
    unlisted = [c for c in made if not any(_call_matches(s, c) for s in expected)]
    passed = not missing and not unlisted
    described = ", ".join(c.name for c in made) or "no calls"
    wanted = ", ".join(s if isinstance(s, str) else str(s.get("name")) for s in expected)
    return MetricOutcome(
        name=metric.key,
        part=f"metric:{metric.key}",
        score=1.0 if passed else 0.0,
        passed=passed,
        reason=f"{described}, expected {wanted or 'none'}",
        value=float(len(made)),
    )


def _measurement(
    measure: str, transcript: Sequence[Line], ended_at: float | None
) -> tuple[float | None, str]:
    agent = [line for line in transcript if line.speaker == "agent"]
    if measure == "turns":
        turns = sum(1 for line in transcript if line.speaker == "caller")
        return float(turns), f"{turns} caller turn(s)"
    if measure == "duration":
        if not transcript:
            return None, "no conversation"
        end = ended_at if ended_at is not None else transcript[-1].at
        seconds = max(0.0, end - transcript[0].at)
        return seconds, f"{seconds:.1f} s"
    if measure == "words":
        longest = max((len(line.text.split()) for line in agent), default=None)
        return (None, "no reply to measure") if longest is None else (
            float(longest), f"longest reply {longest} words"
        )  # fmt: skip
    if measure == "latency":
        timed = [line.latency_ms / 1000.0 for line in agent if line.latency_ms is not None]
        slowest = max(timed, default=None)
        return (None, "no reply to time") if slowest is None else (
            round(slowest, 3), f"slowest reply {slowest:.2f} s to the first text"
        )  # fmt: skip
    raise ValueError(f"unknown measure {measure!r}")


def measure(
    metric: Metric,
    transcript: Sequence[Line],
    calls: Sequence[ToolCallSeen],
    ended_at: float | None = None,
) -> MetricOutcome:
    """A measured metric's outcome: its value against its range, or the calls against `calls`."""
    if metric.measure == "function_calls":
        return _calls_outcome(metric, calls)
    value, described = _measurement(str(metric.measure), transcript, ended_at)
    low, high = metric.min_value, metric.max_value
    bound = " and ".join(
        b for b in (f"at least {low:g}" if low is not None else "",
                    f"at most {high:g}" if high is not None else "") if b
    )  # fmt: skip
    if value is None:
        score, passed = None, True
    else:
        passed = (low is None or value >= low) and (high is None or value <= high)
        score = 1.0 if passed else 0.0
    return MetricOutcome(
        name=metric.key,
        part=f"metric:{metric.key}",
        score=score,
        passed=passed,
        reason=f"{described}, {bound}",
        value=value,
    )


def judged(judgement: EvalSimulationJudgement) -> list[MetricOutcome]:
    """The criterion metrics' outcomes from Pipecat's judgement."""
    return [
        MetricOutcome(
            name=m.name,
            part=f"judge:{m.name}",
            score=m.score,
            passed=m.passed,
            reason=m.reason,
            min_score=m.min_score,
        )
        for m in judgement.metrics
    ]


@dataclass(frozen=True)
class ScenarioScore:
    """A run's Pipecat verdict and metric outcomes, ready for reward parts and ledger scores."""

    outcomes: list[MetricOutcome]
    goal: str | None
    """The judge's verdict on `success`: yes, no, none (no usable answer), or None (not asked)."""
    goal_reason: str = ""
    ended_by: EndReason | None = None

    @property
    def success(self) -> float | None:
        """1.0 when Pipecat would pass the run, 0.0 when not, None when nobody judged it."""
        if self.ended_by in BACKSTOPS:
            return 0.0
        if self.goal not in ("yes", "no"):
            return None
        return 1.0 if self.goal == "yes" and all(o.passed for o in self.outcomes) else 0.0

    def parts(self) -> dict[str, float]:
        """`judge:success` and every scored metric, each its own part."""
        parts = {o.part: o.score for o in self.outcomes if o.score is not None}
        if self.success is not None:
            parts = {SUCCESS_PART: self.success, **parts}
        return parts

    def details(self) -> dict[str, dict[str, Any]]:
        """What each part's ledger score carries beside its value."""
        out: dict[str, dict[str, Any]] = {o.part: asdict(o) for o in self.outcomes}
        failed = [o.name for o in self.outcomes if not o.passed]
        out[SUCCESS_PART] = {
            "goal": self.goal,
            "reason": self.goal_reason,
            "ended_by": self.ended_by if self.ended_by in BACKSTOPS else None,
            "failed_metrics": failed,
            "unscored": [o.name for o in self.outcomes if o.score is None],
        }
        return out


def score_scenario(
    scenario: Scenario,
    transcript: Sequence[Line],
    calls: Sequence[ToolCallSeen],
    *,
    judgement: EvalSimulationJudgement | None,
    end_reason: EndReason | None,
    ended_at: float | None = None,
    unjudged: str = "no judge was asked",
) -> ScenarioScore:
    """Every metric of `scenario` for one run, in the file's order, and the run's verdict.

    Without a judgement (`unjudged` says why) every judged metric is still listed, unscored.
    """
    measured = {
        m.key: measure(m, transcript, calls, ended_at)
        for m in scenario.metrics
        if m.measure is not None
    }
    by_judge = {o.name: o for o in judged(judgement)} if judgement is not None else {}
    outcomes = [
        measured.get(m.key) or by_judge.get(m.key) or _unscored(m, unjudged)
        for m in scenario.metrics
        if m.measure is not None or m.criterion is not None
    ]
    goal = judgement.goal.verdict if judgement is not None else None
    reason = judgement.goal.reason if judgement is not None else unjudged
    return ScenarioScore(outcomes=outcomes, goal=goal, goal_reason=reason, ended_by=end_reason)


def _unscored(metric: Metric, why: str) -> MetricOutcome:
    return MetricOutcome(
        name=metric.key, part=f"judge:{metric.key}", score=None, passed=True,
        reason=f"unscored: {why}", min_score=metric.min_score,
    )  # fmt: skip
