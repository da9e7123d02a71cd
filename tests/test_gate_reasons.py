"""Receipts in plain words: one sentence to act on, one reason per check, one number format.

Receipts are built the way the gate builds them (`evaluate`, `write_receipt` with a ledger) from
runs with planted outcomes: a clear gain, a small noisy one, and a candidate that is slower per
call and writes what it must not. The committed cycle receipt (schema 4) is the older one that
must still load, render and promote.
"""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipecat_rl.gate import GateConfig, GateData, InputSource, RunResult, evaluate, promote
from pipecat_rl.gate.evaluate import recheck
from pipecat_rl.gate.inputs import UnauthorizedWrite
from pipecat_rl.gate.lineage import base_lineage, ledger_lineage
from pipecat_rl.gate.receipt import (
    GateReceipt,
    load_receipt,
    reasons_of,
    receipt_sha256,
    render_markdown,
    write_receipt,
)
from pipecat_rl.gate.report_html import render_html
from pipecat_rl.gate.verdict import REASON_CHARS, GateCheck, decide
from pipecat_rl.gate.wording import CHECK_TITLES, PER_CALL_VS_TURN, STATUS_WORDS
from pipecat_rl.ledger import AdapterRecord, Ledger

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "docs" / "results" / "cycle-clinic-78f4918" / "receipt" / "receipt.json"
"""A real schema-4 receipt (PROMOTE), its reason ~1,900 characters of joined details."""

GUARD = {
    "passed": True, "space": "processed_logprobs", "compared_turns": 16, "compared_tokens": 1229,
    "skipped_turns": 0, "missing_logprobs_turns": 0, "template_mismatches": 0,
    "mean_abs_diff": 2e-06, "max_abs_diff": 0.000137,
    "per_adapter": {"base": {"tokens": 1229, "mean": 2e-06, "max": 0.000137}},
    "mean_threshold": 0.02, "max_threshold": 0.5, "cause": None, "source": "ledger",
}  # fmt: skip
"""The guard as the trainer records it (the committed receipt showed it as a Python repr)."""

REPRS = ("={", "None", "cause=", "{'", "(s)")


def _runs(
    p_cand: float, p_inc: float, *, seed: int, slower: float = 1.0, writes: bool = False
) -> tuple[RunResult, ...]:
    """Text-mode runs of 12 scenarios x 4 repeats: per-call TTFT, and caller turns that wait
    for tool rounds (10x the per-call figure), as the ledger records them."""
    rng = np.random.default_rng(seed)
    runs = []
    for s in range(12):
        for r in range(4):
            for policy, p, factor in (("cand-v2", p_cand, slower), ("base", p_inc, 1.0)):
                call = rng.lognormal(np.log(480 * factor), 0.3, 3).tolist()
                wrote = writes and policy == "cand-v2" and s == 3 and r in (1, 2)
                runs.append(RunResult(
                    scenario=f"scn-{s:02d}", policy=policy, run=r, seed=r,
                    reward=float(rng.random() < p), channel="text", guarded=True,
                    llm_call_ttft_ms=call, llm_turn_ms=[2 * x for x in call],
                    stages_ms={"llm_ttft_ms": [10 * x for x in call]},
                    unauthorized_writes=int(wrote),
                    writes=[UnauthorizedWrite(kind="appointments", tool="cancel_appointment")]
                    if wrote else [],
                ))  # fmt: skip
    return tuple(runs)


CASES = {
    "PROMOTE": {"p_cand": 0.8, "p_inc": 0.25, "seed": 0},
    "INCONCLUSIVE": {"p_cand": 0.55, "p_inc": 0.5, "seed": 3},
    "REJECT": {"p_cand": 0.8, "p_inc": 0.3, "seed": 0, "slower": 10.0, "writes": True},
}


@pytest.fixture(scope="module")
def gated(tmp_path_factory) -> dict[str, tuple[GateReceipt, dict[str, Path]]]:
    """Each verdict's receipt, written with a ledger that holds the candidate's trained guard."""
    out = {}
    for verdict, case in CASES.items():
        tmp = tmp_path_factory.mktemp(verdict.lower())
        (tmp / "cand-v2").mkdir()
        data = GateData("cand-v2", "base", _runs(**case), InputSource(kind="ledger", path="t"))
        with Ledger(tmp / "ledger.db") as ledger:
            ledger.register_adapter(AdapterRecord(
                name="cand-v2", path=str(tmp / "cand-v2"), base_model="smollm2", created_at=1.0,
                training_run={"id": "run-1", "algo": "grpo", "guard": GUARD},
            ))  # fmt: skip
            receipt = evaluate(
                data, GateConfig(), ledger_lineage(ledger, "cand-v2", "cand-v2"),
                base_lineage("base"),
            )  # fmt: skip
            paths = write_receipt(receipt, tmp / "out", ledger)
        assert receipt.verdict == verdict, receipt.reasons
        out[verdict] = (receipt, paths)
    return out


@pytest.mark.parametrize("verdict", list(CASES))
def test_the_reason_is_one_short_sentence_led_by_the_verdict(gated, verdict):
    receipt, _ = gated[verdict]
    reason = receipt.reason
    assert reason.startswith(f"{verdict}: ") and reason.endswith(".")
    assert len(reason) < 300 and "; " not in reason, reason
    assert reason.count(". ") == 0, "one sentence"
    assert not any(c.detail in reason for c in receipt.checks), "no check's detail joined in"
    assert not any(f"{c.name}:" in reason for c in receipt.checks), "no check's identifier"


@pytest.mark.parametrize("verdict", list(CASES))
def test_reasons_hold_one_entry_per_check_with_its_name_in_words(gated, verdict):
    receipt, paths = gated[verdict]
    assert len(receipt.reasons) == len(receipt.checks) == 9
    for check, reason in zip(receipt.checks, receipt.reasons, strict=True):
        assert reason.startswith(f"{CHECK_TITLES[check.name]} ({STATUS_WORDS[check.status]}): ")
        assert check.detail in reason and reason.endswith(".")
        assert check.detail[0].isupper() and check.detail.endswith("."), check.detail
    stored = json.loads(paths["json"].read_text())
    assert stored["schema_version"] == 5 and stored["reasons"] == receipt.reasons
    assert all("headline" not in c for c in stored["checks"]), "the sentence is `reason`"


@pytest.mark.parametrize("verdict", list(CASES))
def test_no_python_repr_in_the_reason_reasons_or_markdown(gated, verdict):
    receipt, paths = gated[verdict]
    md = paths["md"].read_text()
    for text in (receipt.reason, *receipt.reasons, md):
        assert not [r for r in REPRS if r in text], text
    guard = next(r for r in receipt.reasons if r.startswith("Training guard"))
    assert "It compared 1,229 tokens over 16 turns in the processed logprobs space" in guard
    assert "by 0.000002 on average (limit 0.02) and by at most 0.000137 (limit 0.5)" in guard
    assert "base: 1,229 tokens, mean 0.000002, largest 0.000137" in guard


def test_promote_says_the_pass_rates_the_interval_and_what_held(gated):
    receipt, _ = gated["PROMOTE"]
    rates = receipt.paired.pass_k
    low, high = receipt.paired.ci95
    assert receipt.reason.startswith(
        f"PROMOTE: cand-v2 passes {rates['candidate'][1]:.1%} of held-out calls against base's "
        f"{rates['incumbent'][1]:.1%} ({receipt.paired.mean_delta:+.3f}, 95% CI {low:+.3f} to "
        f"{high:+.3f}), with no confirmed regression"
    ), receipt.reason
    assert "latency within its limits" in receipt.reason
    assert "no unauthorised write" in receipt.reason and "a passed training guard" in receipt.reason
    assert receipt.reason.endswith("(voice-to-voice P95 not checked).")


def test_an_inconclusive_reason_names_the_sample_that_would_decide(gated):
    receipt, _ = gated["INCONCLUSIVE"]
    sample = receipt.paired.sample_size
    assert sample.required_scenarios is not None
    assert receipt.reason.startswith("INCONCLUSIVE: the score difference ")
    assert receipt.reason.endswith(
        f"about {sample.required_scenarios} scenarios at {sample.mean_repeats:g} repeats"
        + (f", or about {sample.required_repeats} repeats on these 12 scenarios,"
           if sample.required_repeats is not None else "")
        + " would decide."
    ), receipt.reason  # fmt: skip
    paired = receipt.reasons[0]
    assert paired.endswith(f"The smallest effect this sample detects is {sample.mde:+.3f}.")


def test_reject_names_the_writes_and_the_slower_calls(gated):
    receipt, _ = gated["REJECT"]
    assert {c.name for c in receipt.checks if c.status == "fail"} == {
        "llm_ttft_ratio", "llm_turn_ratio", "unauthorized_writes"
    }  # fmt: skip
    assert "cand-v2's P50 LLM TTFT per call is " in receipt.reason
    assert receipt.reason.endswith("cand-v2 made 2 unauthorised writes in 48 guarded runs.")


def test_a_reject_on_many_checks_counts_what_does_not_fit():
    def failed(name: str) -> GateCheck:
        return GateCheck(
            name=name, status="fail", detail="It failed.", headline=f"{name} failed " + "x" * 90
        )

    checks = tuple(failed(n) for n in CHECK_TITLES)
    reason = decide(checks, None).reason
    assert len(reason) <= REASON_CHARS + 40 and reason.endswith("more failed checks.")
    assert reason.startswith("REJECT: paired_reward failed") and "; " not in reason


@pytest.mark.parametrize("verdict", list(CASES))
def test_one_number_format_per_quantity_across_json_markdown_and_html(gated, verdict):
    receipt, paths = gated[verdict]
    md, page = paths["md"].read_text(), paths["html"].read_text()
    low, high = receipt.paired.ci95
    ci = f"95% CI {low:+.3f} to {high:+.3f}"
    assert ci in receipt.reasons[0] and ci in md and ci in page
    mean = f"{receipt.paired.mean_delta:+.3f}"
    assert mean in receipt.reasons[0] and f"mean delta {mean}" in md and mean in page
    other = f"{receipt.paired.mean_delta:.4g}"
    assert other != mean.lstrip("+") and not re.search(rf"(?<![+\d.-]){re.escape(other)}", md)
    assert "[" not in receipt.reasons[0] and "CI [" not in md and "CI [" not in page
    ttft = receipt.latency.llm["llm_ttft_ms"]
    cand = f"{ttft.candidate:,.0f} ms"
    assert cand in receipt.reasons[4] and f"| {cand} |" in md and f">{cand}<" in page
    rate = f"{receipt.paired.pass_k['candidate'][1]:.1%}"
    assert f"k=1: {rate}" in md and f">{rate}<" in page


def test_the_latency_section_says_what_gates_and_keeps_per_call_apart_from_per_turn(gated):
    receipt, paths = gated["PROMOTE"]
    md, page = paths["md"].read_text(), paths["html"].read_text()
    per_call = receipt.latency.llm["llm_ttft_ms"]
    per_turn = receipt.latency.stages["candidate"]["llm_ttft_ms"]
    assert per_turn.p95 > 5 * per_call.candidate, "the planted tool rounds"
    assert receipt.latency.llm_ttft_unit == "call"
    latency = md[md.index("## Latency") : md.index("## Safety")]
    assert latency.startswith(
        "## Latency\n\nGated on the candidate's latency: the P50 LLM TTFT per call at most 3.0x "
        "the incumbent's (passed) and the P50 LLM time per call at most 3.0x the incumbent's "
        "(passed). The per-stage figures below break the latency down; no check reads them."
    )
    assert PER_CALL_VS_TURN in latency
    per_call_table = latency[latency.index("### Per LLM call") : latency.index("### Per caller")]
    assert f"| LLM TTFT per call | {per_call.candidate:,.0f} ms |" in per_call_table
    assert "per caller turn" not in per_call_table.split("\n", 1)[1]
    turn_table = latency[latency.index("### Per caller turn, by stage") :]
    assert f"| LLM TTFT per caller turn | {per_turn.p50:,.0f} ms | {per_turn.p95:,.0f} ms |" in (
        turn_table
    )
    html_latency = page[page.index("<h2>Latency") : page.index("<h2>Score deltas")]
    assert "Gated on the candidate&#x27;s latency" in html_latency
    assert "Per call: one request to the model; per caller turn: everything" in html_latency
    assert "<h3>Per LLM call</h3>" in html_latency and "Per caller turn, by stage" in html_latency
    ttft_check = page[page.index('id="check-llm_ttft_ratio"') :]
    ttft_check = ttft_check[: ttft_check.index("</section>")]
    assert "per caller turn" not in ttft_check, "the check shows only what it reads"


def test_a_ttft_from_the_caller_turn_stage_is_named_so():
    runs = tuple(
        r.model_copy(update={"llm_call_ttft_ms": ()}) for r in _runs(0.8, 0.25, seed=0)
    )
    data = GateData("cand-v2", "base", runs, InputSource(kind="scores", path="t"))
    receipt = evaluate(data, GateConfig(), base_lineage("cand-v2"), base_lineage("base"))
    assert receipt.latency.llm_ttft_unit == "caller_turn"
    ttft = next(c for c in receipt.checks if c.name == "llm_ttft_ratio")
    assert "LLM TTFT per caller turn" in ttft.detail and not re.search(r"per call\b", ttft.detail)


def test_a_schema_5_receipt_needs_one_reason_per_check(gated):
    receipt, _ = gated["PROMOTE"]
    data = receipt.model_dump(mode="json")
    data["reasons"] = data["reasons"][:-1]
    with pytest.raises(ValueError, match="reasons has 8 entries for 9 checks"):
        GateReceipt.model_validate(data)


def test_a_schema_4_receipt_still_loads_renders_and_promotes(tmp_path):
    folder = tmp_path / "receipt"
    folder.mkdir()
    path = folder / "receipt.json"
    shutil.copy(COMMITTED, path)
    receipt = load_receipt(folder)
    assert receipt.schema_version == 4 and receipt.reasons == []
    assert receipt.latency.llm_ttft_unit is None
    worded = reasons_of(receipt)
    assert len(worded) == len(receipt.checks)
    assert worded[0].startswith("Paired score, candidate − incumbent (passed): ")
    md = render_markdown(receipt)
    assert md.startswith("# Gate: PROMOTE") and f"Reason: {receipt.reason}" in md
    assert "### Per caller turn, by stage" in md and PER_CALL_VS_TURN in md
    assert "<h2>Latency</h2>" in render_html(receipt)
    verdict, problems = recheck(receipt)
    assert verdict.decision == "PROMOTE" and problems == []
    assert verdict.reason.startswith(
        "PROMOTE: clinic-sft-v1-8d02ab passes 79.2% of held-out calls against base's 25.0% "
        "(+0.542, 95% CI +0.336 to +0.747)"
    ) and len(verdict.reason) < 300  # fmt: skip
    with Ledger(tmp_path / "ledger.db") as ledger:
        weights = tmp_path / "adapter"
        weights.mkdir()
        ledger.register_adapter(AdapterRecord(
            name=receipt.candidate.name, path=str(weights), base_model="smollm2", created_at=1.0,
        ))  # fmt: skip
        ledger.record_gate_receipt(  # what the gate recorded when it wrote these bytes
            receipt_sha256=receipt_sha256(path), receipt_id=receipt.receipt_id,
            verdict=receipt.verdict, candidate=receipt.candidate.name,
            incumbent=receipt.incumbent.name, heldout_set_id=receipt.input.heldout_set_id,
            path=str(path),
        )  # fmt: skip
        move = promote(path, ledger)
        assert move.adapter == receipt.candidate.name
        assert ledger.live().adapter == receipt.candidate.name
