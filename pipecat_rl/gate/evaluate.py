"""From `GateData` to a `GateReceipt`: pair the runs, compute every statistic, decide.

Pairing: runs are grouped by scenario (id and, when recorded, content hash, so a scenario edited
between runs never pairs with its old self), and candidate run r pairs with incumbent run r.
Everything below is computed on the paired runs only, except unauthorised writes, which count
over every candidate run.
"""

import importlib.metadata
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from pipecat_rl.errors import GateError
from pipecat_rl.gate.config import GateConfig
from pipecat_rl.gate.cost import CostSummary, cost_summary
from pipecat_rl.gate.inputs import GateData, RunResult
from pipecat_rl.gate.latency import (
    STAGES,
    attribute_regression,
    cdf_points,
    compare_quantiles,
    stage_quantiles,
)
from pipecat_rl.gate.lineage import Lineage
from pipecat_rl.gate.receipt import (
    CostStats,
    GateReceipt,
    LatencyStats,
    PairedStats,
    Role,
    ScenarioRow,
)
from pipecat_rl.gate.stats import (
    Interval,
    cluster_bootstrap,
    outcome,
    pass_k_curve,
    sample_size,
    scenario_deltas,
    win_loss_tie,
)
from pipecat_rl.gate.verdict import (
    decide,
    guard_check,
    p95_budget_check,
    p95_margin_check,
    paired_check,
    regressions_check,
    writes_check,
)

ScenarioKey = tuple[str, str | None]


@dataclass(frozen=True)
class PairedScenario:
    """One scenario's matched runs, in run order."""

    key: ScenarioKey
    candidate: tuple[RunResult, ...]
    incumbent: tuple[RunResult, ...]


def pair_runs(data: GateData) -> tuple[list[PairedScenario], list[str]]:
    """Match candidate run r with incumbent run r per scenario; notes say what did not pair."""
    by_key: dict[ScenarioKey, dict[str, dict[int, RunResult]]] = defaultdict(
        lambda: {data.candidate: {}, data.incumbent: {}}
    )
    for run in data.runs:
        by_key[(run.scenario, run.scenario_hash)][run.policy][run.run] = run
    pairs, notes = [], []
    for key in sorted(by_key, key=lambda k: (k[0], k[1] or "")):
        cand, inc = by_key[key][data.candidate], by_key[key][data.incumbent]
        shared = sorted(cand.keys() & inc.keys())
        unpaired = len(cand) + len(inc) - 2 * len(shared)
        label = key[0] if key[1] is None else f"{key[0]} ({key[1][:12]})"
        if not shared:
            notes.append(f"scenario {label}: no run of both policies with the same index; excluded")
            continue
        if unpaired:
            notes.append(f"scenario {label}: {unpaired} run(s) without a partner left out")
        mismatched = [r for r in shared if cand[r].seed != inc[r].seed]
        if mismatched:
            notes.append(f"scenario {label}: runs {mismatched} were paired but their seeds differ")
        pairs.append(
            PairedScenario(key, tuple(cand[r] for r in shared), tuple(inc[r] for r in shared))
        )
    if not pairs:
        raise GateError(
            "no scenario has runs of both policies with the same run index, so nothing pairs; "
            "run both policies on the same held-out scenarios and seeds."
        )
    return pairs, notes


def _rewards(runs: tuple[RunResult, ...]) -> np.ndarray:
    return np.array([r.reward for r in runs], dtype=float)


def _passed(runs: tuple[RunResult, ...], config: GateConfig) -> int:
    return int(np.sum(_rewards(runs) >= config.pass_threshold))


def _paired(pairs: list[PairedScenario], config: GateConfig) -> tuple[PairedStats, Interval]:
    """The paired reward statistics, and the interval the verdict reads."""
    run_diffs = [_rewards(p.candidate) - _rewards(p.incumbent) for p in pairs]
    deltas = scenario_deltas(run_diffs)
    interval = cluster_bootstrap(deltas, resamples=config.resamples, seed=config.seed)
    outcomes = win_loss_tie(deltas, config.tie_band)
    stats = PairedStats(
        n_scenarios=len(pairs),
        n_pairs=sum(len(d) for d in run_diffs),
        mean_delta=interval.estimate,
        ci95=(interval.low, interval.high),
        resamples=interval.resamples,
        seed=interval.seed,
        wins=outcomes.wins,
        losses=outcomes.losses,
        ties=outcomes.ties,
        tie_band=outcomes.tie_band,
        pass_k={
            "candidate": pass_k_curve(
                [(_passed(p.candidate, config), len(p.candidate)) for p in pairs]
            ),
            "incumbent": pass_k_curve(
                [(_passed(p.incumbent, config), len(p.incumbent)) for p in pairs]
            ),
        },  # fmt: skip
        sample_size=sample_size(run_diffs, target=config.min_delta),
    )
    return stats, interval


def _compare(sessions: dict[Role, list[tuple[float, ...]]], config: GateConfig):
    if not all(any(s) for s in sessions.values()):
        return None
    return compare_quantiles(
        sessions["candidate"], sessions["incumbent"], resamples=config.resamples, seed=config.seed
    )


def _latency(runs: dict[Role, list[RunResult]], config: GateConfig) -> LatencyStats:
    """The gated P95 with session intervals (None without samples for both), stages and CDFs.

    Issue 12: audio runs carry the caller-side heard gap, the figure a caller lives through;
    when both policies have it, the P95 checks gate on it and the in-agent v2v stands beside.
    """
    agent = {role: [r.v2v_ms for r in rs] for role, rs in runs.items()}
    heard = {role: [r.heard_gap_ms for r in rs] for role, rs in runs.items()}
    on_heard = all(any(s) for s in heard.values())
    sessions = heard if on_heard else agent
    v2v = _compare(sessions, config)
    stages = {
        role: {
            stage: stage_quantiles([v for r in rs for v in r.stages_ms.get(stage, ())])
            for stage in STAGES
        }
        for role, rs in runs.items()
    }
    return LatencyStats(
        gated_on="heard_gap" if on_heard else "v2v",
        in_agent_v2v_p95=_compare(agent, config) if on_heard else None,
        v2v_p95=v2v,
        stages=stages,
        attributed_stage=attribute_regression(stages["candidate"], stages["incumbent"]),
        cdf_ms={role: cdf_points([v for s in ss for v in s]) for role, ss in sessions.items()},
    )


def _cost(runs: list[RunResult], config: GateConfig) -> CostSummary | None:
    usages = [r.usage for r in runs if r.usage is not None]
    if len(usages) < len(runs):
        return None
    passed = sum(r.reward >= config.pass_threshold for r in runs)
    return cost_summary(usages, passed, config.prices)


def _row(p: PairedScenario, config: GateConfig) -> ScenarioRow:
    cand, inc = _rewards(p.candidate), _rewards(p.incumbent)
    delta = float(np.mean(cand - inc))
    return ScenarioRow(
        scenario=p.key[0],
        scenario_hash=p.key[1],
        pairs=len(p.candidate),
        seeds=[r.seed for r in p.candidate],
        candidate_mean=float(cand.mean()),
        incumbent_mean=float(inc.mean()),
        delta=delta,
        outcome=outcome(delta, config.tie_band),
        candidate_passed=_passed(p.candidate, config),
        incumbent_passed=_passed(p.incumbent, config),
        candidate_unauthorized_writes=sum(r.unauthorized_writes for r in p.candidate),
    )


def _version() -> str:
    try:
        return importlib.metadata.version("pipecat-rl")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def evaluate(
    data: GateData, config: GateConfig, candidate: Lineage, incumbent: Lineage
) -> GateReceipt:
    """Compute every statistic of the gate on `data` and decide; the result is the receipt."""
    pairs, notes = pair_runs(data)
    notes = [*data.source.notes, *notes]
    paired, interval = _paired(pairs, config)
    runs: dict[Role, list[RunResult]] = {
        "candidate": [r for p in pairs for r in p.candidate],
        "incumbent": [r for p in pairs for r in p.incumbent],
    }
    latency = _latency(runs, config)
    cost = CostStats(
        candidate=_cost(runs["candidate"], config), incumbent=_cost(runs["incumbent"], config)
    )
    if cost.candidate is None or cost.incumbent is None:
        notes.append("cost not computed for a policy with runs lacking recorded usage")
    v2v = latency.v2v_p95
    measure = "heard gap" if latency.gated_on == "heard_gap" else "v2v"
    if runs["candidate"] and all(r.channel == "text" for rs in runs.values() for r in rs):
        notes.append(
            "text-mode runs: no voice-to-voice evidence (a text call carries no audio; its "
            "caller-side response gap is not v2v); gate with --mode audio for latency"
        )
    writes = sum(r.unauthorized_writes for r in data.runs if r.policy == data.candidate)
    checks = (
        paired_check(interval, len(pairs), config.min_delta),
        regressions_check(paired.losses, config.max_regressions, config.tie_band),
        p95_budget_check(
            v2v.candidate if v2v else None, config.p95_budget_ms, config.require_latency, measure
        ),
        p95_margin_check(
            v2v.difference if v2v else None, config.p95_margin_ms, config.require_latency, measure
        ),
        writes_check(writes),
        guard_check(candidate, config.require_guard),
    )
    verdict = decide(checks, paired.sample_size)
    return GateReceipt(
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        pipecat_rl_version=_version(),
        verdict=verdict.decision,
        reason=verdict.reason,
        exit_code=verdict.exit_code,
        candidate=candidate,
        incumbent=incumbent,
        input=data.source,
        repeats=max(len(p.candidate) for p in pairs),
        thresholds=config,
        paired=paired,
        latency=latency,
        cost=cost,
        scenarios=[_row(p, config) for p in pairs],
        checks=list(verdict.checks),
        notes=notes,
    )
