"""Operating characteristics of the gate's reward decision, where users are: 8 and 24 scenarios,
2 and 8 repeats, pass rates spread over [0, 1] or bimodal like the clinic's.

Seeded Monte Carlo through `gate.operating.reward_decisions`, which is first held to `evaluate`
on the same runs. Identical arms: 20,000 trials (Monte-Carlo SE ~0.11 points at 2.5%, ~0.15 at
5%); effects: 4,000 trials (SE <= 0.8 points). Bounds allow three Monte-Carlo SEs.
"""

import math

import numpy as np
import pytest

from pipecat_rl.errors import ConfigError
from pipecat_rl.gate import GateConfig, GateData, InputSource, RunResult, evaluate
from pipecat_rl.gate.lineage import unknown_lineage
from pipecat_rl.gate.operating import (
    DECISIONS,
    broken,
    draw_runs,
    identical,
    interval_clears,
    rates,
    reward_decisions,
    scenario_ids,
    shifted,
)

SIZES = [(8, 2), (8, 8), (24, 2), (24, 8)]
MODELS = ["spread", "bimodal"]
CONFIG = GateConfig()


def _mc(rate: float, trials: int) -> float:
    return 3 * math.sqrt(max(rate * (1 - rate), 1e-4) / trials)


def _runs(cand: np.ndarray, inc: np.ndarray) -> GateData:
    runs = tuple(
        RunResult(scenario=sid, policy=policy, run=r, reward=float(x[s, r]), seed=r)
        for s, sid in enumerate(scenario_ids(cand.shape[0]))
        for r in range(cand.shape[1])
        for policy, x in (("cand", cand), ("inc", inc))
    )
    return GateData("cand", "inc", runs, InputSource(kind="scores", path="mc"))


@pytest.mark.parametrize(
    "config",
    [CONFIG, GateConfig(regression_tests=("pooled", "scenarios")), GateConfig(min_delta=-0.1)],
    ids=["default", "per-scenario", "non-inferiority"],
)
def test_the_vectorised_decision_is_the_gate_s_decision(config):
    rng = np.random.default_rng(5)
    cand, inc = [], []
    for effect in (0.0, 0.3, -0.3):
        p_cand, p_inc = shifted("spread", rng, 10, 12, abs(effect))
        if effect < 0:
            p_cand, p_inc = p_inc, p_cand
        c, i = draw_runs(p_cand, p_inc, 10, rng)
        cand.append(c)
        inc.append(i)
    c, i = draw_runs(*broken("bimodal", rng, 10, 12, broken=2, gaining=8, gain=0.4), 10, rng)
    cand, inc = np.concatenate([*cand, c]), np.concatenate([*inc, i])
    cand[0], inc[0] = 1.0, 0.0  # zero width, every run won
    cand[1], inc[1] = 0.0, 0.0  # zero width, nothing differs
    decisions = reward_decisions(cand, inc, config)
    settings = config.model_copy(update={"require_latency": False})
    for t in range(len(cand)):
        receipt = evaluate(
            _runs(cand[t], inc[t]), settings, unknown_lineage("cand", "cand", "mc"),
            unknown_lineage("inc", "inc", "mc"),
        )  # fmt: skip
        assert receipt.verdict == DECISIONS[decisions[t]], (t, receipt.reason)
    assert set(decisions.tolist()) == {0, 1, 2}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("n", "repeats"), SIZES)
def test_identical_arms_rarely_promote_or_reject(model, n, repeats):
    rng = np.random.default_rng(1000 * n + repeats)
    cand, inc = draw_runs(*identical(model, rng, 20_000, n), repeats, rng)
    r = rates(reward_decisions(cand, inc, CONFIG))
    assert r["PROMOTE"] <= 0.025 + _mc(0.025, 20_000), r
    assert r["REJECT"] <= 0.05 + _mc(0.05, 20_000), r


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("n", "repeats"), SIZES)
def test_a_real_gain_promotes_as_often_as_the_interval_alone_allows(model, n, repeats):
    """The other checks may cost at most a tenth of the interval's power."""
    rng = np.random.default_rng(2000 * n + repeats)
    cand, inc = draw_runs(*shifted(model, rng, 4000, n, 0.3), repeats, rng)
    promote = rates(reward_decisions(cand, inc, CONFIG))["PROMOTE"]
    clears = float(np.mean(interval_clears(cand, inc, CONFIG)))
    assert promote >= 0.9 * clears - _mc(clears, 4000), (promote, clears)
    assert clears > 0.3  # the comparison means something: the interval has power here


def _broken_promote_rate(model, repeats, gaining, config, trials=4000):
    rng = np.random.default_rng(repeats + 100 * gaining)
    p = broken(model, rng, trials, 24, broken=2, gaining=gaining, gain=0.4)
    cand, inc = draw_runs(*p, repeats, rng)
    return rates(reward_decisions(cand, inc, config))["PROMOTE"]


@pytest.mark.parametrize("model", MODELS)
def test_two_scenarios_broken_while_twelve_gain_does_not_promote(model):
    """The benchmark reports this by K; the smallest K at which P(PROMOTE) <= 10% is 2."""
    for repeats in (2, 8):
        assert _broken_promote_rate(model, repeats, 12, CONFIG) <= 0.10


@pytest.mark.parametrize("model", MODELS)
def test_two_scenarios_broken_while_the_rest_gain_needs_per_scenario_tests(model):
    """Better on average, broken outright on two: the pooled test cannot see it, nine repeats
    of per-scenario tests can, and fewer are refused."""
    per_scenario = GateConfig(regression_tests=("pooled", "scenarios"))
    assert _broken_promote_rate(model, 9, 22, CONFIG) > 0.9
    assert _broken_promote_rate(model, 9, 22, per_scenario) <= 0.01
    with pytest.raises(ConfigError, match="at least 9 repeats"):
        _broken_promote_rate(model, 8, 22, per_scenario, trials=10)
