"""The receipt page's pictures, as inline SVG.

Drawn with matplotlib's object API (never pyplot: nothing global changes). Each figure function
returns None when it has nothing to draw, so the page says what is missing instead of showing
empty axes; without matplotlib (the `report` extra) every one returns None and `MISSING` says so
at the top of the page: the core install still gates and writes every receipt file.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from typing import ParamSpec

try:
    from matplotlib import colormaps
    from matplotlib.figure import Figure
except ImportError:  # an extra: the core install still gates and writes every receipt file
    colormaps = Figure = None

from pipecat_rl.gate.latency import STAGES
from pipecat_rl.gate.receipt import GateReceipt, HotSpotStats, hotspot_rows

MISSING = (
    None
    if Figure is not None
    else "The plots are not drawn: matplotlib is not installed here. "
    "pip install 'pipecat-rl[report]' draws them."
)
"""Why this page has no pictures, or None when matplotlib is installed."""

_P = ParamSpec("_P")


def _drawn(fn: Callable[_P, Figure | None]) -> Callable[_P, Figure | None]:
    """A figure function that draws nothing (None) where matplotlib is not installed."""

    @functools.wraps(fn)
    def draw(*args: _P.args, **kwargs: _P.kwargs) -> Figure | None:
        return None if MISSING else fn(*args, **kwargs)

    return draw


COLORS = {"candidate": "#1f6feb", "incumbent": "#8b949e"}
_OUTCOME_COLORS = {"win": "#2da44e", "loss": "#cf222e", "tie": "#8b949e"}


def svg(fig: Figure) -> str:
    """The figure as an inline `<svg>` element."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg") :]


@_drawn
def deltas_figure(r: GateReceipt) -> Figure | None:
    """Per-scenario deltas (sorted), the mean's interval, min_delta and the tie band."""
    if not r.scenarios:
        return None
    rows = sorted(r.scenarios, key=lambda s: s.delta)
    fig = Figure(figsize=(7.5, 0.3 * len(rows) + 1.6))
    ax = fig.add_subplot()
    y = list(range(len(rows)))
    band = r.paired.tie_band
    ax.axvspan(-band, band, color="#eaeef2", label=f"tie band ±{band:g}")
    if r.paired.ci95 is not None:
        low, high = r.paired.ci95
        ax.axvspan(low, high, color=COLORS["candidate"], alpha=0.18, label="95% CI of mean delta")
    ax.axvline(r.paired.mean_delta, color=COLORS["candidate"], lw=1.5, label="mean delta")
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


def measure_name(r: GateReceipt) -> str:
    """What the gated P95 measures, in words."""
    return "heard gap" if r.latency.gated_on == "heard_gap" else "voice-to-voice latency"


@_drawn
def cdf_figure(r: GateReceipt) -> Figure | None:
    """Gated-latency CDFs of the policies that have samples, with the P95 level and the budget."""
    drawn = {role: points for role, points in r.latency.cdf_ms.items() if len(points) > 1}
    if not drawn:
        return None
    fig = Figure(figsize=(6.0, 3.4))
    ax = fig.add_subplot()
    for role, points in drawn.items():
        levels = [i / (len(points) - 1) for i in range(len(points))]
        ax.step(points, levels, where="post", color=COLORS[role], label=role)
    ax.axhline(0.95, color="#57606a", ls=":", lw=1, label="P95")
    ax.axvline(r.thresholds.p95_budget_ms, color="#cf222e", ls="--", lw=1.2, label="P95 budget")
    measure = measure_name(r)
    ax.set_xlabel(f"{measure} (ms)")
    ax.set_ylabel("fraction of turns")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{measure.capitalize()} CDF")
    ax.legend(loc="lower right", fontsize=8)
    return fig


def measured_stages(r: GateReceipt) -> list[str]:
    """The stages at least one policy has samples of, in pipeline order."""
    return [s for s in STAGES if any(r.latency.stages[role][s].n for role in COLORS)]


@_drawn
def stages_figure(r: GateReceipt) -> Figure | None:
    """Grouped bars of the measured stages: P50 (solid) and P95 (light) of both policies."""
    stages = measured_stages(r)
    if not stages:
        return None
    fig = Figure(figsize=(6.0, 3.4))
    ax = fig.add_subplot()
    width = 0.2
    bars = [(role, q, alpha) for role in COLORS for q, alpha in (("p50", 1.0), ("p95", 0.45))]
    for k, (role, q, alpha) in enumerate(bars):
        xs = [i + (k - 1.5) * width for i in range(len(stages))]
        values = [getattr(r.latency.stages[role][s], q) or 0.0 for s in stages]
        ax.bar(xs, values, width, color=COLORS[role], alpha=alpha, label=f"{role} {q}")
    ax.set_xticks(range(len(stages)), [s.removesuffix("_ms") for s in stages])
    ax.set_ylabel("ms")
    title = "Per-stage latency"
    if r.latency.attributed_stage:
        title += f" (P95 grew most: {r.latency.attributed_stage.removesuffix('_ms')})"
    ax.set_title(title)
    ax.legend(fontsize=7, ncols=2)
    return fig


HEATMAP_ROWS = 16
"""Cells the heat map shows, worst for the candidate first (the page's table lists the same)."""


@_drawn
def hotspots_figure(h: HotSpotStats | None) -> Figure | None:
    """Axis values and pairs x policy: the pass rate as colour, passes / runs written in."""
    rows = hotspot_rows(h, HEATMAP_ROWS) if h is not None else []
    if not rows:
        return None
    nan = float("nan")
    rates = [[nan if x.pass_rate is None else x.pass_rate for x in pair] for pair in rows]
    fig = Figure(figsize=(5.2, 0.32 * len(rows) + 1.3))
    ax = fig.add_subplot()
    cmap = colormaps["RdYlGn"].with_extremes(bad="#eaeef2")  # a copy; no verified run: grey
    image = ax.imshow(rates, cmap=cmap, vmin=0, vmax=1, aspect="auto")
    for y, pair in enumerate(rows):
        for x, cell in enumerate(pair):
            few = "*" if cell.few else ""
            ax.text(x, y, f"{cell.passes}/{cell.verified}{few}", ha="center", va="center",
                    fontsize=8)  # fmt: skip
    ax.set_xticks([0, 1], list(COLORS))
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(rows)), [c.name for c, _ in rows], fontsize=8)
    ax.set_title("Pass rate per axis value and pair (passes / runs; * few runs)", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.08, pad=0.04, label="pass rate")
    return fig


@_drawn
def curves_figure(curves: dict[str, tuple[list[int], list[float]]]) -> Figure | None:
    """One small panel per training metric, against the line of the step log it came from."""
    if not curves:
        return None
    cols = 2 if len(curves) > 1 else 1
    rows = (len(curves) + cols - 1) // cols
    fig = Figure(figsize=(3.6 * cols, 2.3 * rows), layout="constrained")
    for k, (name, (xs, ys)) in enumerate(curves.items()):
        ax = fig.add_subplot(rows, cols, k + 1)
        ax.plot(xs, ys, color=COLORS["candidate"], lw=1.2, marker="." if len(xs) < 30 else None)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
        if k >= len(curves) - cols:
            ax.set_xlabel("step-log line", fontsize=8)
    return fig
