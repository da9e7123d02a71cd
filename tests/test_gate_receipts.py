"""Receipts that cannot be edited into a promotion: every refusal rule of `promote`, by name."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.cli.common import EXIT_DATA
from pipecat_rl.errors import GateError
from pipecat_rl.gate import (
    GateConfig,
    GateData,
    InputSource,
    RunResult,
    evaluate,
    promote,
    verify_receipt,
)
from pipecat_rl.gate.lineage import unknown_lineage
from pipecat_rl.gate.receipt import receipt_sha256, write_receipt
from pipecat_rl.ledger import AdapterRecord, Ledger


def gated_receipt(
    out: Path,
    ledger: Ledger,
    verdict: str,
    candidate: str,
    incumbent: str,
    *,
    requested_incumbent: str | None = None,
    kind: str = "ledger",
) -> Path:
    """A genuine PROMOTE or REJECT receipt, evaluated and recorded by the gate's functions.

    The winner passes every run; the loser passes run 0 of the first two scenarios too.
    """
    winner = candidate if verdict == "PROMOTE" else incumbent
    runs = tuple(
        RunResult(scenario=f"s{s}", policy=p, run=r,
                  reward=float(p == winner or (s < 2 and r == 0)), seed=r)
        for s in range(8) for r in range(2) for p in (candidate, incumbent)
    )  # fmt: skip
    data = GateData(candidate, incumbent, runs, InputSource(kind=kind, path="test"))
    receipt = evaluate(
        data,
        GateConfig(require_latency=False),
        unknown_lineage(candidate, candidate, "test"),
        unknown_lineage(requested_incumbent or incumbent, incumbent, "test"),
    )
    assert receipt.verdict == verdict
    return write_receipt(receipt, out, ledger)["json"]


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.db") as store:
        folder = tmp_path / "v2"
        folder.mkdir()
        (folder / "adapter_config.json").write_text("{}")
        store.register_adapter(
            AdapterRecord(name="v2", path=str(folder), base_model="smollm2", created_at=1.0)
        )
        yield store


def edit(path: Path, change) -> dict:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))
    return data


def forge_row(ledger: Ledger, path: Path, data: dict, verdict: str | None = None) -> None:
    """What a forger with write access to the ledger would add for an edited receipt."""
    ledger.record_gate_receipt(
        receipt_sha256=receipt_sha256(path), receipt_id=data["receipt_id"],
        verdict=verdict or data["verdict"], candidate=data["candidate"]["name"],
        incumbent=data["incumbent"]["name"], heldout_set_id=None, path=str(path),
    )  # fmt: skip


def test_a_genuine_promote_receipt_verifies(ledger, tmp_path):
    path = gated_receipt(tmp_path / "r", ledger, "PROMOTE", "v2", "base")
    assert verify_receipt(path, ledger).verdict == "PROMOTE"
    assert verify_receipt(path.parent, ledger).candidate.name == "v2"


def test_a_reject_edited_to_promote_is_not_the_recorded_receipt(ledger, tmp_path):
    path = gated_receipt(tmp_path / "r", ledger, "REJECT", "v2", "base")
    edit(path, lambda d: d.update(verdict="PROMOTE", exit_code=0))
    with pytest.raises(GateError, match=r"promotion refused \(not_recorded\)"):
        verify_receipt(path, ledger)


def test_a_receipt_edited_to_swap_the_candidate_is_refused(ledger, tmp_path):
    path = gated_receipt(tmp_path / "r", ledger, "PROMOTE", "v2", "base")
    edit(path, lambda d: d["candidate"].update(name="base"))
    with pytest.raises(GateError, match=r"\(not_recorded\)"):
        verify_receipt(path, ledger)


def test_a_receipt_from_another_ledger_is_refused(ledger, tmp_path):
    with Ledger(tmp_path / "other.db") as other:
        path = gated_receipt(tmp_path / "r", other, "PROMOTE", "v2", "base")
    with pytest.raises(GateError, match=r"\(not_recorded\).*another ledger"):
        verify_receipt(path, ledger)


def test_a_verdict_that_disagrees_with_the_ledger_is_refused(ledger, tmp_path):
    path = gated_receipt(tmp_path / "r", ledger, "REJECT", "v2", "base")
    data = edit(path, lambda d: d.update(verdict="PROMOTE", exit_code=0))
    forge_row(ledger, path, data, verdict="REJECT")
    with pytest.raises(GateError, match=r"\(verdict\).*recorded this receipt as REJECT"):
        verify_receipt(path, ledger)


def test_candidate_equal_to_incumbent_is_refused(ledger, tmp_path):
    path = gated_receipt(tmp_path / "r", ledger, "PROMOTE", "v2", "base")
    data = edit(path, lambda d: d["incumbent"].update(name="v2"))
    forge_row(ledger, path, data)
    with pytest.raises(GateError, match=r"\(same_policy\)"):
        verify_receipt(path, ledger)


def test_statistics_that_do_not_support_promote_are_refused(ledger, tmp_path):
    # a REJECT edited to PROMOTE, with a matching ledger row: its own numbers still say REJECT
    path = gated_receipt(tmp_path / "r", ledger, "REJECT", "v2", "base")
    data = edit(path, lambda d: d.update(verdict="PROMOTE", exit_code=0))
    forge_row(ledger, path, data)
    with pytest.raises(GateError, match=r"\(statistics\).*recomputed, REJECT: v2 scores "):
        verify_receipt(path, ledger)


def test_an_edited_interval_is_caught_by_recomputing_it(ledger, tmp_path):
    path = gated_receipt(tmp_path / "r", ledger, "PROMOTE", "v2", "base")

    def widen(d):
        d["paired"]["ci95"] = [0.5, 1.0]

    data = edit(path, widen)
    forge_row(ledger, path, data)
    with pytest.raises(GateError, match=r"\(statistics\).*paired.ci95 is \(0.5, 1.0\)"):
        verify_receipt(path, ledger)


def test_an_edited_scenario_table_is_caught(ledger, tmp_path):
    path = gated_receipt(tmp_path / "r", ledger, "REJECT", "v2", "base")

    def flip(d):  # make every scenario look like a win, and the verdict PROMOTE
        d.update(verdict="PROMOTE", exit_code=0)
        for row in d["scenarios"]:
            row.update(delta=1.0, outcome="win")

    data = edit(path, flip)
    forge_row(ledger, path, data)
    with pytest.raises(GateError, match=r"\(statistics\)"):
        verify_receipt(path, ledger)


def test_cli_promote_refusal_names_the_rule_and_exits_with_the_data_code(ledger, tmp_path):
    path = gated_receipt(tmp_path / "r", ledger, "REJECT", "v2", "base")
    edit(path, lambda d: d.update(verdict="PROMOTE", exit_code=0))
    result = CliRunner().invoke(app, ["promote", str(path), "--ledger", str(ledger.path)])
    assert result.exit_code == EXIT_DATA
    assert "promotion refused (not_recorded)" in " ".join(result.stderr.split())
    assert ledger.live() is None


def test_a_receipt_gated_from_a_scores_file_is_refused_unless_allowed(ledger, tmp_path):
    path = gated_receipt(tmp_path / "r", ledger, "PROMOTE", "v2", "base", kind="scores")
    with pytest.raises(GateError, match=r"promotion refused \(scores_input\).*--allow-scores"):
        verify_receipt(path, ledger)
    assert verify_receipt(path, ledger, allow_scores_receipt=True).verdict == "PROMOTE"
    with pytest.raises(GateError, match="scores_input"):
        promote(path, ledger)
    assert promote(path, ledger, allow_scores_receipt=True).adapter == "v2"


def test_an_edited_regression_table_is_caught(ledger, tmp_path):
    path = gated_receipt(tmp_path / "r", ledger, "PROMOTE", "v2", "base")

    def hide(d):  # claim the candidate lost a run it won
        d["scenarios"][0]["worse_runs"] += 3

    data = edit(path, hide)
    forge_row(ledger, path, data)
    with pytest.raises(GateError, match=r"\(statistics\).*regression tests do not follow"):
        verify_receipt(path, ledger)


def test_cli_promote_takes_a_scores_receipt_only_with_the_flag(ledger, tmp_path):
    path = gated_receipt(tmp_path / "r", ledger, "PROMOTE", "v2", "base", kind="scores")
    base = ["promote", str(path), "--ledger", str(ledger.path)]
    refused = CliRunner().invoke(app, base)
    assert refused.exit_code == EXIT_DATA and "scores_input" in " ".join(refused.stderr.split())
    assert ledger.live() is None
    allowed = CliRunner().invoke(app, [*base, "--allow-scores-receipt"])
    assert allowed.exit_code == 0, allowed.output
    assert ledger.live().adapter == "v2"
