"""The simulator: scenarios, worlds, the persona caller bot, the local transport, episodes.

`pipecat-rl simulate` runs the user's bot unmodified against persona callers over an in-process
transport pair, executes its tool calls against a fresh world per episode, verifies the world
after the call, and writes every episode to the ledger with its reward parts and labels. A fork
of a recorded call replays its first turns token-exactly before the policy answers (`fork`).
"""

import importlib
from typing import Any

# Names resolve lazily (PEP 562): scenario files load without importing Pipecat, so CLI verbs
# that only read scenarios (and `pipecat-rl ledger ...`) start fast.
_EXPORTS = {
    "BotEntry": "botloader",
    "SimulationRunnerArguments": "botloader",
    "load_bot": "botloader",
    "FAILURE_LABELS": "rewards",
    "EpisodeResult": "runner",
    "ScenarioSummary": "runner",
    "SimulationConfig": "runner",
    "SimulationReport": "runner",
    "run_episode": "runner",
    "simulate": "runner",
    "SimulationOptions": "options",
    "Rollouts": "options",
    "Server": "options",
    "run": "simulation",
    "Scenario": ".scenarios",  # pipecat_rl.scenarios
    "ScenarioSet": ".scenarios",
    "load_scenarios": ".scenarios",
    "ScriptedLLMService": "scripted",
    "ScriptedReply": "scripted",
    "LocalTransportPair": "transport",
    "ToolError": "world",
    "ToolExecution": "world",
    "World": "world",
    "WorldPack": "world",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pipecat_rl.simulator' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "FAILURE_LABELS",
    "BotEntry",
    "EpisodeResult",
    "LocalTransportPair",
    "Scenario",
    "ScenarioSet",
    "ScenarioSummary",
    "ScriptedLLMService",
    "ScriptedReply",
    "Rollouts",
    "Server",
    "SimulationConfig",
    "SimulationOptions",
    "SimulationReport",
    "SimulationRunnerArguments",
    "ToolError",
    "ToolExecution",
    "World",
    "WorldPack",
    "load_bot",
    "load_scenarios",
    "run",
    "run_episode",
    "simulate",
]


def __dir__() -> list[str]:
    return __all__
