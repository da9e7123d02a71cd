"""The gate's receipt: a schema-versioned record of what was compared, how, and what was decided.

`receipt.json` is the source of truth (`promote` reads it); `receipt.md` and `receipt.html` are
renderings of it for people. At gate time the sha256 of `receipt.json`'s bytes and its verdict go
into the ledger (`gate_receipts`), so a receipt edited afterwards no longer matches and cannot be
promoted (see `promote`). No number the gate computed is ever written as `null`: a non-finite
statistic is refused before the receipt is written. A receipt holds the candidate's and
incumbent's lineage, the held-out set and file hashes, seeds, repeats, thresholds, every
statistic, the per-scenario table, the hot spots of a scenario matrix (both policies' paired runs
per axis value and pair of values; absent when no scenario has axes, and in older receipts), and
the verdict with its reason; and, when the gate ran a regression suite, its runs and test (absent
before, and without one). The caller-perceived gap per arm (`latency.caller_gap`) and the
turn-taking section (`turn_taking`) came later without a schema bump: both are additions an older
reader has no field to misread, absent (empty, None) in older receipts, and their checks are on
a receipt only when its thresholds configured them.
"""

import hashlib
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipecat_rl.errors import GateError
from pipecat_rl.gate.config import GateConfig
from pipecat_rl.gate.cost import CostSummary
from pipecat_rl.gate.inputs import InputSource, Unusable
from pipecat_rl.gate.latency import (
    LLM_MEASURES,
    STAGE_LABELS,
    STAGES,
    QuantileComparison,
    QuantileInterval,
    RatioComparison,
    StageQuantiles,
    TtftUnit,
    llm_label,
)
from pipecat_rl.gate.lineage import Lineage
from pipecat_rl.gate.regressions import RegressionTest
from pipecat_rl.gate.safety import SafetyArm, writes_words
from pipecat_rl.gate.stats import IntervalMethod, Outcome, SampleSize, SignFlip
from pipecat_rl.gate.turntaking import RateInterval, TurnTakingArm, TurnTakingStats
from pipecat_rl.gate.verdict import Decision, GateCheck, check_reason
from pipecat_rl.gate.wording import (
    PER_CALL_VS_TURN,
    STATUS_WORDS,
    count,
    delta,
    interval,
    join_and,
    ms,
    p_value,
    rate,
    ratio,
)
from pipecat_rl.ledger import Ledger
from pipecat_rl.scoring import HotSpotRow, HotSpots

RECEIPT_FILES = ("receipt.json", "receipt.md", "receipt.html")
"""The files of a receipt folder, the source of truth first (`write_receipt`)."""

SCHEMA_VERSION = 5
"""Bumped on any change a reader of an older receipt would misread (2: t interval, evidence-based
regressions, authoritative score, receipt id; 3: exact discordant-pair regression tests, the
sign-flip test, REJECT only on a surely worse candidate, Woodruff P95 intervals and paired
differences, text-mode LLM latency ratios, both arms' unauthorised writes with a denominator,
unusable runs counted, runs paired by seed and occurrence; 4: the unauthorised-write bound takes the
scenario as its unit; 5: `reason` is one sentence and `reasons` one entry per check, the checks'
details are sentences in one number format, and `latency.llm_ttft_unit` says what the gated TTFT
was measured per). Receipts of schema 3 and 4 still load."""

OLDEST_SCHEMA = 3
"""The oldest receipt schema this version still reads (and `promote` still verifies)."""

Role = Literal["candidate", "incumbent"]


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PairedStats(_Part):
    """The paired score comparison over scenarios."""

    score: str
    """What was paired: the authoritative part, and any judged parts with their weights."""
    n_scenarios: int
    n_pairs: int
    mean_delta: float
    ci95: tuple[float, float] | None
    """None only with fewer than two paired scenarios (no interval can be computed)."""
    method: IntervalMethod
    level: float
    se: float | None
    df: int | None
    zero_width: bool
    """Every scenario had the same delta: the interval is a point, no evidence of spread."""
    sign_flip: SignFlip
    """The sign-flip test of "no difference" over the same deltas."""
    wins: int
    losses: int
    """Scenarios whose mean delta is below -tie_band (point estimates; see `regressions`)."""
    ties: int
    tie_band: float
    pass_k: dict[Role, dict[int, float]]
    """pass^k for k = 1..min repeats, per policy, by the authoritative part."""
    sample_size: SampleSize


class RegressionStats(_Part):
    """The exact discordant-pair tests of the family, and what they confirmed."""

    control: str
    """The error control, in words (Holm, family-wise, at `alpha`)."""
    alpha: float
    tests: list[RegressionTest]
    confirmed: int
    max_regressions: int
    fewest_losses: int
    """Runs a unit must lose (winning none) before any test of this family can confirm it."""


class LatencyStats(_Part):
    """The gated P95 (paired over scenarios), the LLM-stage ratios, per-stage P50/P95, CDFs."""

    text_mode: bool
    """Every run was a text call: no voice, so the LLM stages carry the latency checks."""
    gated_on: Literal["v2v", "heard_gap"]
    """What `v2v_p95` (the gated P95) measures: in-agent v2v, or the caller-side heard gap."""
    v2v_p95: QuantileComparison | None
    in_agent_v2v_p95: QuantileComparison | None
    """Beside a heard-gap gate: the in-agent voice-to-voice P95, for attribution."""
    llm: dict[str, RatioComparison | None]
    """Candidate / incumbent P50 of each of `LLM_MEASURES` (None without samples for both)."""
    llm_ttft_unit: TtftUnit | None = None
    """What the gated LLM TTFT was measured per: each LLM call, or (runs without per-call
    timing) each caller turn, or some of each; None without TTFT samples, and before schema 5
    (per call wherever it was recorded)."""
    stages: dict[Role, dict[str, StageQuantiles]]
    attributed_stage: str | None
    """The stage whose P95 grew most from incumbent to candidate (None if none grew)."""
    cdf_ms: dict[Role, list[float]]
    """Gated-latency quantiles at 0, 1, ..., 100 percent, for the CDF plot."""
    caller_gap: dict[Role, StageQuantiles] = Field(default_factory=dict)
    """Per caller line, the wait for the agent's first words, tool rounds included
    (`inputs.caller_gap_samples`), P50/P95 per arm; empty in older receipts."""
    caller_gap_p95: QuantileInterval | None = None
    """The candidate's P95 caller-perceived gap with Woodruff's interval over scenarios (what
    `caller_gap_p95_budget_ms` reads); None without samples in 2 or more scenarios."""


class SafetyStats(_Part):
    """Unauthorised writes of both policies (`gate.safety`)."""

    candidate: SafetyArm
    incumbent: SafetyArm


class RunAccounting(_Part):
    """Per policy: runs paired, and the sessions left out (harness errors, unverified)."""

    paired: dict[Role, int]
    unusable: dict[Role, Unusable]
    max_unusable_share: float


class CostStats(_Part):
    """Cost per call and per successful call; None for a policy whose usage was not recorded."""

    candidate: CostSummary | None
    incumbent: CostSummary | None


class HotSpotStats(_Part):
    """Both policies' paired runs per axis value and pair of values (`scoring.hot_spots`).

    Descriptive, never a check: the paired score and the regression tests decide.
    """

    candidate: HotSpots
    incumbent: HotSpots


class ScenarioRow(_Part):
    """One held-out scenario's paired result."""

    scenario: str
    scenario_hash: str | None
    group: str | None
    """Its regression group, when groups are configured."""
    pairs: int
    seeds: list[int | None]
    candidate_mean: float
    incumbent_mean: float
    delta: float
    outcome: Outcome
    worse_runs: int
    """Paired runs in which the candidate scored below incumbent - tie_band (discordant, lost)."""
    better_runs: int
    """Paired runs in which it scored above incumbent + tie_band (discordant, won)."""
    regression_p: float
    """One-sided exact p-value of "worse" over this scenario's discordant runs alone."""
    regression: Literal["regressed", "none", "untested"]
    """`regressed` when its own per-scenario test is confirmed; `untested` when the family has
    no per-scenario test (its runs count in the pooled or group tests)."""
    candidate_passed: int
    incumbent_passed: int
    candidate_unauthorized_writes: int
    incumbent_unauthorized_writes: int


class SuiteRow(_Part):
    """One scenario of the regression suite: paired runs, lost and won, and each arm's passes."""

    scenario: str
    scenario_hash: str | None
    pairs: int
    worse_runs: int
    better_runs: int
    candidate_passed: int
    incumbent_passed: int


class RegressionSuiteStats(_Part):
    """A fixed regression suite run beside the held-out set (`loop.yaml`'s `regressions:`).

    Its runs never enter the paired score: they answer only "is the candidate surely worse
    here?" (`regressions.suite_tests`, the `regression_suite` check).
    """

    set_id: str | None
    """The suite's files' hash (the held-out set id of that folder)."""
    files: dict[str, str] = Field(default_factory=dict)
    """File -> sha256 of the suite's scenario files."""
    scenarios: list[SuiteRow]
    tests: list[RegressionTest]
    unusable: dict[Role, Unusable]
    notes: list[str] = Field(default_factory=list)


class GateReceipt(_Part):
    """Everything about one gate decision."""

    schema_version: Literal[3, 4, 5] = SCHEMA_VERSION
    receipt_id: str
    """Unique per gate run, so two runs of the same data are two receipts."""
    created_at: str
    pipecat_rl_version: str
    verdict: Decision
    reason: str
    """One sentence a person can act on, led by the verdict (before schema 5: every check's
    detail joined)."""
    reasons: list[str] = Field(default_factory=list)
    """One entry per check, in the order of `checks`: its title, status and detail (empty before
    schema 5; `reasons_of` words an older receipt's checks the same way)."""
    exit_code: int
    candidate: Lineage
    incumbent: Lineage
    input: InputSource
    repeats: int
    """Most paired runs of any scenario."""
    thresholds: GateConfig
    paired: PairedStats
    regressions: RegressionStats
    latency: LatencyStats
    safety: SafetyStats
    runs: RunAccounting
    cost: CostStats
    scenarios: list[ScenarioRow]
    unauthorized_writes: int
    """By the candidate, over all its runs (paired or not)."""
    checks: list[GateCheck]
    notes: list[str] = Field(default_factory=list)
    hotspots: HotSpotStats | None = None
    """None when no paired scenario has axes (and in receipts written before hot spots)."""
    regression_suite: RegressionSuiteStats | None = None
    """A regression suite's runs and test, when the gate ran one (its check is the last)."""
    turn_taking: TurnTakingStats | None = None
    """Both arms' turn-taking (`gate.turntaking`); None in receipts written before it."""

    @model_validator(mode="after")
    def _one_reason_per_check(self) -> "GateReceipt":
        """From schema 5, every check has its entry in `reasons`."""
        if self.schema_version >= 5 and len(self.reasons) != len(self.checks):
            raise ValueError(
                f"reasons has {len(self.reasons)} entries for {len(self.checks)} checks"
            )
        return self


def reasons_of(r: GateReceipt) -> list[str]:
    """The receipt's reasons, one per check; an older receipt's worded from its checks."""
    return r.reasons or [check_reason(c) for c in r.checks]


def load_receipt(path: Path) -> GateReceipt:
    """Read a receipt.json (or the folder holding one).

    Raises:
        GateError: missing, unreadable, or not a receipt this version understands.
    """
    file = path / "receipt.json" if path.is_dir() else path
    try:
        return GateReceipt.model_validate_json(file.read_bytes())
    except OSError as e:
        raise GateError(f"cannot read the receipt {file}: {e.strerror}; check the path.") from e
    except ValidationError as e:
        raise GateError(
            f"{file} is not a gate receipt of schema version {OLDEST_SCHEMA} to {SCHEMA_VERSION} "
            f"({e.error_count()} problem(s)); re-run `pipecat-rl gate` to produce one."
        ) from e


def ci_text(p: PairedStats) -> str:
    """The interval as people read it, with its method and the sign-flip test beside it."""
    flip = f"sign-flip p = {p_value(p.sign_flip.p_two_sided)} ({p.sign_flip.method})"
    if p.ci95 is None:
        return f"no interval ({p.n_scenarios} scenario: an interval needs two); {flip}"
    low, high = p.ci95
    width = ", zero width: no evidence of spread" if p.zero_width else ""
    se = "" if p.se is None else f", se {p.se:.3f}"
    return f"{interval(low, high)} (Student t, {p.df} df{se}{width}); {flip}"


def _fmt(value: float | None, digits: str = ".3g") -> str:
    return "n/a" if value is None else format(value, digits)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else ms(value)


LATENCY_CHECKS = (
    "p95_budget", "p95_vs_incumbent", "llm_ttft_ratio", "llm_turn_ratio", "caller_gap_budget",
)  # fmt: skip
"""The checks that read latency, in the order the receipt lists them."""


def p95_name(lat: LatencyStats) -> str:
    """What the gated P95 measures, in words."""
    return "heard gap" if lat.gated_on == "heard_gap" else "voice-to-voice"


def latency_gates(r: GateReceipt) -> str:
    """Which latency measures gate this receipt, and that the stages per caller turn do not."""
    t, lat = r.thresholds, r.latency
    said = {
        "p95_budget": f"the {p95_name(lat)} P95 within the {ms(t.p95_budget_ms)} budget",
        "p95_vs_incumbent": f"the {p95_name(lat)} P95 at most {ms(t.p95_margin_ms)} over the "
        "incumbent's",
        **{
            f"{'llm_ttft' if m == 'llm_ttft_ms' else 'llm_turn'}_ratio": f"the P50 "
            f"{llm_label(m, lat.llm_ttft_unit)} at most {ratio(t.max_llm_latency_ratio)} the "
            "incumbent's"
            for m in LLM_MEASURES
        },
        "caller_gap_budget": "the caller-perceived gap P95 within the "
        f"{ms(t.caller_gap_p95_budget_ms or 0)} budget",
    }  # fmt: skip
    gated = [
        f"{said[c.name]} ({STATUS_WORDS[c.status]})"
        for c in r.checks
        if c.name in LATENCY_CHECKS and c.status != "unavailable"
    ]
    if not gated:
        return "No latency check gated this receipt (latency not required, or not measured)."
    return (
        f"Gated on the candidate's latency: {join_and(gated)}. The per-stage figures below "
        "break the latency down; no check reads them."
    )


def p95_rows(lat: LatencyStats) -> list[list[str]]:
    """The gated P95: per policy and the difference, as (what, estimate, 95% interval, turns)."""
    v = lat.v2v_p95
    if v is None:
        return []

    def high(i: QuantileInterval) -> str:
        return ms(i.high) if i.bounded else "unbounded"

    d = v.difference
    return [
        *([role, ms(i.estimate), f"{ms(i.low)} to {high(i)}", f"{i.turns:,} in {i.clusters}"]
          for role, i in (("candidate", v.candidate), ("incumbent", v.incumbent))),
        ["candidate − incumbent", ms(d.estimate, signed=True),
         f"{ms(d.low, signed=True)} to {ms(d.high, signed=True)}", f"{v.clusters} scenarios"],
    ]  # fmt: skip


def llm_rows(r: GateReceipt) -> list[list[str]]:
    """Per LLM call: (measure, candidate P50, incumbent P50, ratio, 95% interval, status)."""
    lat, status = r.latency, {c.name: c.status for c in r.checks}
    rows = []
    for measure in LLM_MEASURES:
        c = lat.llm.get(measure)
        name = f"{'llm_ttft' if measure == 'llm_ttft_ms' else 'llm_turn'}_ratio"
        label = llm_label(measure, lat.llm_ttft_unit)
        word = STATUS_WORDS.get(status.get(name, "unavailable"), "")
        if c is None:
            rows.append([label, "n/a", "n/a", "n/a", "no samples for both policies", word])
        else:
            rows.append([
                label, ms(c.candidate), ms(c.incumbent), ratio(c.ratio.estimate),
                f"{ratio(c.ratio.low)} to {ratio(c.ratio.high)}",
                f"{word} (limit {ratio(r.thresholds.max_llm_latency_ratio)})",
            ])  # fmt: skip
    return rows


def stage_rows(lat: LatencyStats) -> list[list[str]]:
    """Per caller turn, each measured stage: (stage, P50 and P95 of each policy, turns)."""
    cand, inc = lat.stages["candidate"], lat.stages["incumbent"]
    return [
        [STAGE_LABELS.get(s, s), _ms(cand[s].p50), _ms(cand[s].p95), _ms(inc[s].p50),
         _ms(inc[s].p95), f"{cand[s].n:,} / {inc[s].n:,}"]
        for s in STAGES
        if s in cand and s in inc and (cand[s].n or inc[s].n)
    ]  # fmt: skip


CALLER_GAP_HEADER = ["policy", "P50", "P95", "95% interval of the P95", "caller lines"]


def caller_gap_rows(lat: LatencyStats) -> list[list[str]]:
    """The caller-perceived gap per arm: (policy, P50, P95, the candidate's interval, lines)."""
    i = lat.caller_gap_p95
    band = "" if i is None else f"{ms(i.low)} to {ms(i.high) if i.bounded else 'unbounded'}"
    return [
        [role, _ms(q.p50), _ms(q.p95), band if role == "candidate" else "", f"{q.n:,}"]
        for role, q in lat.caller_gap.items()
        if q.n
    ]


CALLER_GAP_LEAD = (
    "Caller-perceived gap, per caller turn: from the caller's line to the agent's first words, "
    "tool rounds included (the response gap in text mode, the heard gap in audio mode)."
)

TURN_TAKING_HEADER = [
    "policy", "measured calls", "time to yield P50", "time to yield P95 (barge-ins)",
    "missed barge-ins", "false interruptions", "overlap ratio", "awkward silences",
]  # fmt: skip


def _rate_cell(r: RateInterval | None) -> str:
    if r is None:
        return "n/a"
    return f"{r.events}/{r.opportunities}: {rate(r.estimate)} ({rate(r.low)} to {rate(r.high)})"


def turn_taking_rows(t: TurnTakingStats) -> list[list[str]]:
    """Per arm (`TURN_TAKING_HEADER`): time to yield, the rates with intervals, overlap."""

    def row(role: str, a: TurnTakingArm) -> list[str]:
        y = a.time_to_yield
        return [
            role, f"{a.measured_calls:,}", _ms(y.p50), f"{_ms(y.p95)} ({y.n:,})",
            _rate_cell(a.missed_barge_ins), _rate_cell(a.false_interruptions),
            "n/a" if a.overlap_ratio is None else rate(a.overlap_ratio), f"{a.awkward_silences:,}",
        ]  # fmt: skip

    return [row("candidate", t.candidate), row("incumbent", t.incumbent)]


def turn_taking_comparisons(t: TurnTakingStats) -> list[str]:
    """The paired comparisons in words, one line each (what the turn-taking checks read)."""
    lines = []
    if (c := t.time_to_yield_p95) is not None:
        lines.append(
            f"Time to yield P95, candidate / incumbent: {ratio(c.ratio.estimate)} "
            f"({interval(c.ratio.low, c.ratio.high, ratio)}, paired over {c.clusters} scenarios)."
        )
    if (d := t.false_interruption_diff) is not None:
        lines.append(
            f"False interruptions per backchannel, candidate − incumbent: {rate(d.estimate)} "
            f"({interval(d.low, d.high, rate)}, paired over {d.clusters} scenarios)."
        )
    return lines


def turn_taking_lead(t: TurnTakingStats | None) -> str:
    """What the turn-taking section shows, or why it shows nothing."""
    if t is None or t.unavailable is not None:
        return f"Turn-taking unavailable: {t.unavailable if t else 'not recorded'}."
    return (
        "Measured from the caller's side of the line: time to yield per barge-in (how long the "
        "agent talked over the caller, a missed barge-in included); missed barge-ins per "
        "barge-in and false interruptions per backchannel, "
        "each with a 95% interval over scenarios; overlap over all talk time."
    )


def _turn_taking_lines(r: GateReceipt) -> list[str]:
    t = r.turn_taking
    if t is None:
        return []
    lines = ["", "## Turn-taking", "", turn_taking_lead(t)]
    if t.unavailable is None:
        lines += ["", *_md_table(TURN_TAKING_HEADER, turn_taking_rows(t))]
        lines += ["", *(f"- {line}" for line in turn_taking_comparisons(t))]
    return lines


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows),
    ]


def _latency_lines(r: GateReceipt) -> list[str]:
    lat = r.latency
    lines = [latency_gates(r), "", PER_CALL_VS_TURN, ""]
    if lat.v2v_p95 is None:
        lines.append(
            "No voice-to-voice samples: text mode." if lat.text_mode
            else "No voice-to-voice samples for both policies."
        )  # fmt: skip
    else:
        lines += [
            f"### {p95_name(lat).capitalize()} P95, per caller turn",
            "",
            *_md_table(["P95", "estimate", "95% interval", "turns in scenarios"], p95_rows(lat)),
            "",
            "Woodruff intervals per policy; the difference resamples scenarios with both "
            "policies together.",
        ]
    gaps = caller_gap_rows(lat)
    if gaps:
        lines += ["", "### Caller-perceived gap", "", CALLER_GAP_LEAD, "",
                  *_md_table(CALLER_GAP_HEADER, gaps)]  # fmt: skip
    lines += [
        "",
        "### Per LLM call",
        "",
        *_md_table(
            ["measure (P50)", "candidate", "incumbent", "candidate / incumbent", "95% interval",
             "check"],
            llm_rows(r),
        ),  # fmt: skip
    ]
    stages = stage_rows(lat)
    if stages:
        grew = lat.attributed_stage
        lines += [
            "",
            "### Per caller turn, by stage",
            "",
            *_md_table(
                ["stage", "candidate P50", "candidate P95", "incumbent P50", "incumbent P95",
                 "turns (candidate / incumbent)"],
                stages,
            ),  # fmt: skip
            "",
            f"Stage whose P95 grew most: {STAGE_LABELS.get(grew, grew) if grew else 'none'}.",
        ]
    return lines


def _regression_lines(g: RegressionStats) -> list[str]:
    lines = [
        f"- {g.control}; {g.confirmed} confirmed (cap {g.max_regressions}); a unit must lose at "
        f"least {g.fewest_losses} runs, winning none, to be confirmed",
    ]
    shown = [t for t in g.tests if t.kind != "scenarios"]
    if shown:
        lines += [
            "",
            "| test | unit | scenarios | runs | lost | won | p | adjusted | confirmed |",
            "|---|---|---|---|---|---|---|---|---|",
            *(
                f"| {t.kind} | {t.unit} | {t.scenarios} | {t.pairs} | {t.worse} | {t.better} | "
                f"{p_value(t.p_value)} | "
                f"{'n/a' if t.adjusted_p is None else p_value(t.adjusted_p)} | "
                f"{'untested' if not t.tested else 'yes' if t.confirmed else 'no'} |"
                for t in shown
            ),
        ]
    return lines


HOTSPOT_ROWS = 10
"""Worst cells the Markdown receipt and the page list (all of them are in receipt.json)."""


def rate_text(row: HotSpotRow) -> str:
    """A cell's passes over verified runs and its pass rate, `few` said: `3/4 (75%)`."""
    rate = "n/a" if row.pass_rate is None else f"{row.pass_rate:.0%}"
    return f"{row.passes}/{row.verified} ({rate}{', few' if row.few else ''})"


def hotspot_rows(h: HotSpotStats, n: int = HOTSPOT_ROWS) -> list[tuple[HotSpotRow, HotSpotRow]]:
    """(candidate, incumbent) of the `n` cells worst for the candidate, `few` cells last.

    Both policies ran the same paired scenarios, so each cell has both rows.
    """
    incumbent = {r.name: r for r in (*h.incumbent.values, *h.incumbent.pairs)}
    worst = h.candidate.worst(n, few=True)
    return [(c, incumbent[c.name]) for c in worst if c.name in incumbent]


def _hotspot_lines(h: HotSpotStats | None) -> list[str]:
    if h is None:
        return []
    cand = h.candidate
    few = sum(r.few for r in (*cand.values, *cand.pairs))
    lines = [
        "",
        "## Hot spots",
        "",
        f"Paired runs per axis value and pair of values ({', '.join(cand.axes)}), worst for the "
        f"candidate first; {few} cell(s) with under {cand.min_runs} runs marked few, listed last"
        + (f"; {cand.without_axes} run(s) of scenarios without axes left out" if
           cand.without_axes else "") + ". Descriptive: no check reads it.",
        "",
        "| cell | candidate | incumbent | writes (cand / inc) | scenarios |",
        "|---|---|---|---|---|",
    ]  # fmt: skip
    lines += [
        f"| {c.name} | {rate_text(c)} | {rate_text(i)} | {c.unauthorized_writes} / "
        f"{i.unauthorized_writes} | {c.scenarios} |"
        for c, i in hotspot_rows(h)
    ]
    return lines


SUITE_HEADER = ["scenario", "pairs", "lost / won runs", "candidate passed", "incumbent passed"]


def suite_rows(suite: RegressionSuiteStats) -> list[list[str]]:
    """The regression suite's table, one row per scenario (`SUITE_HEADER`), as text."""
    return [
        [s.scenario, str(s.pairs), f"{s.worse_runs} / {s.better_runs}", str(s.candidate_passed),
         str(s.incumbent_passed)]
        for s in suite.scenarios
    ]  # fmt: skip


def suite_lead(suite: RegressionSuiteStats) -> str:
    """What the regression suite's table is, in a sentence."""
    return (
        f"Set {suite.set_id or 'n/a'}: the candidate must not be confirmed worse here; these "
        "runs never enter the paired score."
    )


def _suite_lines(suite: RegressionSuiteStats | None) -> list[str]:
    """The regression suite's section, when the gate ran one."""
    if suite is None:
        return []
    return [
        "", "## Regression suite", "", suite_lead(suite), "",
        *_md_table(SUITE_HEADER, suite_rows(suite)),
        *(f"- {n}" for n in suite.notes),
    ]  # fmt: skip


def render_markdown(r: GateReceipt) -> str:
    """A human summary of the receipt: verdict, checks, statistics, scenario table."""
    p = r.paired
    lines = [
        f"# Gate: {r.verdict}",
        "",
        f"**{r.candidate.name}** (candidate) vs **{r.incumbent.name}** (incumbent, "
        f"requested as `{r.incumbent.requested}`), {p.n_scenarios} held-out scenarios, "
        f"up to {r.repeats} paired runs each, from {r.input.kind} `{r.input.path}`.",
        "",
        f"**{r.reason}**" if r.schema_version >= 5 else f"Reason: {r.reason}",
        "",
        "## Checks",
        "",
        *(f"- {reason}" for reason in reasons_of(r)),
        "",
        "## Paired score",
        "",
        f"- score: {p.score}",
        f"- mean delta {delta(p.mean_delta)}, {ci_text(p)}",
        f"- wins / losses / ties: {p.wins} / {p.losses} / {p.ties} (tie band {p.tie_band:g})",
        f"- smallest detectable effect "
        f"{'n/a' if p.sample_size.mde is None else delta(p.sample_size.mde)}; scenarios to decide "
        f"{_fmt(p.sample_size.required_scenarios, 'd')}; repeats to decide "
        f"{_fmt(p.sample_size.required_repeats, 'd')}",
        *(
            f"- pass^k {role}: "
            + ", ".join(f"k={k}: {rate(v)}" for k, v in sorted(p.pass_k[role].items()))
            for role in ("candidate", "incumbent")
        ),
        "",
        "## Regressions",
        "",
        *_regression_lines(r.regressions),
        *_suite_lines(r.regression_suite),
        "",
        "## Latency",
        "",
        *_latency_lines(r),
        "",
        *_turn_taking_lines(r),
        "",
        "## Safety",
        "",
        f"- {writes_words(r.safety.candidate, 'the candidate')}",
        f"- {writes_words(r.safety.incumbent, 'the incumbent')}",
        "",
        "## Runs",
        "",
        *(
            f"- {role}: {r.runs.paired[role]} paired; left out "
            f"{count(u.harness_errors, 'harness error')}, {count(u.unverified, 'unverified run')} "
            f"and {count(u.unindexed, 'run')} without a scenario or repeat"
            for role, u in r.runs.unusable.items()
        ),
        "",
        "## Cost",
        "",
        "| policy | per call | per successful call | completion tokens |",
        "|---|---|---|---|",
    ]
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
        "| scenario | group | pairs | candidate | incumbent | delta | outcome | lost / won runs | "
        "p (worse) | regression |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {s.scenario} | {s.group or ''} | {s.pairs} | {s.candidate_mean:.3f} | "
            f"{s.incumbent_mean:.3f} | {delta(s.delta)} | {s.outcome} | {s.worse_runs} / "
            f"{s.better_runs} | {p_value(s.regression_p)} | {s.regression} |"
            for s in r.scenarios
        ),
        *_hotspot_lines(r.hotspots),
        "",
        "## Lineage",
        "",
        *(
            f"- {role}: `{lin.name}` ({lin.kind}), guard {lin.guard.replace('_', ' ')}: "
            f"{lin.guard_detail}"
            for role, lin in (("candidate", r.candidate), ("incumbent", r.incumbent))
        ),
        f"- held-out set: {r.input.heldout_set_id or 'n/a'}; input sha256: "
        f"{r.input.sha256 or 'n/a'}",
    ]
    if r.notes:
        lines += ["", "## Notes", "", *(f"- {n}" for n in r.notes)]
    return "\n".join(lines) + "\n"


def non_finite_fields(receipt: GateReceipt) -> list[str]:
    """Dotted paths of every NaN or infinite number in the receipt (JSON would write `null`)."""
    found: list[str] = []

    def walk(value: Any, where: str) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            found.append(where)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{where}.{k}" if where else str(k))
        elif isinstance(value, list | tuple):
            for i, v in enumerate(value):
                walk(v, f"{where}.{i}")

    walk(receipt.model_dump(), "")
    return found


def receipt_sha256(path: Path) -> str:
    """sha256 of a receipt.json's bytes (the identity the ledger records at gate time)."""
    file = path / "receipt.json" if path.is_dir() else path
    return hashlib.sha256(file.read_bytes()).hexdigest()


def write_receipt(
    receipt: GateReceipt, out_dir: Path, ledger: Ledger | None = None
) -> dict[str, Path]:
    """Write receipt.json, receipt.md and receipt.html into `out_dir`; returns their paths.

    With a ledger, the sha256 of receipt.json and its verdict are recorded there: `promote`
    accepts only a receipt whose bytes the gate recorded.

    Raises:
        GateError: a statistic is not finite (it would be written as `null`).
        OSError: `out_dir` is not a writable folder (the message says to pass --out FOLDER).
    """
    from pipecat_rl.gate.report_html import render_html

    bad = non_finite_fields(receipt)
    if bad:
        raise GateError(
            f"the gate computed non-finite values for {', '.join(bad[:5])}; no receipt was "
            "written. This is a bug: report it with the input file."
        )
    paths = {Path(name).suffix[1:]: out_dir / name for name in RECEIPT_FILES}  # json, md, html
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        paths["json"].write_text(receipt.model_dump_json(indent=2) + "\n")
    except OSError as e:  # an I/O error (exit 74), naming the folder and what to pass instead
        raise OSError(e.errno, f"{e.strerror}; pass --out FOLDER", str(out_dir)) from e
    if ledger is not None:
        ledger.record_gate_receipt(
            receipt_sha256=receipt_sha256(paths["json"]),
            receipt_id=receipt.receipt_id,
            verdict=receipt.verdict,
            candidate=receipt.candidate.name,
            incumbent=receipt.incumbent.name,
            heldout_set_id=receipt.input.heldout_set_id,
            path=str(paths["json"].resolve()),
        )
    paths["md"].write_text(render_markdown(receipt))
    paths["html"].write_text(render_html(receipt, ledger))
    return paths
