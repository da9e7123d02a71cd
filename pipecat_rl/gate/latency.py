"""Latency quantiles with intervals that resample sessions, and per-stage attribution.

A quantile here is the inverted-CDF one (numpy `method="inverted_cdf"`): the smallest latency
such that at least a fraction q of the pooled turns are at or below it. It is always an observed
value, and it is what "P95" means in every statistic and check of the gate.

Turns of one call share its network, load and prompt length, so they are not independent: the
bootstrap resamples whole sessions (each contributing all its turns) and recomputes the pooled
quantile per resample. Candidate and incumbent are resampled independently (seeds `seed` and
`seed + 1`); the difference's interval is taken over the resample-wise differences.
"""

from collections.abc import Mapping, Sequence

import numpy as np

from pipecat_rl.gate.stats import Interval, Result

STAGES: tuple[str, ...] = ("endpointing_ms", "stt_ms", "llm_ttft_ms", "tts_ttfb_ms")
"""Pipeline stages a voice-to-voice regression is attributed to, in pipeline order."""

_CELLS_PER_CHUNK = 4_000_000
"""Resamples x turns processed at once; bounds the bootstrap's memory to tens of MB."""


class StageQuantiles(Result):
    """P50 and P95 of one stage for one policy; None when the stage was never measured."""

    n: int
    p50: float | None
    p95: float | None


class QuantileComparison(Result):
    """One quantile for both policies and their difference (candidate - incumbent)."""

    q: float
    candidate: Interval
    incumbent: Interval
    difference: Interval
    candidate_sessions: int
    incumbent_sessions: int
    candidate_turns: int
    incumbent_turns: int


def quantile(values: Sequence[float], q: float) -> float:
    """The inverted-CDF q-quantile of `values`."""
    return float(np.quantile(np.asarray(values, dtype=float), q, method="inverted_cdf"))


def _replicates(
    sessions: Sequence[Sequence[float]], q: float, resamples: int, seed: int
) -> tuple[np.ndarray, float]:
    """Bootstrap replicates of the pooled quantile (resampling sessions), and the estimate.

    A resample with session counts c_j is the pooled sample in which session j's turns appear
    c_j times, so its quantile is a weighted inverted-CDF quantile: sort all turns once, weight
    each by its session's count, and take the first turn whose cumulative weight reaches
    q * total. This is vectorised over resamples in memory-bounded chunks.
    """
    kept = [np.asarray(s, dtype=float) for s in sessions if len(s)]
    if not kept:
        raise ValueError("no session has a latency sample")
    values = np.concatenate(kept)
    owner = np.repeat(np.arange(len(kept)), [s.size for s in kept])
    order = np.argsort(values, kind="stable")
    sorted_values, sorted_owner = values[order], owner[order]
    n_sessions = len(kept)
    rng = np.random.default_rng(seed)
    chunk = max(1, _CELLS_PER_CHUNK // max(values.size, n_sessions))
    out = np.empty(resamples, dtype=float)
    for start in range(0, resamples, chunk):
        b = min(chunk, resamples - start)
        idx = rng.integers(0, n_sessions, size=(b, n_sessions))
        flat = (idx + np.arange(b)[:, None] * n_sessions).ravel()
        counts = np.bincount(flat, minlength=b * n_sessions).reshape(b, n_sessions)
        cum = np.cumsum(counts[:, sorted_owner], axis=1)
        reached = cum >= q * cum[:, -1:]
        out[start : start + b] = sorted_values[reached.argmax(axis=1)]
    return out, quantile(values, q)


def _interval(
    estimate: float, replicates: np.ndarray, level: float, resamples: int, seed: int
) -> Interval:
    alpha = 1.0 - level
    low, high = np.quantile(replicates, [alpha / 2, 1 - alpha / 2])
    return Interval(
        estimate=estimate,
        low=float(low),
        high=float(high),
        level=level,
        resamples=resamples,
        seed=seed,
    )


def session_quantile_ci(
    sessions: Sequence[Sequence[float]],
    *,
    q: float = 0.95,
    resamples: int,
    seed: int,
    level: float = 0.95,
) -> Interval:
    """The pooled q-quantile of all turns, with a percentile interval resampling sessions."""
    replicates, estimate = _replicates(sessions, q, resamples, seed)
    return _interval(estimate, replicates, level, resamples, seed)


def compare_quantiles(
    candidate: Sequence[Sequence[float]],
    incumbent: Sequence[Sequence[float]],
    *,
    q: float = 0.95,
    resamples: int,
    seed: int,
    level: float = 0.95,
) -> QuantileComparison:
    """Each policy's pooled q-quantile and candidate - incumbent, all with session intervals.

    The candidate's interval equals `session_quantile_ci(candidate, seed=seed)`, the incumbent's
    `session_quantile_ci(incumbent, seed=seed + 1)`.
    """
    cand_reps, cand_est = _replicates(candidate, q, resamples, seed)
    inc_reps, inc_est = _replicates(incumbent, q, resamples, seed + 1)
    return QuantileComparison(
        q=q,
        candidate=_interval(cand_est, cand_reps, level, resamples, seed),
        incumbent=_interval(inc_est, inc_reps, level, resamples, seed + 1),
        difference=_interval(cand_est - inc_est, cand_reps - inc_reps, level, resamples, seed),
        candidate_sessions=sum(1 for s in candidate if len(s)),
        incumbent_sessions=sum(1 for s in incumbent if len(s)),
        candidate_turns=sum(len(s) for s in candidate),
        incumbent_turns=sum(len(s) for s in incumbent),
    )


def stage_quantiles(values: Sequence[float]) -> StageQuantiles:
    """P50 and P95 of one stage's pooled samples."""
    if not len(values):
        return StageQuantiles(n=0, p50=None, p95=None)
    return StageQuantiles(n=len(values), p50=quantile(values, 0.5), p95=quantile(values, 0.95))


def attribute_regression(
    candidate: Mapping[str, StageQuantiles], incumbent: Mapping[str, StageQuantiles]
) -> str | None:
    """The stage whose P95 grew most from incumbent to candidate, or None if none grew."""
    growth = {
        stage: cand.p95 - inc.p95
        for stage in STAGES
        if (cand := candidate.get(stage)) is not None
        and (inc := incumbent.get(stage)) is not None
        and cand.p95 is not None
        and inc.p95 is not None
    }
    worst = max(growth, key=lambda s: growth[s], default=None)
    return worst if worst is not None and growth[worst] > 0 else None


def cdf_points(values: Sequence[float], points: int = 101) -> list[float]:
    """Evenly spaced inverted-CDF quantiles (0 to 1) of `values`: a compact CDF for plots."""
    if not len(values):
        return []
    grid = np.linspace(0.0, 1.0, points)
    return [float(v) for v in np.quantile(np.asarray(values, float), grid, method="inverted_cdf")]
