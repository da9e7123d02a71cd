"""The gate's receipt: a schema-versioned record of what was compared, how, and what was decided.

`receipt.json` is the source of truth (`promote` reads it); `receipt.md` and `receipt.html` are
renderings of it for people. A receipt holds the candidate's and incumbent's lineage, the
held-out set and file hashes, seeds, repeats, thresholds, every statistic, the per-scenario table,
and the verdict with its reason.
"""

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipecat_rl.errors import GateError
from pipecat_rl.gate.config import GateConfig
from pipecat_rl.gate.cost import CostSummary
from pipecat_rl.gate.inputs import InputSource
from pipecat_rl.gate.latency import QuantileComparison, StageQuantiles
from pipecat_rl.gate.lineage import Lineage
from pipecat_rl.gate.stats import Outcome, SampleSize
from pipecat_rl.gate.verdict import Check, Decision

SCHEMA_VERSION = 1
"""Bumped on any change a reader of an older receipt would misread."""

Role = Literal["candidate", "incumbent"]


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PairedStats(_Part):
    """The paired reward comparison over scenarios."""

    n_scenarios: int
    n_pairs: int
    mean_delta: float
    ci95: tuple[float, float]
    resamples: int
    seed: int
    wins: int
    losses: int
    ties: int
    tie_band: float
    pass_k: dict[Role, dict[int, float]]
    """pass^k for k = 1..min repeats, per policy."""
    sample_size: SampleSize


class LatencyStats(_Part):
    """Voice-to-voice P95 with session intervals, and per-stage P50/P95 for attribution."""

    v2v_p95: QuantileComparison | None
    stages: dict[Role, dict[str, StageQuantiles]]
    attributed_stage: str | None
    """The stage whose P95 grew most from incumbent to candidate (None if none grew)."""
    cdf_ms: dict[Role, list[float]]
    """Voice-to-voice quantiles at 0, 1, ..., 100 percent, for the CDF plot."""
    # Issue 12 (audio channel): in audio mode `v2v_p95` is the caller-side heard gap.
    gated_on: Literal["v2v", "heard_gap"] = "v2v"
    """What `v2v_p95` (the gated P95) measures: in-agent v2v, or the caller-side heard gap."""
    in_agent_v2v_p95: QuantileComparison | None = None
    """Beside a heard-gap gate: the in-agent voice-to-voice P95, for attribution."""


class CostStats(_Part):
    """Cost per call and per successful call; None for a policy whose usage was not recorded."""

    candidate: CostSummary | None
    incumbent: CostSummary | None


class ScenarioRow(_Part):
    """One held-out scenario's paired result."""

    scenario: str
    scenario_hash: str | None
    pairs: int
    seeds: list[int | None]
    candidate_mean: float
    incumbent_mean: float
    delta: float
    outcome: Outcome
    candidate_passed: int
    incumbent_passed: int
    candidate_unauthorized_writes: int


class GateReceipt(_Part):
    """Everything about one gate decision."""

    schema_version: Literal[1] = SCHEMA_VERSION
    created_at: str
    pipecat_rl_version: str
    verdict: Decision
    reason: str
    exit_code: int
    candidate: Lineage
    incumbent: Lineage
    input: InputSource
    repeats: int
    """Most paired runs of any scenario."""
    thresholds: GateConfig
    paired: PairedStats
    latency: LatencyStats
    cost: CostStats
    scenarios: list[ScenarioRow]
    checks: list[Check]
    notes: list[str] = Field(default_factory=list)


def load_receipt(path: Path) -> GateReceipt:
    """Read a receipt.json (or the folder holding one).

    Raises:
        GateError: missing, unreadable, or not a receipt this version understands.
    """
    file = path / "receipt.json" if path.is_dir() else path
    try:
        return GateReceipt.model_validate_json(file.read_text())
    except OSError as e:
        raise GateError(f"cannot read the receipt {file}: {e.strerror}; check the path.") from e
    except ValidationError as e:
        raise GateError(
            f"{file} is not a gate receipt of schema version {SCHEMA_VERSION} ({e.error_count()} "
            "problem(s)); re-run `pipecat-rl gate` to produce one."
        ) from e


def _fmt(value: float | None, digits: str = ".3g") -> str:
    return "n/a" if value is None else format(value, digits)


def render_markdown(r: GateReceipt) -> str:
    """A human summary of the receipt: verdict, checks, statistics, scenario table."""
    p, lat = r.paired, r.latency
    lines = [
        f"# Gate: {r.verdict}",
        "",
        f"**{r.candidate.name}** (candidate) vs **{r.incumbent.name}** (incumbent, "
        f"requested as `{r.incumbent.requested}`), {p.n_scenarios} held-out scenarios, "
        f"up to {r.repeats} paired runs each, from {r.input.kind} `{r.input.path}`.",
        "",
        f"Reason: {r.reason}",
        "",
        "## Checks",
        "",
        "| check | status | detail |",
        "|---|---|---|",
        *(f"| {c.name} | {c.status} | {c.detail} |" for c in r.checks),
        "",
        "## Paired reward",
        "",
        f"- mean delta {p.mean_delta:.4g}, 95% CI [{p.ci95[0]:.4g}, {p.ci95[1]:.4g}] "
        f"({p.resamples} scenario resamples, seed {p.seed})",
        f"- wins / losses / ties: {p.wins} / {p.losses} / {p.ties} (tie band {p.tie_band:g})",
        f"- MDE {_fmt(p.sample_size.mde)}; scenarios to decide "
        f"{_fmt(p.sample_size.required_scenarios, 'd')}; repeats to decide "
        f"{_fmt(p.sample_size.required_repeats, 'd')}",
        *(
            f"- pass^k {role}: "
            + ", ".join(f"k={k}: {v:.3f}" for k, v in sorted(p.pass_k[role].items()))
            for role in ("candidate", "incumbent")
        ),
        "",
        "## Latency (voice to voice)",
        "",
    ]
    if lat.v2v_p95 is None:
        lines.append("No voice-to-voice samples for both policies.")
    else:
        v = lat.v2v_p95
        if lat.gated_on == "heard_gap":
            lines.append("Gated on the caller-side heard gap (audio mode).")
        lines += [
            f"- candidate P95 {v.candidate.estimate:.0f} ms [{v.candidate.low:.0f}, "
            f"{v.candidate.high:.0f}] over {v.candidate_sessions} sessions",
            f"- incumbent P95 {v.incumbent.estimate:.0f} ms [{v.incumbent.low:.0f}, "
            f"{v.incumbent.high:.0f}] over {v.incumbent_sessions} sessions",
            f"- difference {v.difference.estimate:+.0f} ms [{v.difference.low:+.0f}, "
            f"{v.difference.high:+.0f}]",
        ]
    lines += [
        f"- stage whose P95 grew most: {lat.attributed_stage or 'none'}",
        "",
        "| stage | cand P50 | cand P95 | inc P50 | inc P95 |",
        "|---|---|---|---|---|",
    ]
    cand_stages, inc_stages = lat.stages["candidate"], lat.stages["incumbent"]
    for stage in cand_stages:
        c, i = cand_stages[stage], inc_stages[stage]
        lines.append(
            f"| {stage} | {_fmt(c.p50, '.0f')} | {_fmt(c.p95, '.0f')} | "
            f"{_fmt(i.p50, '.0f')} | {_fmt(i.p95, '.0f')} |"
        )
    lines += ["", "## Cost", "", "| policy | per call | per successful call | completion tokens |"]
    lines.append("|---|---|---|---|")
    for role, cost in (("candidate", r.cost.candidate), ("incumbent", r.cost.incumbent)):
        if cost is None:
            lines.append(f"| {role} | not recorded | not recorded | not recorded |")
        else:
            lines.append(
                f"| {role} | ${cost.per_call_usd:.5f} | "
                f"{'n/a' if cost.per_success_usd is None else f'${cost.per_success_usd:.5f}'} | "
                f"{cost.mean_completion_tokens:.1f} |"
            )
    lines += [
        "",
        "## Scenarios",
        "",
        "| scenario | pairs | candidate | incumbent | delta | outcome |",
        "|---|---|---|---|---|---|",
        *(
            f"| {s.scenario} | {s.pairs} | {s.candidate_mean:.3f} | {s.incumbent_mean:.3f} | "
            f"{s.delta:+.3f} | {s.outcome} |"
            for s in r.scenarios
        ),
        "",
        "## Lineage",
        "",
        *(
            f"- {role}: `{lin.name}` ({lin.kind}); guard {lin.guard}: {lin.guard_detail}"
            for role, lin in (("candidate", r.candidate), ("incumbent", r.incumbent))
        ),
        f"- held-out set: {r.input.heldout_set_id or 'n/a'}; input sha256: "
        f"{r.input.sha256 or 'n/a'}",
    ]
    if r.notes:
        lines += ["", "## Notes", "", *(f"- {n}" for n in r.notes)]
    return "\n".join(lines) + "\n"


def write_receipt(receipt: GateReceipt, out_dir: Path) -> dict[str, Path]:
    """Write receipt.json, receipt.md and receipt.html into `out_dir`; returns their paths."""
    from pipecat_rl.gate.report_html import render_html  # matplotlib only when a page is written

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "receipt.json",
        "md": out_dir / "receipt.md",
        "html": out_dir / "receipt.html",
    }
    paths["json"].write_text(receipt.model_dump_json(indent=2) + "\n")
    paths["md"].write_text(render_markdown(receipt))
    paths["html"].write_text(render_html(receipt))
    return paths
