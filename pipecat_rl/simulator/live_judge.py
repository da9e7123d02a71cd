"""The nightly judge: Pipecat's simulation judge over the live calls nobody has scored yet.

A rubric file holds Pipecat-eval-style criteria: one `success` (what counts as the bot having
done its job, judged over the whole call) and named `metrics`, each a `criterion` decided per
agent turn, with an optional `min_score`, exactly as in a Pipecat simulated scenario:

```yaml
success: The receptionist booked what the caller asked for and read back its confirmation.
metrics:
  - name: polite
    criterion: The reply is polite and does not blame the caller.
    min_score: 0.8
```

Each call is rebuilt from its turns (`ledger.transcript.conversation`) and judged by
`simulator.judge.judge_call`, the judge `simulate` uses, and its verdict by Pipecat's own rule
(`pipecat_metrics.score_scenario`: the goal met and no metric short of its `min_score`). Every
metric it scores and then `success` are posted through `Ledger.post_score` with source `judge`:
the one way a score gets in. A question the judge could not answer writes nothing for it, so
the call stays unscored and is judged again next night.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import Ledger, ScoreIn, SessionRecord, TurnRecord
from pipecat_rl.ledger.scores import METRIC_NAME
from pipecat_rl.ledger.transcript import conversation
from pipecat_rl.scenarios import Scenario
from pipecat_rl.scenarios.scenario import Metric
from pipecat_rl.scenarios.yaml_safe import load_yaml
from pipecat_rl.scoring.outcome import JUDGE_SOURCE, SUCCESS_METRIC
from pipecat_rl.simulator.judge import Endpoint, ToolCallSeen, judge_call
from pipecat_rl.simulator.pipecat_metrics import ScenarioScore, score_scenario
from pipecat_rl.simulator.transport import Line

DEFAULT_MAX_CALLS = 200
"""Most calls one run judges (each costs a judge question per criterion per agent turn)."""


class JudgeRubric(BaseModel):
    """What the judge decides about each call: `success` and the named judged metrics."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    success: str = Field(min_length=1)
    metrics: list[Metric] = Field(default_factory=list)

    @field_validator("metrics")
    @classmethod
    def _judged(cls, metrics: list[Metric]) -> list[Metric]:
        names = [m.key for m in metrics]
        for m in metrics:
            if m.measure is not None:
                raise ValueError(
                    f"metric {m.key!r} is measured ({m.measure}); a live call is judged from its "
                    "transcript alone: give it a `criterion`"
                )
            if not METRIC_NAME.match(m.key) or m.key == SUCCESS_METRIC:
                raise ValueError(
                    f"metric name {m.key!r} cannot be a score's name (letters, digits, spaces, "
                    f"'.', '_' or '-', and not {SUCCESS_METRIC!r})"
                )
        doubled = sorted({n for n in names if names.count(n) > 1})
        if doubled:
            raise ValueError(f"metric name(s) {', '.join(doubled)} appear more than once")
        return metrics

    def scenario(self) -> Scenario:
        """The criteria as a scenario the judge reads (a live call has no persona or goal)."""
        return Scenario(
            name="live-call", persona="A caller of the live bot.",
            goal="Whatever the caller asked for.", success=self.success, metrics=self.metrics,
        )  # fmt: skip


def load_judge_rubric(path: Path) -> JudgeRubric:
    """The judge's criteria from a YAML (or JSON) file.

    Raises:
        ConfigError: the file cannot be read or holds no valid criteria (naming the field).
    """
    data, _ = load_yaml(path)
    try:
        return JudgeRubric.model_validate(data if data is not None else {})
    except ValidationError as e:
        where = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'rubric'}: {err['msg']}"
            for err in e.errors()
        )
        raise ConfigError(f"judge rubric {path}: {where}") from e


def call_transcript(turns: Sequence[TurnRecord]) -> tuple[list[Line], list[ToolCallSeen]]:
    """A live call's lines and tool calls, in order, as the simulator's judge takes them."""
    lines: list[Line] = []
    calls: list[ToolCallSeen] = []
    for at, message in enumerate(conversation(turns)):
        if message["role"] == "tool_call":
            calls.append(ToolCallSeen(message["name"], message["arguments"], float(at)))
        else:
            speaker = "caller" if message["role"] == "user" else "agent"
            text = message["content"]
            lines.append(Line(speaker=speaker, text=text, heard=text, at=float(at)))
    return lines, calls


@dataclass(frozen=True)
class CallJudged:
    """One call's judgement, as posted."""

    session_id: str
    success: float | None
    """1 passed, 0 failed, None when the judge gave no verdict (nothing posted for it)."""
    metrics: dict[str, float] = field(default_factory=dict)
    explanation: str = ""
    error: str | None = None
    """Why the call could not be judged (no conversation, the judge failed)."""


@dataclass(frozen=True)
class JudgeReport:
    """What one run of the judge did."""

    calls: list[CallJudged]
    remaining: int
    """Unscored calls left beyond `max_calls` (judged on a later run)."""

    @property
    def passed(self) -> int:
        """Calls judged a success."""
        return sum(c.success == 1.0 for c in self.calls)

    @property
    def failed(self) -> int:
        """Calls judged a failure."""
        return sum(c.success == 0.0 for c in self.calls)

    @property
    def unjudged(self) -> int:
        """Calls the judge gave no verdict on (they stay unscored)."""
        return sum(c.success is None for c in self.calls)


def _explanation(verdict: ScenarioScore) -> str:
    """Why the call passed or failed: the goal's verdict, then every metric short of full marks."""
    parts = [f"goal {verdict.goal}: {verdict.goal_reason.strip() or 'no reason given'}"]
    for o in verdict.outcomes:
        if o.score is not None and o.score < 1:
            short = "" if o.passed else f", below its minimum {o.min_score:g}"
            parts.append(f"{o.name} {o.score:.2f}{short}: {o.reason}")
    return "; ".join(parts)


async def judge_session(
    ledger: Ledger, session: SessionRecord, rubric: JudgeRubric, endpoint: Endpoint
) -> CallJudged:
    """Judge one live call and post its scores (metrics first, then `success`)."""
    lines, calls = call_transcript(ledger.turns(session.id))
    if not any(line.speaker == "caller" for line in lines):
        return CallJudged(session.id, None, explanation="nothing to judge: no caller line")
    scenario = rubric.scenario()
    try:
        judgement = await judge_call(scenario, lines, calls, endpoint)
    except Exception as e:  # a judge that fails leaves the call unscored, never guessed
        return CallJudged(session.id, None, error=f"{type(e).__name__}: {e}")
    verdict = score_scenario(scenario, lines, calls, judgement=judgement, end_reason=None)
    metrics = {o.name: o.score for o in verdict.outcomes if o.score is not None}
    for o in verdict.outcomes:
        if o.score is not None:
            ledger.post_score(session.id, ScoreIn(
                metric=o.name, value=o.score, explanation=o.reason, source=JUDGE_SOURCE,
            ))  # fmt: skip
    explanation = _explanation(verdict)
    if verdict.success is not None:
        ledger.post_score(session.id, ScoreIn(
            metric=SUCCESS_METRIC, value=verdict.success, explanation=explanation,
            source=JUDGE_SOURCE,
        ))  # fmt: skip
    return CallJudged(session.id, verdict.success, metrics, explanation)


async def judge_live(
    ledger: Ledger,
    rubric: JudgeRubric,
    endpoint: Endpoint,
    *,
    since: float | None = None,
    max_calls: int = DEFAULT_MAX_CALLS,
    on_call: Callable[[CallJudged], None] | None = None,
) -> JudgeReport:
    """Judge the live calls nobody has scored yet, oldest first, at most `max_calls` of them.

    The calls are those `Ledger.unscored_live_sessions` gives: ended, started since `since`.
    """
    todo = ledger.unscored_live_sessions(since=since)
    judged: list[CallJudged] = []
    for session in todo[:max_calls]:
        result = await judge_session(ledger, session, rubric, endpoint)
        if result.error:
            logger.warning(f"judge: call {session.id} not judged: {result.error}")
        judged.append(result)
        if on_call is not None:
            on_call(result)
    return JudgeReport(judged, remaining=max(0, len(todo) - max_calls))
