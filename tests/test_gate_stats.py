"""The gate's statistics against hand-computed cases and direct implementations."""

import itertools
import math
import random
from statistics import NormalDist

import numpy as np
import pytest

from pipecat_rl.gate.config import PriceTable
from pipecat_rl.gate.cost import Usage, call_cost, cost_summary
from pipecat_rl.gate.latency import (
    StageQuantiles,
    attribute_regression,
    cdf_points,
    compare_quantiles,
    compare_ratio,
    stage_quantiles,
)
from pipecat_rl.gate.stats import (
    EXACT_FLIPS_MAX_N,
    cluster_bootstrap,
    sample_size,
    scenario_deltas,
    sign_flip_p,
    sign_flip_test,
    win_loss_tie,
)
from pipecat_rl.scoring import pass_hat_k, pass_k_curve, quantile

# --- paired reward ---------------------------------------------------------------------------


def test_scenario_deltas_are_mean_paired_differences():
    diffs = [[1.0, 0.0, 0.0, 1.0], [-1.0, 0.0], [0.5]]
    assert scenario_deltas(diffs).tolist() == [0.5, -0.5, 0.5]


def test_cluster_bootstrap_of_identical_arms_is_zero():
    ci = cluster_bootstrap([0.0] * 12, resamples=10_000, seed=3)
    assert (ci.estimate, ci.low, ci.high) == (0.0, 0.0, 0.0)


def test_cluster_bootstrap_is_seeded():
    deltas = np.random.default_rng(1).normal(0.1, 0.3, size=20)
    a = cluster_bootstrap(deltas, resamples=10_000, seed=7)
    b = cluster_bootstrap(deltas, resamples=10_000, seed=7)
    c = cluster_bootstrap(deltas, resamples=10_000, seed=8)
    assert a == b
    assert (a.low, a.high) != (c.low, c.high)


def _direct_bootstrap(deltas: list[float], resamples: int, seed: int) -> tuple[float, float]:
    """The textbook loop, with its own random source: resample scenarios, average, sort."""
    rnd = random.Random(seed)
    n = len(deltas)
    means = sorted(sum(rnd.choice(deltas) for _ in range(n)) / n for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def test_cluster_bootstrap_matches_a_direct_implementation_within_monte_carlo_error():
    deltas = np.random.default_rng(5).normal(0.05, 0.25, size=24).tolist()
    ci = cluster_bootstrap(deltas, resamples=20_000, seed=0)
    low, high = _direct_bootstrap(deltas, 20_000, seed=1)
    # Monte-Carlo SE of a 2.5% quantile of 20k resamples is ~0.1 * SE(mean); allow 4x that.
    se = np.std(deltas, ddof=1) / math.sqrt(len(deltas))
    assert abs(ci.low - low) < 0.4 * se
    assert abs(ci.high - high) < 0.4 * se
    assert ci.estimate == pytest.approx(np.mean(deltas))
    # And the interval has the normal-theory width, to first order.
    assert (ci.high - ci.low) == pytest.approx(2 * 1.96 * se * math.sqrt(23 / 24), rel=0.1)


def test_cluster_bootstrap_covers_a_known_mean():
    rng = np.random.default_rng(1)
    trials = 300
    covered = 0
    for t in range(trials):
        deltas = rng.normal(0.1, 0.3, size=24)
        ci = cluster_bootstrap(deltas, resamples=2000, seed=t)
        covered += ci.low <= 0.1 <= ci.high
    # The percentile bootstrap runs slightly narrow at n = 24 (about 93%).
    assert 0.88 <= covered / trials <= 0.99


def test_win_loss_tie_with_the_band_inclusive():
    wlt = win_loss_tie([0.3, 0.05, -0.05, -0.051, 0.0, 0.051], tie_band=0.05)
    assert (wlt.wins, wlt.losses, wlt.ties) == (2, 1, 3)


def test_pass_hat_k_hand_cases():
    assert pass_hat_k(3, 4, 2) == pytest.approx(3 / 6)
    assert pass_hat_k(4, 4, 4) == 1.0
    assert pass_hat_k(3, 4, 4) == 0.0
    assert pass_hat_k(2, 8, 1) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        pass_hat_k(2, 3, 4)


def test_pass_hat_k_equals_the_fraction_of_all_passing_k_subsets():
    runs = [True, False, True, True, False, True, True]
    for k in range(1, len(runs) + 1):
        subsets = list(itertools.combinations(runs, k))
        brute = sum(all(s) for s in subsets) / len(subsets)
        assert pass_hat_k(sum(runs), len(runs), k) == pytest.approx(brute)


def test_pass_k_curve_averages_scenarios_up_to_the_fewest_runs():
    curve = pass_k_curve([(2, 2), (1, 3)])
    assert curve == pytest.approx({1: (1 + 1 / 3) / 2, 2: (1 + 0) / 2})


def test_sample_size_hand_computed():
    # Two scenarios, two repeats each: deltas 0.5 and 0.0, within-scenario differences spread.
    diffs = [[1.0, 0.0], [0.0, 0.0]]
    ss = sample_size(diffs, target=0.02)
    z, zp = NormalDist().inv_cdf(0.975), NormalDist().inv_cdf(0.8)
    sd = np.std([0.5, 0.0], ddof=1)
    assert ss.sd_delta == pytest.approx(sd)
    assert ss.mde == pytest.approx((z + zp) * sd / math.sqrt(2))
    gap = 0.25 - 0.02
    assert ss.required_scenarios == math.ceil((z * sd / gap) ** 2)
    within = (0.5 + 0.0) / 2  # var([1, 0], ddof=1) = 0.5, var([0, 0]) = 0, pooled over 2 dof
    assert ss.within_sd == pytest.approx(math.sqrt(within))
    between = max(0.0, sd**2 - within / 2)
    allowed = 2 * (gap / z) ** 2 - between
    assert ss.required_repeats == math.ceil(within / allowed)


def test_sample_size_more_repeats_cannot_beat_between_scenario_spread():
    # Scenarios differ a lot and runs within each agree: only more scenarios help.
    diffs = [[0.8] * 4, [-0.7] * 4, [0.6] * 4, [-0.5] * 4]
    ss = sample_size(diffs, target=0.02)
    assert ss.required_repeats is None
    assert ss.required_scenarios is not None and ss.required_scenarios > 4


def test_sample_size_with_one_scenario_cannot_be_estimated():
    ss = sample_size([[0.1, 0.2]], target=0.0)
    assert ss.mde is None and ss.required_scenarios is None and ss.required_repeats is None


# --- latency ---------------------------------------------------------------------------------


def test_quantile_is_the_inverted_cdf_one():
    values = list(range(1, 21))  # 1..20
    assert quantile(values, 0.95) == 19.0  # smallest x with F(x) >= 0.95
    assert quantile(values, 0.5) == 10.0
    assert stage_quantiles(values) == StageQuantiles(n=20, p50=10.0, p95=19.0)
    assert stage_quantiles([]) == StageQuantiles(n=0, p50=None, p95=None)


def test_compare_quantiles_detects_a_planted_shift_and_counts_what_it_used():
    rng = np.random.default_rng(2)
    cand = [[rng.normal(900, 100, size=4).tolist() for _ in range(2)] for _ in range(20)]
    inc = [[rng.normal(800, 100, size=4).tolist() for _ in range(2)] for _ in range(20)]
    inc[0] = [[], []]  # a scenario with no incumbent sample is left out of the comparison
    cmp = compare_quantiles(cand, inc, resamples=2000, seed=9)
    assert cmp.difference.estimate == pytest.approx(cmp.candidate.estimate - cmp.incumbent.estimate)
    assert cmp.difference.low > 0  # a planted +100 ms shift is detected
    assert (cmp.clusters, cmp.candidate_sessions, cmp.candidate_turns) == (19, 38, 152)
    assert cmp.candidate.low <= cmp.candidate.estimate <= cmp.candidate.high
    assert compare_quantiles(cand[:1], inc[1:2], resamples=100, seed=0) is None


def test_compare_ratio_estimates_a_planted_ratio():
    rng = np.random.default_rng(4)
    inc = [[rng.lognormal(np.log(500), 0.3, size=3).tolist()] for _ in range(24)]
    cand = [[[2 * x for x in s] for s in scenario] for scenario in inc]  # exactly twice as slow
    r = compare_ratio("llm_ttft_ms", cand, inc, resamples=2000, seed=0)
    assert r.ratio.estimate == pytest.approx(2.0) and (r.ratio.low, r.ratio.high) == (
        pytest.approx(2.0),
        pytest.approx(2.0),
    )
    assert r.candidate == pytest.approx(2 * r.incumbent) and r.clusters == 24


def test_sign_flip_p_values_equal_the_count_over_every_flip():
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 9):
        deltas = np.round(rng.normal(0.1, 0.5, (40, n)) * 4) / 4  # ties and exact zeros
        greater, less = sign_flip_p(deltas)
        for row, above, below in zip(deltas, greater, less, strict=True):
            sums = [np.dot(eps, row) for eps in itertools.product((-1, 1), repeat=n)]
            assert above == pytest.approx(np.mean([x >= row.sum() - 1e-9 for x in sums]))
            assert below == pytest.approx(np.mean([x <= row.sum() + 1e-9 for x in sums]))


def test_sign_flip_test_speaks_where_the_t_interval_has_no_width():
    assert sign_flip_test([0.5] * 12).p_greater == pytest.approx(2**-12)
    assert sign_flip_test([0.0] * 12).p_two_sided == 1.0
    big = sign_flip_test(np.random.default_rng(1).normal(0, 1, EXACT_FLIPS_MAX_N + 1))
    assert big.method == "monte_carlo" and 0 < big.p_two_sided <= 1
    assert sign_flip_test([1.0, -1.0, 0.5]).method == "exact"


def test_attribution_names_the_stage_whose_p95_grew_most():
    def q(p95):
        return StageQuantiles(n=10, p50=p95 / 2, p95=p95)

    cand = {"stt_ms": q(200), "llm_ttft_ms": q(700), "tts_ttfb_ms": q(150)}
    inc = {"stt_ms": q(190), "llm_ttft_ms": q(400), "tts_ttfb_ms": q(160)}
    assert attribute_regression(cand, inc) == "llm_ttft_ms"
    assert attribute_regression(inc, cand) == "tts_ttfb_ms"
    assert attribute_regression(inc, inc) is None


def test_cdf_points_span_min_to_max():
    points = cdf_points([5.0, 1.0, 3.0], points=5)
    assert points[0] == 1.0 and points[-1] == 5.0 and points == sorted(points)
    assert cdf_points([]) == []


# --- cost ------------------------------------------------------------------------------------


def test_call_cost_hand_computed():
    prices = PriceTable(
        llm_input_usd_per_mtok=1.0,
        llm_output_usd_per_mtok=4.0,
        stt_usd_per_min=0.01,
        tts_usd_per_min=0.06,
    )
    usage = Usage(prompt_tokens=2_000, completion_tokens=500, stt_seconds=120, tts_seconds=30)
    assert call_cost(usage, prices) == pytest.approx(0.002 + 0.002 + 0.02 + 0.03)


def test_cost_per_success_shows_a_policy_that_talks_more():
    prices = PriceTable()
    terse = [Usage(prompt_tokens=1000, completion_tokens=50, tts_seconds=10)] * 4
    chatty = [Usage(prompt_tokens=1000, completion_tokens=400, tts_seconds=80)] * 4
    a, b = cost_summary(terse, 2, prices), cost_summary(chatty, 3, prices)
    assert b.per_call_usd > a.per_call_usd
    assert a.per_success_usd == pytest.approx(a.total_usd / 2)
    assert b.mean_completion_tokens == 400
    assert cost_summary(terse, 0, prices).per_success_usd is None
