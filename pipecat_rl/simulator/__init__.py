"""The simulator: scenarios, worlds, the persona caller bot, the local transport, episodes.

`pipecat-rl simulate` runs the user's bot unmodified against persona callers over an in-process
transport pair, executes its tool calls against a fresh world per episode, verifies the world
after the call, and writes every episode to the ledger with its reward parts and labels.
"""

from pipecat_rl.simulator.botloader import BotEntry, SimulationRunnerArguments, load_bot
from pipecat_rl.simulator.rewards import FAILURE_LABELS, pass_hat_k
from pipecat_rl.simulator.runner import (
    EpisodeResult,
    ScenarioSummary,
    SimulationConfig,
    SimulationReport,
    run_episode,
    simulate,
)
from pipecat_rl.simulator.scenario import Scenario, ScenarioSet, load_scenarios
from pipecat_rl.simulator.scripted import ScriptedLLMService, ScriptedReply
from pipecat_rl.simulator.transport import LocalTransportPair
from pipecat_rl.simulator.world import ToolError, ToolExecution, World, WorldPack

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
    "SimulationConfig",
    "SimulationReport",
    "SimulationRunnerArguments",
    "ToolError",
    "ToolExecution",
    "World",
    "WorldPack",
    "load_bot",
    "load_scenarios",
    "pass_hat_k",
    "run_episode",
    "simulate",
]
