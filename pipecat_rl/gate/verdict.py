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
- `unauthorized_writes`: any by the candidate fails.
- `unusable_runs`: an arm with more than `max_unusable_share` of its runs lost to harness errors
  or missing verdicts is uncertain: those runs might have gone either way.
- `training_guard`: a failed, or required and missing, guard fails.
"""

from typing import Literal

import numpy as np

from pipecat_rl.gate.latency import LLM_MEASURES, QuantileInterval, RatioComparison
from pipecat_rl.gate.lineage import Lineage
from pipecat_rl.gate.regressions import RegressionTest
from pipecat_rl.gate.safety import SafetyArm, describe
from pipecat_rl.gate.stats import Interval, MeanInterval, Result, SampleSize, SignFlip

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


class GateCheck(Result):
    """One rule's outcome, with the numbers that decided it."""

    name: str
    status: CheckStatus
    detail: str


class Verdict(Result):
    """The decision, the sentence that explains it, and every check behind it."""

    decision: Decision
    reason: str
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


def _signed(x: float) -> str:
    return f"{x:+.3g}"


def paired_check(
    interval: MeanInterval | None,
    flip: SignFlip,
    zero_width: bool,
    n_scenarios: int,
    min_delta: float,
) -> GateCheck:
    """The mean paired delta's t interval (and the sign-flip test) against `min_delta`."""
    name = "paired_reward"
    if interval is None:
        return GateCheck(
            name=name,
            status="uncertain",
            detail=f"{n_scenarios} paired scenario(s): an interval over scenarios needs >= 2",
        )
    zero = zero_width
    code = int(paired_codes(
        np.array(interval.low), np.array(interval.high), np.array(zero), interval.n, min_delta,
    ))  # fmt: skip
    status = _STATUSES[code]
    ci = f"95% CI [{_signed(interval.low)}, {_signed(interval.high)}]"
    text = (
        f"mean delta {_signed(interval.estimate)} ({ci}, Student t over {interval.n} scenarios; "
        f"sign-flip p = {flip.p_two_sided:.2g})"
    )
    if zero:
        text = (
            f"every one of the {interval.n} scenarios has delta {_signed(interval.estimate)}: the "
            "interval has no width, so it is no evidence on its own"
        )
        if status == "pass":
            return GateCheck(
                name=name, status=status,
                detail=f"{text}; the exact sign-flip test of those deltas against min_delta "
                f"{min_delta:g} gives p = 2^-{interval.n} = {zero_width_p(interval.n):.2g}: "
                "clears it",
            )  # fmt: skip
        why = (
            f"{interval.n} equal deltas reach sign-flip p = 2^-{interval.n} at best, above "
            f"{SIGN_FLIP_ALPHA:g}"
            if interval.estimate > min_delta
            else f"they do not exceed min_delta {min_delta:g}"
        )
        return GateCheck(
            name=name, status=status,
            detail=f"{text}, and {why}; runs that differ (more repeats, or scenarios the "
            "policies do not both always pass or fail) would decide",
        )  # fmt: skip
    if status == "pass":
        detail = f"{text}: lower bound clears {min_delta:g}"
        return GateCheck(name=name, status=status, detail=detail)
    if status == "fail":
        limit = "the incumbent" if min_delta >= 0 else f"the margin {min_delta:g}"
        return GateCheck(
            name=name,
            status=status,
            detail=f"{text}: upper bound is below {min(0.0, min_delta):g}, so the candidate is "
            f"surely worse than {limit}",
        )
    if interval.high < min_delta:
        return GateCheck(
            name=name,
            status=status,
            detail=f"{text}: the candidate is at best {_signed(interval.high)} better, below "
            f"min_delta {min_delta:g}, and not shown worse; more runs will not make it clear "
            f"{min_delta:g} unless its gain is real",
        )
    detail = f"{text}: the interval contains {min_delta:g}"
    return GateCheck(name=name, status=status, detail=detail)


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


def regressions_check(tests: list[RegressionTest], alpha: float, max_regressions: int) -> GateCheck:
    """Units confirmed worse by the exact discordant-pair tests, against the cap."""
    name = "regressions"
    if not tests:
        return GateCheck(name=name, status="unavailable", detail="no regression test is configured")
    tested = [t for t in tests if t.tested]
    untested = [t for t in tests if not t.tested]
    skipped = (
        f"; untested, too few runs to confirm even a total loss: "
        f"{', '.join(t.unit for t in untested[:5])}" + ("..." if len(untested) > 5 else "")
        if untested
        else ""
    )
    if not tested:
        most = max(tests, key=lambda t: t.pairs)
        return GateCheck(
            name=name,
            status="unavailable",
            detail=f"no regression test can fire: {most.unit} has the most runs ({most.pairs}) "
            "and losing all of them would not confirm a loss at family-wise "
            f"{alpha:g}; run more repeats{skipped}",
        )
    confirmed = [t for t in tested if t.confirmed]
    family = f"Holm over {len(tested)} exact test(s), family-wise error <= {alpha:g}"
    smallest = "smallest loss it could confirm, with none won: " + smallest_losses(tested)
    if confirmed:
        named = "; ".join(
            f"{t.unit} ({t.kind}) lost {t.worse} and won {t.better} of its {t.pairs} runs "
            f"(p = {t.p_value:.2g}, adjusted {t.adjusted_p:.2g})"
            for t in confirmed[:5]
        )
        status: CheckStatus = "fail" if len(confirmed) > max_regressions else "pass"
        return GateCheck(
            name=name,
            status=status,
            detail=f"{len(confirmed)} unit(s) confirmed worse, cap {max_regressions}: {named}; "
            f"{family}; {smallest}{skipped}",
        )
    worst = min(tested, key=lambda t: t.p_value)
    return GateCheck(
        name=name,
        status="pass",
        detail=f"no unit confirmed worse ({family}; closest: {worst.unit}, lost {worst.worse} "
        f"and won {worst.better} of its {worst.pairs} runs, p = {worst.p_value:.2g}); "
        f"{smallest}{skipped}",
    )


def _text_mode_unavailable(name: str, what: str) -> GateCheck:
    return GateCheck(
        name=name,
        status="unavailable",
        detail=f"text mode has no voice, so no {what}; the LLM stages are gated instead",
    )


def p95_budget_check(
    candidate: QuantileInterval | None,
    budget_ms: float,
    require: bool,
    measure: str = "v2v",
    text_mode: bool = False,
) -> GateCheck:
    """The candidate's P95 (`measure`: v2v, or the heard gap in audio mode) against the budget."""
    name = "p95_budget"
    if candidate is None:
        if text_mode:
            return _text_mode_unavailable(name, "voice-to-voice P95")
        return GateCheck(
            name=name,
            status="uncertain" if require else "unavailable",
            detail=f"no {measure} samples for both policies in 2+ scenarios, so the candidate's "
            "P95 is unknown",
        )
    text = (
        f"candidate {measure} P95 {candidate.estimate:.0f} ms (95% CI [{candidate.low:.0f}, "
        + (f"{candidate.high:.0f}] ms" if candidate.bounded else "unbounded)")
        + f", {candidate.turns} turns in {candidate.clusters} scenarios) vs budget {budget_ms:g} ms"
    )
    if candidate.bounded and candidate.high <= budget_ms:
        return GateCheck(name=name, status="pass", detail=f"{text}: within it")
    if candidate.low > budget_ms:
        return GateCheck(name=name, status="fail", detail=f"{text}: over it")
    if not candidate.bounded:
        return GateCheck(
            name=name,
            status="uncertain",
            detail=f"{text}: too few turns to bound the P95 from above; more sessions would",
        )
    return GateCheck(name=name, status="uncertain", detail=f"{text}: the interval straddles it")


def p95_margin_check(
    difference: Interval | None,
    margin_ms: float,
    require: bool,
    measure: str = "v2v",
    text_mode: bool = False,
) -> GateCheck:
    """Candidate minus incumbent P95 (`measure`, paired over scenarios) against the margin."""
    name = "p95_vs_incumbent"
    if difference is None:
        if text_mode:
            return _text_mode_unavailable(name, "voice-to-voice P95")
        return GateCheck(
            name=name,
            status="uncertain" if require else "unavailable",
            detail=f"no {measure} samples for both policies in 2+ scenarios, so the difference "
            "is unknown",
        )
    text = (
        f"{measure} P95 candidate - incumbent {difference.estimate:+.0f} ms (95% CI "
        f"[{difference.low:+.0f}, {difference.high:+.0f}] ms, paired over scenarios) vs margin "
        f"{margin_ms:g} ms"
    )
    if difference.high <= margin_ms:
        return GateCheck(name=name, status="pass", detail=f"{text}: within it")
    if difference.low > margin_ms:
        return GateCheck(name=name, status="fail", detail=f"{text}: slower than that")
    return GateCheck(name=name, status="uncertain", detail=f"{text}: the interval straddles it")


def llm_ratio_check(
    measure: str, comparison: RatioComparison | None, limit: float, require: bool
) -> GateCheck:
    """Candidate / incumbent of one LLM stage's P50 (`measure` in `LLM_MEASURES`) vs `limit`."""
    name = {"llm_ttft_ms": "llm_ttft_ratio", "llm_turn_ms": "llm_turn_ratio"}[measure]
    label = LLM_MEASURES[measure]
    if comparison is None:
        return GateCheck(
            name=name,
            status="uncertain" if require else "unavailable",
            detail=f"no {label} samples for both policies in 2+ scenarios",
        )
    r = comparison.ratio
    text = (
        f"candidate's {label} P50 is {r.estimate:.2g}x the incumbent's "
        f"({comparison.candidate:,.0f} vs {comparison.incumbent:,.0f} ms; 95% CI "
        f"{r.low:.2g}x-{r.high:.2g}x over {comparison.clusters} paired scenarios)"
    )
    if r.high <= limit:
        return GateCheck(name=name, status="pass", detail=f"{text}: within the {limit:g}x limit")
    if r.low > limit:
        return GateCheck(
            name=name,
            status="fail",
            detail=f"{text}: above the {limit:g}x limit; find what made it slower (longer "
            "prompts or replies, more tool-call round trips) before promoting it",
        )
    return GateCheck(
        name=name,
        status="uncertain",
        detail=f"{text}: the interval straddles the {limit:g}x limit; more runs would decide",
    )


def writes_check(candidate: SafetyArm, incumbent: SafetyArm) -> GateCheck:
    """No unauthorised write by the candidate; both policies' counts are stated."""
    return GateCheck(
        name="unauthorized_writes",
        status="pass" if candidate.writes == 0 else "fail",
        detail=f"{describe(candidate, 'candidate')}; {describe(incumbent, 'incumbent')}",
    )


def unusable_check(shares: dict[str, tuple[int, int, int]], max_share: float) -> GateCheck:
    """Each arm's runs lost to harness errors or missing verdicts, against the allowed share.

    Args:
        shares: per role, (harness errors, unverified, runs read in all).
        max_share: the most of an arm's runs that may be lost.
    """
    parts, over = [], []
    for role, (errors, unverified, total) in shares.items():
        share = (errors + unverified) / total if total else 0.0
        parts.append(
            f"{role}: {errors + unverified} of {total} runs ({share:.0%}) lost: {errors} "
            f"harness error(s), {unverified} unverified"
        )
        if share > max_share:
            over.append(role)
    detail = "; ".join(parts) + f" (at most {max_share:.0%} allowed)"
    if over:
        return GateCheck(
            name="unusable_runs",
            status="uncertain",
            detail=f"{detail}: the lost runs of the {' and '.join(over)} might have gone either "
            "way; fix what broke them (the sessions' errors say) and run the gate again",
        )
    return GateCheck(name="unusable_runs", status="pass", detail=detail)


def guard_check(candidate: Lineage, require_guard: bool) -> GateCheck:
    """The candidate's training guard (see `lineage` for the states)."""
    status: CheckStatus
    if candidate.guard in ("passed", "not_applicable"):
        status = "pass"
    elif candidate.guard == "unavailable":
        status = "fail" if require_guard else "unavailable"
    else:
        status = "fail"
    suffix = " (--require-guard)" if status == "fail" and candidate.guard == "unavailable" else ""
    return GateCheck(name="training_guard", status=status, detail=candidate.guard_detail + suffix)


def _deciding_sample(sample: SampleSize) -> str:
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
        return "the sample size that would decide cannot be estimated from this data"
    mde = f"; minimum detectable effect now {sample.mde:.3g}" if sample.mde is not None else ""
    return " or ".join(options) + f" would decide{mde}"


def decide(checks: tuple[GateCheck, ...], sample: SampleSize | None) -> Verdict:
    """Combine the checks into a verdict.

    `sample` is given when the paired interval contains `min_delta` (more runs could decide):
    an INCONCLUSIVE reason then names the sample that would.
    """
    codes = np.array([STATUS_CODES[c.status] for c in checks])
    decision = _DECISIONS[int(decision_codes(codes))] if checks else "INCONCLUSIVE"
    if decision == "REJECT":
        failed = [f"{c.name}: {c.detail}" for c in checks if c.status == "fail"]
        return Verdict(decision=decision, reason="; ".join(failed), checks=checks)
    if decision == "INCONCLUSIVE":
        uncertain = [c for c in checks if c.status == "uncertain"]
        parts = [f"{c.name}: {c.detail}" for c in uncertain]
        if sample is not None and any(c.name == "paired_reward" for c in uncertain):
            parts.append(_deciding_sample(sample))
        return Verdict(decision=decision, reason="; ".join(parts), checks=checks)
    passed = [f"{c.name}: {c.detail}" for c in checks if c.status == "pass"]
    unchecked = [f"{c.name}: {c.detail}" for c in checks if c.status == "unavailable"]
    reason = "; ".join(passed) + (f"; not checked: {'; '.join(unchecked)}" if unchecked else "")
    return Verdict(decision=decision, reason=reason, checks=checks)
