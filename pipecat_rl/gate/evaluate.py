"""From `GateData` to a `GateReceipt`: pair the runs, compute every statistic, decide.

Pairing: runs are grouped by scenario (id and, when recorded, content hash, so a scenario edited
between runs never pairs with its old self), and a candidate run pairs with the incumbent run of
the same run index, seed and occurrence (a run repeated is one more pair, never a replacement).
What is paired is each run's gate score (`inputs.gate_score`: the authoritative part, never the
shaped tool credit). Everything below is computed on the paired runs only, except unauthorised
writes, which count over every run of each policy, and the runs left out, which are counted.
The hot spots (`scoring.hot_spots`) group both policies' paired runs by the axes of the scenarios
expanded from a matrix; they describe, and no check reads them.

`recheck` recomputes a receipt's interval, sign-flip test, regression tests (a regression suite's
too) and checks from the receipt's own per-scenario tables and stored statistics, through the
same functions: `promote` refuses a receipt whose statistics do not support its verdict.

A regression suite (`evaluate`'s `suite`) is paired the same way and decides only its own check.
"""

import importlib.metadata
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from pipecat_rl.errors import ConfigError, GateError
from pipecat_rl.gate.config import GateConfig
from pipecat_rl.gate.cost import CostSummary, cost_summary
from pipecat_rl.gate.inputs import (
    GateData,
    RunResult,
    Unusable,
    caller_gap_samples,
    llm_ttft_samples,
)
from pipecat_rl.gate.latency import (
    LLM_MEASURES,
    STAGES,
    TtftUnit,
    attribute_regression,
    cdf_points,
    compare_quantiles,
    compare_ratio,
    llm_label,
    stage_quantiles,
    woodruff_interval,
)
from pipecat_rl.gate.lineage import Lineage
from pipecat_rl.gate.receipt import (
    CostStats,
    GateReceipt,
    HotSpotStats,
    LatencyStats,
    PairedStats,
    RegressionStats,
    RegressionSuiteStats,
    Role,
    RunAccounting,
    SafetyStats,
    ScenarioRow,
    SuiteRow,
)
from pipecat_rl.gate.regressions import (
    RegressionTest,
    check_design,
    discordant,
    group_members,
    losses_to_confirm,
    regression_family,
    suite_tests,
)
from pipecat_rl.gate.safety import safety_arm
from pipecat_rl.gate.stats import (
    MeanInterval,
    binomial_tail,
    outcome,
    sample_size,
    scenario_deltas,
    sign_flip_test,
    t_interval,
    win_loss_tie,
)
from pipecat_rl.gate.turntaking import TurnTakingStats, turn_taking_checks, turn_taking_stats
from pipecat_rl.gate.verdict import (
    GateCheck,
    Verdict,
    caller_gap_check,
    decide,
    guard_check,
    llm_ratio_check,
    p95_budget_check,
    p95_margin_check,
    paired_check,
    regression_suite_check,
    regressions_check,
    unusable_check,
    writes_check,
)
from pipecat_rl.scenarios import axes_of
from pipecat_rl.scoring import AxisRun, hot_spots, pass_k_curve

ScenarioKey = tuple[str, str | None]
RunKey = tuple[int, int | None, int]
"""A run's pairing key within its scenario: run index, seed, occurrence."""


@dataclass(frozen=True)
class PairedScenario:
    """One scenario's matched runs, in run order."""

    key: ScenarioKey
    candidate: tuple[RunResult, ...]
    incumbent: tuple[RunResult, ...]


def pair_runs(data: GateData) -> tuple[list[PairedScenario], list[str]]:
    """Match candidate and incumbent runs per scenario; notes say what did not pair."""
    by_key: dict[ScenarioKey, dict[str, dict[RunKey, RunResult]]] = defaultdict(
        lambda: {data.candidate: {}, data.incumbent: {}}
    )
    for run in data.runs:
        by_key[(run.scenario, run.scenario_hash)][run.policy][
            (run.run, run.seed, run.occurrence)
        ] = run
    pairs, notes = [], []
    for key in sorted(by_key, key=lambda k: (k[0], k[1] or "")):
        cand, inc = by_key[key][data.candidate], by_key[key][data.incumbent]
        shared = sorted(cand.keys() & inc.keys(), key=lambda k: (k[0], k[2], k[1] or 0))
        unpaired = len(cand) + len(inc) - 2 * len(shared)
        label = key[0] if key[1] is None else f"{key[0]} ({key[1][:12]})"
        if not shared:
            notes.append(
                f"scenario {label}: no run of both policies with the same index and seed; excluded"
            )
            continue
        if unpaired:
            notes.append(
                f"scenario {label}: {unpaired} run(s) without a partner (same index and seed) "
                "left out"
            )
        pairs.append(
            PairedScenario(key, tuple(cand[r] for r in shared), tuple(inc[r] for r in shared))
        )
    if not pairs:
        raise GateError(
            "no scenario has runs of both policies with the same run index and seed, so nothing "
            "pairs; run both policies on the same held-out scenarios and seeds."
        )
    return pairs, notes


def _rewards(runs: tuple[RunResult, ...]) -> np.ndarray:
    return np.array([r.reward for r in runs], dtype=float)


def _passes(runs: tuple[RunResult, ...]) -> int:
    return sum(r.passed for r in runs)


def score_description(config: GateConfig) -> str:
    """What the gate pairs, in words, for the receipt."""
    text = "authoritative part (verifier, else judge:success; never tool_credit)"
    if config.judged_metrics:
        named = ", ".join(f"{k} x{w:g}" for k, w in sorted(config.judged_metrics.items()))
        text += f", averaged with {named}"
    return text


def _interval(deltas: np.ndarray) -> MeanInterval | None:
    return t_interval(deltas) if deltas.size >= 2 else None


def _zero_width(deltas: np.ndarray) -> bool:
    """Every scenario has exactly the same delta (with two or more, the interval is a point)."""
    return deltas.size >= 2 and bool(np.ptp(deltas) == 0)


def _paired(
    pairs: list[PairedScenario], config: GateConfig
) -> tuple[PairedStats, MeanInterval | None]:
    """The paired statistics and the interval the verdict reads."""
    run_diffs = [_rewards(p.candidate) - _rewards(p.incumbent) for p in pairs]
    deltas = scenario_deltas(run_diffs)
    interval = _interval(deltas)
    outcomes = win_loss_tie(deltas, config.tie_band)
    stats = PairedStats(
        score=score_description(config),
        n_scenarios=len(pairs),
        n_pairs=sum(len(d) for d in run_diffs),
        mean_delta=float(deltas.mean()),
        ci95=None if interval is None else (interval.low, interval.high),
        method="student_t",
        level=0.95,
        se=None if interval is None else interval.se,
        df=None if interval is None else interval.df,
        zero_width=_zero_width(deltas),
        sign_flip=sign_flip_test(deltas, seed=config.seed),
        wins=outcomes.wins,
        losses=outcomes.losses,
        ties=outcomes.ties,
        tie_band=outcomes.tie_band,
        pass_k={
            "candidate": pass_k_curve([(_passes(p.candidate), len(p.candidate)) for p in pairs]),
            "incumbent": pass_k_curve([(_passes(p.incumbent), len(p.incumbent)) for p in pairs]),
        },
        sample_size=sample_size(run_diffs, target=config.min_delta),
    )
    return stats, interval


def _regression_stats(
    worse: Sequence[int],
    better: Sequence[int],
    pairs: Sequence[int],
    scenario_ids: Sequence[str],
    config: GateConfig,
) -> RegressionStats:
    tests = regression_family(worse, better, pairs, scenario_ids, config)
    return RegressionStats(
        control=f"Holm, family-wise error <= {config.regression_alpha:g}",
        alpha=config.regression_alpha,
        tests=tests,
        confirmed=sum(t.confirmed for t in tests),
        max_regressions=config.max_regressions,
        fewest_losses=losses_to_confirm(len(tests), config.regression_alpha),
    )


def _samples(run: RunResult, field: str) -> tuple[float, ...]:
    if field == "llm_ttft_ms":
        return llm_ttft_samples(run)
    if field == "caller_gap_ms":
        return caller_gap_samples(run)
    return run.stages_ms.get(field, ()) if field in STAGES else getattr(run, field)


def _clusters(pairs: list[PairedScenario], role: Role, field: str) -> list[list[tuple]]:
    """Per scenario, per paired run of `role`, the samples of one latency field.

    The LLM TTFT is per LLM call (`llm_ttft_samples`), not the caller-turn stage of that name;
    `caller_gap_ms` is each caller line's wait for the first words (`caller_gap_samples`).
    """
    return [
        [_samples(r, field) for r in (p.candidate if role == "candidate" else p.incumbent)]
        for p in pairs
    ]


def _latency(pairs: list[PairedScenario], config: GateConfig) -> LatencyStats:
    """The gated P95 (paired over scenarios), the LLM-stage ratios, stages and CDFs.

    Audio runs carry the caller-side heard gap, the figure a caller lives through; when both
    policies have it, over one transport, the P95 checks gate on it and the in-agent v2v stands
    beside. Heard over different transports, the in-agent v2v is gated on instead.
    """
    runs = {
        "candidate": [r for p in pairs for r in p.candidate],
        "incumbent": [r for p in pairs for r in p.incumbent],
    }
    heard = {role: _clusters(pairs, role, "heard_gap_ms") for role in runs}
    agent = {role: _clusters(pairs, role, "v2v_ms") for role in runs}
    on_heard = (
        all(any(r.heard_gap_ms for r in rs) for rs in runs.values())
        and len(_heard_transports(runs)) == 1
    )
    gated = heard if on_heard else agent
    kw = {"resamples": config.resamples, "seed": config.seed}
    stages = {
        role: {
            stage: stage_quantiles([v for r in rs for v in r.stages_ms.get(stage, ())])
            for stage in STAGES
        }
        for role, rs in runs.items()
    }
    return LatencyStats(
        text_mode=all(r.channel == "text" for rs in runs.values() for r in rs),
        llm_ttft_unit=_ttft_unit([r for rs in runs.values() for r in rs]),
        gated_on="heard_gap" if on_heard else "v2v",
        v2v_p95=compare_quantiles(gated["candidate"], gated["incumbent"], **kw),
        in_agent_v2v_p95=(
            compare_quantiles(agent["candidate"], agent["incumbent"], **kw) if on_heard else None
        ),
        llm={
            measure: compare_ratio(
                measure,
                _clusters(pairs, "candidate", measure),
                _clusters(pairs, "incumbent", measure),
                **kw,
            )  # fmt: skip
            for measure in LLM_MEASURES
        },
        stages=stages,
        attributed_stage=attribute_regression(stages["candidate"], stages["incumbent"]),
        cdf_ms={
            role: cdf_points([v for scenario in c for run in scenario for v in run])
            for role, c in gated.items()
        },
        caller_gap={
            role: stage_quantiles([v for r in rs for v in caller_gap_samples(r)])
            for role, rs in runs.items()
        },
        caller_gap_p95=woodruff_interval(
            [[v for run in s for v in run] for s in _clusters(pairs, "candidate", "caller_gap_ms")]
        ),
    )


def _turn_taking(pairs: list[PairedScenario], config: GateConfig) -> TurnTakingStats:
    """Both arms' turn-taking over the paired runs (`gate.turntaking`)."""
    return turn_taking_stats(
        [[r.turn_taking for r in p.candidate] for p in pairs],
        [[r.turn_taking for r in p.incumbent] for p in pairs],
        resamples=config.resamples, seed=config.seed,
    )  # fmt: skip


def _ttft_unit(runs: list[RunResult]) -> TtftUnit | None:
    """What the gated LLM TTFT was measured per (`inputs.llm_ttft_samples`), so it is named so."""
    units = {
        "call" if r.llm_call_ttft_ms else "caller_turn"
        for r in runs
        if r.llm_call_ttft_ms or r.stages_ms.get("llm_ttft_ms")
    }
    if not units:
        return None
    return units.pop() if len(units) == 1 else "mixed"


def _heard_transports(runs: dict[str, list[RunResult]]) -> set[str | None]:
    """The transports the runs' heard gaps were measured over."""
    return {r.transport for rs in runs.values() for r in rs if r.heard_gap_ms}


def _hotspots(pairs: list[PairedScenario]) -> HotSpotStats | None:
    """Both policies' paired runs per axis value and pair; None when no scenario has axes."""
    axes = {p.key[0]: axes_of(p.key[0]) for p in pairs}
    if not any(axes.values()):
        return None
    arms = {
        role: hot_spots(
            AxisRun(r.scenario, axes[p.key[0]], r.passed, (), r.unauthorized_writes)
            for p in pairs
            for r in (p.candidate if role == "candidate" else p.incumbent)
        )
        for role in ("candidate", "incumbent")
    }
    return HotSpotStats(candidate=arms["candidate"], incumbent=arms["incumbent"])


def _cost(runs: list[RunResult], config: GateConfig) -> CostSummary | None:
    usages = [r.usage for r in runs if r.usage is not None]
    if len(usages) < len(runs):
        return None
    return cost_summary(usages, sum(r.passed for r in runs), config.prices)


def _version() -> str:
    try:
        return importlib.metadata.version("pipecat-rl")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _checks(
    interval: MeanInterval | None,
    receipt_parts: tuple[PairedStats, RegressionStats, LatencyStats, SafetyStats, RunAccounting],
    lineages: tuple[Lineage, Lineage],
    config: GateConfig,
    suite: RegressionSuiteStats | None = None,
    turn_taking: TurnTakingStats | None = None,
) -> tuple[GateCheck, ...]:
    """Every check of the verdict, from the statistics (shared by `evaluate` and `recheck`).

    The policies' names and pass rates only word the verdict sentence. The caller-gap budget
    and the turn-taking checks are there only when configured, and a regression suite's check
    comes last, so a receipt without them lists the checks it always did.
    """
    paired, regressions, latency, safety, accounting = receipt_parts
    candidate, incumbent = lineages
    names = (candidate.name, incumbent.name)
    v2v = latency.v2v_p95  # in audio mode this holds the heard gap (`gated_on`)
    measure = "heard gap" if latency.gated_on == "heard_gap" else "v2v"
    text, require = latency.text_mode, config.require_latency
    shares = {role: _share(u, accounting.paired[role]) for role, u in accounting.unusable.items()}
    rates = (paired.pass_k["candidate"].get(1), paired.pass_k["incumbent"].get(1))
    pass_rates = None if rates[0] is None or rates[1] is None else (rates[0], rates[1])
    return (
        paired_check(
            interval, paired.sign_flip, paired.zero_width, paired.n_scenarios, config.min_delta,
            names=names, pass_rates=pass_rates,
        ),
        regressions_check(regressions.tests, config.regression_alpha, config.max_regressions,
                          names=names),
        p95_budget_check(v2v.candidate if v2v else None, config.p95_budget_ms, require, measure,
                         text, names=names),
        p95_margin_check(v2v.difference if v2v else None, config.p95_margin_ms, require, measure,
                         text, names=names),
        *(
            llm_ratio_check(m, latency.llm.get(m), config.max_llm_latency_ratio, require and text,
                            names=names, label=llm_label(m, latency.llm_ttft_unit))
            for m in LLM_MEASURES
        ),
        *(() if config.caller_gap_p95_budget_ms is None else (
            caller_gap_check(latency.caller_gap_p95, config.caller_gap_p95_budget_ms, require,
                             names=names),
        )),
        *turn_taking_checks(turn_taking, config.turn_taking, names=names),
        writes_check(safety.candidate, safety.incumbent, names=names),
        unusable_check(shares, config.max_unusable_share, names=names),
        guard_check(candidate, config.require_guard, names=names),
        *(() if suite is None else (_suite_check(suite, config, names),)),
    )  # fmt: skip


def _share(lost: Unusable, paired: int) -> tuple[int, int, int]:
    """(harness errors, unverified, runs read in all) of an arm: what `unusable_check` reads."""
    return lost.harness_errors, lost.unverified, paired + lost.harness_errors + lost.unverified


def _suite_check(
    suite: RegressionSuiteStats, config: GateConfig, names: tuple[str, str]
) -> GateCheck:
    paired = sum(s.pairs for s in suite.scenarios)
    return regression_suite_check(
        suite.tests, config.regression_alpha, len(suite.scenarios),
        {role: _share(u, paired) for role, u in suite.unusable.items()},
        config.max_unusable_share, names=names,
    )  # fmt: skip


def _suite(suite: GateData, config: GateConfig) -> RegressionSuiteStats:
    """The regression suite's paired runs and its one test (`regressions.suite_tests`).

    Paired as the held-out runs are (`pair_runs`); a suite where nothing pairs has no test,
    and its check says so rather than the gate failing.
    """
    try:
        pairs, notes = pair_runs(suite)
    except GateError as e:
        pairs, notes = [], [str(e)]
    rows = []
    for p in pairs:
        worse, better = discordant(_rewards(p.candidate), _rewards(p.incumbent), config.tie_band)
        rows.append(SuiteRow(
            scenario=p.key[0], scenario_hash=p.key[1], pairs=len(p.candidate),
            worse_runs=int(worse), better_runs=int(better),
            candidate_passed=_passes(p.candidate), incumbent_passed=_passes(p.incumbent),
        ))  # fmt: skip
    return RegressionSuiteStats(
        set_id=suite.source.heldout_set_id,
        files=suite.source.scenario_files,
        scenarios=rows,
        tests=_suite_tests(rows, config),
        unusable={
            "candidate": suite.source.unusable.get(suite.candidate, Unusable()),
            "incumbent": suite.source.unusable.get(suite.incumbent, Unusable()),
        },
        notes=[*suite.source.notes, *notes],
    )


def _suite_tests(rows: Sequence[SuiteRow], config: GateConfig) -> list[RegressionTest]:
    if not rows:
        return []
    return suite_tests(
        [r.worse_runs for r in rows], [r.better_runs for r in rows], [r.pairs for r in rows],
        [r.scenario for r in rows], config,
    )  # fmt: skip


def _open(interval: MeanInterval | None, min_delta: float) -> bool:
    """Whether the interval contains `min_delta`, so that more runs could decide."""
    return (
        interval is not None
        and interval.low <= min_delta <= interval.high
        and (interval.low < interval.high)
    )


def evaluate(
    data: GateData,
    config: GateConfig,
    candidate: Lineage,
    incumbent: Lineage,
    suite: GateData | None = None,
) -> GateReceipt:
    """Compute every statistic of the gate on `data` and decide; the result is the receipt.

    `suite` is a regression suite's runs of the same two policies: they decide only its own
    no-regression check (`regressions.suite_tests`), never the paired score.

    Raises:
        ConfigError: a configured regression test could never fire at these repeats (it names
            the repeats it needs; `regressions.check_design`), or a regression group matches
            no scenario or overlaps another.
        GateError: nothing pairs.
    """
    pairs, notes = pair_runs(data)
    notes = [*data.source.notes, *notes]
    scenario_ids = [p.key[0] for p in pairs]
    repeats = max(len(p.candidate) for p in pairs)
    check_design(config, scenario_ids, repeats)
    paired, interval = _paired(pairs, config)
    counts = [
        discordant(_rewards(p.candidate), _rewards(p.incumbent), config.tie_band) for p in pairs
    ]
    worse, better = [int(w) for w, _ in counts], [int(b) for _, b in counts]
    pair_counts = [len(p.candidate) for p in pairs]
    regressions = _regression_stats(worse, better, pair_counts, scenario_ids, config)
    latency = _latency(pairs, config)
    by_role = {
        "candidate": [r for r in data.runs if r.policy == data.candidate],
        "incumbent": [r for r in data.runs if r.policy == data.incumbent],
    }
    safety = SafetyStats(
        candidate=safety_arm(by_role["candidate"]), incumbent=safety_arm(by_role["incumbent"])
    )
    accounting = RunAccounting(
        paired={"candidate": sum(pair_counts), "incumbent": sum(pair_counts)},
        unusable={
            "candidate": data.source.unusable.get(data.candidate, Unusable()),
            "incumbent": data.source.unusable.get(data.incumbent, Unusable()),
        },
        max_unusable_share=config.max_unusable_share,
    )
    cost = CostStats(
        candidate=_cost(by_role["candidate"], config), incumbent=_cost(by_role["incumbent"], config)
    )
    if cost.candidate is None or cost.incumbent is None:
        notes.append("cost not computed for a policy with runs lacking recorded usage")
    if latency.text_mode:
        notes.append(
            "text-mode runs: no voice-to-voice evidence (a text call carries no audio; its "
            "caller-side response gap is not v2v); the LLM stages are gated as candidate / "
            "incumbent ratios, and --mode audio gates the voice-to-voice P95"
        )
    if len(_heard_transports(by_role)) > 1:
        notes.append(
            "heard gaps measured over different transports (local and webrtc) are not "
            "comparable: the P95 checks gate on the in-agent v2v; run both policies on one"
        )
    parts = (paired, regressions, latency, safety, accounting)
    suite_stats = None if suite is None else _suite(suite, config)
    turn_taking = _turn_taking(pairs, config)
    checks = _checks(interval, parts, (candidate, incumbent), config, suite_stats, turn_taking)
    verdict = decide(checks, paired.sample_size if _open(interval, config.min_delta) else None)
    return GateReceipt(
        receipt_id=uuid.uuid4().hex,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        pipecat_rl_version=_version(),
        verdict=verdict.decision,
        reason=verdict.reason,
        reasons=list(verdict.reasons),
        exit_code=verdict.exit_code,
        candidate=candidate,
        incumbent=incumbent,
        input=data.source,
        repeats=repeats,
        thresholds=config,
        paired=paired,
        regressions=regressions,
        latency=latency,
        safety=safety,
        runs=accounting,
        cost=cost,
        scenarios=_rows(pairs, worse, better, regressions, config),
        unauthorized_writes=safety.candidate.writes,
        checks=list(verdict.checks),
        notes=notes,
        hotspots=_hotspots(pairs),
        regression_suite=suite_stats,
        turn_taking=turn_taking,
    )


def _rows(
    pairs: list[PairedScenario],
    worse: Sequence[int],
    better: Sequence[int],
    regressions: RegressionStats,
    config: GateConfig,
) -> list[ScenarioRow]:
    scenario_ids = [p.key[0] for p in pairs]
    group_of = {
        i: name
        for name, members in group_members(config.regression_groups, scenario_ids).items()
        for i in members
    }
    own = {t.unit: t for t in regressions.tests if t.kind == "scenarios"}
    p_own = binomial_tail(np.array(worse), np.array(worse) + np.array(better))
    rows = []
    for i, p in enumerate(pairs):
        cand, inc = _rewards(p.candidate), _rewards(p.incumbent)
        delta = float(np.mean(cand - inc))
        test = own.get(p.key[0])
        rows.append(
            ScenarioRow(
                scenario=p.key[0],
                scenario_hash=p.key[1],
                group=group_of.get(i),
                pairs=len(p.candidate),
                seeds=[r.seed for r in p.candidate],
                candidate_mean=float(cand.mean()),
                incumbent_mean=float(inc.mean()),
                delta=delta,
                outcome=outcome(delta, config.tie_band),
                worse_runs=worse[i],
                better_runs=better[i],
                regression_p=float(p_own[i]),
                regression="untested"
                if test is None
                else ("regressed" if test.confirmed else "none"),
                candidate_passed=_passes(p.candidate),
                incumbent_passed=_passes(p.incumbent),
                candidate_unauthorized_writes=sum(r.unauthorized_writes for r in p.candidate),
                incumbent_unauthorized_writes=sum(r.unauthorized_writes for r in p.incumbent),
            )  # fmt: skip
        )
    return rows


def recheck(receipt: GateReceipt) -> tuple[Verdict, list[str]]:
    """Recompute a receipt's verdict from its own numbers; also list what disagrees.

    The interval and the sign-flip test are recomputed from the per-scenario deltas, the
    regression family from each scenario's lost and won runs (and groups), and every check from
    those and the stored latency intervals, safety counts, run accounting and lineage, through
    the functions `evaluate` uses.
    """
    config, paired = receipt.thresholds, receipt.paired
    rows = receipt.scenarios
    problems = []
    deltas = np.array([r.delta for r in rows], dtype=float)
    interval = _interval(deltas)
    stored = paired.ci95
    if len(rows) != paired.n_scenarios:
        problems.append(f"n_scenarios is {paired.n_scenarios} but the table has {len(rows)}")
    if (interval is None) != (stored is None) or (
        interval is not None
        and stored is not None
        and not np.allclose((interval.low, interval.high), stored, rtol=0, atol=1e-9)
    ):
        got = None if interval is None else (round(interval.low, 6), round(interval.high, 6))
        problems.append(f"paired.ci95 is {stored} but the scenario deltas give {got}")
    if rows and abs(float(deltas.mean()) - paired.mean_delta) > 1e-9:
        problems.append(f"paired.mean_delta is {paired.mean_delta} but the deltas give "
                        f"{float(deltas.mean()):.6g}")  # fmt: skip
    flip = sign_flip_test(deltas, seed=config.seed) if rows else paired.sign_flip
    if abs(flip.p_greater - paired.sign_flip.p_greater) > 1e-9:
        problems.append(
            f"paired.sign_flip.p_greater is {paired.sign_flip.p_greater}, recomputed "
            f"{flip.p_greater:.6g}"
        )
    zero = _zero_width(deltas)
    if zero != paired.zero_width:
        problems.append(f"paired.zero_width is {paired.zero_width}, recomputed {zero}")
    recomputed_paired = paired.model_copy(
        update={"n_scenarios": len(rows), "sign_flip": flip, "zero_width": zero}
    )
    try:
        regressions = _regression_stats(
            [r.worse_runs for r in rows], [r.better_runs for r in rows], [r.pairs for r in rows],
            [r.scenario for r in rows], config,
        )  # fmt: skip
    except ConfigError as e:
        problems.append(f"the regression tests cannot be recomputed: {e}")
        regressions = receipt.regressions
    if regressions.tests != receipt.regressions.tests:
        problems.append("the regression tests do not follow from the scenario table")
    if receipt.unauthorized_writes != receipt.safety.candidate.writes or (
        receipt.safety.candidate.writes < sum(r.candidate_unauthorized_writes for r in rows)
    ):
        problems.append("the candidate's unauthorised writes disagree with the scenario table")
    suite = receipt.regression_suite
    if suite is not None:
        tests = _suite_tests(suite.scenarios, config)
        if tests != suite.tests:
            problems.append("the regression suite's test does not follow from its table")
        suite = suite.model_copy(update={"tests": tests})
    parts = (recomputed_paired, regressions, receipt.latency, receipt.safety, receipt.runs)
    checks = _checks(
        interval, parts, (receipt.candidate, receipt.incumbent), config, suite,
        receipt.turn_taking,
    )  # fmt: skip
    verdict = decide(checks, paired.sample_size if _open(interval, config.min_delta) else None)
    for check, stored_check in zip(checks, receipt.checks, strict=False):
        if (check.name, check.status) != (stored_check.name, stored_check.status):
            problems.append(
                f"check {stored_check.name} says {stored_check.status}, recomputed {check.status}"
            )
    if len(receipt.checks) != len(checks):
        problems.append(f"the receipt lists {len(receipt.checks)} checks, the gate makes "
                        f"{len(checks)}")  # fmt: skip
    return verdict, problems
