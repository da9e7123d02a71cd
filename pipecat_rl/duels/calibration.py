"""Judge calibration: the LLM judge's verdicts against people's, on the same calls.

A person's label of a call is their `success` score (source `human`, through the score API or
`pipecat-rl ledger score`), else a `both_bad` vote on a duel at one of its moments (a person
saw both policies' next reply there fail: a fail). The judge's is its `success` score (source
`judge`). On the calls that have both: agreement, Cohen's κ with its interval, the confusion
table, and the calls where they disagree. `judge_trust` turns that into the rule the cycle's
`live:` applies: judge-decided calls train only once κ's lower bound on enough labelled calls
clears the threshold.
"""

from pydantic import BaseModel, ConfigDict, Field

from pipecat_rl.duels.kappa import Kappa, cohen_kappa
from pipecat_rl.ledger import Ledger, LiveTrust
from pipecat_rl.scoring.outcome import HUMAN_SOURCE, JUDGE_SOURCE, SUCCESS_METRIC, score_passed

LABELS = ("pass", "fail")


class JudgeCalibrationSettings(BaseModel):
    """When the judge's verdicts may train: its κ with people, on enough of the same calls."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_labels: int = Field(default=50, ge=2)
    """Calls both the judge and a person labelled, at the least (below 50 the interval's lower
    bound is too high 6-7% of the time, not 2.5%: see `kappa`)."""
    min_kappa: float = Field(default=0.4, ge=-1, le=1)
    """The lower bound of κ's interval must reach this (0.4: "moderate" agreement)."""
    confidence: float = Field(default=0.95, gt=0, lt=1)


class Disagreement(BaseModel):
    """A call the judge and a person labelled differently."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    judge: str
    human: str
    human_via: str
    """`score` (a person's success score) or `duel` (a `both_bad` vote on one of its moments)."""
    judge_explanation: str | None = None
    human_explanation: str | None = None


class Calibration(BaseModel):
    """The judge against people on the calls both labelled."""

    model_config = ConfigDict(frozen=True)

    judged: int
    """Calls the judge labelled."""
    human_labelled: int
    """Calls a person labelled (by score or by duel)."""
    kappa: Kappa
    """Over the calls both labelled (`kappa.n` of them)."""
    disagreements: list[Disagreement]


def _label(value: float) -> str:
    return "pass" if score_passed(value) else "fail"


def calibrate(ledger: Ledger, *, confidence: float = 0.95) -> Calibration:
    """Compare the judge's `success` verdicts with people's labels on the same calls."""
    judge: dict[str, tuple[str, str | None]] = {}
    human: dict[str, tuple[str, str, str | None]] = {}
    for session in ledger.sessions():
        for s in ledger.scores(session.id):
            if s.name != SUCCESS_METRIC:
                continue
            if s.source == JUDGE_SOURCE:
                judge[session.id] = (_label(s.value), s.explanation)
            elif s.source == HUMAN_SOURCE:
                human[session.id] = (_label(s.value), "score", s.explanation)
    sessions = {d.id: d.session_id for d in ledger.duels()}
    for vote in ledger.votes():
        sid = sessions[vote.duel_id]
        if vote.choice == "both_bad" and sid not in human:
            human[sid] = ("fail", "duel", vote.note)
    both = sorted(set(judge) & set(human))
    kappa = cohen_kappa(
        [judge[s][0] for s in both], [human[s][0] for s in both], confidence=confidence,
        labels=LABELS,
    )  # fmt: skip
    disagreements = [
        Disagreement(
            session_id=s, judge=judge[s][0], human=human[s][0], human_via=human[s][1],
            judge_explanation=judge[s][1], human_explanation=human[s][2],
        )
        for s in both
        if judge[s][0] != human[s][0]
    ]  # fmt: skip
    return Calibration(
        judged=len(judge), human_labelled=len(human), kappa=kappa, disagreements=disagreements
    )


def refusal(calibration: Calibration, settings: JudgeCalibrationSettings) -> str | None:
    """Why the judge's verdicts may not train (one line), or None when they may."""
    k = calibration.kappa
    if k.n < settings.min_labels:
        return (
            f"judge-scored calls refused for training: {k.n} call(s) labelled by both the judge "
            f"and a person, under min_labels {settings.min_labels} (label more: `pipecat-rl "
            "ledger score CALL_ID --source human`, or duels)"
        )
    if k.low is None or k.low < settings.min_kappa:
        said = kappa_text(k)
        return (
            f"judge-scored calls refused for training: κ with people {said} on {k.n} calls, "
            f"lower bound under min_kappa {settings.min_kappa:g}"
        )
    return None


def kappa_text(k: Kappa) -> str:
    """κ and its interval in words (or why it has none)."""
    if k.kappa is None:
        return "undefined (both used one label only)"
    if k.low is None:
        return f"{k.kappa:.3f}, no interval (one of them used one label only)"
    return f"{k.kappa:.3f}, {k.confidence:.0%} CI [{k.low:.3f}, {k.high:.3f}]"


def judge_trust(
    ledger: Ledger, trust: LiveTrust, settings: JudgeCalibrationSettings
) -> tuple[LiveTrust, str | None]:
    """`trust` less the judge when its calibration does not clear `settings`; and why not.

    A trust that does not name the judge is returned as it is (nothing to refuse).
    """
    if JUDGE_SOURCE not in trust.sources:
        return trust, None
    why = refusal(calibrate(ledger, confidence=settings.confidence), settings)
    if why is None:
        return trust, None
    kept = tuple(s for s in trust.sources if s != JUDGE_SOURCE)
    return trust.model_copy(update={"sources": kept}), why
