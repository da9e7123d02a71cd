"""receipt.html: self-contained, verdict first, one table per check, failing scenarios named,
latency numbers beside the plots, the candidate's training curves; checked in headless Chromium."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.gate import GateConfig, GateData, InputSource, RunResult, evaluate
from pipecat_rl.gate.inputs import UnauthorizedWrite
from pipecat_rl.gate.lineage import base_lineage, ledger_lineage
from pipecat_rl.gate.receipt import GateReceipt, write_receipt
from pipecat_rl.gate.report_html import render_html
from pipecat_rl.gate.wording import ratio as fmt_ratio
from pipecat_rl.ledger import AdapterRecord, Ledger
from tests.chromium import CHROMIUM, render

CANDIDATE_BLUE = np.array([0x1F, 0x6F, 0xEB]) / 255
WRITER = "book-cleaning-03"
"""The scenario in which the candidate makes an unauthorised write (run 1)."""
RUN_ID = "run-20261201-000000-abcdef"
GUARD = {
    "passed": True, "space": "raw_logprobs", "compared_turns": 16, "mean_abs_diff": 5e-06,
    "per_adapter": {"base": {"tokens": 1234, "mean": 5e-06, "max": 2.6e-05}}, "cause": None,
}  # fmt: skip


def _external(text: str) -> list[str]:
    return re.findall(r"""(?:src|href)=["'](?!#)[^"']*""", text)


@pytest.fixture(scope="module")
def v2v_page(tmp_path_factory) -> Path:
    """A gate from a scores file of voice calls: a v2v CDF and per-stage bars to draw."""
    tmp = tmp_path_factory.mktemp("html")
    rng = np.random.default_rng(0)
    lines = []
    for s in range(10):
        for r in range(4):
            for policy, p_win, lat in (("cand", 0.8, 750), ("inc", 0.5, 700)):
                v2v = rng.normal(lat, 120, size=4).tolist()
                lines.append({
                    "scenario": f"scenario-{s}", "policy": policy, "run": r,
                    "reward": float(rng.random() < p_win), "v2v_ms": v2v,
                    "stages_ms": {"stt_ms": [x * 0.2 for x in v2v],
                                  "llm_ttft_ms": [x * 0.5 for x in v2v],
                                  "tts_ttfb_ms": [x * 0.2 for x in v2v]},
                })  # fmt: skip
    scores = tmp / "scores.jsonl"
    scores.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = CliRunner().invoke(
        app, ["gate", "--candidate", "cand", "--incumbent", "inc", "--scores", str(scores),
              "--out", str(tmp / "out"), "--ledger", str(tmp / "ledger.db")]
    )  # fmt: skip
    assert result.exit_code in (0, 1, 2), result.output
    return tmp / "out" / "receipt.html"


def register_candidate(ledger: Ledger, folder: Path, algo: str, guard: dict | None) -> None:
    """The candidate as the trainer registers it: its folder, training run id and guard."""
    run = {"id": RUN_ID, "algo": algo, "guard": guard}
    record = AdapterRecord(
        name="cand", path=str(folder), base_model="smollm2", created_at=1.0, training_run=run
    )
    ledger.register_adapter(record)


@pytest.fixture(scope="module")
def text_gate(tmp_path_factory) -> tuple[GateReceipt, Path, Path]:
    """A text-mode gate of a trained adapter with a planted ~10x TTFT regression and one
    unauthorised write, through the gate's own evaluate and write_receipt with a ledger."""
    tmp = tmp_path_factory.mktemp("text")
    adapters = tmp / "adapters"
    (adapters / "cand").mkdir(parents=True)
    (adapters / "runs").mkdir()
    log = adapters / "runs" / f"{RUN_ID}.metrics.jsonl"
    steps = [
        {"step": i, "policy_loss": round(1 / i, 4), "reward": 0.2 + 0.02 * i, "kl": 0.001 * i,
         "clip_ratio": 0.01 * i, "frac_reward_zero_std": 0.5 - 0.01 * i}
        for i in range(1, 21)
    ]  # fmt: skip
    log.write_text("".join(json.dumps(row) + "\n" for row in steps) + "not json\n")
    rng = np.random.default_rng(1)
    runs = []
    for s in range(8):
        for r in range(2):
            for policy, ttft in (("cand", 5400.0), ("base", 570.0)):
                ms = rng.lognormal(np.log(ttft), 0.3, size=5).tolist()
                wrote = policy == "cand" and s == 3 and r == 1
                write = UnauthorizedWrite(
                    kind="appointments", check="unchanged appointments", tool="cancel_appointment"
                )
                runs.append(RunResult(
                    scenario=f"book-cleaning-{s:02d}", policy=policy, run=r, seed=r,
                    reward=float(rng.random() < 0.7), channel="text", guarded=True,
                    stages_ms={"llm_ttft_ms": ms}, llm_turn_ms=[x * 1.5 for x in ms],
                    unauthorized_writes=int(wrote), writes=[write] if wrote else [],
                ))  # fmt: skip
    data = GateData("cand", "base", tuple(runs), InputSource(kind="ledger", path="test"))
    with Ledger(tmp / "ledger.db") as ledger:
        register_candidate(ledger, adapters / "cand", "grpo", GUARD)
        receipt = evaluate(
            data, GateConfig(), ledger_lineage(ledger, "cand", "cand"), base_lineage("base")
        )
        paths = write_receipt(receipt, tmp / "out", ledger)
    return receipt, paths["html"], log


@pytest.fixture(scope="module")
def text_page(text_gate) -> str:
    return text_gate[1].read_text()


def test_the_v2v_page_is_self_contained_with_its_plots_and_their_numbers(v2v_page):
    text = v2v_page.read_text()
    receipt = GateReceipt.model_validate_json((v2v_page.parent / "receipt.json").read_text())
    assert text.count("<svg") == 3  # deltas, the CDF, the stages
    assert "<script" not in text and _external(text) == [], "nothing fetched: works offline"
    assert "Paired per-scenario deltas" in text and "Voice-to-voice latency CDF" in text
    p95 = receipt.latency.v2v_p95
    assert p95 is not None
    assert f"{p95.candidate.estimate:,.0f}" in text and f"{p95.incumbent.estimate:,.0f}" in text


def test_the_page_leads_with_the_verdict_and_the_failed_checks_in_words(text_gate, text_page):
    receipt = text_gate[0]
    assert receipt.verdict == "REJECT"
    failed = {c.name for c in receipt.checks if c.status == "fail"}
    assert failed == {"llm_ttft_ratio", "llm_turn_ratio", "unauthorized_writes"}
    lead = re.search(r'<p class="lead">(.*?)</p>', text_page).group(1)
    assert lead.startswith("Do not promote cand: 3 check(s) failed")
    assert "LLM time to first token" in lead and "Unauthorised writes" in lead
    assert text_page.index('class="lead"') < text_page.index("<h2>Checks")


def test_each_check_has_its_own_table_styled_by_status(text_gate, text_page):
    receipt = text_gate[0]
    statuses = {c.status for c in receipt.checks}
    assert {"pass", "fail", "uncertain", "unavailable"} <= statuses
    for c in receipt.checks:
        start = text_page.index(f'<section class="check {c.status}" id="check-{c.name}">')
        section = text_page[start : text_page.index("</section>", start)]
        assert "<table>" in section and f'<span class="status {c.status}">' in section, c.name
    for status in ("pass", "fail", "uncertain", "unavailable"):
        assert f".status.{status} {{" in text_page, f"{status} has a style"
    ttft = text_page[text_page.index('id="check-llm_ttft_ratio"') :]
    ratio = receipt.latency.llm["llm_ttft_ms"].ratio
    assert f"{fmt_ratio(ratio.low)} to {fmt_ratio(ratio.high)}" in ttft
    assert "upper bound ≤ 3.0x" in ttft


def test_the_scenario_with_the_unauthorised_write_is_named_before_the_checks(text_page):
    named = text_page[: text_page.index("<h2>Checks")]
    assert f"<li><b>{WRITER}</b> — Unauthorised writes: run 1: cancel_appointment" in named
    assert "book-cleaning-02</b>" not in named, "only the scenario a check failed on"


def test_text_mode_draws_no_plot_from_empty_voice_data(text_page):
    assert "No voice-to-voice samples" in text_page
    assert "latency CDF" not in text_page
    assert text_page.count("<svg") == 3  # the stages, the deltas, the training curves


def test_the_guard_is_shown_as_fields_not_a_python_repr(text_page):
    guard = text_page[text_page.index('id="check-training_guard"') :]
    guard = guard[: guard.index("</section>")]
    assert f"training run {RUN_ID}: guard passed" in guard
    assert "<td>compared_turns</td><td>16</td>" in guard
    assert "<td>tokens</td><td>1,234</td>" in guard  # a nested field, as a nested table
    assert "<td>mean</td><td>0.000005</td>" in guard  # never 5e-06
    assert "{'" not in text_page and "'base'" not in text_page


def test_the_candidates_training_curves_come_from_its_step_log(text_gate, text_page):
    log = text_gate[2]
    training = text_page[text_page.index("<h2>Training of the candidate") :]
    for metric, first, last in (
        ("policy_loss", "1", "0.05"),
        ("reward", "0.22", "0.6"),
        ("kl", "0.001", "0.02"),
        ("clip_ratio", "0.01", "0.2"),
        ("frac_reward_zero_std", "0.49", "0.3"),
    ):
        assert re.search(
            rf'<td>{metric}</td><td class="num">20</td><td class="num">{first}</td>'
            rf'<td class="num">{last}</td>', training
        ), metric  # fmt: skip
    assert f"Step log {log} (20 lines; 1 unreadable line(s) left out)" in training
    assert "<td>algorithm</td><td>grpo</td>" in training


def test_without_the_ledger_the_page_says_no_training_run_was_read(text_gate):
    page = render_html(text_gate[0])
    assert "No training run recorded in the ledger for cand" in page
    assert "Training curves" not in page


def test_a_missing_step_log_is_said_not_plotted(text_gate, tmp_path):
    receipt = text_gate[0]
    with Ledger(tmp_path / "ledger.db") as ledger:
        register_candidate(ledger, tmp_path / "cand", "sft", None)
        page = render_html(receipt, ledger)
    assert f"No training curves: no step log ({tmp_path / 'runs' / RUN_ID}" in page
    assert page.count("<svg") == 2


def _text(dom: str) -> str:
    """The DOM's visible text, one space between elements."""
    body = re.sub(r"<(style|svg)\b.*?</\1>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)).replace("&gt;", ">")


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")
def test_chromium_shows_the_ttft_numbers_and_the_failing_scenario(text_gate, tmp_path):
    receipt, page, _ = text_gate
    image, dom, console = render(page, tmp_path, size=(1200, 2000))
    assert console == [], console
    text = _text(dom)
    stages = receipt.latency.stages
    for role in ("candidate", "incumbent"):
        q = stages[role]["llm_ttft_ms"]
        # the scores carry the caller-turn stage only, and the check says so
        assert f"{role} LLM TTFT per caller turn P50 {q.p50:,.0f} ms" in text, role
    cand, inc = stages["candidate"]["llm_ttft_ms"], stages["incumbent"]["llm_ttft_ms"]
    assert (
        f"LLM TTFT per caller turn {cand.p50:,.0f} ms {cand.p95:,.0f} ms {inc.p50:,.0f} ms "
        f"{inc.p95:,.0f} ms" in text
    )
    assert "per caller turn: everything between the caller's line and the agent's answer" in text
    assert f"Scenarios that failed a check {WRITER} — Unauthorised writes: run 1" in text
    assert image.shape[:2] == (2000, 1200)
    colours = np.unique((image.reshape(-1, 3) * 255).round().astype(int), axis=0)
    assert len(colours) > 200, "text, status badges and plot shading, not a blank page"
    red = np.all(np.abs(image - np.array([0xCF, 0x22, 0x2E]) / 255) < 0.05, axis=-1)
    assert red.sum() > 500, "the REJECT badge and the failed checks' red borders are drawn"


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")
def test_the_v2v_page_renders_its_plots_in_chromium(v2v_page, tmp_path):
    image, dom, console = render(v2v_page, tmp_path, size=(1200, 4000))
    assert console == [], console
    assert dom.count("<svg") == 3
    assert image.shape[:2] == (4000, 1200)
    blue = np.all(np.abs(image - CANDIDATE_BLUE) < 0.05, axis=-1)
    assert blue.sum() > 500, "the plots' candidate series are visible"


COMMITTED = Path(__file__).resolve().parents[1] / "docs" / "results" / "cycle-clinic" / "receipt"


def test_the_committed_cycle_receipt_shows_its_ttft_and_the_failing_scenarios(tmp_path):
    """The main job's committed receipt, as it renders: the verdict, the per-call TTFT numbers
    and every scenario a check failed on (those that wrote what they must not among them), or
    the line that says none did; whichever verdict the committed run reached."""
    from pipecat_rl.gate.receipt import load_receipt
    from pipecat_rl.gate.report_html import failed_scenarios

    receipt = load_receipt(COMMITTED / "receipt.json")  # the current schema
    ttft = receipt.latency.llm["llm_ttft_ms"]
    failed = {s for s, _, _ in failed_scenarios(receipt)}
    assert {i.scenario for i in receipt.safety.candidate.incidents} <= failed
    if CHROMIUM is None:
        pytest.skip("chromium is not installed")
    image, dom, console = render(COMMITTED / "receipt.html", tmp_path)
    assert console == [] and np.asarray(image).std() > 0.05
    text = re.sub(r"<[^>]+>", " ", dom)
    assert f"{ttft.candidate:,.0f} ms vs {ttft.incumbent:,.0f} ms" in text
    if failed:
        start = text.index("Scenarios that failed a check")
        listed = text[start : text.index("Checks", start)]
        assert all(scenario in listed for scenario in failed), (failed, listed)
    else:
        assert "No scenario failed a check on its own." in text
    assert f"Gate {receipt.verdict}:" in dom
