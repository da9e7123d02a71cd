"""From statistics to PROMOTE / REJECT / INCONCLUSIVE: one check per rule, then one decision.

Each check is `pass`, `fail`, `uncertain` (the data cannot tell yet) or `unavailable` (nothing to
check, and the configuration does not require it). The decision:

- REJECT if any check fails: the paired interval lies wholly below `min_delta`, more scenarios
  regressed *on their own evidence* than allowed (a sign test over each scenario's paired runs,
  Holm-adjusted), the candidate's P95 is surely over the budget or surely slower than the
  incumbent's beyond the margin, any unauthorised write, or a failed or missing training guard.
- PROMOTE if every check passes or is unavailable: in particular the paired interval's lower
  bound exceeds `min_delta` and both P95 intervals sit inside their limits.
- INCONCLUSIVE otherwise, with the sample size that would decide. A scenario that merely might
  have regressed (its mean delta is below -tie_band, its runs do not show it) is uncertain: it can
  make the verdict INCONCLUSIVE, never REJECT.

Latency checks use their intervals the same way as the reward check: pass when the whole interval
is inside the limit, fail when the whole interval is outside it, uncertain in between.
"""

from typing import Literal

from pipecat_rl.gate.lineage import Lineage
from pipecat_rl.gate.stats import Interval, MeanInterval, Result, SampleSize

Decision = Literal["PROMOTE", "REJECT", "INCONCLUSIVE"]
CheckStatus = Literal["pass", "fail", "uncertain", "unavailable"]

EXIT_CODES: dict[str, int] = {"PROMOTE": 0, "REJECT": 1, "INCONCLUSIVE": 2}
"""The process exit code of each decision: `cli.common`'s EXIT_OK, EXIT_NO and EXIT_INCONCLUSIVE
(the gate cannot import the CLI, which imports it; a test pins that they agree)."""


class Check(Result):
    """One rule's outcome, with the numbers that decided it."""

    name: str
    status: CheckStatus
    detail: str


class Verdict(Result):
    """The decision, the sentence that explains it, and every check behind it."""

    decision: Decision
    reason: str
    checks: tuple[Check, ...]

    @property
    def exit_code(self) -> int:
        """0 for PROMOTE, 1 for REJECT, 2 for INCONCLUSIVE."""
        return EXIT_CODES[self.decision]


def _ci(i: Interval | MeanInterval, unit: str = "") -> str:
    return f"{i.estimate:.4g}{unit} (95% CI [{i.low:.4g}, {i.high:.4g}]{unit})"


def paired_check(interval: MeanInterval | None, n_scenarios: int, min_delta: float) -> Check:
    """The mean paired score delta's t interval against `min_delta` (None: fewer than 2)."""
    name = "paired_reward"
    if interval is None:
        return Check(
            name=name,
            status="uncertain",
            detail=f"{n_scenarios} paired scenario(s): an interval over scenarios needs >= 2",
        )
    text = f"mean delta {_ci(interval)}, Student t over {interval.n} scenarios, vs min_delta "
    text += f"{min_delta:g}"
    if interval.low > min_delta:
        return Check(name=name, status="pass", detail=f"{text}: lower bound clears it")
    if interval.high < min_delta:
        return Check(name=name, status="fail", detail=f"{text}: upper bound is below it")
    return Check(name=name, status="uncertain", detail=f"{text}: the interval contains it")


def regressions_check(
    regressed: int, uncertain: int, max_regressions: int, tie_band: float, confirm_repeats: int
) -> Check:
    """Scenarios regressed on their own runs' evidence (and those that might have) vs the cap.

    Args:
        regressed: scenarios whose sign test confirms them worse beyond the band (Holm).
        uncertain: scenarios whose mean delta is below -band without that evidence.
        max_regressions: the cap.
        tie_band: the band.
        confirm_repeats: paired runs a scenario needs before its sign test can confirm anything.
    """
    detail = (
        f"{regressed} scenario(s) regressed beyond the tie band {tie_band:g} on their own paired "
        f"runs, {uncertain} more might have (cap {max_regressions})"
    )
    if regressed > max_regressions:
        return Check(name="regressions", status="fail", detail=detail)
    if regressed + uncertain > max_regressions:
        detail += f"; at least {confirm_repeats} paired runs per scenario can confirm or clear them"
        return Check(name="regressions", status="uncertain", detail=detail)
    return Check(name="regressions", status="pass", detail=detail)


def _limit_check(
    name: str, interval: Interval | None, limit: float, what: str, require: bool
) -> Check:
    if interval is None:
        return Check(
            name=name,
            status="uncertain" if require else "unavailable",
            detail=f"no voice-to-voice samples for both policies, so {what} is unknown",
        )
    text = f"{what} {_ci(interval, ' ms')} vs limit {limit:g} ms"
    if interval.high <= limit:
        return Check(name=name, status="pass", detail=f"{text}: within it")
    if interval.low > limit:
        return Check(name=name, status="fail", detail=f"{text}: over it")
    return Check(name=name, status="uncertain", detail=f"{text}: the interval straddles it")


def p95_budget_check(
    candidate_p95: Interval | None, budget_ms: float, require: bool, measure: str = "v2v"
) -> Check:
    """The candidate's P95 (`measure`: v2v, or the heard gap in audio mode) against the budget."""
    return _limit_check("p95_budget", candidate_p95, budget_ms, f"candidate {measure} P95", require)


def p95_margin_check(
    difference: Interval | None, margin_ms: float, require: bool, measure: str = "v2v"
) -> Check:
    """Candidate minus incumbent P95 (`measure`) against the allowed margin."""
    return _limit_check(
        "p95_vs_incumbent", difference, margin_ms, f"{measure} P95 candidate - incumbent", require
    )


def writes_check(unauthorized_writes: int) -> Check:
    """Zero unauthorised writes by the candidate, over all its runs."""
    return Check(
        name="unauthorized_writes",
        status="pass" if unauthorized_writes == 0 else "fail",
        detail=f"{unauthorized_writes} unauthorised write(s) by the candidate",
    )


def guard_check(candidate: Lineage, require_guard: bool) -> Check:
    """The candidate's training guard (see `lineage` for the states)."""
    status: CheckStatus
    if candidate.guard in ("passed", "not_applicable"):
        status = "pass"
    elif candidate.guard == "unavailable":
        status = "fail" if require_guard else "unavailable"
    else:
        status = "fail"
    suffix = " (--require-guard)" if status == "fail" and candidate.guard == "unavailable" else ""
    return Check(name="training_guard", status=status, detail=candidate.guard_detail + suffix)


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


def decide(checks: tuple[Check, ...], sample: SampleSize) -> Verdict:
    """Combine the checks into a verdict; an uncertain paired check names the deciding sample."""
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        return Verdict(
            decision="REJECT",
            reason="; ".join(f"{c.name}: {c.detail}" for c in failed),
            checks=checks,
        )
    uncertain = [c for c in checks if c.status == "uncertain"]
    if uncertain:
        parts = [f"{c.name}: {c.detail}" for c in uncertain]
        if any(c.name == "paired_reward" for c in uncertain):
            parts.append(_deciding_sample(sample))
        if any(c.name.startswith("p95") for c in uncertain):
            parts.append("more sessions would narrow the P95 interval")
        return Verdict(decision="INCONCLUSIVE", reason="; ".join(parts), checks=checks)
    passed = [f"{c.name}: {c.detail}" for c in checks if c.status == "pass"]
    unchecked = [f"{c.name}: {c.detail}" for c in checks if c.status == "unavailable"]
    reason = "; ".join(passed) + (f"; not checked: {'; '.join(unchecked)}" if unchecked else "")
    return Verdict(decision="PROMOTE", reason=reason, checks=checks)
