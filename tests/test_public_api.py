import subprocess
import sys
from pathlib import Path

import pipecat_rl

EXPECTED = {
    # recording
    "RLRecorder", "RecorderObserver", "LiveAdapterSelector", "Redactor", "SessionInfo",
    "record_session", "setup_file_path",
    # the store and its records
    "Ledger", "SessionRecord", "TurnRecord", "ToolCallRecord", "LatencyRecord", "AdapterRecord",
    "ScoreIn",
    # scoring, scenarios and worlds
    "SessionOutcome", "Rubric", "Scenario", "ScenarioSet", "load_scenarios", "WorldPack", "World",
    "ToolError", "TurnTaking", "ScriptedLLMService", "ScriptedReply",
    # forks of recorded calls
    "ForkSpec", "fork_call", "fork_yaml",
    # serving, simulation, training
    "VLLMServer", "VLLMAdmin", "prepare_model", "load_bot", "SimulationOptions", "Server",
    "SimulationReport", "EpisodeResult", "run_simulation", "TrainConfig", "TrainResult", "train",
    # the gate and the loop
    "GateConfig", "GateReceipt", "GateRun", "Simulated", "FromLedger", "FromScores",
    "load_gate_config", "evaluate", "run_gate", "promote", "rollback", "LoopConfig",
    "load_loop_config", "run_cycle",
    # people in the loop
    "DuelRecord", "DuelVote", "make_duels", "calibrate_judge",
    "PipecatRLError",
}  # fmt: skip


def test_public_surface_is_pinned_and_resolves():
    assert set(pipecat_rl.__all__) == EXPECTED
    for name in pipecat_rl.__all__:
        assert getattr(pipecat_rl, name) is not None


def test_importing_the_package_imports_nothing_heavy():
    code = "import sys, pipecat_rl; print(sorted({'pipecat','torch','vllm'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_recorder_import_does_not_import_torch_or_vllm():
    code = "import sys, pipecat_rl.recording; print(sorted({'torch','vllm'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic"


def test_a_simulation_and_a_gate_run_from_top_level_names_alone(tmp_path, monkeypatch):
    """What a user's script needs is importable from `pipecat_rl` itself: no deep path."""
    for key in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    from pipecat_rl import (
        FromLedger,
        Ledger,
        Server,
        SimulationOptions,
        load_bot,
        load_gate_config,
        load_scenarios,
        run_gate,
        run_simulation,
    )

    names = ["heldout_terse_booking", "heldout_chatty_booking", "heldout_emergency",
             "heldout_terse_handoff"]  # fmt: skip
    scenarios = load_scenarios([CLINIC / "handwritten" / "heldout" / f"{n}.yaml" for n in names])
    options = SimulationOptions(persona="scripted", repeats=1)
    with Ledger(tmp_path / "l.db") as ledger:
        report = run_simulation(
            scenarios, load_bot(str(CLINIC / "expert.py")), options, ledger,
            policies=["cand", "base"], source="gate", server=Server(needed=False),
        )  # fmt: skip
        assert len(report.episodes) == 8 and all(e.passed for e in report.episodes)
        settings = load_gate_config(None, require_latency=False, min_delta=-0.2)
        done = run_gate(ledger, "cand", "base", FromLedger(source="gate"), settings, tmp_path / "r")
    assert done.receipt.verdict in ("PROMOTE", "REJECT", "INCONCLUSIVE")
    assert done.paths["json"].exists()
