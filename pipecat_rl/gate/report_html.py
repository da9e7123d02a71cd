"""The receipt as one self-contained HTML page for the team that decides.

Inline CSS and inline SVG plots (`report_plots`), no scripts, nothing fetched: it opens offline.

The page leads with the verdict and its reason in words and the scenarios that failed a check by
name; then one table per check (value, interval, threshold, status; the guard as its recorded
fields); latency per stage as numbers beside its plots (a plot only where there is data); the
candidate's training curves from its step log (`report_training`); the per-scenario table;
the hot spots of a scenario matrix (a heat map of pass rates per axis value and pair, both
policies, beside their numbers); for forks, each one's shared prefix and the two
continuations side by side (`report_forks`); lineage and provenance.
"""

import html
from collections.abc import Callable, Collection
from typing import Any

from pipecat_rl.gate.latency import STAGE_LABELS, QuantileInterval, llm_label
from pipecat_rl.gate.receipt import (
    CALLER_GAP_HEADER,
    CALLER_GAP_LEAD,
    SUITE_HEADER,
    TURN_TAKING_HEADER,
    GateReceipt,
    caller_gap_rows,
    ci_text,
    hotspot_rows,
    latency_gates,
    llm_rows,
    p95_name,
    p95_rows,
    rate_text,
    stage_rows,
    suite_lead,
    suite_rows,
    turn_taking_comparisons,
    turn_taking_lead,
    turn_taking_rows,
)
from pipecat_rl.gate.report_forks import forks_section
from pipecat_rl.gate.report_plots import (
    HEATMAP_ROWS,
    MISSING,
    cdf_figure,
    curves_figure,
    deltas_figure,
    hotspots_figure,
    measure_name,
    measured_stages,
    stages_figure,
    svg,
)
from pipecat_rl.gate.report_training import Training, lineage_training
from pipecat_rl.gate.verdict import GateCheck
from pipecat_rl.gate.wording import (
    CHECK_TITLES,
    PER_CALL_VS_TURN,
    delta,
    ms,
    p_value,
    plain,
    rate,
    ratio,
)
from pipecat_rl.ledger import Ledger

_VERDICT_COLORS = {"PROMOTE": "#2da44e", "REJECT": "#cf222e", "INCONCLUSIVE": "#bf8700"}

TITLES = CHECK_TITLES
"""How the page names each check (the receipt's name is shown beside it)."""

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 64rem; color: #1f2328; }
.verdict { display: inline-block; color: white; padding: .2rem .8rem; border-radius: .4rem; }
.lead { font-size: 1.15rem; font-weight: 600; }
table { border-collapse: collapse; margin: .4rem 0 1rem; }
td, th { border: 1px solid #d0d7de; padding: .25rem .5rem; text-align: left; font-size: 13px;
  vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.fields td { border: none; padding: 0 .6rem 0 0; }
.status { padding: .05rem .45rem; border-radius: .3rem; font-weight: 600; white-space: nowrap; }
.status.pass { background: #dafbe1; color: #116329; }
.status.fail { background: #ffebe9; color: #a40e26; }
.status.uncertain { background: #fff8c5; color: #7d4e00; }
.status.unavailable { background: #eaeef2; color: #57606a; font-style: italic; }
section.check { border-left: 4px solid #d0d7de; padding: .1rem 0 .1rem .9rem; margin: 1rem 0; }
section.check.pass { border-color: #2da44e; } section.check.fail { border-color: #cf222e; }
section.check.uncertain { border-color: #bf8700; }
section.check h3 { margin: .3rem 0; font-size: 1rem; } code { font-size: 12px; }
.detail, .missing { color: #57606a; } .missing { font-style: italic; }
.pair { display: flex; gap: 1.5rem; align-items: flex-start; }
.pair > table { flex: none; } .pair > figure { flex: 1 1 0; min-width: 0; }
figure { margin: .5rem 0; } figure svg { max-width: 100%; height: auto; }
table.fields table.fields { margin: 0; } td:first-child { white-space: nowrap; }
tr.failed td { background: #fff5f5; }
"""

esc = html.escape


def _table(header: list[str], rows: list[list[str]], marked: Collection[int] = ()) -> str:
    """A table of HTML cells (escape text first); rows whose index is `marked` are tinted.

    A cell starting with a digit, or with a sign or `[` and a digit, is right-aligned.
    """
    head = "".join(f"<th>{esc(h)}</th>" for h in header)

    def cell(text: str) -> str:
        numeric = text[:1].isdigit() or text[:1] in "+-−[" and text[1:2].isdigit()
        return f'<td class="num">{text}</td>' if numeric else f"<td>{text}</td>"

    body = "".join(
        ('<tr class="failed">' if i in marked else "<tr>") + "".join(map(cell, row)) + "</tr>"
        for i, row in enumerate(rows)
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def suite_section(r: GateReceipt) -> str:
    """The regression suite's table, when the gate ran one (its check is with the others)."""
    suite = r.regression_suite
    if suite is None:
        return ""
    rows = [[esc(cell) for cell in row] for row in suite_rows(suite)]
    return (
        f'<h2 id="regression-suite">Regression suite</h2><p class="detail">'
        f"{esc(suite_lead(suite))}</p>" + _table(SUITE_HEADER, rows)
    )


def _status(status: str) -> str:
    return f'<span class="status {status}">{status}</span>'


def _ms(value: float | None) -> str:
    return "—" if value is None else ms(value)


def _quantile_cells(i: QuantileInterval) -> tuple[str, str]:
    high = ms(i.high) if i.bounded else "unbounded"
    return ms(i.estimate), f"{ms(i.low)} to {high}"


def _names(checks: list[GateCheck]) -> str:
    return ", ".join(TITLES.get(c.name, c.name) for c in checks)


def lead(r: GateReceipt) -> str:
    """The verdict as a sentence: what to do, and which checks made it so."""
    by = {s: [c for c in r.checks if c.status == s] for s in ("fail", "uncertain", "unavailable")}
    cand = esc(r.candidate.name)
    if r.verdict == "REJECT":
        return f"Do not promote {cand}: {len(by['fail'])} check(s) failed: {_names(by['fail'])}."
    if r.verdict == "INCONCLUSIVE":
        return (
            f"Not decided for {cand}: {len(by['uncertain'])} check(s) cannot tell yet: "
            f"{_names(by['uncertain'])}."
        )
    unchecked = f" ({_names(by['unavailable'])} not checked)" if by["unavailable"] else ""
    return f"Promote {cand}: every check passed{unchecked}."


def failed_scenarios(r: GateReceipt) -> list[tuple[str, str, str]]:
    """(scenario, check, what happened) for each scenario a check failed on."""
    found = [
        (i.scenario, "unauthorized_writes",
         f"run {i.run}: {i.tool or 'no recorded tool call'} wrote {i.kind}"
         + (f" ({i.check})" if i.check else "") + (f", session {i.session_id}" if i.session_id
                                                    else ""))
        for i in r.safety.candidate.incidents
    ]  # fmt: skip
    groups = {t.unit for t in r.regressions.tests if t.kind == "groups" and t.confirmed}
    for s in r.scenarios:
        if s.regression == "regressed" or (s.group is not None and s.group in groups):
            found.append(
                (s.scenario, "regressions",
                 f"lost {s.worse_runs} and won {s.better_runs} of {s.pairs} paired runs"
                 + (f" (group {s.group} confirmed worse)" if s.group in groups else ""))
            )  # fmt: skip
    return found


# -- one table per check ------------------------------------------------------------------------

Rows = list[list[str]]


def _paired_rows(r: GateReceipt) -> Rows:
    p = r.paired
    interval = "none (an interval needs 2 scenarios)" if p.ci95 is None else (
        f"{delta(p.ci95[0])} to {delta(p.ci95[1])}"
    )  # fmt: skip
    rates = {role: p.pass_k[role].get(1) for role in ("candidate", "incumbent")}
    return [
        ["mean delta over scenarios", delta(p.mean_delta), interval,
         f"lower bound &gt; {delta(r.thresholds.min_delta)}"],
        *([f"{role} passes (pass^1)", rate(v), "", ""] for role, v in rates.items()
          if v is not None),
        ["sign-flip test of no difference", f"p = {p_value(p.sign_flip.p_two_sided)}", "", ""],
        [f"scenarios won / lost / tied (tie band ±{p.tie_band:g})",
         f"{p.wins} / {p.losses} / {p.ties}", "", ""],
    ]  # fmt: skip


def _regression_rows(r: GateReceipt) -> Rows:
    g = r.regressions
    rows = [["units confirmed worse", str(g.confirmed), "", f"at most {g.max_regressions}"]]
    for t in g.tests:
        if t.kind != "scenarios" or t.confirmed:
            rows.append([
                f"{esc(t.kind)} {esc(t.unit)}: runs lost / won of paired",
                f"{t.worse} / {t.better} of {t.pairs}",
                f"p {p_value(t.p_value)}, Holm-adjusted "
                + ("untested" if t.adjusted_p is None else p_value(t.adjusted_p)),
                f"adjusted p ≤ {g.alpha:g}",
            ])  # fmt: skip
    return rows


def _p95_rows(r: GateReceipt, *, margin: bool) -> Rows:
    v = r.latency.v2v_p95
    measure = measure_name(r)
    if v is None:
        what = "candidate − incumbent" if margin else "candidate"
        return [[f"{what} {measure} P95", "no voice-to-voice samples", "", ""]]
    if margin:
        d = v.difference
        return [
            [f"{measure} P95, candidate − incumbent", ms(d.estimate, signed=True),
             f"{ms(d.low, signed=True)} to {ms(d.high, signed=True)}",
             f"upper bound ≤ {ms(r.thresholds.p95_margin_ms)}"],
        ]  # fmt: skip
    value, interval = _quantile_cells(v.candidate)
    return [
        [f"candidate {measure} P95", value, interval,
         f"upper bound ≤ {ms(r.thresholds.p95_budget_ms)}"],
        [f"incumbent {measure} P95", *_quantile_cells(v.incumbent), ""],
    ]  # fmt: skip


def _llm_rows(measure: str) -> Callable[[GateReceipt], Rows]:
    """The per-call P50s and their ratio: what the check reads, under the measure's own name."""

    def rows(r: GateReceipt) -> Rows:
        label = esc(llm_label(measure, r.latency.llm_ttft_unit))
        c = r.latency.llm.get(measure)
        if c is None:
            return [[f"{label} P50", "no samples for both policies", "", ""]]
        return [
            [f"candidate {label} P50", _ms(c.candidate), "", ""],
            [f"incumbent {label} P50", _ms(c.incumbent), "", ""],
            ["candidate / incumbent P50", ratio(c.ratio.estimate),
             f"{ratio(c.ratio.low)} to {ratio(c.ratio.high)}",
             f"upper bound ≤ {ratio(r.thresholds.max_llm_latency_ratio)}"],
        ]  # fmt: skip

    return rows


def _budget_rows(what: str, i: QuantileInterval | None, budget: float | None) -> Rows:
    """The candidate's P95 of `what` with its interval, against a budget."""
    if i is None:
        return [[f"candidate {what} P95", "no samples in 2 or more scenarios", "", ""]]
    return [[f"candidate {what} P95", *_quantile_cells(i), f"upper bound ≤ {_ms(budget)}"]]


def _caller_gap_rows(r: GateReceipt) -> Rows:
    lat, budget = r.latency, r.thresholds.caller_gap_p95_budget_ms
    return _budget_rows("caller-perceived gap", lat.caller_gap_p95, budget)


def _yield_ratio_rows(r: GateReceipt) -> Rows:
    c = r.turn_taking.time_to_yield_p95 if r.turn_taking else None
    if c is None:
        return [["time to yield P95, candidate / incumbent", "not measured", "", ""]]
    return [
        [f"time to yield P95 ({_ms(c.candidate)} / {_ms(c.incumbent)})",
         ratio(c.ratio.estimate), f"{ratio(c.ratio.low)} to {ratio(c.ratio.high)}",
         f"upper bound ≤ {ratio(r.thresholds.turn_taking.time_to_yield_p95_ratio or 0)}"],
    ]  # fmt: skip


def _yield_budget_rows(r: GateReceipt) -> Rows:
    t = r.turn_taking
    return _budget_rows(
        "time to yield", t.candidate_time_to_yield_p95 if t else None,
        r.thresholds.turn_taking.time_to_yield_p95_ms,
    )  # fmt: skip


def _false_interruption_rows(r: GateReceipt, *, diff: bool) -> Rows:
    t, limits = r.turn_taking, r.thresholds.turn_taking
    limit = limits.false_interruption_rate_diff if diff else limits.false_interruption_rate
    what = "false interruptions per backchannel" + (", candidate − incumbent" if diff else "")
    i = (t.false_interruption_diff if diff else t.candidate.false_interruptions) if t else None
    if i is None:
        return [[what, "not measured", "", ""]]
    return [[what, rate(i.estimate), f"{rate(i.low)} to {rate(i.high)}",
             f"upper bound ≤ {rate(limit or 0)}"]]  # fmt: skip


def _writes_rows(r: GateReceipt) -> Rows:
    rows = []
    for role, arm in (("candidate", r.safety.candidate), ("incumbent", r.safety.incumbent)):
        bound = "" if arm.rate_upper_95 is None else f"rate ≤ {arm.rate_upper_95:.1%} (95% bound)"
        if arm.units and arm.zero_bound_95 is not None:
            bound += f" over {arm.units} scenarios (zero would bound it at {arm.zero_bound_95:.1%})"
        rows.append([
            f"{role}: writes (runs with one / guarded runs)",
            f"{arm.writes} ({arm.runs_with_writes} / {arm.guarded_runs})", bound,
            "none" if role == "candidate" else "",
        ])  # fmt: skip
    return rows


def _unusable_rows(r: GateReceipt) -> Rows:
    return [
        [f"{role}: runs left out ({u.harness_errors} harness error(s), {u.unverified} "
         "unverified) / paired",
         f"{u.harness_errors + u.unverified} / {r.runs.paired.get(role, 0)}", "",
         f"at most {rate(r.runs.max_unusable_share)} of its runs"]
        for role, u in r.runs.unusable.items()
    ]  # fmt: skip


def _guard_rows(r: GateReceipt) -> Rows:
    need = "required" if r.thresholds.require_guard else "passed, or nothing to read"
    return [["candidate's guard", esc(r.candidate.guard), "", need]]


_CHECK_ROWS: dict[str, Callable[[GateReceipt], Rows]] = {
    "paired_reward": _paired_rows,
    "regressions": _regression_rows,
    "p95_budget": lambda r: _p95_rows(r, margin=False),
    "p95_vs_incumbent": lambda r: _p95_rows(r, margin=True),
    "llm_ttft_ratio": _llm_rows("llm_ttft_ms"),
    "llm_turn_ratio": _llm_rows("llm_turn_ms"),
    "caller_gap_budget": _caller_gap_rows,
    "time_to_yield_ratio": _yield_ratio_rows,
    "time_to_yield_budget": _yield_budget_rows,
    "false_interruption_diff": lambda r: _false_interruption_rows(r, diff=True),
    "false_interruption_rate": lambda r: _false_interruption_rows(r, diff=False),
    "unauthorized_writes": _writes_rows,
    "unusable_runs": _unusable_rows,
    "training_guard": _guard_rows,
}


def _check_section(r: GateReceipt, c: GateCheck, extra: str = "", detail: str | None = None) -> str:
    """One check: its numbers against its threshold, then the gate's words (or `detail`)."""
    rows = _CHECK_ROWS.get(c.name, lambda _: [])(r)
    table = _table(
        ["quantity", "value", "95% interval", "threshold", "status"],
        [[*row, _status(c.status) if row[3] else ""] for row in rows],
    ) if rows else ""  # fmt: skip
    return (
        f'<section class="check {c.status}" id="check-{esc(c.name)}">'
        f"<h3>{esc(TITLES.get(c.name, c.name))} <code>{esc(c.name)}</code> {_status(c.status)}</h3>"
        f'{table}<p class="detail">{esc(c.detail) if detail is None else detail}</p>{extra}'
        "</section>"
    )


def _incidents(r: GateReceipt) -> str:
    incidents = r.safety.candidate.incidents
    if not incidents:
        return ""
    return _table(
        ["scenario", "run", "tool call", "wrote", "failed check", "session"],
        [[f"<b>{esc(i.scenario)}</b>", str(i.run), esc(i.tool or "none recorded"), esc(i.kind),
          esc(i.check or ""), esc(i.session_id or "")] for i in incidents],
    )  # fmt: skip


def _guard_section(r: GateReceipt, c: GateCheck, training: Training | None) -> str:
    """The guard check with the guard's recorded fields, when the ledger has them."""
    if training is None or not training.guard:
        return _check_section(r, c)
    words = f"training run {esc(training.run_id or 'unknown')}: guard {esc(r.candidate.guard)}"
    return _check_section(r, c, _fields(training.guard), detail=words)


# -- latency, training, scenarios ---------------------------------------------------------------


def _figure(fig: Any, caption: str) -> str:
    return f"<figure>{svg(fig)}<figcaption>{esc(caption)}</figcaption></figure>"


def latency_section(r: GateReceipt) -> str:
    """What gates, then the gated P95, the per-call LLM figures and the per-caller-turn stages.

    Each under its own name, and as numbers beside its plot when it has data: a per-caller-turn
    figure (tool rounds included) is never shown as if it were the per-call one the check reads.
    """
    lat = r.latency
    parts = [
        f"<p><b>{esc(latency_gates(r))}</b></p>",
        f'<p class="detail">{esc(PER_CALL_VS_TURN)}</p>',
    ]
    cdf = cdf_figure(r)
    if lat.v2v_p95 is None:
        why = "text mode, the LLM stages are gated instead" if lat.text_mode else (
            "not for both policies in two or more scenarios")  # fmt: skip
        parts.append(f'<p class="missing">No voice-to-voice samples ({why}).</p>')
    else:
        table = _table(
            ["P95", "estimate", "95% interval", "turns in scenarios"],
            [[esc(c) for c in row] for row in p95_rows(lat)],
        )
        plot = (
            _figure(cdf, "Pooled turns of every paired run; dashed: the P95 budget.") if cdf else ""
        )
        parts.append(
            f"<h3>{esc(p95_name(lat).capitalize())} P95, per caller turn</h3>"
            f'<div class="pair">{table}{plot}</div>'
        )
    gaps = caller_gap_rows(lat)
    if gaps:
        parts.append(
            f'<h3>Caller-perceived gap</h3><p class="detail">{esc(CALLER_GAP_LEAD)}</p>'
            + _table(CALLER_GAP_HEADER, [[esc(c) for c in row] for row in gaps])
        )
    parts.append(
        "<h3>Per LLM call</h3>"
        + _table(
            ["measure (P50)", "candidate", "incumbent", "candidate / incumbent", "95% interval",
             "check"],
            [[esc(c) for c in row] for row in llm_rows(r)],
        )
    )  # fmt: skip
    rows = stage_rows(lat)
    if not measured_stages(r) or not rows:
        parts.append('<p class="missing">No per-stage latency samples.</p>')
        return "".join(parts)
    table = _table(
        ["stage", "candidate P50", "candidate P95", "incumbent P50", "incumbent P95",
         "turns (cand / inc)"],
        [[esc(c) for c in row] for row in rows],
    )  # fmt: skip
    grew = lat.attributed_stage
    note = (
        f"<p>Stage whose P95 grew most: <b>{esc(STAGE_LABELS.get(grew, grew))}</b>.</p>"
        if grew else ""
    )  # fmt: skip
    plot = stages_figure(r)
    parts.append(
        f'<h3>Per caller turn, by stage</h3>{note}<div class="pair">{table}'
        f"{_figure(plot, 'Solid: P50, light: P95.') if plot else ''}</div>"
    )
    return "".join(parts)


def turn_taking_section(r: GateReceipt) -> str:
    """Both arms' turn-taking beside the paired comparisons; absent in older receipts."""
    t = r.turn_taking
    if t is None:
        return ""
    head = f'<h2 id="turn-taking">Turn-taking</h2><p class="detail">{esc(turn_taking_lead(t))}</p>'
    if t.unavailable is not None:
        return head
    table = _table(TURN_TAKING_HEADER, [[esc(c) for c in row] for row in turn_taking_rows(t)])
    said = "".join(f"<li>{esc(line)}</li>" for line in turn_taking_comparisons(t))
    return head + table + (f"<ul>{said}</ul>" if said else "")


def _field(value: Any) -> str:
    """A recorded value as text: nested mappings as nested field tables, long lists shortened."""
    if isinstance(value, dict):
        return _fields(value) if value else "—"
    if isinstance(value, list | tuple):
        shown = ", ".join(_field(v) for v in value[:8])
        return shown + (f" … ({len(value)} in all)" if len(value) > 8 else "")
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return plain(value)
    return esc(str(value))


def _fields(values: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{esc(str(k))}</td><td>{_field(v)}</td></tr>" for k, v in values.items()
    )
    return f'<table class="fields">{rows}</table>'


def training_section(r: GateReceipt, training: Training | None) -> str:
    """The candidate's lineage and its step-log curves, with their numbers beside them."""
    lin = r.candidate
    facts = {
        "adapter": lin.name, "kind": lin.kind, "parent": lin.parent, "base model": lin.base_model,
        "training run": lin.training_run_id, "training sessions": lin.training_sessions,
        "guard": lin.guard,
    }  # fmt: skip
    if training is None:
        return (
            f'{_fields(facts)}<p class="missing">No training run recorded in the ledger for '
            f"{esc(lin.name)}: {esc(lin.guard_detail)}</p>"
        )
    facts["algorithm"] = training.algo
    curves = training.curves()
    if not curves:
        where = esc(str(training.log)) if training.log else "no run id"
        missing = f"No training curves: no step log ({where})."
        return f'{_fields(facts)}<p class="missing">{missing}</p>'
    table = _table(
        ["metric", "logged", "first", "last", "min", "max"],
        [[esc(name), str(len(ys)), *(f"{x:.4g}" for x in (ys[0], ys[-1], min(ys), max(ys)))]
         for name, (_, ys) in curves.items()],
    )  # fmt: skip
    skipped = f"; {training.unreadable} unreadable line(s) left out" if training.unreadable else ""
    caption = f"Step log {training.log} ({len(training.rows)} lines{skipped})."
    fig = curves_figure(curves)
    plot = _figure(fig, caption) if fig else ""
    return f'{_fields(facts)}<h3>Training curves</h3><div class="pair">{table}{plot}</div>'


def scenario_table(r: GateReceipt, failed: set[str]) -> str:
    """Every held-out scenario's paired result; those a check failed on are marked."""
    header = ["scenario", "group", "pairs", "candidate", "incumbent", "delta", "outcome",
              "lost / won runs", "p (worse)", "regression", "writes (cand / inc)"]  # fmt: skip
    rows = [
        [f"<b>{esc(s.scenario)}</b>" if s.scenario in failed else esc(s.scenario),
         esc(s.group or ""), str(s.pairs), f"{s.candidate_mean:.3f}", f"{s.incumbent_mean:.3f}",
         delta(s.delta), s.outcome, f"{s.worse_runs} / {s.better_runs}",
         p_value(s.regression_p), s.regression,
         f"{s.candidate_unauthorized_writes} / {s.incumbent_unauthorized_writes}"]
        for s in r.scenarios
    ]  # fmt: skip
    marked = {i for i, s in enumerate(r.scenarios) if s.scenario in failed}
    return _table(header, rows, marked=marked)


def hotspots_section(r: GateReceipt) -> str:
    """The cells worst for the candidate: a table of both policies beside the heat map."""
    h = r.hotspots
    if h is None:
        return ""
    rows = hotspot_rows(h, HEATMAP_ROWS)
    table = _table(
        ["cell", "candidate", "incumbent", "writes (cand / inc)", "scenarios"],
        [[esc(c.name), rate_text(c), rate_text(i),
          f"{c.unauthorized_writes} / {i.unauthorized_writes}", str(c.scenarios)]
         for c, i in rows],
    )  # fmt: skip
    fig = hotspots_figure(h)
    cand = h.candidate
    left = f"; {cand.without_axes} run(s) of scenarios without axes left out" if (
        cand.without_axes) else ""  # fmt: skip
    caption = (
        f"Paired runs by axis ({', '.join(cand.axes)}), worst for the candidate first; cells "
        f"with under {cand.min_runs} runs are marked few and listed last{left}."
    )
    plot = _figure(fig, caption) if fig else ""
    return (
        '<h2 id="hotspots">Hot spots</h2><p class="detail">Descriptive: no check reads it; '
        f'receipt.json holds every cell.</p><div class="pair">{table}{plot}</div>'
    )


def _cost_rows(r: GateReceipt) -> Rows:
    rows = []
    for role, cost in (("candidate", r.cost.candidate), ("incumbent", r.cost.incumbent)):
        if cost is None:
            rows.append([role, "not recorded", "not recorded", "not recorded"])
        else:
            per_success = "n/a" if cost.per_success_usd is None else f"${cost.per_success_usd:.5f}"
            rows.append([role, f"${cost.per_call_usd:.5f}", per_success,
                         f"{cost.mean_completion_tokens:.1f}"])  # fmt: skip
    return rows


_DELTAS_CAPTION = "Each dot is one held-out scenario; the band is the 95% CI."


def render_html(r: GateReceipt, ledger: Ledger | None = None) -> str:
    """The whole page as one string; with the ledger, the candidate's training is shown too."""
    p = r.paired
    failed = failed_scenarios(r)
    failed_list = "".join(
        f"<li><b>{esc(s)}</b> — {esc(TITLES.get(check, check))}: {esc(what)}</li>"
        for s, check, what in failed
    )
    failed_html = (
        f"<h2>Scenarios that failed a check</h2><ul>{failed_list}</ul>" if failed
        else "<p>No scenario failed a check on its own.</p>"
    )  # fmt: skip
    training = lineage_training(ledger, r.candidate)
    checks = "".join(
        _check_section(r, c, _incidents(r)) if c.name == "unauthorized_writes"
        else _guard_section(r, c, training) if c.name == "training_guard"
        else _check_section(r, c)
        for c in r.checks
    )  # fmt: skip
    deltas = deltas_figure(r)
    lineage = _table(
        ["role", "requested", "name", "kind", "parent", "training run", "guard", "path"],
        [[role, esc(lin.requested), esc(lin.name), lin.kind, esc(lin.parent or "—"),
          esc(lin.training_run_id or "—"), esc(lin.guard), esc(lin.path or "—")]
         for role, lin in (("candidate", r.candidate), ("incumbent", r.incumbent))],
    )  # fmt: skip
    notes = "".join(f"<li>{esc(n)}</li>" for n in r.notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Gate {r.verdict}: {esc(r.candidate.name)} vs {esc(r.incumbent.name)}</title>
<style>{_CSS}</style></head><body>
<h1>Gate <span class="verdict" style="background:{_VERDICT_COLORS[r.verdict]}">{r.verdict}</span>
</h1>
<p class="lead">{lead(r)}</p>
{f'<p class="detail"><b>{esc(MISSING)}</b></p>' if MISSING else ""}
<p><b>Reason:</b> {esc(r.reason)}</p>
<p><b>{esc(r.candidate.name)}</b> (candidate) vs <b>{esc(r.incumbent.name)}</b> (incumbent),
{p.n_scenarios} held-out scenarios, up to {r.repeats} paired runs each;
mean delta {delta(p.mean_delta)}, {esc(ci_text(p))}.</p>
{failed_html}
<h2>Checks</h2>{checks}
<h2>Latency</h2>{latency_section(r)}
{turn_taking_section(r)}
<h2>Score deltas</h2>{_figure(deltas, _DELTAS_CAPTION) if deltas else ""}
<h2>Training of the candidate</h2>{training_section(r, training)}
<h2>Cost</h2>
{_table(["policy", "cost per call", "per successful call", "completion tokens"], _cost_rows(r))}
<h2>Scenarios</h2>{scenario_table(r, {s for s, _, _ in failed})}
{suite_section(r)}
{hotspots_section(r)}
{forks_section(r, ledger)}
<h2>Lineage</h2>{lineage}
<p>Input: {r.input.kind} {esc(r.input.path)}; held-out set {esc(r.input.heldout_set_id or "n/a")};
created {esc(r.created_at)} by pipecat-rl {esc(r.pipecat_rl_version)};
schema version {r.schema_version}; receipt {esc(r.receipt_id)}.</p>
{f"<h2>Notes</h2><ul>{notes}</ul>" if notes else ""}
</body></html>
"""
