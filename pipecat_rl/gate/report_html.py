"""The receipt as one self-contained HTML page: inline CSS and inline SVG plots, no scripts.

Plots (drawn with matplotlib's object API, never pyplot, so nothing global changes):

1. paired per-scenario deltas, with the mean delta's 95% interval, `min_delta` and the tie band;
2. CDFs of the gated latency (voice to voice, or the heard gap) of both policies, with the P95
   level and the budget line;
3. per-stage P50/P95 of both policies, so a latency regression is attributed to a stage.
"""

import html
import io

try:
    from matplotlib.figure import Figure
except ImportError as e:  # an extra: a bot that only records does not install it
    raise ImportError(
        "the receipt's HTML page draws its plots with matplotlib, which is not installed; "
        "install it with: pip install 'pipecat-rl[report]'"
    ) from e

from pipecat_rl.gate.latency import LLM_MEASURES, STAGES
from pipecat_rl.gate.receipt import GateReceipt, ci_text
from pipecat_rl.gate.safety import describe

_COLORS = {"candidate": "#1f6feb", "incumbent": "#8b949e"}
_OUTCOME_COLORS = {"win": "#2da44e", "loss": "#cf222e", "tie": "#8b949e"}
_VERDICT_COLORS = {"PROMOTE": "#2da44e", "REJECT": "#cf222e", "INCONCLUSIVE": "#bf8700"}


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg") :]


def deltas_figure(r: GateReceipt) -> Figure:
    """Per-scenario deltas (sorted), the mean's interval, min_delta and the tie band."""
    rows = sorted(r.scenarios, key=lambda s: s.delta)
    fig = Figure(figsize=(7.5, 0.3 * len(rows) + 1.6))
    ax = fig.add_subplot()
    y = list(range(len(rows)))
    band = r.paired.tie_band
    ax.axvspan(-band, band, color="#eaeef2", label=f"tie band ±{band:g}")
    if r.paired.ci95 is not None:
        low, high = r.paired.ci95
        ax.axvspan(low, high, color=_COLORS["candidate"], alpha=0.18, label="95% CI of mean delta")
    ax.axvline(r.paired.mean_delta, color=_COLORS["candidate"], lw=1.5, label="mean delta")
    ax.axvline(r.thresholds.min_delta, color="black", ls="--", lw=1, label="min_delta")
    ax.axvline(0, color="#57606a", lw=0.8)
    ax.scatter(
        [s.delta for s in rows], y, c=[_OUTCOME_COLORS[s.outcome] for s in rows], zorder=3, s=28
    )
    ax.set_yticks(y, [s.scenario for s in rows], fontsize=8)
    ax.set_xlabel("candidate − incumbent mean score per scenario")
    ax.set_title("Paired per-scenario deltas")
    ax.legend(loc="lower right", fontsize=7)
    return fig


def cdf_figure(r: GateReceipt) -> Figure:
    """Gated-latency CDFs of both policies, with the P95 level and the budget."""
    fig = Figure(figsize=(7.5, 3.6))
    ax = fig.add_subplot()
    for role, points in r.latency.cdf_ms.items():
        if points:
            levels = [i / (len(points) - 1) for i in range(len(points))]
            ax.step(points, levels, where="post", color=_COLORS[role], label=role)
    ax.axhline(0.95, color="#57606a", ls=":", lw=1, label="P95")
    ax.axvline(r.thresholds.p95_budget_ms, color="#cf222e", ls="--", lw=1.2, label="P95 budget")
    measure = "heard gap" if r.latency.gated_on == "heard_gap" else "voice-to-voice latency"
    ax.set_xlabel(f"{measure} (ms)")
    ax.set_ylabel("fraction of turns")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{measure.capitalize()} CDF")
    ax.legend(loc="lower right", fontsize=8)
    return fig


def stages_figure(r: GateReceipt) -> Figure:
    """Grouped bars: P50 (solid) and P95 (light) of each stage for both policies."""
    fig = Figure(figsize=(7.5, 3.6))
    ax = fig.add_subplot()
    width = 0.2
    bars = [(role, q, alpha) for role in _COLORS for q, alpha in (("p50", 1.0), ("p95", 0.45))]
    for k, (role, q, alpha) in enumerate(bars):
        xs = [i + (k - 1.5) * width for i in range(len(STAGES))]
        values = [getattr(r.latency.stages[role][s], q) or 0.0 for s in STAGES]
        ax.bar(xs, values, width, color=_COLORS[role], alpha=alpha, label=f"{role} {q}")
    ax.set_xticks(range(len(STAGES)), [s.removesuffix("_ms") for s in STAGES])
    ax.set_ylabel("ms")
    title = "Per-stage latency"
    if r.latency.attributed_stage:
        title += f" (P95 grew most: {r.latency.attributed_stage.removesuffix('_ms')})"
    ax.set_title(title)
    ax.legend(fontsize=7, ncols=2)
    return fig


_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 60rem; color: #1f2328; }
.verdict { display: inline-block; color: white; padding: .2rem .8rem; border-radius: .4rem; }
table { border-collapse: collapse; margin: .5rem 0 1.5rem; }
td, th { border: 1px solid #d0d7de; padding: .25rem .5rem; text-align: left; font-size: 13px; }
figure { margin: 1.5rem 0; } figure svg { max-width: 100%; height: auto; }
.pass { color: #2da44e; } .fail { color: #cf222e; } .uncertain { color: #bf8700; }
"""


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _money(value: float | None) -> str:
    return "n/a" if value is None else f"${value:.5f}"


def _summary_rows(r: GateReceipt) -> list[list[str]]:
    """Gated P95 and LLM-stage P50s with intervals, unsafe writes, cost per (successful) call."""
    rows = []
    v = r.latency.v2v_p95
    if v is not None:
        measure = "heard gap" if r.latency.gated_on == "heard_gap" else "v2v"
        rows.append(
            [f"{measure} P95 (ms, 95% CI)"]
            + [
                f"{i.estimate:.0f} [{i.low:.0f}, {i.high:.0f}]"
                for i in (v.candidate, v.incumbent, v.difference)
            ]
        )
    for measure, label in LLM_MEASURES.items():
        c = r.latency.llm.get(measure)
        if c is not None:
            rows.append(
                [f"{label} P50 (ms; ratio, 95% CI)", f"{c.candidate:,.0f}", f"{c.incumbent:,.0f}",
                 f"{c.ratio.estimate:.2g}x [{c.ratio.low:.2g}, {c.ratio.high:.2g}]"]
            )  # fmt: skip
    rows.append(
        ["unauthorised writes (runs with one / guarded runs)"]
        + [
            f"{a.writes} ({a.runs_with_writes} / {a.guarded_runs})"
            for a in (r.safety.candidate, r.safety.incumbent)
        ]
        + [f"{r.safety.candidate.writes - r.safety.incumbent.writes:+d}"]
    )
    costs = (r.cost.candidate, r.cost.incumbent)
    for label, field in (("cost per call", "per_call_usd"), ("per success", "per_success_usd")):
        values = [None if c is None else getattr(c, field) for c in costs]
        diff = None if None in values else values[0] - values[1]
        rows.append([label, *(_money(x) for x in (*values, diff))])
    return rows


def render_html(r: GateReceipt) -> str:
    """The whole page as one string."""
    esc = html.escape
    p = r.paired
    checks = _table(
        ["check", "status", "detail"],
        [
            [esc(c.name), f'<span class="{c.status}">{c.status}</span>', esc(c.detail)]
            for c in r.checks
        ],
    )
    scenarios = _table(
        ["scenario", "group", "pairs", "candidate", "incumbent", "delta", "outcome",
         "lost / won runs", "p (worse)", "regression"],
        [
            [
                esc(s.scenario), esc(s.group or ""), str(s.pairs), f"{s.candidate_mean:.3f}",
                f"{s.incumbent_mean:.3f}", f"{s.delta:+.3f}", s.outcome,
                f"{s.worse_runs} / {s.better_runs}", f"{s.regression_p:.3g}", s.regression,
            ]
            for s in r.scenarios
        ],
    )  # fmt: skip
    safety = "".join(
        f"<li>{esc(describe(arm, role))}</li>"
        for role, arm in (("candidate", r.safety.candidate), ("incumbent", r.safety.incumbent))
    )
    lineage = _table(
        ["role", "name", "kind", "guard", "detail"],
        [
            [role, esc(lin.name), lin.kind, lin.guard, esc(lin.guard_detail)]
            for role, lin in (("candidate", r.candidate), ("incumbent", r.incumbent))
        ],
    )
    summary = _table(["", "candidate", "incumbent", "candidate − incumbent"], _summary_rows(r))
    figures = "".join(
        f"<figure>{_svg(make(r))}<figcaption>{esc(caption)}</figcaption></figure>"
        for make, caption in (
            (deltas_figure, "Each dot is one held-out scenario; the band is the 95% CI."),
            (cdf_figure, "Pooled turns of every paired run; dashed: the P95 budget."),
            (stages_figure, "Solid: P50, light: P95."),
        )
    )
    notes = "".join(f"<li>{esc(n)}</li>" for n in r.notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Gate {r.verdict}: {esc(r.candidate.name)} vs {esc(r.incumbent.name)}</title>
<style>{_CSS}</style></head><body>
<h1>Gate <span class="verdict" style="background:{_VERDICT_COLORS[r.verdict]}">{r.verdict}</span>
</h1>
<p><b>{esc(r.candidate.name)}</b> (candidate) vs <b>{esc(r.incumbent.name)}</b> (incumbent),
{p.n_scenarios} held-out scenarios, up to {r.repeats} paired runs each;
mean delta {p.mean_delta:.4g}, {esc(ci_text(p))};
wins / losses / ties {p.wins} / {p.losses} / {p.ties}.</p>
<p>{esc(r.reason)}</p>
<h2>Checks</h2>{checks}
<h2>Latency, safety and cost</h2>{summary}<ul>{safety}</ul>
<p>Regressions: {esc(r.regressions.control)}; {r.regressions.confirmed} unit(s) confirmed worse
(cap {r.regressions.max_regressions}).</p>
<h2>Plots</h2>{figures}
<h2>Scenarios</h2>{scenarios}
<h2>Lineage</h2>{lineage}
<p>Input: {r.input.kind} {esc(r.input.path)}; held-out set {esc(r.input.heldout_set_id or "n/a")};
created {esc(r.created_at)} by pipecat-rl {esc(r.pipecat_rl_version)};
schema version {r.schema_version}.</p>
{f"<h2>Notes</h2><ul>{notes}</ul>" if notes else ""}
</body></html>
"""
