"""From `GateData` to a `GateReceipt`: pair the runs, compute every statistic, decide.

Pairing: runs are grouped by scenario (id and, when recorded, content hash, so a scenario edited
between runs never pairs with its old self), and candidate run r pairs with incumbent run r.
What is paired is each run's gate score (`inputs.gate_score`: the authoritative part, never the
shaped tool credit). Everything below is computed on the paired runs only, except unauthorised
writes, which count over every candidate run.

`recheck` recomputes a receipt's interval, regressions and checks from the receipt's own
per-scenario table and stored intervals, through the same functions: `promote` refuses a receipt
whose statistics do not support its verdict.
"""

import importlib.metadata
import uuid
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
    MeanInterval,
    ScenarioRegression,
    min_repeats_to_confirm,
    outcome,
    pass_k_curve,
    regressions,
    sample_size,
    scenario_deltas,
    t_interval,
    win_loss_tie,
)
from pipecat_rl.gate.verdict import (
    Check,
    Verdict,
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


def _passed(runs: tuple[RunResult, ...]) -> int:
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


def _paired(
    pairs: list[PairedScenario], config: GateConfig
) -> tuple[PairedStats, MeanInterval | None, list[ScenarioRegression]]:
    """The paired statistics, the interval the verdict reads, and each scenario's regression."""
    run_diffs = [_rewards(p.candidate) - _rewards(p.incumbent) for p in pairs]
    deltas = scenario_deltas(run_diffs)
    interval = _interval(deltas)
    outcomes = win_loss_tie(deltas, config.tie_band)
    regs = regressions(run_diffs, config.tie_band, config.regression_alpha)
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
        wins=outcomes.wins,
        losses=outcomes.losses,
        ties=outcomes.ties,
        tie_band=outcomes.tie_band,
        regressed=sum(r.status == "regressed" for r in regs),
        uncertain_regressions=sum(r.status == "uncertain" for r in regs),
        regression_alpha=config.regression_alpha,
        pass_k={
            "candidate": pass_k_curve([(_passed(p.candidate), len(p.candidate)) for p in pairs]),
            "incumbent": pass_k_curve([(_passed(p.incumbent), len(p.incumbent)) for p in pairs]),
        },
        sample_size=sample_size(run_diffs, target=config.min_delta),
    )
    return stats, interval, regs


def _compare(sessions: dict[Role, list[tuple[float, ...]]], config: GateConfig):
    if not all(any(s) for s in sessions.values()):
        return None
    return compare_quantiles(
        sessions["candidate"], sessions["incumbent"], resamples=config.resamples, seed=config.seed
    )


def _latency(runs: dict[Role, list[RunResult]], config: GateConfig) -> LatencyStats:
    """The gated P95 with session intervals (None without samples for both), stages and CDFs.

    Audio runs carry the caller-side heard gap, the figure a caller lives through; when both
    policies have it, over one transport, the P95 checks gate on it and the in-agent
    v2v stands beside. Heard over different transports, the in-agent v2v is gated on instead.
    """
    agent = {role: [r.v2v_ms for r in rs] for role, rs in runs.items()}
    heard = {role: [r.heard_gap_ms for r in rs] for role, rs in runs.items()}
    on_heard = all(any(s) for s in heard.values()) and len(_heard_transports(runs)) == 1
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


def _heard_transports(runs: dict[Role, list[RunResult]]) -> set[str | None]:
    """The transports the runs' heard gaps were measured over."""
    return {r.transport for rs in runs.values() for r in rs if r.heard_gap_ms}


def _cost(runs: list[RunResult], config: GateConfig) -> CostSummary | None:
    usages = [r.usage for r in runs if r.usage is not None]
    if len(usages) < len(runs):
        return None
    return cost_summary(usages, sum(r.passed for r in runs), config.prices)


def _row(p: PairedScenario, reg: ScenarioRegression, config: GateConfig) -> ScenarioRow:
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
        worse_runs=reg.sign.worse,
        not_worse_runs=reg.sign.not_worse,
        sign_p=reg.sign.p_value,
        regression=reg.status,
        candidate_passed=_passed(p.candidate),
        incumbent_passed=_passed(p.incumbent),
        candidate_unauthorized_writes=sum(r.unauthorized_writes for r in p.candidate),
    )


def _version() -> str:
    try:
        return importlib.metadata.version("pipecat-rl")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _checks(
    interval: MeanInterval | None,
    paired: PairedStats,
    repeats: int,
    latency: LatencyStats,
    writes: int,
    candidate: Lineage,
    config: GateConfig,
) -> tuple[Check, ...]:
    """Every check of the verdict, from the statistics (shared by `evaluate` and `recheck`)."""
    v2v = latency.v2v_p95  # in audio mode this holds the heard gap (`gated_on`)
    measure = "heard gap" if latency.gated_on == "heard_gap" else "v2v"
    confirm = min_repeats_to_confirm(paired.n_scenarios, config.regression_alpha)
    return (
        paired_check(interval, paired.n_scenarios, config.min_delta),
        regressions_check(
            paired.regressed, paired.uncertain_regressions, config.max_regressions,
            config.tie_band, max(confirm, repeats + 1),
        ),  # fmt: skip
        p95_budget_check(
            v2v.candidate if v2v else None, config.p95_budget_ms, config.require_latency, measure
        ),
        p95_margin_check(
            v2v.difference if v2v else None, config.p95_margin_ms, config.require_latency, measure
        ),
        writes_check(writes),
        guard_check(candidate, config.require_guard),
    )


def evaluate(
    data: GateData, config: GateConfig, candidate: Lineage, incumbent: Lineage
) -> GateReceipt:
    """Compute every statistic of the gate on `data` and decide; the result is the receipt."""
    pairs, notes = pair_runs(data)
    notes = [*data.source.notes, *notes]
    paired, interval, regs = _paired(pairs, config)
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
    if runs["candidate"] and all(r.channel == "text" for rs in runs.values() for r in rs):
        notes.append(
            "text-mode runs: no voice-to-voice evidence (a text call carries no audio; its "
            "caller-side response gap is not v2v); gate with --mode audio for latency"
        )
    if len(_heard_transports(runs)) > 1:
        notes.append(
            "heard gaps measured over different transports (local and webrtc) are not "
            "comparable: the P95 checks gate on the in-agent v2v; run both policies on one"
        )
    writes = sum(r.unauthorized_writes for r in data.runs if r.policy == data.candidate)
    repeats = max(len(p.candidate) for p in pairs)
    checks = _checks(interval, paired, repeats, latency, writes, candidate, config)
    verdict = decide(checks, paired.sample_size)
    return GateReceipt(
        receipt_id=uuid.uuid4().hex,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        pipecat_rl_version=_version(),
        verdict=verdict.decision,
        reason=verdict.reason,
        exit_code=verdict.exit_code,
        candidate=candidate,
        incumbent=incumbent,
        input=data.source,
        repeats=repeats,
        thresholds=config,
        paired=paired,
        latency=latency,
        cost=cost,
        scenarios=[_row(p, reg, config) for p, reg in zip(pairs, regs, strict=True)],
        unauthorized_writes=writes,
        checks=list(verdict.checks),
        notes=notes,
    )


def recheck(receipt: GateReceipt) -> tuple[Verdict, list[str]]:
    """Recompute a receipt's verdict from its own numbers; also list what disagrees.

    The interval is recomputed from the per-scenario deltas, each scenario's sign test and the
    Holm adjustment from its run counts, and every check from those and the stored latency
    intervals, writes and lineage, through the functions `evaluate` uses.
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
    signs = [
        [-1.0] * r.worse_runs + [1.0] * r.not_worse_runs for r in rows
    ]  # the sign test needs only the counts; +-1 reproduces them for any band < 1
    regs = regressions(signs, 0.0, config.regression_alpha) if rows else []
    statuses = [
        reg.status if reg.status == "regressed" else
        ("uncertain" if row.delta < -config.tie_band else "none")
        for reg, row in zip(regs, rows, strict=True)
    ]  # fmt: skip
    for row, status in zip(rows, statuses, strict=True):
        if row.regression != status:
            problems.append(f"scenario {row.scenario} says {row.regression}, recomputed {status}")
    recomputed = paired.model_copy(
        update={
            "regressed": statuses.count("regressed"),
            "uncertain_regressions": statuses.count("uncertain"),
            "n_scenarios": len(rows),
        }
    )
    for name in ("regressed", "uncertain_regressions"):
        if getattr(recomputed, name) != getattr(paired, name):
            problems.append(
                f"paired.{name} is {getattr(paired, name)}, recomputed {getattr(recomputed, name)}"
            )
    writes = receipt.unauthorized_writes
    if writes < sum(r.candidate_unauthorized_writes for r in rows):
        problems.append("unauthorized_writes is less than the scenario table's")
    checks = _checks(
        interval, recomputed, receipt.repeats, receipt.latency, writes, receipt.candidate, config
    )
    verdict = decide(checks, paired.sample_size)
    for check, stored_check in zip(checks, receipt.checks, strict=False):
        if (check.name, check.status) != (stored_check.name, stored_check.status):
            problems.append(
                f"check {stored_check.name} says {stored_check.status}, recomputed {check.status}"
            )
    if len(receipt.checks) != len(checks):
        problems.append(f"the receipt lists {len(receipt.checks)} checks, the gate makes "
                        f"{len(checks)}")  # fmt: skip
    return verdict, problems
