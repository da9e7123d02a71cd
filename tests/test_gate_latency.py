"""Latency intervals that hold their level, and latency checks that fire on a slow candidate.

Turns are lognormal with a scenario effect (shared by both policies: they ran the same scenario
under the same load), a session effect and a turn effect, so the true P95 is known in closed
form: exp(mu + z_0.95 * sqrt(sv^2 + ss^2 + st^2)). 48 sessions = 24 scenarios x 2 runs.
"""

import math

import numpy as np
import pytest

from pipecat_rl.gate.latency import (
    compare_quantiles,
    compare_ratio,
    paired_replicates,
    woodruff_interval,
)
from pipecat_rl.gate.verdict import llm_ratio_check, p95_budget_check
from pipecat_rl.scoring import quantile

Z95 = 1.6448536269514722
EFFECTS = (0.3, 0.3, 0.5)  # scenario, session, turn (log-scale SDs)


def _arm(rng, scenario_effect, mu, runs, turns, effects=EFFECTS):
    _, session_sd, turn_sd = effects
    return [
        [
            np.exp(mu + v + rng.normal(0, session_sd) + rng.normal(0, turn_sd, turns)).tolist()
            for _ in range(runs)
        ]
        for v in scenario_effect
    ]


def _true_quantile(mu, z, effects=EFFECTS):
    return math.exp(mu + z * math.sqrt(sum(e**2 for e in effects)))


def test_woodruff_hand_computed():
    clusters = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]
    i = woodruff_interval(clusters, q=0.5)
    assert i.estimate == 4.0 and (i.clusters, i.turns) == (2, 8)
    # F(4) = 4/8; the clusters hold 4 and 0 of their 4 turns at or below it: se = 0.5
    half = 12.7062 * 0.5  # t_{0.975, 1}
    assert not i.bounded and i.low == quantile(sum(clusters, []), max(0.5 - half, 0.0))
    assert woodruff_interval([[1.0, 2.0]], q=0.5) is None


def test_woodruff_p95_covers_and_the_budget_rarely_passes_when_the_p95_is_over_it():
    rng = np.random.default_rng(0)
    mu = math.log(800)
    true_p95 = _true_quantile(mu, Z95)
    trials, covered, passed = 4000, 0, 0
    for _ in range(trials):
        sessions = _arm(rng, rng.normal(0, EFFECTS[0], 24), mu, runs=2, turns=4)
        interval = woodruff_interval([[v for s in c for v in s] for c in sessions])
        covered += interval.low <= true_p95 <= interval.high
        # a budget set exactly at the true P95: passing it is a false pass
        passed += p95_budget_check(interval, true_p95, require=True).status == "pass"
    # Monte-Carlo SE with 4000 trials: 0.36 points at 95%, 0.25 at 2.5%.
    assert covered / trials >= 0.93, covered / trials
    assert passed / trials <= 0.035, passed / trials


def test_the_p95_budget_cannot_pass_on_too_few_turns():
    rng = np.random.default_rng(1)
    sessions = _arm(rng, rng.normal(0, 0.3, 3), math.log(800), runs=1, turns=3)
    interval = woodruff_interval([[v for s in c for v in s] for c in sessions])
    assert not interval.bounded
    check = p95_budget_check(interval, 1e9, require=True)
    assert check.status == "uncertain" and "too few turns" in check.detail


def test_paired_replicates_equal_a_direct_loop_over_the_same_draws():
    rng = np.random.default_rng(3)
    cand = [rng.gamma(4, 200, size=rng.integers(1, 6)).tolist() for _ in range(15)]
    inc = [rng.gamma(4, 180, size=rng.integers(1, 6)).tolist() for _ in range(15)]
    reps_c, reps_i = paired_replicates(cand, inc, q=0.95, resamples=300, seed=4)
    idx = np.random.default_rng(4).integers(0, 15, size=(300, 15))
    for b, row in enumerate(idx):  # the same scenarios drawn for both policies
        assert reps_c[b] == quantile(np.concatenate([cand[j] for j in row]), 0.95)
        assert reps_i[b] == quantile(np.concatenate([inc[j] for j in row]), 0.95)


def test_the_paired_difference_covers_and_pairing_narrows_it():
    rng = np.random.default_rng(2)
    mu_c, mu_i = math.log(900), math.log(800)
    true_diff = _true_quantile(mu_c, Z95) - _true_quantile(mu_i, Z95)
    trials, covered, widths = 500, 0, []
    for t in range(trials):
        v = rng.normal(0, EFFECTS[0], 24)
        cmp = compare_quantiles(
            _arm(rng, v, mu_c, 2, 4), _arm(rng, v, mu_i, 2, 4), resamples=500, seed=t
        )
        covered += cmp.difference.low <= true_diff <= cmp.difference.high
        widths.append(cmp.difference.high - cmp.difference.low)
    assert covered / trials >= 0.93, covered / trials  # MC SE 1 point
    # Resampling the two policies apart ignores the shared scenario effect: a wider interval.
    v = rng.normal(0, 0.6, 24)
    cand = [[x for s in c for x in s] for c in _arm(rng, v, mu_c, 2, 4)]
    inc = [[x for s in c for x in s] for c in _arm(rng, v, mu_i, 2, 4)]
    paired = np.subtract(*paired_replicates(cand, inc, q=0.95, resamples=2000, seed=0))
    apart = (
        paired_replicates(cand, cand, q=0.95, resamples=2000, seed=1)[0]
        - paired_replicates(inc, inc, q=0.95, resamples=2000, seed=2)[0]
    )
    assert np.std(paired) < 0.8 * np.std(apart)


def _ratio_statuses(factor, trials=300, effects=(0.3, 0.5, 1.5), turns=2, seed=0):
    """llm_ttft_ratio statuses for a candidate `factor` times slower (spread like the cycle's)."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(trials):
        v = rng.normal(0, effects[0], 24)
        cand = _arm(rng, v, math.log(568 * factor), 2, turns, effects)
        inc = _arm(rng, v, math.log(568), 2, turns, effects)
        ratio = compare_ratio("llm_ttft_ms", cand, inc, resamples=2000, seed=t)
        out.append(llm_ratio_check("llm_ttft_ms", ratio, 3.0, require=True).status)
    return np.array(out)


def test_the_default_llm_ratio_lets_noise_pass_and_fails_a_ten_times_slower_candidate():
    # Turns as spread as the committed cycle's (P95 / P50 ~ 14 on a busy 2-core server).
    same = _ratio_statuses(1.0)
    assert np.mean(same == "fail") == 0.0 and np.mean(same == "pass") >= 0.9
    slow = _ratio_statuses(10.0)
    assert np.mean(slow == "fail") >= 0.95


def test_a_ratio_check_says_what_to_do_in_words():
    rng = np.random.default_rng(7)
    v = rng.normal(0, 0.2, 24)
    cand = _arm(rng, v, math.log(5457), 2, 3, (0.2, 0.2, 0.3))
    inc = _arm(rng, v, math.log(568), 2, 3, (0.2, 0.2, 0.3))
    check = llm_ratio_check("llm_ttft_ms", compare_ratio("llm_ttft_ms", cand, inc,
                            resamples=10_000, seed=0), 3.0, require=True)  # fmt: skip
    assert check.status == "fail"
    assert "The candidate's P50 LLM TTFT per call is 9." in check.detail
    assert "above the 3.0x limit" in check.detail and "before promoting" in check.detail


@pytest.mark.parametrize("require", [True, False])
def test_a_missing_llm_stage_is_uncertain_only_when_required(require):
    check = llm_ratio_check("llm_turn_ms", None, 3.0, require=require)
    assert check.status == ("uncertain" if require else "unavailable")
    assert "LLM time per call" in check.detail
