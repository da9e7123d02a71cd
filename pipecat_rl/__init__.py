"""pipecat-rl: record, simulate, train and gate Pipecat voice agents.

The public surface is re-exported here. Names resolve lazily (PEP 562) so that `pipecat-rl`
commands which need neither Pipecat nor the gate do not pay for importing them.
"""

import importlib
from typing import Any

_EXPORTS = {
    # recording inside a user's pipeline
    "RLRecorder": "pipecat_rl.recording",
    "RecorderObserver": "pipecat_rl.recording",
    "LiveAdapterSelector": "pipecat_rl.recording",
    "Redactor": "pipecat_rl.recording",
    "SessionInfo": "pipecat_rl.recording",
    "record_session": "pipecat_rl.recording",
    "setup_file_path": "pipecat_rl.recording",
    # the store, and the records users read from it
    "Ledger": "pipecat_rl.ledger",
    "SessionRecord": "pipecat_rl.ledger",
    "TurnRecord": "pipecat_rl.ledger",
    "ToolCallRecord": "pipecat_rl.ledger",
    "LatencyRecord": "pipecat_rl.ledger",
    "AdapterRecord": "pipecat_rl.ledger",
    "ScoreIn": "pipecat_rl.ledger",
    # scoring: what "passed" means, and the reward's parts
    "SessionOutcome": "pipecat_rl.scoring",
    "Rubric": "pipecat_rl.scoring",
    "TurnTaking": "pipecat_rl.scoring",
    # scenarios and the worlds they run against
    "Scenario": "pipecat_rl.scenarios",
    "ScenarioSet": "pipecat_rl.scenarios",
    "load_scenarios": "pipecat_rl.scenarios",
    # forks of recorded calls: a call's first K turns replayed, then a policy answers
    "ForkSpec": "pipecat_rl.scenarios.fork",
    "fork_call": "pipecat_rl.scenarios.forking",
    "fork_yaml": "pipecat_rl.scenarios.forking",
    "WorldPack": "pipecat_rl.simulator",
    "World": "pipecat_rl.simulator",
    "ToolError": "pipecat_rl.simulator",
    "ScriptedLLMService": "pipecat_rl.simulator",
    "ScriptedReply": "pipecat_rl.simulator",
    # serving
    "VLLMServer": "pipecat_rl.serving",
    "VLLMAdmin": "pipecat_rl.serving",
    "prepare_model": "pipecat_rl.serving",
    # simulation: the one entry point and what it takes
    "load_bot": "pipecat_rl.simulator",
    "SimulationOptions": "pipecat_rl.simulator",
    "Server": "pipecat_rl.simulator",
    "SimulationReport": "pipecat_rl.simulator",
    "EpisodeResult": "pipecat_rl.simulator",
    "run_simulation": "pipecat_rl.simulator:run",
    # training
    "TrainConfig": "pipecat_rl.training",
    "TrainResult": "pipecat_rl.training",
    "train": "pipecat_rl.training",
    # the gate
    "GateConfig": "pipecat_rl.gate",
    "GateReceipt": "pipecat_rl.gate",
    "GateRun": "pipecat_rl.gate",
    "Simulated": "pipecat_rl.gate",
    "FromLedger": "pipecat_rl.gate",
    "FromScores": "pipecat_rl.gate",
    "load_gate_config": "pipecat_rl.gate",
    "evaluate": "pipecat_rl.gate",
    "run_gate": "pipecat_rl.gate",
    "promote": "pipecat_rl.gate",
    "rollback": "pipecat_rl.gate",
    # people in the loop: preference duels, and the judge against people
    "DuelRecord": "pipecat_rl.ledger.duels",
    "DuelVote": "pipecat_rl.ledger.duels",
    "make_duels": "pipecat_rl.duels.make",
    "calibrate_judge": "pipecat_rl.duels:calibrate",
    # the night loop
    "LoopConfig": "pipecat_rl.loop",
    "load_loop_config": "pipecat_rl.loop",
    "run_cycle": "pipecat_rl.loop",
    # errors
    "PipecatRLError": "pipecat_rl.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pipecat_rl' has no attribute {name!r}")
    module, _, attribute = _EXPORTS[name].partition(":")  # `module:attr` renames on export
    value = getattr(importlib.import_module(module), attribute or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
