"""`gate.run_gate`: the one gate sequence, its design check before any call, its receipt."""

from pathlib import Path

import pytest

from pipecat_rl.errors import ConfigError
from pipecat_rl.gate import Simulated, load_gate_config, run_gate, verify_receipt
from pipecat_rl.ledger import Ledger
from pipecat_rl.simulator import Server, SimulationOptions, load_bot, load_scenarios

CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic"
HELDOUT = CLINIC / "handwritten" / "heldout"


def _evidence(repeats: int, names: list[str]) -> Simulated:
    scenarios = load_scenarios([HELDOUT / f"{n}.yaml" for n in names])
    return Simulated(
        scenarios=scenarios, bot=load_bot(str(CLINIC / "expert.py")), files=None,
        options=SimulationOptions(persona="scripted", repeats=repeats),
        server=Server(needed=False),
    )  # fmt: skip


def test_a_regression_test_that_cannot_fire_is_refused_before_any_call(tmp_path):
    settings = load_gate_config(None, regression_tests=["scenarios"])
    evidence = _evidence(1, ["heldout_terse_booking", "heldout_chatty_booking"])
    with Ledger(tmp_path / "l.db") as ledger:
        with pytest.raises(ConfigError, match="cannot fire at 1 repeat"):
            run_gate(ledger, "base", "base-too", evidence, settings, tmp_path / "r")
        assert ledger.sessions() == []  # refused before any episode
    assert not (tmp_path / "r").exists()


def test_the_receipt_is_written_and_recorded(tmp_path):
    names = ["heldout_terse_booking", "heldout_chatty_booking", "heldout_routine_booking",
             "heldout_emergency", "heldout_terse_handoff", "heldout_chatty_medical"]  # fmt: skip
    settings = load_gate_config(None, require_latency=False, min_delta=-0.2)
    with Ledger(tmp_path / "l.db") as ledger:
        done = run_gate(ledger, "cand", "base", _evidence(1, names), settings, tmp_path / "r")
        assert set(done.paths) == {"json", "md", "html"}
        assert done.receipt.paired.n_scenarios == 6
        verify_receipt(done.paths["json"], ledger)  # recorded: promote would accept its bytes
        held = ledger.heldout_hashes()
        assert {r.scenario_hash for r in done.data.runs} <= set(held)


def test_stopped_runs_write_no_receipt(tmp_path):
    from dataclasses import replace

    from pipecat_rl.errors import GateStopped

    names = ["heldout_terse_booking", "heldout_chatty_booking"]
    evidence = replace(_evidence(1, names), stop=lambda: True)  # a cancelled job's flag
    settings = load_gate_config(None, require_latency=False)
    with Ledger(tmp_path / "l.db") as ledger:
        with pytest.raises(GateStopped, match="no receipt was written"):
            run_gate(ledger, "cand", "base", evidence, settings, tmp_path / "r")
        assert ledger.sessions(source="gate") == []  # stopped before its first episode
    assert not (tmp_path / "r").exists()
