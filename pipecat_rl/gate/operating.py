"""Operating characteristics of the gate's reward decision: how often it PROMOTEs and REJECTs.

Seeded Monte Carlo, vectorised over trials, through the statistics and rules the gate applies to
one receipt: `reward_decisions` is the paired check (the t interval; the sign-flip test for
zero-width evidence) and the regression family (`gate.regressions`), combined by
`verdict.decision_codes`, and a test holds it to `evaluate` on the same runs. Latency, safety
and the guard are left out: the question is what the reward statistics do. Use it to choose
repeats before spending a night on them (`benchmarks/gate_decision.py` prints the table the
README shows).

Scenario models draw each held-out scenario's incumbent pass probability: `spread` (uniform on
[0, 1]) or `bimodal` (Beta(0.15, 0.15): most scenarios nearly always or nearly never pass, as the
clinic's do). Effects turn those into the candidate's:

- `identical`: the same probabilities;
- `shifted(delta)`: every scenario gains `delta` (the incumbent's probabilities are scaled into
  [0, 1 - delta] first, so every scenario can gain it);
- `broken(broken, gaining, gain)`: `broken` scenarios always pass under the incumbent and never
  under the candidate, `gaining` others gain `gain` (scaled the same way), the rest are identical.
"""

from collections.abc import Sequence
from typing import Literal

import numpy as np

from pipecat_rl.gate.config import GateConfig
from pipecat_rl.gate.regressions import check_design, discordant, family_tests, membership
from pipecat_rl.gate.stats import t_bounds
from pipecat_rl.gate.verdict import decision_codes, paired_codes

ScenarioModel = Literal["spread", "bimodal"]
DECISIONS = ("PROMOTE", "INCONCLUSIVE", "REJECT")
"""Index = the code `reward_decisions` returns."""


def pass_probabilities(model: ScenarioModel, rng: np.random.Generator, shape) -> np.ndarray:
    """Incumbent pass probabilities drawn from a scenario model."""
    if model == "spread":
        return rng.uniform(0.0, 1.0, size=shape)
    return rng.beta(0.15, 0.15, size=shape)


def identical(
    model: ScenarioModel, rng: np.random.Generator, trials: int, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Candidate and incumbent pass probabilities (trials x n): the same."""
    p = pass_probabilities(model, rng, (trials, n))
    return p, p


def shifted(
    model: ScenarioModel, rng: np.random.Generator, trials: int, n: int, delta: float
) -> tuple[np.ndarray, np.ndarray]:
    """Every scenario gains exactly `delta`."""
    inc = (1.0 - delta) * pass_probabilities(model, rng, (trials, n))
    return inc + delta, inc


def broken(
    model: ScenarioModel,
    rng: np.random.Generator,
    trials: int,
    n: int,
    *,
    broken: int,
    gaining: int,
    gain: float,
) -> tuple[np.ndarray, np.ndarray]:
    """`broken` scenarios go from always passing to never, `gaining` gain `gain`, the rest tie."""
    inc = pass_probabilities(model, rng, (trials, n))
    inc[:, broken : broken + gaining] *= 1.0 - gain
    cand = inc.copy()
    cand[:, broken : broken + gaining] += gain
    inc[:, :broken], cand[:, :broken] = 1.0, 0.0
    return cand, inc


def draw_runs(
    p_candidate: np.ndarray, p_incumbent: np.ndarray, repeats: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Pass/fail scores (trials x n x repeats) of both policies, independently per run."""
    shape = (*p_candidate.shape, repeats)
    cand = (rng.random(shape) < p_candidate[..., None]).astype(float)
    inc = (rng.random(shape) < p_incumbent[..., None]).astype(float)
    return cand, inc


def scenario_ids(n: int) -> list[str]:
    """The ids `reward_decisions` gives scenarios when none are named (groups match these)."""
    return [f"s{i:02d}" for i in range(n)]


def interval_clears(cand: np.ndarray, inc: np.ndarray, config: GateConfig) -> np.ndarray:
    """Per trial, whether the t interval alone clears `min_delta` (the power to compare with)."""
    _, low, _, _ = t_bounds((cand - inc).mean(axis=-1))
    return low > config.min_delta


def reward_decisions(
    cand: np.ndarray,
    inc: np.ndarray,
    config: GateConfig,
    ids: Sequence[str] | None = None,
) -> np.ndarray:
    """The gate's reward-side decision per trial: 0 PROMOTE, 1 INCONCLUSIVE, 2 REJECT.

    `cand` and `inc` are trials x scenarios x repeats scores.

    Raises:
        ConfigError: a configured regression test cannot fire at these repeats (as the gate).
    """
    n, repeats = cand.shape[1], cand.shape[2]
    ids = list(ids) if ids is not None else scenario_ids(n)
    family = check_design(config, ids, repeats)
    deltas = (cand - inc).mean(axis=-1)
    _, low, high, _ = t_bounds(deltas)
    zero_width = np.ptp(deltas, axis=-1) == 0
    paired = paired_codes(low, high, zero_width, n, config.min_delta)
    regressions = np.zeros_like(paired)
    if family:
        worse, better = discordant(cand, inc, config.tie_band)
        confirmed = family_tests(worse, better, membership(family, n), config.regression_alpha)[-1]
        regressions = np.where(confirmed.sum(axis=-1) > config.max_regressions, 2, 0)
    return decision_codes(np.stack([paired, regressions], axis=-1))


def rates(decisions: np.ndarray) -> dict[str, float]:
    """The share of trials with each decision."""
    return {name: float(np.mean(decisions == code)) for code, name in enumerate(DECISIONS)}
