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
- `sign_flip_p` / `sign_flip_test`: the exact sign-flip test of "no difference" over scenario
  deltas, reported next to the t interval; it needs no variance, so it is what decides when every
  delta is equal and the interval has no width.
- `binomial_tail`, `holm`: the exact discordant-pair tests of `gate.regressions` and their
  family-wise control; `binomial_upper_bound`: the upper bound on an unsafe-write rate.
- `win_loss_tie`: delta_s > band is a win, < -band a loss, otherwise a tie.
- `sample_size`: the minimum detectable effect at the current size, and the scenarios or
  repeats that would shrink the interval enough to decide (formulas on the function).
"""

import functools
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


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (bisection on `t_cdf`).

    Cached: the gate asks for the same few (level, df) pairs thousands of times in a simulation.
    """
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


EXACT_FLIPS_MAX_N = 40
"""Up to this many scenarios the sign-flip p-value is exact (two halves of 2^20 sums at most);
above it, it is a seeded Monte-Carlo estimate over `MONTE_CARLO_FLIPS` random flips."""

MONTE_CARLO_FLIPS = 200_000

_FLIP_CELLS = 4_000_000
"""Rows x half-sums processed at once by `sign_flip_p`: bounds its memory to tens of MB."""


class SignFlip(Result):
    """The sign-flip test of "no difference" over scenario deltas, beside the t interval.

    With identical arms each scenario's delta is as likely to be d as -d, so under that null the
    2^n sign flips of the deltas are equally likely; the p-values count the flips whose sum is at
    least (or at most) the observed one. It needs no variance, so it still speaks when every
    delta is equal and the t interval has no width.
    """

    p_greater: float
    """P(flipped sum >= observed): small means the candidate is better."""
    p_less: float
    """P(flipped sum <= observed): small means the candidate is worse."""
    p_two_sided: float
    method: Literal["exact", "monte_carlo"]
    flips: int
    """2^n when exact, else the number of random flips."""


def _subset_sums(values: np.ndarray) -> np.ndarray:
    """All 2^m subset sums of each row of `values` (rows x m -> rows x 2^m)."""
    sums = np.zeros((values.shape[0], 1))
    for j in range(values.shape[1]):
        sums = np.concatenate([sums, sums + values[:, j : j + 1]], axis=1)
    return sums


def _pairs_at_most(a: np.ndarray, b_sorted: np.ndarray, bound: float, side: str) -> np.ndarray:
    """Per row, how many (x in a, y in b) have x + y <= bound ('right') or < bound ('left').

    One searchsorted over all rows at once: row r's values are offset by r * span, with span
    larger than any difference of sums, so rows never interleave.
    """
    rows = a.shape[0]
    span = 2.0 * (np.abs(a).max() + np.abs(b_sorted).max() + abs(bound)) + 1.0
    offset = (np.arange(rows) * span)[:, None]
    found = np.searchsorted((b_sorted + offset).ravel(), (bound - a + offset).ravel(), side=side)
    return (found.reshape(rows, -1) - (np.arange(rows) * b_sorted.shape[1])[:, None]).sum(axis=1)


def sign_flip_p(deltas: np.ndarray, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """P(T >= t) and P(T <= t) for T = sum_i eps_i d_i over sign flips, along the last axis.

    T >= t exactly when the flipped deltas sum to <= 0, so the exact p-values count subsets by
    their sums: the deltas split in two halves, every subset sum of each half is listed, and the
    pairs are counted with one sorted search (2^(n/2) work instead of 2^n). Sums within 1e-9 of
    the boundary count as equal. Above `EXACT_FLIPS_MAX_N` scenarios: `MONTE_CARLO_FLIPS` seeded
    random flips, p = (1 + hits) / (1 + flips).
    """
    values = np.asarray(deltas, dtype=float)
    lead, n = values.shape[:-1], values.shape[-1]
    rows = values.reshape(-1, n)
    tol = 1e-9 * max(1, n)
    greater, less = np.empty(rows.shape[0]), np.empty(rows.shape[0])
    if n > EXACT_FLIPS_MAX_N:
        rng = np.random.default_rng(seed)
        observed = rows.sum(axis=1)
        hits_g, hits_l = np.zeros(rows.shape[0]), np.zeros(rows.shape[0])
        for start in range(0, MONTE_CARLO_FLIPS, 10_000):
            eps = rng.choice((-1.0, 1.0), size=(min(10_000, MONTE_CARLO_FLIPS - start), n))
            flipped = rows @ eps.T
            hits_g += (flipped >= observed[:, None] - tol).sum(axis=1)
            hits_l += (flipped <= observed[:, None] + tol).sum(axis=1)
        greater[:], less[:] = (
            (1 + hits_g) / (1 + MONTE_CARLO_FLIPS),
            (1 + hits_l) / (1 + MONTE_CARLO_FLIPS),
        )
        return greater.reshape(lead), less.reshape(lead)
    half = n // 2
    chunk = max(1, _FLIP_CELLS // 2 ** (n - half))
    total = 2.0**n
    for start in range(0, rows.shape[0], chunk):
        part = rows[start : start + chunk]
        a = _subset_sums(part[:, :half])
        b = np.sort(_subset_sums(part[:, half:]), axis=1)
        greater[start : start + chunk] = _pairs_at_most(a, b, tol, "right") / total
        # T <= t exactly when the flipped deltas sum to >= 0: all pairs minus those below -tol.
        below = _pairs_at_most(a, b, -tol, "left")
        less[start : start + chunk] = (a.shape[1] * b.shape[1] - below) / total
    return greater.reshape(lead), less.reshape(lead)


def sign_flip_test(deltas: Sequence[float], *, seed: int = 0) -> SignFlip:
    """The sign-flip test of one set of scenario deltas (see `sign_flip_p`)."""
    values = np.asarray(deltas, dtype=float)
    greater, less = (float(x) for x in sign_flip_p(values, seed=seed))
    exact = values.size <= EXACT_FLIPS_MAX_N
    return SignFlip(
        p_greater=greater, p_less=less, p_two_sided=min(1.0, 2 * min(greater, less)),
        method="exact" if exact else "monte_carlo",
        flips=2**values.size if exact else MONTE_CARLO_FLIPS,
    )  # fmt: skip


def binomial_tail(successes: np.ndarray, trials: np.ndarray) -> np.ndarray:
    """P(Binomial(trials, 1/2) >= successes), elementwise (1 when successes <= 0).

    Each distinct `trials` gets its row of log binomial coefficients by a cumulative sum of
    log((N - j + 1) / j), so no factorial is ever formed.
    """
    k = np.asarray(successes, dtype=int)
    n = np.asarray(trials, dtype=int)
    shape = np.broadcast(k, n).shape
    k, n = np.broadcast_to(k, shape), np.broadcast_to(n, shape)
    out = np.where(k > n, 0.0, 1.0)
    inside = (k > 0) & (k <= n)
    for total in np.unique(n[inside]):
        j = np.arange(1, total + 1)
        log_comb = np.concatenate([[0.0], np.cumsum(np.log((total - j + 1) / j))])
        tail = np.cumsum(np.exp(log_comb - total * math.log(2))[::-1])[::-1]  # P(X >= w)
        where = inside & (n == total)
        out[where] = np.minimum(1.0, tail[k[where]])
    return out


def holm(p_values: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Holm's step-down over the last axis: adjusted p-values, and which are rejected at alpha.

    The i-th smallest of m p-values is multiplied by m - i (i from 0), the products made
    non-decreasing, and capped at 1; a hypothesis is rejected when its adjusted p <= alpha. The
    chance of rejecting any true hypothesis is at most alpha (family-wise), whatever their
    dependence.
    """
    p = np.asarray(p_values, dtype=float)
    m = p.shape[-1]
    order = np.argsort(p, axis=-1, kind="stable")
    ranked = np.take_along_axis(p, order, axis=-1) * (m - np.arange(m))
    adjusted_sorted = np.minimum(1.0, np.maximum.accumulate(ranked, axis=-1))
    adjusted = np.empty_like(adjusted_sorted)
    np.put_along_axis(adjusted, order, adjusted_sorted, axis=-1)
    return adjusted, adjusted <= alpha


def binomial_upper_bound(events: int, trials: int, level: float = 0.95) -> float | None:
    """One-sided Clopper-Pearson upper bound on a rate: the p at which P(X <= events) = 1-level.

    None without trials. With no events it is 1 - (1 - level)^(1/trials), about 3/trials.
    """
    if trials <= 0:
        return None
    if events >= trials:
        return 1.0
    target = 1.0 - level

    def cdf(p: float) -> float:
        return sum(math.comb(trials, k) * p**k * (1 - p) ** (trials - k) for k in range(events + 1))

    low, high = events / trials, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) > target else (low, mid)
    return high


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
