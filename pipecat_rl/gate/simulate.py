"""The gate's own paired runs: every held-out scenario K times under each policy, same seeds.

Both policies run in one `simulator.run`, interleaved, so that they share the server's load
and a latency difference is the policies' and not the time of day's. Sessions are labelled
`gate` and then read back exactly as `--from-ledger` reads them.
"""

from collections.abc import Callable, Mapping
from typing import Any

from pipecat_rl.errors import ConfigError, GateStopped
from pipecat_rl.gate.inputs import GateData, load_ledger_runs
from pipecat_rl.ledger import Ledger
from pipecat_rl.scenarios import HELDOUT, ScenarioSet
from pipecat_rl.simulator.botloader import BotEntry
from pipecat_rl.simulator.options import SimulationOptions
from pipecat_rl.simulator.simulation import Server, run


def run_paired_simulations(
    ledger: Ledger,
    scenarios: ScenarioSet,
    candidate: str,
    incumbent: str,
    bot: BotEntry,
    options: SimulationOptions,
    server: Server,
    judged: Mapping[str, float] | None = None,
    *,
    stop: Callable[[], bool] | None = None,
    on_episode: Callable[[Any], None] | None = None,
) -> GateData:
    """Simulate both (resolved) policies on the held-out `scenarios` and return their runs.

    `options.repeats` is K; `judged` is the gate config's `judged_metrics` (`inputs.gate_score`).
    """
    pool = [s.id for s in scenarios if s.split != HELDOUT]
    if pool:
        raise ConfigError(
            f"the gate decides on held-out scenarios only; the scenarios given also hold "
            f"{', '.join(pool[:5])} (split pool): point --scenarios at the held-out folder"
        )
    if options.mode != "audio":
        options = options.model_copy(update={"transport": "local"})
    report = run(
        scenarios, bot, options, ledger, policies=(candidate, incumbent), source="gate",
        server=server, stop=stop, on_episode=on_episode,
    )  # fmt: skip
    if stop is not None and stop():
        raise GateStopped(
            "the gate's runs were stopped before they finished: no receipt was written (the "
            "runs that finished are in the ledger, labelled gate)"
        )
    return load_ledger_runs(
        ledger, candidate, incumbent, heldout_set=scenarios.heldout_set_id, source="gate",
        judged=judged, session_ids=[e.session_id for e in report.episodes if e.session_id],
    )  # fmt: skip
