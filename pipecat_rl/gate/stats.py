"""Paired statistics over held-out scenarios: pure functions returning frozen, typed results.

Notation. Scenario `s` has `K_s` paired runs: candidate run `r` and incumbent run `r` used the same
seed. `d[s][r] = reward_cand - reward_inc` is a paired run difference and
`delta_s = mean_r d[s][r]` is the scenario's delta (equal to mean(cand) - mean(inc) over the
paired runs). Scenarios are the unit of inference: runs of one scenario are correlated, so
intervals resample whole scenarios (a cluster bootstrap), never single runs.

- `cluster_bootstrap`: percentile interval for mean_s(delta_s), resampling scenarios with
  replacement (seeded numpy Generator, vectorised).
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
