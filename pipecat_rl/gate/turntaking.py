"""Turn-taking on the receipt and its checks: time to yield, false interruptions, overlap.

Each paired run may carry its call's `scoring.TurnTaking` record (audio mode measures it; text
mode says why it cannot). The scenario is the unit here as in every other check: barge-ins and
backchannels of one call share its agent, its caller and its audio, so they are not
independent events, and both policies' runs of a scenario stay together.

- Time to yield (per barge-in, a missed one included: how long the agent talked over the
  caller): P50/P95 per arm (the one quantile), the candidate / incumbent P95 with the paired
  bootstrap interval of `latency.compare_ratio` (the text gate's LLM ratios), and the
  candidate's P95 with Woodruff's interval for a budget.
- Rates (false interruptions per backchannel, missed barge-ins per barge-in): events over
  opportunities pooled over an arm's runs (a ratio estimator), with a cluster-robust
  (linearised) standard error over scenarios and Student t with scenarios - 1 degrees of
  freedom; `compare_rates` gives candidate - incumbent, linearised over the same scenarios, so
  what they share cancels. The standard error is never below that of independent events with
  one event and one non-event added to each arm (Agresti and Caffo): an arm with no false
  interruption in 40 backchannels has not shown a rate of 0, and a zero-width interval is no
  evidence.

A configured check the runs cannot measure (text mode; no barge-in or backchannel in two or more
scenarios of both arms) is `unavailable` with the reason: listed on the receipt, never a pass.
"""

from collections.abc import Sequence

import numpy as np

from pipecat_rl.gate.config import TurnTakingConfig
from pipecat_rl.gate.latency import (
    QuantileInterval,
    RatioComparison,
    StageQuantiles,
    compare_ratio,
    stage_quantiles,
    woodruff_interval,
)
from pipecat_rl.gate.stats import Result, t_quantile
from pipecat_rl.gate.verdict import (
    ROLES,
    GateCheck,
    Names,
    limit_status,
    quantile_budget_check,
    ratio_check,
)
from pipecat_rl.gate.wording import interval, rate, sentence
from pipecat_rl.scoring import P95, TurnTaking

Records = Sequence[Sequence[TurnTaking | None]]
"""Per scenario, per paired run of one arm, its call's record (None: not recorded)."""

NO_RECORD = (
    "no run carries a turn-taking record (a scores file without `turn_taking`, or sessions "
    "recorded before the simulator measured it)"
)


class RateInterval(Result):
    """Events per opportunity of one arm, pooled over its runs, with a 95% interval."""

    events: int
    opportunities: int
    estimate: float
    low: float
    high: float
    level: float
    clusters: int
    """Scenarios with at least one opportunity."""


class RateDifference(Result):
    """Candidate - incumbent of one rate, over the scenarios both arms had opportunities in."""

    candidate: RateInterval
    incumbent: RateInterval
    estimate: float
    low: float
    high: float
    level: float
    clusters: int


class TurnTakingArm(Result):
    """One arm's turn-taking over its paired runs."""

    measured_calls: int
    """Runs whose call measured its turn-taking (audio)."""
    barge_ins: int
    time_to_yield: StageQuantiles
    """P50/P95 over every yield of the measured calls, ms."""
    missed_barge_ins: RateInterval | None
    """Per barge-in; None without barge-ins in 2 or more scenarios."""
    backchannels: int
    false_interruptions: RateInterval | None
    """Per backchannel; None without backchannels in 2 or more scenarios."""
    overlap_ratio: float | None
    """Both sides audible, over time anyone was: pooled over the measured calls."""
    awkward_silences: int


class TurnTakingStats(Result):
    """Both arms' turn-taking and the paired comparisons the checks read."""

    unavailable: str | None
    """Why it was not measured under both policies; None when it was."""
    candidate: TurnTakingArm
    incumbent: TurnTakingArm
    time_to_yield_p95: RatioComparison | None
    """Candidate / incumbent P95 time to yield, paired over scenarios."""
    candidate_time_to_yield_p95: QuantileInterval | None
    """The candidate's P95 time to yield with Woodruff's interval (for a budget)."""
    false_interruption_diff: RateDifference | None


def _rate_parts(
    events: Sequence[int], opportunities: Sequence[int]
) -> tuple[np.ndarray, float, float]:
    """Per cluster, its linearised share of the pooled rate's error; the rate; its floor se."""
    e, n = np.asarray(events, dtype=float), np.asarray(opportunities, dtype=float)
    total = n.sum()
    estimate = e.sum() / total
    return (e - estimate * n) / total, estimate, _floor_se(e.sum(), total)


def _floor_se(events: float, opportunities: float) -> float:
    """Independent events' standard error with one event and one non-event added."""
    p = (events + 1) / (opportunities + 2)
    return float(np.sqrt(p * (1 - p) / (opportunities + 2)))


def _robust_se(z: np.ndarray) -> float:
    k = z.size
    return float(np.sqrt(k / (k - 1) * np.sum(z**2)))


def rate_interval(
    events: Sequence[int], opportunities: Sequence[int], *, level: float = 0.95
) -> RateInterval | None:
    """Pooled events / opportunities with its interval over clusters (see the module docstring).

    `events[j]` and `opportunities[j]` are cluster j's counts; clusters without opportunities
    are left out, and with fewer than two left there is no interval (None).
    """
    kept = [(e, n) for e, n in zip(events, opportunities, strict=True) if n > 0]
    if len(kept) < 2:
        return None
    ev, opp = zip(*kept, strict=True)
    z, estimate, floor = _rate_parts(ev, opp)
    half = t_quantile((1 + level) / 2, len(kept) - 1) * max(_robust_se(z), floor)
    return RateInterval(
        events=int(sum(ev)), opportunities=int(sum(opp)), estimate=estimate,
        low=max(0.0, estimate - half), high=min(1.0, estimate + half), level=level,
        clusters=len(kept),
    )  # fmt: skip


def compare_rates(
    candidate: tuple[Sequence[int], Sequence[int]],
    incumbent: tuple[Sequence[int], Sequence[int]],
    *,
    level: float = 0.95,
) -> RateDifference | None:
    """Candidate - incumbent of events / opportunities, paired over scenarios.

    Each arm is (events, opportunities) per scenario, in the same scenario order; scenarios
    where either arm had no opportunity are left out (None with fewer than two left).
    """
    both = [j for j, (a, b) in enumerate(zip(candidate[1], incumbent[1], strict=True)) if a and b]
    if len(both) < 2:
        return None

    def pick(arm: tuple[Sequence[int], Sequence[int]]) -> tuple[list[int], list[int]]:
        return [arm[0][j] for j in both], [arm[1][j] for j in both]

    (ce, cn), (ie, in_) = pick(candidate), pick(incumbent)
    cand, inc = rate_interval(ce, cn, level=level), rate_interval(ie, in_, level=level)
    if cand is None or inc is None:
        return None
    zc, rc, fc = _rate_parts(ce, cn)
    zi, ri, fi = _rate_parts(ie, in_)
    se = max(_robust_se(zc - zi), float(np.hypot(fc, fi)))
    half = t_quantile((1 + level) / 2, len(both) - 1) * se
    return RateDifference(
        candidate=cand, incumbent=inc, estimate=rc - ri,
        low=max(-1.0, rc - ri - half), high=min(1.0, rc - ri + half), level=level,
        clusters=len(both),
    )  # fmt: skip


def _measured(scenario: Sequence[TurnTaking | None]) -> list[TurnTaking]:
    return [t for t in scenario if t is not None and t.measured]


def _counts(records: Records, events: str, opportunities: str) -> tuple[list[int], list[int]]:
    """Per scenario, the measured calls' summed `events` and `opportunities`."""
    per = [_measured(s) for s in records]
    return (
        [sum(getattr(t, events) for t in s) for s in per],
        [sum(getattr(t, opportunities) for t in s) for s in per],
    )


def _yields(records: Records) -> list[list[list[float]]]:
    """Per scenario, per measured call, its times to yield (the latency module's clusters)."""
    return [[t.time_to_yield_ms for t in _measured(s)] for s in records]


def _arm(records: Records) -> TurnTakingArm:
    calls = [t for s in records for t in _measured(s)]
    talk = sum(t.talk_ms for t in calls)
    return TurnTakingArm(
        measured_calls=len(calls),
        barge_ins=sum(t.barge_ins for t in calls),
        time_to_yield=stage_quantiles([v for t in calls for v in t.time_to_yield_ms]),
        missed_barge_ins=rate_interval(*_counts(records, "missed_barge_ins", "barge_ins")),
        backchannels=sum(t.backchannels for t in calls),
        false_interruptions=rate_interval(*_counts(records, "false_interruptions", "backchannels")),
        overlap_ratio=sum(t.overlap_ms for t in calls) / talk if talk > 0 else None,
        awkward_silences=sum(t.awkward_silences for t in calls),
    )


def _unavailable(candidate: Records, incumbent: Records) -> str | None:
    """Why turn-taking was not measured under both policies; None when it was."""
    runs = {role: [t for s in arm for t in s] for role, arm in zip(ROLES, (candidate, incumbent),
                                                                   strict=True)}  # fmt: skip
    if not any(t is not None for arm in runs.values() for t in arm):
        return NO_RECORD
    unmeasured = [role for role, arm in runs.items() if not any(t and t.measured for t in arm)]
    if not unmeasured:
        return None
    said = sorted({t.unavailable for arm in runs.values() for t in arm if t and t.unavailable})
    who = (
        "neither policy's runs measured it" if len(unmeasured) == 2
        else f"{unmeasured[0]}'s runs did not measure it"
    )  # fmt: skip
    return who + (f" ({'; '.join(said)})" if said else "")


def turn_taking_stats(
    candidate: Records, incumbent: Records, *, resamples: int, seed: int
) -> TurnTakingStats:
    """Both arms' turn-taking and the comparisons the checks read, over paired scenarios."""
    ttfy = compare_ratio(
        "time_to_yield_ms", _yields(candidate), _yields(incumbent), q=P95, resamples=resamples,
        seed=seed,
    )  # fmt: skip
    return TurnTakingStats(
        unavailable=_unavailable(candidate, incumbent),
        candidate=_arm(candidate),
        incumbent=_arm(incumbent),
        time_to_yield_p95=ttfy,
        candidate_time_to_yield_p95=woodruff_interval(
            [[v for call in s for v in call] for s in _yields(candidate)], q=P95
        ),
        false_interruption_diff=compare_rates(
            _counts(candidate, "false_interruptions", "backchannels"),
            _counts(incumbent, "false_interruptions", "backchannels"),
        ),
    )


def _why(stats: TurnTakingStats | None, what: str) -> str:
    """Why a turn-taking check has nothing to read, as a clause."""
    if stats is None:
        return f"turn-taking not measured: {NO_RECORD}"
    if stats.unavailable is not None:
        return f"turn-taking not measured: {stats.unavailable}"
    return f"{what} under both policies in fewer than 2 scenarios, so there is nothing to compare"


def _rate_check(
    name: str,
    what: str,
    low: float,
    high: float,
    estimate: float,
    limit: float,
    names: Names,
) -> GateCheck:
    """A rate (or a difference of rates) and its interval against an upper limit."""
    status = limit_status(low, high, limit)
    ci = interval(low, high, rate)
    text = f"The candidate's {what} is {rate(estimate)} ({ci}), against a limit of {rate(limit)}"
    words = {"pass": ": within it.", "fail": ": over it.",
             "uncertain": ": the interval straddles it; more calls with backchannels would "
             "decide."}  # fmt: skip
    headline = {
        "pass": "",
        "fail": f"{names[0]}'s {what} of {rate(estimate)} ({ci}) is over {rate(limit)}",
        "uncertain": f"{names[0]}'s {what} of {rate(estimate)} ({ci}) may be over {rate(limit)}",
    }[status]
    return GateCheck(name=name, status=status, detail=text + words[status], headline=headline)


def turn_taking_checks(
    stats: TurnTakingStats | None, config: TurnTakingConfig, *, names: Names = ROLES
) -> tuple[GateCheck, ...]:
    """One check per configured limit (none when nothing is configured), in a fixed order."""
    checks: list[GateCheck] = []
    yields = "barge-ins"
    if config.time_to_yield_p95_ratio is not None:
        checks.append(ratio_check(
            "time_to_yield_ratio", "time to yield",
            stats.time_to_yield_p95 if stats else None, config.time_to_yield_p95_ratio,
            missing=_why(stats, yields), names=names,
            fix="Listen to the barge-ins of the scenarios it yields slowest in (the receipt's "
            "sessions) before promoting it.",
        ))  # fmt: skip
    if config.time_to_yield_p95_ms is not None:
        candidate = stats.candidate_time_to_yield_p95 if stats else None
        checks.append(
            GateCheck(name="time_to_yield_budget", status="unavailable",
                      detail=sentence(_why(stats, yields)))
            if candidate is None
            else quantile_budget_check(
                "time_to_yield_budget", "time to yield", candidate, config.time_to_yield_p95_ms,
                names=names, unit="barge-ins",
            )
        )  # fmt: skip
    diff = stats.false_interruption_diff if stats else None
    if config.false_interruption_rate_diff is not None:
        checks.append(
            GateCheck(name="false_interruption_diff", status="unavailable",
                      detail=sentence(_why(stats, "backchannels")))
            if diff is None
            else _rate_check(
                "false_interruption_diff",
                "false-interruption rate minus the incumbent's (per backchannel, paired over "
                f"{diff.clusters} scenarios)",
                diff.low, diff.high, diff.estimate, config.false_interruption_rate_diff, names,
            )
        )  # fmt: skip
    if config.false_interruption_rate is not None:
        own = stats.candidate.false_interruptions if stats else None
        checks.append(
            GateCheck(name="false_interruption_rate", status="unavailable",
                      detail=sentence(_why(stats, "backchannels")))
            if own is None
            else _rate_check(
                "false_interruption_rate",
                f"false-interruption rate ({own.events} of {own.opportunities} backchannels in "
                f"{own.clusters} scenarios)",
                own.low, own.high, own.estimate, config.false_interruption_rate, names,
            )
        )  # fmt: skip
    return tuple(checks)
