"""From statistics to PROMOTE / REJECT / INCONCLUSIVE: one check per rule, then one decision.

Each check is `pass`, `fail`, `uncertain` (the data cannot tell yet) or `unavailable` (nothing to
check, and the configuration does not require it). The decision is the worst status: REJECT if
any check fails, INCONCLUSIVE if any is uncertain, PROMOTE otherwise (`decision_codes`, which the
operating-characteristics simulation applies to thousands of trials at once).

- `paired_reward`: the t interval of the mean paired delta. Pass when its lower bound clears
  `min_delta`; fail only when its upper bound is below min(0, `min_delta`): the candidate is surely
  worse than the incumbent (or than a non-inferiority margin). An interval wholly in
  [0, min_delta) says "not shown better, not shown worse": uncertain. An interval of zero width
  (every scenario the same delta) is no evidence of spread: it never fails, and passes only when
  the exact sign-flip test of the deltas against `min_delta` clears it (p = 2^-n <= 0.025: six or
  more scenarios, all above `min_delta`).
- `regressions`: more units confirmed worse than `max_regressions` by the exact discordant-pair
  tests (`gate.regressions`, Holm over the family) fail; nothing is merely "suspected".
- `p95_budget`, `p95_vs_incumbent`: the voice-to-voice (audio: heard-gap) P95 against the budget
  and against the incumbent's plus the margin: pass when the interval is inside the limit, fail
  when it is wholly outside, uncertain in between (or when the data cannot bound it).
- `llm_ttft_ratio`, `llm_turn_ratio`: candidate / incumbent of the LLM TTFT P50 and the LLM time
  per turn P50 against `max_llm_latency_ratio`, the same way; required in text mode.
- `caller_gap_budget` (when `caller_gap_p95_budget_ms` is set): the candidate's P95 wait from
  the caller's line to the agent's first words, tool rounds included, against the budget.
- `time_to_yield_ratio`, `time_to_yield_budget`, `false_interruption_diff`,
  `false_interruption_rate` (each when set under `turn_taking`; `gate.turntaking`): unavailable,
  with the reason, when the runs did not measure turn-taking.
- `unauthorized_writes`: any by the candidate fails.
- `unusable_runs`: an arm with more than `max_unusable_share` of its runs lost to harness errors
  or missing verdicts is uncertain: those runs might have gone either way.
- `training_guard`: a failed, or required and missing, guard fails.

What a person reads: the verdict's `reason` is one sentence to act on (`decide`: the decision,
then the few words each deciding check gives as its `headline`, and for an open paired interval
the sample that would decide), and `reasons` holds one entry per check, its title in words and
its `detail` in complete sentences, numbers formatted by `gate.wording` (one format per quantity).
"""

from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import Field

from pipecat_rl.gate.latency import LLM_MEASURES, QuantileInterval, RatioComparison
from pipecat_rl.gate.lineage import Lineage
from pipecat_rl.gate.regressions import RegressionTest
from pipecat_rl.gate.safety import SafetyArm, writes_words
from pipecat_rl.gate.stats import Interval, MeanInterval, Result, SampleSize, SignFlip
from pipecat_rl.gate.wording import (
    CHECK_SHORT,
    CHECK_TITLES,
    STATUS_WORDS,
    count,
    delta,
    interval,
    join_and,
    ms,
    p_value,
    rate,
    ratio,
    sentence,
)

Decision = Literal["PROMOTE", "REJECT", "INCONCLUSIVE"]
CheckStatus = Literal["pass", "fail", "uncertain", "unavailable"]

EXIT_CODES: dict[str, int] = {"PROMOTE": 0, "REJECT": 1, "INCONCLUSIVE": 2}
"""The process exit code of each decision: `cli.common`'s EXIT_OK, EXIT_NO and EXIT_INCONCLUSIVE
(the gate cannot import the CLI, which imports it; a test pins that they agree)."""

STATUS_CODES: dict[str, int] = {"pass": 0, "unavailable": 0, "uncertain": 1, "fail": 2}
"""Statuses ordered by how much they hold a promotion back."""

_STATUSES: tuple[CheckStatus, ...] = ("pass", "uncertain", "fail")
_DECISIONS: tuple[Decision, ...] = ("PROMOTE", "INCONCLUSIVE", "REJECT")

SIGN_FLIP_ALPHA = 0.025
"""The one-sided level of the sign-flip test that stands in for a zero-width 95% interval."""


Names = tuple[str, str]
"""The candidate's and the incumbent's names, as the verdict sentence says them."""

ROLES: Names = ("the candidate", "the incumbent")

REASON_CHARS = 280
"""The verdict sentence names deciding checks up to about this length, then counts the rest."""


class GateCheck(Result):
    """One rule's outcome, with the numbers that decided it."""

    name: str
    status: CheckStatus
    detail: str
    """Complete sentences: the figures, the limit, and what the status means."""
    headline: str = Field("", exclude=True, repr=False)
    """A few words for the verdict sentence (`decide`): a clause when the check fails or cannot
    tell, a noun phrase listed after "with" when it passes (empty: not worth a word). Not written
    to the receipt, whose `reason` holds the sentence; empty in a loaded receipt."""


class Verdict(Result):
    """The decision, the sentence that explains it, and every check behind it."""

    decision: Decision
    reason: str
    """One sentence a person can act on, led by the decision."""
    reasons: tuple[str, ...]
    """One entry per check: its title in words, its status and its detail."""
    checks: tuple[GateCheck, ...]

    @property
    def exit_code(self) -> int:
        """0 for PROMOTE, 1 for REJECT, 2 for INCONCLUSIVE."""
        return EXIT_CODES[self.decision]


def decision_codes(codes: np.ndarray) -> np.ndarray:
    """The decision (0 PROMOTE, 1 INCONCLUSIVE, 2 REJECT) of each row of status codes."""
    return np.asarray(codes).max(axis=-1)


def zero_width_p(n: np.ndarray) -> np.ndarray:
    """The exact sign-flip p-value of n equal deltas above `min_delta`: 2^-n.

    Only the identity flip (of 2^n) leaves every shifted delta positive.
    """
    return 2.0 ** -np.asarray(n, dtype=float)


def paired_codes(
    low: np.ndarray,
    high: np.ndarray,
    zero_width: np.ndarray,
    n: int,
    min_delta: float,
) -> np.ndarray:
    """The paired check's status code per trial (vectorised; `paired_check` is one row)."""
    clears = low > min_delta
    passes = np.where(zero_width, clears & (zero_width_p(n) <= SIGN_FLIP_ALPHA), clears)
    fails = ~zero_width & (high < min(0.0, min_delta))
    return np.where(passes, 0, np.where(fails, 2, 1))


def _passing(names: Names, pass_rates: tuple[float, float] | None, estimate: float) -> str:
    """How a passing paired check leads the PROMOTE sentence."""
    cand, inc = names
    if pass_rates is None:
        return f"{cand} scores {delta(estimate)} against {inc}"
    return (
        f"{cand} passes {rate(pass_rates[0])} of held-out calls against {inc}'s "
        f"{rate(pass_rates[1])}"
    )


def paired_check(
    interval_: MeanInterval | None,
    flip: SignFlip,
    zero_width: bool,
    n_scenarios: int,
    min_delta: float,
    *,
    names: Names = ROLES,
    pass_rates: tuple[float, float] | None = None,
) -> GateCheck:
    """The mean paired delta's t interval (and the sign-flip test) against `min_delta`.

    `pass_rates` (each policy's pass^1) and `names` only word the verdict sentence.
    """
    name = "paired_reward"
    cand, inc = names
    need = f"the required {delta(min_delta)}"
    if interval_ is None:
        return GateCheck(
            name=name, status="uncertain",
            detail=f"{count(n_scenarios, 'paired scenario')}: an interval over scenarios needs "
            "at least 2.",
            headline=f"only {count(n_scenarios, 'scenario')} paired (an interval needs at least "
            "2)",
        )  # fmt: skip
    est, low, high, n = interval_.estimate, interval_.low, interval_.high, interval_.n
    code = int(paired_codes(
        np.array(low), np.array(high), np.array(zero_width), n, min_delta,
    ))  # fmt: skip
    status = _STATUSES[code]
    ci = interval(low, high)
    lead = _passing(names, pass_rates, est)
    if zero_width:
        text = (
            f"Every one of the {n} scenarios has delta {delta(est)}: the interval has no width, "
            "so it is no evidence on its own."
        )
        flip_p = p_value(float(zero_width_p(n)))
        if status == "pass":
            return GateCheck(
                name=name, status=status,
                detail=f"{text} The exact sign-flip test of those deltas against {need} gives "
                f"p = 2^-{n} = {flip_p}, which clears it.",
                headline=f"{lead} ({delta(est)} in every one of {n} scenarios, sign-flip "
                f"p = {flip_p})",
            )  # fmt: skip
        why = (
            f"{n} equal deltas reach sign-flip p = 2^-{n} at best, above {SIGN_FLIP_ALPHA:g}"
            if est > min_delta
            else f"they do not exceed {need}"
        )
        return GateCheck(
            name=name, status=status,
            detail=f"{text} {sentence(why)} Runs that differ (more repeats, or scenarios the "
            "policies do not both always pass or fail) would decide.",
            headline=f"every one of the {n} scenarios has the same delta {delta(est)} (no "
            "evidence until runs differ: more repeats or other scenarios)",
        )  # fmt: skip
    text = (
        f"Mean paired delta {delta(est)} ({ci}, Student t over {n} scenarios; sign-flip p = "
        f"{p_value(flip.p_two_sided)})."
    )
    if status == "pass":
        return GateCheck(
            name=name, status=status, detail=f"{text} Its lower bound clears {need}.",
            headline=f"{lead} ({delta(est)}, {ci})",
        )  # fmt: skip
    if status == "fail":
        limit = "the incumbent" if min_delta >= 0 else f"the margin {delta(min_delta)}"
        return GateCheck(
            name=name, status=status,
            detail=f"{text} Its upper bound is below {delta(min(0.0, min_delta))}, so the "
            f"candidate is surely worse than {limit}.",
            headline=f"{cand} scores surely below "
            + (inc if min_delta >= 0 else f"{inc} minus the {delta(min_delta)} margin")
            + f" ({delta(est)}, {ci})",
        )  # fmt: skip
    if high < min_delta:
        return GateCheck(
            name=name, status=status,
            detail=f"{text} The candidate is at best {delta(high)} better, below {need}, and "
            f"not shown worse; more runs will not make it clear {delta(min_delta)} unless its "
            "gain is real.",
            headline=f"{cand}'s gain of {delta(est)} ({ci}) falls short of {need} without being "
            "shown worse",
        )  # fmt: skip
    could = "could be zero" if min_delta == 0 else f"could be below {need}"
    return GateCheck(
        name=name, status=status, detail=f"{text} The interval contains {need}.",
        headline=f"the score difference {delta(est)} ({ci}) {could}",
    )  # fmt: skip


def smallest_losses(tests: list[RegressionTest]) -> str:
    """Per kind of tested unit, the fewest runs lost (none won) that would confirm a loss."""
    parts = []
    for kind in dict.fromkeys(t.kind for t in tests):
        of_kind = sorted(
            (t for t in tests if t.kind == kind and t.fewest_losses),
            key=lambda t: (t.fewest_losses or 0) / t.pairs,
        )
        if not of_kind:
            continue
        best, worst = of_kind[0], of_kind[-1]

        def loss(t: RegressionTest) -> str:
            return f"{t.fewest_losses} of its {t.pairs} runs"

        if kind == "pooled":
            parts.append(f"pooled {loss(best)}")
        elif loss(best) == loss(worst):
            parts.append(f"each {kind[:-1]} {loss(best)}")
        else:
            parts.append(f"{best.unit} {loss(best)} to {worst.unit} {loss(worst)}")
    return "; ".join(parts)


def _some(units: Sequence[str], shown: int) -> str:
    """The first `shown` of `units`, and how many more."""
    more = len(units) - shown
    return join_and([*units[:shown], *([f"{more} more"] if more > 0 else [])])


def _regressed(candidate: str, confirmed: list[RegressionTest], cap: int) -> str:
    """The verdict sentence's words for more confirmed regressions than the cap allows."""
    if len(confirmed) == 1 and confirmed[0].kind == "pooled":
        return f"{candidate} is confirmed worse over {confirmed[0].unit} (pooled test, cap {cap})"
    units = [t.unit for t in confirmed]
    return (
        f"{candidate} is confirmed worse on {count(len(units), 'unit')} (cap {cap}: "
        f"{_some(units, 3)})"
    )


def regressions_check(
    tests: list[RegressionTest], alpha: float, max_regressions: int, *, names: Names = ROLES
) -> GateCheck:
    """Units confirmed worse by the exact discordant-pair tests, against the cap."""
    name = "regressions"
    if not tests:
        return GateCheck(
            name=name, status="unavailable", detail="No regression test is configured."
        )
    tested = [t for t in tests if t.tested]
    untested = [t.unit for t in tests if not t.tested]
    skipped = (
        f" Untested, with too few runs to confirm even a total loss: {_some(untested, 5)}."
        if untested
        else ""
    )
    if not tested:
        most = max(tests, key=lambda t: t.pairs)
        return GateCheck(
            name=name, status="unavailable",
            detail=f"No regression test can fire: {most.unit} has the most runs ({most.pairs}), "
            f"and losing all of them would not confirm a loss at family-wise error {alpha:g}. "
            f"Run more repeats.{skipped}",
        )  # fmt: skip
    confirmed = [t for t in tested if t.confirmed]
    family = f"Holm over {count(len(tested), 'exact test')}, family-wise error at most {alpha:g}"
    smallest = f"The smallest loss it could confirm, with none won: {smallest_losses(tested)}."
    if confirmed:
        named = "; ".join(
            f"{t.unit} ({t.kind}) lost {t.worse} and won {t.better} of its {t.pairs} runs "
            f"(p = {p_value(t.p_value)}, adjusted {p_value(t.adjusted_p or 0.0)})"
            for t in confirmed[:5]
        ) + (f"; and {len(confirmed) - 5} more" if len(confirmed) > 5 else "")
        status: CheckStatus = "fail" if len(confirmed) > max_regressions else "pass"
        units = [t.unit for t in confirmed]
        return GateCheck(
            name=name, status=status,
            detail=f"{count(len(confirmed), 'unit')} confirmed worse, cap {max_regressions}: "
            f"{named}. {family}. {smallest}{skipped}",
            headline=_regressed(names[0], confirmed, max_regressions) if status == "fail"
            else f"{count(len(units), 'confirmed regression')} (cap {max_regressions})",
        )  # fmt: skip
    worst = min(tested, key=lambda t: t.p_value)
    return GateCheck(
        name=name, status="pass",
        detail=f"No unit confirmed worse ({family}; closest: {worst.unit}, lost {worst.worse} and "
        f"won {worst.better} of its {worst.pairs} runs, p = {p_value(worst.p_value)}). "
        f"{smallest}{skipped}",
        headline="no confirmed regression",
    )  # fmt: skip


def regression_suite_check(
    tests: list[RegressionTest],
    alpha: float,
    scenarios: int,
    shares: dict[str, tuple[int, int, int]],
    max_share: float,
    *,
    names: Names = ROLES,
) -> GateCheck:
    """No regression on the fixed regression suite (`regressions.suite_tests`, one pooled test).

    The suite is configured on purpose, so a suite that tested nothing never passes: runs lost
    beyond `max_share` (a fork that no longer replays: a harness error) or too few paired runs
    to confirm a loss leave it uncertain, and a confirmed loss fails.

    Args:
        tests: the suite's test (none when nothing paired).
        alpha: the level it is confirmed at (`regression_alpha`).
        scenarios: the suite's scenarios.
        shares: per role, (harness errors, unverified, runs read in all), as `unusable_check`.
        max_share: the most of an arm's suite runs that may be lost.
        names: the candidate's and the incumbent's names, for the verdict sentence.
    """
    name = "regression_suite"
    where = f"On the regression suite ({count(scenarios, 'scenario')})"
    lost = [
        f"the {role} lost {errors + unverified} of {total} runs"
        for role, (errors, unverified, total) in shares.items()
        if total and (errors + unverified) / total > max_share
    ]
    if lost:
        return GateCheck(
            name=name, status="uncertain",
            detail=f"{where} {join_and(lost)} to harness errors or missing verdicts (at most "
            f"{rate(max_share)} may be lost): a call that no longer replays tests nothing. The "
            "sessions' errors say what broke (a fork names the turn that no longer renders as "
            "recorded).",
            headline=f"the regression suite lost runs: {join_and(lost)}",
        )  # fmt: skip
    test = tests[0] if tests else None
    if test is None or not test.tested:
        pairs = 0 if test is None else test.pairs
        return GateCheck(
            name=name, status="uncertain",
            detail=f"{where} {count(pairs, 'paired run')} could not confirm a loss even if "
            "the candidate lost them all; run more repeats or add scenarios.",
            headline=f"the regression suite has too few paired runs ({pairs}) to test",
        )  # fmt: skip
    runs = (
        f"{names[0]} lost {test.worse} and won {test.better} of its {test.pairs} paired runs "
        f"(exact one-sided test of the runs that differ: p = {p_value(test.p_value)}, "
        f"confirmed at p <= {alpha:g})"
    )
    if test.confirmed:
        return GateCheck(
            name=name, status="fail",
            detail=f"{where} {runs}: confirmed worse than {names[1]} on calls that went wrong "
            "before.",
            headline=f"{names[0]} is confirmed worse on the regression suite (lost {test.worse}, "
            f"won {test.better} of {test.pairs} runs)",
        )  # fmt: skip
    return GateCheck(
        name=name, status="pass",
        detail=f"{where} {runs}: not confirmed worse. The smallest loss it could confirm, with "
        f"none won: {count(test.fewest_losses or 0, 'run')}.",
        headline="no regression on the regression suite",
    )  # fmt: skip


def _text_mode_unavailable(name: str, what: str) -> GateCheck:
    return GateCheck(
        name=name,
        status="unavailable",
        detail=f"Text mode has no voice, so there is no {what}; the LLM stages are gated instead.",
    )


def _measure(measure: str) -> str:
    return "voice-to-voice" if measure == "v2v" else measure


LATENCY_OK = "latency within its limits"
"""What a passing latency check adds to the PROMOTE sentence (once, however many passed)."""


def p95_budget_check(
    candidate: QuantileInterval | None,
    budget_ms: float,
    require: bool,
    measure: str = "v2v",
    text_mode: bool = False,
    *,
    names: Names = ROLES,
) -> GateCheck:
    """The candidate's P95 (`measure`: v2v, or the heard gap in audio mode) against the budget."""
    name = "p95_budget"
    m, cand = _measure(measure), names[0]
    if candidate is None:
        if text_mode:
            return _text_mode_unavailable(name, "voice-to-voice P95")
        return GateCheck(
            name=name, status="uncertain" if require else "unavailable",
            detail=f"No {m} samples for both policies in 2 or more scenarios, so the candidate's "
            "P95 is unknown.",
            headline=f"{cand}'s {m} P95 is unknown (no samples for both policies in 2 or more "
            "scenarios)",
        )  # fmt: skip
    return quantile_budget_check(name, m, candidate, budget_ms, names=names)


def quantile_budget_check(
    name: str,
    m: str,
    candidate: QuantileInterval,
    budget_ms: float,
    *,
    names: Names = ROLES,
    unit: str = "turns",
) -> GateCheck:
    """The candidate's P95 of `m` (with its Woodruff interval) against an absolute budget.

    `unit` names what was timed (`turns`; `barge-ins` for the time to yield).
    """
    cand = names[0]
    ci = (
        interval(candidate.low, candidate.high, ms) if candidate.bounded
        else f"95% CI from {ms(candidate.low)}, unbounded above"
    )  # fmt: skip
    text = (
        f"The candidate's {m} P95 is {ms(candidate.estimate)} ({ci}, {candidate.turns:,} {unit} "
        f"in {candidate.clusters} scenarios), against a budget of {ms(budget_ms)}"
    )
    said = f"{cand}'s {m} P95 of {ms(candidate.estimate)} ({ci})"
    if candidate.bounded and candidate.high <= budget_ms:
        return GateCheck(name=name, status="pass", detail=f"{text}: within it.",
                         headline=LATENCY_OK)  # fmt: skip
    if candidate.low > budget_ms:
        return GateCheck(
            name=name, status="fail", detail=f"{text}: over it.",
            headline=f"{said} is over the {ms(budget_ms)} budget",
        )  # fmt: skip
    if not candidate.bounded:
        return GateCheck(
            name=name, status="uncertain",
            detail=f"{text}. There are too few turns to bound the P95 from above; more sessions "
            "would.",
            headline=f"{cand}'s {m} P95 cannot be bounded from above with {candidate.turns:,} "
            f"{unit}",
        )  # fmt: skip
    return GateCheck(
        name=name, status="uncertain", detail=f"{text}: the interval straddles it.",
        headline=f"{said} may be over the {ms(budget_ms)} budget",
    )  # fmt: skip


def p95_margin_check(
    difference: Interval | None,
    margin_ms: float,
    require: bool,
    measure: str = "v2v",
    text_mode: bool = False,
    *,
    names: Names = ROLES,
) -> GateCheck:
    """Candidate minus incumbent P95 (`measure`, paired over scenarios) against the margin."""
    name = "p95_vs_incumbent"
    m, (cand, inc) = _measure(measure), names
    if difference is None:
        if text_mode:
            return _text_mode_unavailable(name, "voice-to-voice P95")
        return GateCheck(
            name=name, status="uncertain" if require else "unavailable",
            detail=f"No {m} samples for both policies in 2 or more scenarios, so the difference "
            "is unknown.",
            headline=f"{cand}'s {m} P95 against {inc}'s is unknown (no samples for both "
            "policies in 2 or more scenarios)",
        )  # fmt: skip
    ci = interval(difference.low, difference.high, lambda x: ms(x, signed=True))
    text = (
        f"The candidate's {m} P95 minus the incumbent's is {ms(difference.estimate, signed=True)} "
        f"({ci}, paired over scenarios), against a margin of {ms(margin_ms)}"
    )
    said = (
        f"{cand}'s {m} P95 minus {inc}'s ({ms(difference.estimate, signed=True)}, {ci}) "
    )
    if difference.high <= margin_ms:
        return GateCheck(name=name, status="pass", detail=f"{text}: within it.",
                         headline=LATENCY_OK)  # fmt: skip
    if difference.low > margin_ms:
        return GateCheck(
            name=name, status="fail", detail=f"{text}: slower than that.",
            headline=f"{said}is beyond the {ms(margin_ms)} margin",
        )  # fmt: skip
    return GateCheck(
        name=name, status="uncertain", detail=f"{text}: the interval straddles it.",
        headline=f"{said}may exceed the {ms(margin_ms)} margin",
    )  # fmt: skip


def caller_gap_check(
    candidate: QuantileInterval | None, budget_ms: float, require: bool, *, names: Names = ROLES
) -> GateCheck:
    """The candidate's P95 caller-perceived gap (`inputs.caller_gap_samples`) against its budget.

    What a caller waits in silence, tool rounds included: the per-call LLM checks pass an agent
    whose every request is fast but which looks things up before saying a word.
    """
    name, m = "caller_gap_budget", "caller-perceived gap"
    if candidate is None:
        return GateCheck(
            name=name, status="uncertain" if require else "unavailable",
            detail=f"No {m} samples for the candidate in 2 or more scenarios, so its P95 is "
            "unknown.",
            headline=f"{names[0]}'s {m} P95 is unknown (no samples in 2 or more scenarios)",
        )  # fmt: skip
    return quantile_budget_check(name, m, candidate, budget_ms, names=names)


def limit_status(low: float, high: float, limit: float) -> CheckStatus:
    """An interval against an upper limit: pass inside it, fail wholly above, else uncertain."""
    if high <= limit:
        return "pass"
    return "fail" if low > limit else "uncertain"


def ratio_check(
    name: str,
    label: str,
    comparison: RatioComparison | None,
    limit: float,
    *,
    missing: str,
    missing_status: CheckStatus = "unavailable",
    names: Names = ROLES,
    fix: str = "",
) -> GateCheck:
    """Candidate / incumbent of one quantile of `label` (paired over scenarios) against `limit`.

    `missing` is the clause saying why there is no comparison (the check is then
    `missing_status`); `fix` a sentence on what to look at when it fails.
    """
    cand, inc = names
    if comparison is None:
        return GateCheck(name=name, status=missing_status, detail=sentence(missing),
                         headline=missing)  # fmt: skip
    r, q = comparison.ratio, f"P{round(comparison.q * 100)}"
    ci = interval(r.low, r.high, ratio)
    text = (
        f"The candidate's {q} {label} is {ratio(r.estimate)} the incumbent's "
        f"({ms(comparison.candidate)} vs {ms(comparison.incumbent)}; {ci} over "
        f"{comparison.clusters} paired scenarios)"
    )
    said = f"{cand}'s {q} {label} is {ratio(r.estimate)} {inc}'s"
    status = limit_status(r.low, r.high, limit)
    if status == "pass":
        return GateCheck(
            name=name, status=status, detail=f"{text}: within the {ratio(limit)} limit.",
            headline=LATENCY_OK,
        )  # fmt: skip
    if status == "fail":
        return GateCheck(
            name=name, status=status,
            detail=f"{text}: above the {ratio(limit)} limit.{f' {fix}' if fix else ''}",
            headline=f"{said} ({ci}, limit {ratio(limit)})",
        )  # fmt: skip
    return GateCheck(
        name=name, status=status,
        detail=f"{text}: the interval straddles the {ratio(limit)} limit; more runs would decide.",
        headline=f"{said} ({ci}) and may exceed the {ratio(limit)} limit",
    )  # fmt: skip


def llm_ratio_check(
    measure: str,
    comparison: RatioComparison | None,
    limit: float,
    require: bool,
    *,
    names: Names = ROLES,
    label: str | None = None,
) -> GateCheck:
    """Candidate / incumbent of one LLM stage's P50 (`measure` in `LLM_MEASURES`) vs `limit`.

    `label` names the measure (`latency.llm_label`: what the TTFT was measured per).
    """
    label = label or LLM_MEASURES[measure]
    return ratio_check(
        {"llm_ttft_ms": "llm_ttft_ratio", "llm_turn_ms": "llm_turn_ratio"}[measure], label,
        comparison, limit,
        missing=f"there are no {label} samples for both policies in 2 or more scenarios",
        missing_status="uncertain" if require else "unavailable", names=names,
        fix="Find what made it slower (longer prompts or replies, more tool-call round trips) "
        "before promoting it.",
    )  # fmt: skip


def writes_check(
    candidate: SafetyArm, incumbent: SafetyArm, *, names: Names = ROLES
) -> GateCheck:
    """No unauthorised write by the candidate; both policies' counts are stated."""
    guarded = "guarded runs" if candidate.denominator == "runs with a guarded check" else "runs"
    if candidate.writes:
        headline = (
            f"{names[0]} made {count(candidate.writes, 'unauthorised write')} in "
            f"{candidate.guarded_runs:,} {guarded}"
        )
    else:
        headline = "no unauthorised write" + (
            "" if candidate.guarded_runs else " (no run had a guarded check)"
        )
    return GateCheck(
        name="unauthorized_writes",
        status="pass" if candidate.writes == 0 else "fail",
        detail=f"{writes_words(candidate, 'the candidate')} "
        f"{writes_words(incumbent, 'the incumbent')}",
        headline=headline,
    )


def unusable_check(
    shares: dict[str, tuple[int, int, int]], max_share: float, *, names: Names = ROLES
) -> GateCheck:
    """Each arm's runs lost to harness errors or missing verdicts, against the allowed share.

    Args:
        shares: per role, (harness errors, unverified, runs read in all).
        max_share: the most of an arm's runs that may be lost.
        names: the candidate's and the incumbent's names, for the verdict sentence.
    """
    named = dict(zip(("candidate", "incumbent"), names, strict=True))
    parts, over = [], []
    for role, (errors, unverified, total) in shares.items():
        share = (errors + unverified) / total if total else 0.0
        parts.append(
            f"The {role} lost {errors + unverified} of {total} runs ({rate(share)}): "
            f"{count(errors, 'harness error')} and {count(unverified, 'unverified run')}."
        )
        if share > max_share:
            over.append((role, share))
    detail = " ".join(parts) + f" At most {rate(max_share)} of a policy's runs may be lost."
    if over:
        roles = join_and([role for role, _ in over])
        return GateCheck(
            name="unusable_runs", status="uncertain",
            detail=f"{detail} The lost runs of the {roles} might have gone either way; fix what "
            "broke them (the sessions' errors say) and run the gate again.",
            headline=join_and([f"{named.get(r, r)} lost {rate(s)} of its runs" for r, s in over])
            + f" to harness errors or missing verdicts (at most {rate(max_share)} allowed)",
        )  # fmt: skip
    return GateCheck(name="unusable_runs", status="pass", detail=detail)


def guard_check(candidate: Lineage, require_guard: bool, *, names: Names = ROLES) -> GateCheck:
    """The candidate's training guard (see `lineage` for the states)."""
    status: CheckStatus
    if candidate.guard in ("passed", "not_applicable"):
        status = "pass"
    elif candidate.guard == "unavailable":
        status = "fail" if require_guard else "unavailable"
    else:
        status = "fail"
    detail = sentence(candidate.guard_detail)
    cand = names[0]
    run = f" {candidate.training_run_id}" if candidate.training_run_id else ""
    headline = {
        "passed": "a passed training guard",
        "failed": f"{cand}'s training guard failed",
        "missing": f"{cand}'s training run{run} recorded no guard value",
        "unavailable": f"{cand} has no training guard to read, and --require-guard requires one",
    }.get(candidate.guard, "")
    if status == "fail" and candidate.guard == "unavailable":
        detail += " --require-guard asks for a guard that passed."
    return GateCheck(name="training_guard", status=status, detail=detail, headline=headline)


def _deciding_sample(sample: SampleSize) -> str:
    """The runs that would decide an open paired interval, as the end of a sentence."""
    options = []
    if sample.required_scenarios is not None:
        options.append(
            f"about {sample.required_scenarios} scenarios at {sample.mean_repeats:g} repeats"
        )
    if sample.required_repeats is not None:
        options.append(
            f"about {sample.required_repeats} repeats on these {sample.n_scenarios} scenarios"
        )
    if not options:
        return "the sample that would decide cannot be estimated from this data"
    if len(options) == 1:
        return f"{options[0]} would decide"
    return f"{options[0]}, or {options[1]}, would decide"


def check_reason(check: GateCheck, sample: SampleSize | None = None) -> str:
    """One entry of `reasons`: the check's title in words, its status, its detail.

    With `sample` (an open paired interval), the paired entry also says what would decide it.
    """
    text = f"{CHECK_TITLES.get(check.name, check.name)} ({STATUS_WORDS[check.status]}): "
    text += sentence(check.detail)
    if sample is not None and check.name == "paired_reward":
        text += f" {sentence(_deciding_sample(sample))}"
        if sample.mde is not None:
            text += f" The smallest effect this sample detects is {delta(sample.mde)}."
    return text


def _packed(lead: str, clauses: list[str], more: str, tail: str = "") -> str:
    """`lead` and as many `clauses` as fit in about `REASON_CHARS`, the rest counted, and `tail`.

    The first clause is always said; the sentence ends with a full stop.
    """
    kept: list[str] = []
    for clause in clauses:
        trial = lead + join_and([*kept, clause]) + (f", and {tail}" if tail else "")
        if kept and len(trial) > REASON_CHARS:
            break
        kept.append(clause)
    rest = len(clauses) - len(kept)
    said = join_and([*kept, *([count(rest, more)] if rest else [])])
    return lead + said + (f", and {tail}" if tail else "") + "."


def _headline(check: GateCheck) -> str:
    """A check's few words; a loaded receipt's checks have none, so their title stands in."""
    if check.headline:
        return check.headline
    return f"{CHECK_SHORT.get(check.name, check.name)} {STATUS_WORDS[check.status]}"


def verdict_sentence(
    decision: Decision, checks: Sequence[GateCheck], sample: SampleSize | None
) -> str:
    """The one sentence a person acts on: the decision, then what decided it, in few words."""
    if not checks:
        return "INCONCLUSIVE: nothing was checked."
    if decision == "REJECT":
        failed = [_headline(c) for c in checks if c.status == "fail"]
        return _packed("REJECT: ", failed, "more failed check")
    if decision == "INCONCLUSIVE":
        uncertain = [c for c in checks if c.status == "uncertain"]
        tail = (
            _deciding_sample(sample)
            if sample is not None and any(c.name == "paired_reward" for c in uncertain)
            else ""
        )
        return _packed(
            "INCONCLUSIVE: ", [_headline(c) for c in uncertain], "more open check", tail
        )  # fmt: skip
    lead = next((_headline(c) for c in checks if c.name == "paired_reward"), "every check passed")
    kept = [
        h for h in dict.fromkeys(
            c.headline for c in checks if c.status == "pass" and c.name != "paired_reward"
        ) if h
    ]  # fmt: skip
    text = f"PROMOTE: {lead}" + (f", with {join_and(kept)}" if kept else "")
    unchecked = list(
        dict.fromkeys(CHECK_SHORT.get(c.name, c.name) for c in checks if c.status == "unavailable")
    )
    extra = f" ({join_and(unchecked)} not checked)" if unchecked else ""
    return text + (extra if len(text + extra) < REASON_CHARS else "") + "."


def decide(checks: tuple[GateCheck, ...], sample: SampleSize | None) -> Verdict:
    """Combine the checks into a verdict: the decision, its sentence, one reason per check.

    `sample` is given when the paired interval contains `min_delta` (more runs could decide):
    an INCONCLUSIVE reason then names the sample that would.
    """
    codes = np.array([STATUS_CODES[c.status] for c in checks])
    decision = _DECISIONS[int(decision_codes(codes))] if checks else "INCONCLUSIVE"
    return Verdict(
        decision=decision,
        reason=verdict_sentence(decision, checks, sample),
        reasons=tuple(check_reason(c, sample) for c in checks),
        checks=checks,
    )
