"""Paired statistics over held-out scenarios: pure functions returning frozen, typed results.

Notation. Scenario `s` has `K_s` paired runs: candidate run `r` and incumbent run `r` used the same
seed. `d[s][r] = reward_cand - reward_inc` is a paired run difference and
`delta_s = mean_r d[s][r]` is the scenario's delta (equal to mean(cand) - mean(inc) over the
paired runs). Scenarios are the unit of inference: runs of one scenario are correlated, so
intervals resample whole scenarios (a cluster bootstrap), never single runs.

- `t_interval`: the decision interval, Student's t over the scenario deltas,
  mean +- t_{(1+level)/2, n-1} * sd / sqrt(n). Chosen by the coverage test
  (`tests/test_gate_coverage.py`, `benchmarks/gate_decision.py`): with identical arms it covers
  0 within half a point of 95% at 8, 16 and 24 scenarios and clears 0 on the promote side about
  2.5% of the time, where the percentile bootstrap covers ~88-90% at 8 scenarios and clears ~5%.
- `cluster_bootstrap`: the percentile interval, resampling scenarios (kept for the comparison the
  benchmark prints; it is too narrow at small n and decides nothing).
- `sign_test_worse` / `regressions`: a scenario regressed only when its own paired runs show it
  worse by more than the tie band (exact one-sided sign test, Holm-adjusted over scenarios).
- `win_loss_tie`: delta_s > band is a win, < -band a loss, otherwise a tie.
- `pass_hat_k`: tau-bench's unbiased pass^k for one scenario, C(c, k) / C(n, k) with c of n runs
  passed: the chance that k runs drawn without replacement all pass.
- `sample_size`: the minimum detectable effect at the current size, and the scenarios or
  repeats that would shrink the interval enough to decide (formulas on the function).
"""

import math
from collections import Counter
from collections.abc import Sequence
from statistics import NormalDist
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

Outcome = Literal["win", "loss", "tie"]


class Result(BaseModel):
    """Base of every statistics result: immutable, and no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Interval(Result):
    """A point estimate with a percentile bootstrap interval."""

    estimate: float
    low: float
    high: float
    level: float
    resamples: int
    seed: int


IntervalMethod = Literal["student_t"]


class MeanInterval(Result):
    """A mean with its two-sided interval, and what it was computed from."""

    estimate: float
    low: float
    high: float
    level: float
    method: IntervalMethod
    n: int
    df: int
    se: float
    """Standard error of the mean, sd(ddof=1) / sqrt(n)."""


class WinLossTie(Result):
    """Scenario outcomes under a tie band."""

    wins: int
    losses: int
    ties: int
    tie_band: float


class SampleSize(Result):
    """How far the current sample is from deciding, and what would decide it.

    `None` means "cannot be estimated" (fewer than two scenarios, or no spread to scale), or, for
    `required_repeats`, that more repeats alone cannot decide because the between-scenario spread
    already exceeds the allowed variance: add scenarios instead.
    """

    n_scenarios: int
    mean_repeats: float
    sd_delta: float | None
    """Standard deviation of the per-scenario deltas (ddof=1)."""
    within_sd: float | None
    """Pooled within-scenario SD of paired run differences (ddof=1 per scenario)."""
    mde: float | None
    """Minimum detectable effect: (z_{1-a/2} + z_{power}) * sd_delta / sqrt(n)."""
    required_scenarios: int | None
    required_repeats: int | None


def scenario_deltas(run_diffs: Sequence[Sequence[float]]) -> np.ndarray:
    """Per-scenario deltas: the mean of each scenario's paired run differences."""
    if any(len(d) == 0 for d in run_diffs):
        raise ValueError("every scenario needs at least one paired run difference")
    return np.array([float(np.mean(d)) for d in run_diffs], dtype=float)


def t_cdf(t: float, df: int) -> float:
    """Student's t CDF for an integer `df` >= 1, in closed form (Abramowitz & Stegun 26.7.3-4)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if t < 0:
        return 1.0 - t_cdf(-t, df)
    theta = math.atan(t / math.sqrt(df))
    sin, cos2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:  # odd: (2/pi) (theta + sin (cos + 2/3 cos^3 + ... ))
        term = total = math.cos(theta) if df > 1 else 0.0
        for k in range(3, df - 1, 2):
            term *= cos2 * (k - 1) / k
            total += term
        inside = 2 / math.pi * (theta + sin * total)
    else:  # even: sin (1 + 1/2 cos^2 + 1.3/(2.4) cos^4 + ...)
        term = total = 1.0
        for k in range(2, df - 1, 2):
            term *= cos2 * (k - 1) / k
            total += term
        inside = sin * total
    return (1.0 + inside) / 2


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (bisection on `t_cdf`)."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(100):  # 2^-100 of the bracket: exact to float precision
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def t_bounds(
    deltas: np.ndarray, level: float = 0.95
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean, low, high and standard error of the t interval along the last axis (vectorised).

    `t_interval` is this on one row; the coverage test runs it on thousands of rows at once.
    """
    values = np.asarray(deltas, dtype=float)
    n = values.shape[-1]
    if n < 2:
        raise ValueError("a t interval needs at least two scenarios")
    mean = values.mean(axis=-1)
    se = values.std(axis=-1, ddof=1) / math.sqrt(n)
    half = t_quantile((1 + level) / 2, n - 1) * se
    return mean, mean - half, mean + half, se


def t_interval(deltas: Sequence[float], *, level: float = 0.95) -> MeanInterval:
    """Student's t interval for the mean of the per-scenario deltas (needs >= 2 scenarios).

    With no spread at all (every scenario the same delta) the interval is that point.
    """
    values = np.asarray(deltas, dtype=float)
    mean, low, high, se = t_bounds(values, level)
    return MeanInterval(
        estimate=float(mean), low=float(low), high=float(high), level=level,
        method="student_t", n=int(values.size), df=int(values.size) - 1, se=float(se),
    )  # fmt: skip


def cluster_bootstrap(
    deltas: Sequence[float], *, resamples: int, seed: int, level: float = 0.95
) -> Interval:
    """Percentile bootstrap interval for the mean per-scenario delta, resampling scenarios.

    Each resample draws n scenarios with replacement and takes the mean of their deltas; the
    interval is the (1-level)/2 and (1+level)/2 quantiles of those means. Deterministic for a seed.
    """
    values = np.asarray(deltas, dtype=float)
    if values.size == 0:
        raise ValueError("no scenarios to bootstrap")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(resamples, values.size))
    means = values[idx].mean(axis=1)
    alpha = 1.0 - level
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return Interval(
        estimate=float(values.mean()),
        low=float(low),
        high=float(high),
        level=level,
        resamples=resamples,
        seed=seed,
    )


RegressionStatus = Literal["regressed", "uncertain", "none"]


class SignTest(Result):
    """One scenario's paired runs against the tie band: how many were worse, and the p-value."""

    worse: int
    """Paired runs with candidate - incumbent < -tie_band."""
    not_worse: int
    """Paired runs with candidate - incumbent > -tie_band (runs exactly at -band are dropped)."""
    p_value: float
    """P(at least `worse` of worse + not_worse fair coin flips): small means surely worse."""


class ScenarioRegression(Result):
    """Whether one scenario regressed, on the evidence of its own paired runs."""

    status: RegressionStatus
    sign: SignTest
    holm_alpha: float
    """The Holm step-down level this scenario's p-value was compared with."""


def sign_test_worse(run_diffs: Sequence[float], tie_band: float) -> SignTest:
    """Exact one-sided sign test of "this scenario's paired runs are worse beyond the band"."""
    diffs = np.asarray(run_diffs, dtype=float)
    worse = int(np.sum(diffs < -tie_band))
    not_worse = int(np.sum(diffs > -tie_band))
    n = worse + not_worse
    p = sum(math.comb(n, k) for k in range(worse, n + 1)) / 2**n if n else 1.0
    return SignTest(worse=worse, not_worse=not_worse, p_value=p)


def regressions(
    run_diffs: Sequence[Sequence[float]], tie_band: float, alpha: float
) -> list[ScenarioRegression]:
    """Each scenario's regression status: `regressed`, `uncertain` or `none`.

    A scenario is `regressed` when its sign test rejects "not worse beyond the band" under Holm's
    step-down over all scenarios at family level `alpha` (so identical arms show any false
    regression at most `alpha` of the time). One whose mean delta is below -band without that
    evidence is `uncertain`: it might have regressed, and the verdict can only be INCONCLUSIVE.
    """
    tests = [sign_test_worse(d, tie_band) for d in run_diffs]
    m = len(tests)
    order = sorted(range(m), key=lambda i: tests[i].p_value)
    levels = [0.0] * m
    rejected = [False] * m
    still = True
    for rank, i in enumerate(order):
        levels[i] = alpha / (m - rank)
        still = still and tests[i].p_value <= levels[i]
        rejected[i] = still
    out = []
    for i, d in enumerate(run_diffs):
        mean = float(np.mean(d))
        status: RegressionStatus = (
            "regressed" if rejected[i] else "uncertain" if mean < -tie_band else "none"
        )
        out.append(ScenarioRegression(status=status, sign=tests[i], holm_alpha=levels[i]))
    return out


def min_repeats_to_confirm(n_scenarios: int, alpha: float) -> int:
    """The fewest paired runs with which one scenario's sign test can confirm a regression.

    All K runs worse gives p = 2^-K; under Holm the smallest p meets alpha / n_scenarios.
    """
    return max(1, math.ceil(math.log2(max(1, n_scenarios) / alpha)))


def outcome(delta: float, tie_band: float) -> Outcome:
    """A scenario's outcome: a win if delta > band, a loss if delta < -band, else a tie."""
    if delta > tie_band:
        return "win"
    if delta < -tie_band:
        return "loss"
    return "tie"


def win_loss_tie(deltas: Sequence[float], tie_band: float) -> WinLossTie:
    """Count scenarios won, lost and tied under `outcome`."""
    counts = Counter(outcome(float(d), tie_band) for d in deltas)
    return WinLossTie(
        wins=counts["win"], losses=counts["loss"], ties=counts["tie"], tie_band=tie_band
    )


def pass_hat_k(passed: int, n: int, k: int) -> float:
    """Unbiased pass^k of one scenario with `passed` of `n` runs passing: C(passed,k) / C(n,k)."""
    if not 0 <= passed <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= passed <= n and 1 <= k <= n, got {passed=}, {n=}, {k=}")
    return math.comb(passed, k) / math.comb(n, k)


def pass_k_curve(passed_of_n: Sequence[tuple[int, int]]) -> dict[int, float]:
    """A policy's pass^k for k = 1..min(n): the mean over scenarios of `pass_hat_k`.

    Args:
        passed_of_n: per scenario, (runs passed, runs total).
    """
    if not passed_of_n:
        return {}
    k_max = min(n for _, n in passed_of_n)
    return {
        k: float(np.mean([pass_hat_k(c, n, k) for c, n in passed_of_n]))
        for k in range(1, k_max + 1)
    }


def sample_size(
    run_diffs: Sequence[Sequence[float]],
    *,
    target: float,
    level: float = 0.95,
    power: float = 0.8,
) -> SampleSize:
    """Minimum detectable effect, and the sample that would make the interval decide vs `target`.

    With n scenarios, per-scenario delta SD `sd`, z = z_{(1+level)/2} and gap = |mean - target|:

    - MDE = (z + z_{power}) * sd / sqrt(n), the effect this design detects with `power`.
    - Scenarios needed at the current repeats, so the interval's half-width z*sd/sqrt(n') drops
      below gap: n' = ceil((z * sd / gap)^2).
    - Repeats needed at the current scenarios: split var(delta_s) into a between-scenario part
      sb^2 = max(0, sd^2 - sw^2 / K) and a within part sw^2 / K, where sw^2 is the pooled variance
      of paired run differences within scenarios and K the mean repeats. The interval decides when
      sb^2 + sw^2 / K' <= n * (gap / z)^2, so K' = ceil(sw^2 / (n * (gap / z)^2 - sb^2)); when the
      denominator is <= 0 no number of repeats decides and the result is None.
    """
    arrays = [np.asarray(d, dtype=float) for d in run_diffs]
    n = len(arrays)
    mean_repeats = float(np.mean([a.size for a in arrays])) if arrays else 0.0
    if n < 2:
        return SampleSize(
            n_scenarios=n,
            mean_repeats=mean_repeats,
            sd_delta=None,
            within_sd=None,
            mde=None,
            required_scenarios=None,
            required_repeats=None,
        )
    deltas = scenario_deltas(arrays)
    sd = float(np.std(deltas, ddof=1))
    z = NormalDist().inv_cdf((1 + level) / 2)
    mde = (z + NormalDist().inv_cdf(power)) * sd / math.sqrt(n)
    multi = [a for a in arrays if a.size >= 2]
    within_var = (
        float(sum(np.var(a, ddof=1) * (a.size - 1) for a in multi) / sum(a.size - 1 for a in multi))
        if multi
        else None
    )
    gap = abs(float(deltas.mean()) - target)
    required_scenarios = math.ceil((z * sd / gap) ** 2) if gap > 0 and sd > 0 else None
    required_repeats = None
    if gap > 0 and within_var:
        between_var = max(0.0, sd**2 - within_var / mean_repeats)
        allowed = n * (gap / z) ** 2 - between_var
        if allowed > 0:
            required_repeats = math.ceil(within_var / allowed)
    return SampleSize(
        n_scenarios=n,
        mean_repeats=mean_repeats,
        sd_delta=sd,
        within_sd=math.sqrt(within_var) if within_var is not None else None,
        mde=mde,
        required_scenarios=required_scenarios,
        required_repeats=required_repeats,
    )
