"""pipecat-rl: record, simulate, train and gate Pipecat voice agents.

The public surface is re-exported here. Names resolve lazily (PEP 562) so that `pipecat-rl`
commands which need neither Pipecat nor the gate do not pay for importing them.
"""

import importlib
from typing import Any

_EXPORTS = {
    # recording inside a user's pipeline
    "RLRecorder": "pipecat_rl.processors",
    "RecorderObserver": "pipecat_rl.processors",
    "LiveAdapterSelector": "pipecat_rl.processors",
    "Redactor": "pipecat_rl.processors",
    "SessionInfo": "pipecat_rl.processors",
    "recording": "pipecat_rl.processors",
    "setup_file_path": "pipecat_rl.processors",
    # the store
    "Ledger": "pipecat_rl.ledger",
    # serving
    "VLLMServer": "pipecat_rl.serving",
    "VLLMAdmin": "pipecat_rl.serving",
    "prepare_model": "pipecat_rl.models",
    # simulation: the one entry point and what it takes
    "SimulationOptions": "pipecat_rl.simulator",
    "run_simulation": "pipecat_rl.simulator:run",
    # rewards
    "Rubric": "pipecat_rl.rubric",
    # training
    "TrainConfig": "pipecat_rl.training",
    "TrainResult": "pipecat_rl.training",
    "train": "pipecat_rl.training",
    # the gate
    "GateConfig": "pipecat_rl.gate",
    "GateReceipt": "pipecat_rl.gate",
    "evaluate": "pipecat_rl.gate",
    "run_gate": "pipecat_rl.gate",
    "promote": "pipecat_rl.gate",
    "rollback": "pipecat_rl.gate",
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
