"""Regression tests that can fire: exact discordant-pair tests, Holm, and refused designs.

Hand cases pin the arithmetic; seeded Monte Carlo pins the error rates at the repeats the tests
are allowed to run at (identical arms never confirm more often than the family level), and
planted regressions show each kind of test firing where it can.
"""

import itertools
import math

import numpy as np
import pytest

from pipecat_rl.errors import ConfigError
from pipecat_rl.gate.config import GateConfig
from pipecat_rl.gate.operating import draw_runs, identical, scenario_ids
from pipecat_rl.gate.regressions import (
    check_design,
    discordant,
    family_tests,
    losses_to_confirm,
    membership,
    regression_family,
)
from pipecat_rl.gate.stats import binomial_tail, binomial_upper_bound, holm

SCENARIOS_ONLY = GateConfig(regression_tests=("scenarios",))
GROUPS = {"even": ("s*[02468]",), "odd": ("s*[13579]",)}


def test_binomial_tail_matches_the_exact_sum():
    for n in range(0, 13):
        for k in range(-1, n + 2):
            exact = sum(math.comb(n, j) for j in range(max(k, 0), n + 1)) / 2**n
            assert binomial_tail(np.array(k), np.array(n)) == pytest.approx(exact, abs=1e-12)
    assert binomial_tail(np.array([9]), np.array([9]))[0] == pytest.approx(2**-9)
    assert binomial_tail(np.array([300]), np.array([400]))[0] < 1e-20


def test_holm_hand_case_and_its_family_wise_error():
    adjusted, rejected = holm(np.array([0.01, 0.04, 0.03, 0.5]), 0.05)
    assert adjusted.tolist() == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert rejected.tolist() == [True, False, False, False]
    p = np.random.default_rng(0).random((20_000, 10))  # ten true nulls, independent
    assert np.mean(holm(p, 0.05)[1].any(axis=1)) <= 0.05 + 0.005


def test_the_upper_bound_on_a_rate():
    assert binomial_upper_bound(0, 28) == pytest.approx(1 - 0.05 ** (1 / 28), rel=1e-6)
    upper = binomial_upper_bound(2, 40)
    tail = sum(math.comb(40, k) * upper**k * (1 - upper) ** (40 - k) for k in range(3))
    assert tail == pytest.approx(0.05, abs=1e-6)
    assert binomial_upper_bound(0, 0) is None and binomial_upper_bound(5, 5) == 1.0


def test_only_discordant_runs_count_beyond_the_band():
    cand = np.array([[1.0, 0.0, 1.0, 0.5], [0.0, 0.0, 0.0, 0.97]])
    inc = np.array([[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 1.0]])
    worse, better = discordant(cand, inc, band=0.05)
    assert worse.tolist() == [1, 1] and better.tolist() == [2, 0]


def test_the_fewest_losses_a_family_can_confirm():
    assert losses_to_confirm(1, 0.05) == 5  # 2^-5 = 0.031 <= 0.05 < 2^-4
    assert losses_to_confirm(24, 0.05) == 9  # 2^-9 = 0.00195 <= 0.00208
    assert losses_to_confirm(25, 0.05) == 9
    for m, alpha in itertools.product((1, 5, 24, 100), (0.01, 0.05, 0.2)):
        w = losses_to_confirm(m, alpha)
        assert 2.0**-w <= alpha / m < 2.0 ** -(w - 1)


def test_a_per_scenario_test_the_repeats_cannot_fire_is_refused_naming_the_repeats():
    ids = scenario_ids(24)
    with pytest.raises(ConfigError, match=r"at least 9 repeats") as e:
        check_design(SCENARIOS_ONLY, ids, repeats=2)
    assert "2^-2" in str(e.value) and "regression_tests" in str(e.value)
    assert len(check_design(SCENARIOS_ONLY, ids, repeats=9)) == 24
    groups = GateConfig(regression_tests=("groups",), regression_groups={"few": ("s00",)})
    with pytest.raises(ConfigError, match=r"group 'few'.*merge small groups"):
        check_design(groups, ids, repeats=2)


def test_the_default_pooled_test_on_a_tiny_gate_is_untested_not_refused():
    ids = scenario_ids(2)
    assert check_design(GateConfig(), ids, repeats=1) == []
    (test,) = regression_family([2, 0], [0, 0], [1, 1], ids, GateConfig())
    assert not test.tested and not test.confirmed and test.adjusted_p is None
    with pytest.raises(ConfigError, match="pooled"):
        check_design(GateConfig(regression_tests=("pooled",)), ids, repeats=1)


def test_groups_must_match_and_must_not_overlap():
    ids = ["book-a", "book-b", "cancel-a"]
    config = GateConfig(regression_tests=("groups",), regression_groups={"x": ("nothing*",)})
    with pytest.raises(ConfigError, match="matches none"):
        check_design(config, ids, repeats=8)
    config = GateConfig(
        regression_tests=("groups",), regression_groups={"a": ("book*",), "b": ("*-a",)}
    )
    with pytest.raises(ConfigError, match="'book-a' is in regression groups 'a' and 'b'"):
        check_design(config, ids, repeats=8)


def test_groups_and_their_test_go_together_in_the_config():
    with pytest.raises(ValueError, match="regression_groups names none"):
        GateConfig(regression_tests=("groups",))
    with pytest.raises(ValueError, match="does not name `groups`"):
        GateConfig(regression_groups={"a": ("x*",)})


def _false_confirmations(config, model, n, repeats, trials=4000, seed=0):
    rng = np.random.default_rng(seed)
    ids = scenario_ids(n)
    family = check_design(config, ids, repeats)
    cand, inc = draw_runs(*identical(model, rng, trials, n), repeats, rng)
    worse, better = discordant(cand, inc, config.tie_band)
    confirmed = family_tests(worse, better, membership(family, n), config.regression_alpha)[-1]
    return float(np.mean(confirmed.any(axis=1)))


@pytest.mark.parametrize("model", ["spread", "bimodal"])
@pytest.mark.parametrize(
    ("config", "n", "repeats"),
    [
        (GateConfig(), 8, 2),
        (GateConfig(), 24, 8),
        (GateConfig(regression_tests=("pooled", "groups"), regression_groups=GROUPS), 24, 2),
        (GateConfig(regression_tests=("scenarios",)), 24, 9),
    ],
    ids=["pooled-8x2", "pooled-24x8", "groups-24x2", "scenarios-24x9"],
)
def test_identical_arms_confirm_a_regression_at_most_alpha_of_the_time(config, n, repeats, model):
    # 4000 trials: Monte-Carlo SE of a 5% rate is 0.35 points.
    assert _false_confirmations(config, model, n, repeats) <= config.regression_alpha + 0.01


def test_each_kind_of_test_fires_on_the_loss_it_can_see():
    ids = scenario_ids(24)
    pairs = [9] * 24
    # Two scenarios lose all nine runs; every other scenario wins two.
    worse, better = [9, 9] + [0] * 22, [0, 0] + [2] * 22
    tests = regression_family(worse, better, pairs, ids, SCENARIOS_ONLY)
    assert [t.unit for t in tests if t.confirmed] == ["s00", "s01"]
    assert tests[0].p_value == pytest.approx(2**-9) and tests[0].fewest_losses == 9
    pooled = regression_family(worse, better, pairs, ids, GateConfig())
    assert not pooled[0].confirmed  # the pooled test sees a net gain: it cannot see these two
    # A whole group lost at two repeats is seen by the group test.
    grouped = GateConfig(regression_tests=("groups",), regression_groups=GROUPS)
    worse = [2 if i % 2 == 0 else 0 for i in range(24)]
    better = [0 if i % 2 == 0 else 1 for i in range(24)]
    tests = regression_family(worse, better, [2] * 24, ids, grouped)
    assert [(t.unit, t.confirmed) for t in tests] == [("even", True), ("odd", False)]


def test_the_clinic_s_groups_cover_its_heldout_set_and_fire_at_its_repeats():
    from pathlib import Path

    from pipecat_rl.gate.config import load_gate_config
    from pipecat_rl.gate.regressions import group_members
    from pipecat_rl.loop.config import load_loop_config
    from pipecat_rl.scenarios import load_scenarios
    from pipecat_rl.scenarios.sampling import stratified_sample

    clinic = Path(__file__).resolve().parents[1] / "examples" / "clinic"
    config = load_gate_config(clinic / "gate.yaml")
    loop = load_loop_config(clinic / "loop.yaml")
    heldout = load_scenarios([loop.heldout])
    sample = stratified_sample(heldout, loop.heldout_sample.size, by=loop.heldout_sample.by)
    for gated in (heldout, sample):  # loop-full.yaml's and the main job's
        ids = [s.id for s in gated]
        members = group_members(config.regression_groups, ids)
        partition = sorted(i for m in members.values() for i in m)
        assert partition == list(range(len(ids)))
        fire = check_design(config, ids, repeats=loop.gate.repeats)
        assert len(fire) == 1 + len(members)  # every group can fire
    assert config.require_latency and config.max_llm_latency_ratio == 3.0
