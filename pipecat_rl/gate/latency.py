"""Latency quantiles with intervals over scenarios, paired comparisons, per-stage attribution.

A quantile here is the inverted-CDF one (numpy `method="inverted_cdf"`): the smallest latency
such that at least a fraction q of the pooled turns are at or below it. It is always an observed
value, and it is what "P95" means in every statistic and check of the gate.

Turns of one call share its network, load and prompt; calls of one scenario share its prompts
and tools, and both policies ran every scenario under the same interleaved load. So the scenario
is the unit of resampling (a cluster), and a comparison keeps both policies' turns of a scenario
together (the pairing):

- `woodruff_interval`: one policy's quantile, with Woodruff's interval. The proportion of turns at
  or below the estimate, F(Q), is a mean over clusters with a cluster-robust standard error se;
  the interval is [F^-1(q - t se), F^-1(q + t se)] through the pooled empirical CDF, t with
  clusters - 1 degrees of freedom (the standard error never below independent turns'). Chosen by
  the coverage test (`tests/test_gate_latency.py`,
  lognormal turns with scenario and session effects, 24 scenarios x 2 sessions): the percentile
  cluster bootstrap of the P95 covers ~88% and passes a budget set at the true P95 ~10% of the
  time; Woodruff covers ~94% and passes it ~2%. When q + t se > 1 the data cannot bound the
  quantile from above (too few turns in the tail: at 24 scenarios a P95 needs about 80 turns):
  `bounded` is False, and no budget passes on it.
- `paired_replicates`: bootstrap replicates of both policies' quantiles under one resampling of
  scenarios, as weighted quantiles (a resample with scenario counts c_j is the pooled sample in
  which scenario j's turns appear c_j times), found by bisection over the sorted turns.
- `compare_quantiles`: both Woodruff intervals, and candidate - incumbent with the percentile
  interval of the paired replicates' differences (the audio gate's P95 margin).
- `compare_ratio`: candidate / incumbent of one quantile with the percentile interval of the
  paired replicates' ratios (the text gate's LLM stages).
"""

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

from pipecat_rl.gate.stats import Interval, Result, t_quantile
from pipecat_rl.scoring import P50, P95, quantile

STAGES: tuple[str, ...] = ("endpointing_ms", "stt_ms", "llm_ttft_ms", "tts_ttfb_ms")
"""Pipeline stages a voice-to-voice regression is attributed to, in pipeline order."""

LLM_MEASURES: dict[str, str] = {
    "llm_ttft_ms": "LLM TTFT per call",
    "llm_turn_ms": "LLM time per call",
}
"""What the text gate compares as candidate / incumbent ratios, and how a receipt names them:
each LLM call's time from request to its first token (`gate.inputs.llm_ttft_samples`; the
`llm_ttft_ms` stage of a caller turn also waits for its tool rounds) and to its last token."""

TtftUnit = Literal["call", "caller_turn", "mixed"]
"""What the gated LLM TTFT was measured per: each LLM call, or (runs without per-call timing,
such as a scores file with `stages_ms` only) each caller turn, or some of each."""

STAGE_LABELS: dict[str, str] = {
    "endpointing_ms": "endpointing",
    "stt_ms": "STT",
    "llm_ttft_ms": "LLM TTFT per caller turn",
    "tts_ttfb_ms": "TTS time to first byte",
}
"""How receipts name the pipeline stages: every one is per caller turn, so the LLM's first token
there waits for the turn's tool rounds (not the per-call TTFT the text gate compares)."""


def llm_label(measure: str, ttft_unit: TtftUnit | None = None) -> str:
    """The name of one of `LLM_MEASURES`, saying what the TTFT was measured per.

    `ttft_unit` None (a receipt before schema 5) reads as per call, which those receipts gated on
    wherever per-call timing was recorded.
    """
    if measure != "llm_ttft_ms" or ttft_unit in (None, "call"):
        return LLM_MEASURES[measure]
    if ttft_unit == "caller_turn":
        return "LLM TTFT per caller turn"
    return "LLM TTFT (per call where recorded, else per caller turn)"

Clusters = Sequence[Sequence[Sequence[float]]]
"""Per scenario, per session, the turns' latencies (ms)."""

_CELLS_PER_CHUNK = 4_000_000
"""Resamples x scenarios processed at once; bounds the bootstrap's memory to tens of MB."""

_FLOOR_MS = 1e-3
"""A ratio's denominator is at least this, so a 0 ms sample never makes it infinite."""


class StageQuantiles(Result):
    """P50 and P95 of one stage for one policy; None when the stage was never measured."""

    n: int
    p50: float | None
    p95: float | None


class QuantileInterval(Result):
    """One policy's quantile with its Woodruff interval over scenarios."""

    estimate: float
    low: float
    high: float
    level: float
    bounded: bool
    """False when the data cannot bound the quantile from above; `high` is then the largest
    turn, which is no bound."""
    clusters: int
    turns: int


class QuantileComparison(Result):
    """One quantile of both policies, and candidate - incumbent with a paired interval.

    Over the scenarios both policies have samples in.
    """

    q: float
    candidate: QuantileInterval
    incumbent: QuantileInterval
    difference: Interval
    clusters: int
    candidate_sessions: int
    incumbent_sessions: int
    candidate_turns: int
    incumbent_turns: int


class RatioComparison(Result):
    """Candidate / incumbent of one quantile of one measure, with a paired bootstrap interval."""

    measure: str
    q: float
    candidate: float
    incumbent: float
    ratio: Interval
    clusters: int
    candidate_turns: int
    incumbent_turns: int


def woodruff_interval(
    clusters: Sequence[Sequence[float]], *, q: float = 0.95, level: float = 0.95
) -> QuantileInterval | None:
    """The pooled q-quantile of every turn, with Woodruff's interval over clusters (see above).

    None with fewer than two clusters holding a sample. The standard error is the linearised one
    of a ratio mean, sqrt(k / (k - 1) * sum_j (y_j - p m_j)^2) / sum_j m_j, for y_j of m_j turns
    of cluster j at or below the estimate and p = sum y / sum m, never below the independent
    turns' sqrt(q (1 - q) / sum m) (turns of one call are not less alike than strangers', and
    at the sample maximum every cluster is all "below" and the clustered estimate is 0). Past
    q + t se = 1 the largest turn is no bound: `bounded` is then False.
    """
    kept = [np.asarray(c, dtype=float) for c in clusters if len(c)]
    if len(kept) < 2:
        return None
    values = np.sort(np.concatenate(kept))
    estimate = quantile(values, q)
    below = np.array([np.sum(c <= estimate) for c in kept], dtype=float)
    sizes = np.array([c.size for c in kept], dtype=float)
    k, total = len(kept), sizes.sum()
    share = below.sum() / total
    se = max(
        np.sqrt(k / (k - 1) * np.sum((below - share * sizes) ** 2)) / total,
        np.sqrt(q * (1 - q) / total),
    )
    half = t_quantile((1 + level) / 2, k - 1) * se
    low_p, high_p = q - half, q + half
    bounded = high_p <= 1.0
    return QuantileInterval(
        estimate=estimate,
        low=quantile(values, max(low_p, 0.0)),
        high=quantile(values, high_p) if bounded else float(values[-1]),
        level=level, bounded=bool(bounded), clusters=k, turns=int(total),
    )  # fmt: skip


class _Pooled:
    """One policy's turns over the scenarios, sorted once for weighted quantiles.

    `below[i, j]` counts scenario j's turns among the i + 1 smallest, so a resample with scenario
    counts c has cumulative weight c . below[i] at sorted position i.
    """

    def __init__(self, clusters: Sequence[np.ndarray]):
        values = np.concatenate(clusters)
        owner = np.repeat(np.arange(len(clusters)), [c.size for c in clusters])
        order = np.argsort(values, kind="stable")
        self.values = values[order]
        below = np.zeros((values.size, len(clusters)), dtype=np.int32)
        below[np.arange(values.size), owner[order]] = 1
        self.below = np.cumsum(below, axis=0, dtype=np.int32)
        self.sizes = np.array([c.size for c in clusters], dtype=float)

    def quantiles(self, counts: np.ndarray, q: float) -> np.ndarray:
        """Per row of scenario counts, the first sorted turn whose weight reaches q * total.

        A bisection over sorted positions (the cumulative weight only grows), about log2(turns)
        steps of rows x scenarios each, instead of a cumulative sum over every turn.
        """
        target = q * (counts @ self.sizes)
        low = np.zeros(len(counts), dtype=int)
        high = np.full(len(counts), self.values.size - 1)
        while np.any(low < high):
            mid = (low + high) // 2
            reached = np.einsum("bj,bj->b", counts, self.below[mid]) >= target
            high, low = np.where(reached, mid, high), np.where(reached, low, mid + 1)
        return self.values[low]


def paired_replicates(
    candidate: Sequence[Sequence[float]],
    incumbent: Sequence[Sequence[float]],
    *,
    q: float,
    resamples: int,
    seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap replicates of both policies' q-quantiles, resampling scenarios jointly.

    `candidate[j]` and `incumbent[j]` are scenario j's turns under each policy (both non-empty):
    a resample draws scenarios with replacement and both policies' quantiles are recomputed on
    the same draw. Vectorised over resamples in memory-bounded chunks.
    """
    cand = [np.asarray(c, dtype=float) for c in candidate]
    inc = [np.asarray(c, dtype=float) for c in incumbent]
    if not cand or len(cand) != len(inc) or any(c.size == 0 for c in cand + inc):
        raise ValueError("every scenario needs turns under both policies")
    k = len(cand)
    pooled_c, pooled_i = _Pooled(cand), _Pooled(inc)
    chunk = max(1, _CELLS_PER_CHUNK // k)
    rng = np.random.default_rng(seed)
    out_c, out_i = np.empty(resamples), np.empty(resamples)
    for start in range(0, resamples, chunk):
        b = min(chunk, resamples - start)
        idx = rng.integers(0, k, size=(b, k))
        flat = (idx + np.arange(b)[:, None] * k).ravel()
        counts = np.bincount(flat, minlength=b * k).reshape(b, k)
        out_c[start : start + b] = pooled_c.quantiles(counts, q)
        out_i[start : start + b] = pooled_i.quantiles(counts, q)
    return out_c, out_i


def _interval_ends(
    estimate: float, replicates: np.ndarray, level: float, resamples: int, seed: int
) -> Interval:
    alpha = 1.0 - level
    low, high = np.quantile(replicates, [alpha / 2, 1 - alpha / 2])
    return Interval(
        estimate=estimate, low=float(low), high=float(high), level=level, resamples=resamples,
        seed=seed,
    )  # fmt: skip


def _paired_clusters(
    candidate: Clusters, incumbent: Clusters
) -> tuple[list[np.ndarray], list[np.ndarray], int, int]:
    """The scenarios both policies have turns in: their pooled turns, and the sessions counted."""
    cand, inc, cand_sessions, inc_sessions = [], [], 0, 0
    for c_sessions, i_sessions in zip(candidate, incumbent, strict=True):
        c = np.array([v for s in c_sessions for v in s], dtype=float)
        i = np.array([v for s in i_sessions for v in s], dtype=float)
        if c.size and i.size:
            cand.append(c)
            inc.append(i)
            cand_sessions += sum(1 for s in c_sessions if len(s))
            inc_sessions += sum(1 for s in i_sessions if len(s))
    return cand, inc, cand_sessions, inc_sessions


def compare_quantiles(
    candidate: Clusters,
    incumbent: Clusters,
    *,
    q: float = 0.95,
    resamples: int,
    seed: int,
    level: float = 0.95,
) -> QuantileComparison | None:
    """Both policies' q-quantiles and candidate - incumbent, over scenarios both have turns in.

    None with fewer than two such scenarios.
    """
    cand, inc, cand_sessions, inc_sessions = _paired_clusters(candidate, incumbent)
    cand_q, inc_q = (
        woodruff_interval(cand, q=q, level=level),
        woodruff_interval(inc, q=q, level=level),
    )
    if cand_q is None or inc_q is None:
        return None
    reps_c, reps_i = paired_replicates(cand, inc, q=q, resamples=resamples, seed=seed)
    return QuantileComparison(
        q=q, candidate=cand_q, incumbent=inc_q,
        difference=_interval_ends(
            cand_q.estimate - inc_q.estimate, reps_c - reps_i, level, resamples, seed
        ),
        clusters=len(cand), candidate_sessions=cand_sessions, incumbent_sessions=inc_sessions,
        candidate_turns=cand_q.turns, incumbent_turns=inc_q.turns,
    )  # fmt: skip


def compare_ratio(
    measure: str,
    candidate: Clusters,
    incumbent: Clusters,
    *,
    q: float = 0.5,
    resamples: int,
    seed: int,
    level: float = 0.95,
) -> RatioComparison | None:
    """Candidate / incumbent of the q-quantile of `measure`, over scenarios both have turns in.

    None with fewer than two such scenarios.
    """
    cand, inc, _, _ = _paired_clusters(candidate, incumbent)
    if len(cand) < 2:
        return None
    reps_c, reps_i = paired_replicates(cand, inc, q=q, resamples=resamples, seed=seed)
    est_c, est_i = quantile(np.concatenate(cand), q), quantile(np.concatenate(inc), q)
    return RatioComparison(
        measure=measure, q=q, candidate=est_c, incumbent=est_i,
        ratio=_interval_ends(
            max(est_c, _FLOOR_MS) / max(est_i, _FLOOR_MS),
            np.maximum(reps_c, _FLOOR_MS) / np.maximum(reps_i, _FLOOR_MS), level, resamples, seed,
        ),
        clusters=len(cand), candidate_turns=sum(c.size for c in cand),
        incumbent_turns=sum(i.size for i in inc),
    )  # fmt: skip


def stage_quantiles(values: Sequence[float]) -> StageQuantiles:
    """P50 and P95 of one stage's pooled samples."""
    if not len(values):
        return StageQuantiles(n=0, p50=None, p95=None)
    return StageQuantiles(n=len(values), p50=quantile(values, P50), p95=quantile(values, P95))


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
    return [quantile(values, float(q)) for q in grid]
