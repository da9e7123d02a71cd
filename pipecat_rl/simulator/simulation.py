"""`simulator.run`: the one way any part of pipecat-rl runs simulated episodes.

The `simulate` verb, the gate's paired runs, the trainer's online rollouts, the cycle's filter
and demonstrations and the service's jobs all call `run` with scenarios and a bot already
loaded and one `SimulationOptions`; they add nothing but arguments. `run` chooses the served
endpoint (a given server, the embedded vLLM started for this run, or none for bots that need no
model), makes every policy it is asked for servable there, and runs the policies interleaved
in one event loop, so that several policies share the server's load and a latency difference
between them is theirs, not the time of day's. `options.executor` says where each episode runs
(`simulator.executor`: this process, or a Ray task); the rest of the run is the same.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

from pipecat_rl.errors import first_error
from pipecat_rl.ledger import BASE_ADAPTER, Ledger
from pipecat_rl.scenarios import ScenarioSet
from pipecat_rl.serving.server import openai_base_url
from pipecat_rl.simulator.botloader import BotEntry
from pipecat_rl.simulator.executor import episode_runner
from pipecat_rl.simulator.lines import LineListener, listening
from pipecat_rl.simulator.options import Server, SimulationOptions, Source
from pipecat_rl.simulator.runner import (
    EpisodeResult,
    EpisodeRunner,
    SimulationConfig,
    SimulationReport,
    simulate,
)

if TYPE_CHECKING:  # it imports Pipecat's WebSocket client only for a run that calls one
    from pipecat_rl.simulator.remote import RemoteBot

EMBEDDED = Server()
"""The default: the embedded vLLM, started for the run."""


@contextlib.asynccontextmanager
async def _endpoint(
    server: Server, ledger: Ledger, policies: Sequence[str], options: SimulationOptions
) -> AsyncIterator[str | None]:
    if not server.needed:  # its URL still serves the persona and the judge: as a /v1 root
        yield openai_base_url(server.url) if server.url else None
        return
    from pipecat_rl.simulator.endpoint import llm_endpoint

    async with llm_endpoint(
        server.url, ledger=ledger, adapters=policies, model=server.model,
        concurrency=options.concurrency, reserve_core=options.mode == "audio",
    ) as url:  # fmt: skip
        yield url


@contextlib.asynccontextmanager
async def _endpoints(
    server: Server, ledger: Ledger, policies: Sequence[str], options: SimulationOptions
) -> AsyncIterator[str | None]:
    """The run's served URL; every Ray endpoint, too, serves each policy before any episode."""
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(_endpoint(server, ledger, policies, options))
        for other in options.ray_endpoints:
            await stack.enter_async_context(
                _endpoint(Server(url=other), ledger, policies, options)
            )
        yield url


def run(
    scenarios: ScenarioSet,
    bot: "BotEntry | RemoteBot",
    options: SimulationOptions,
    ledger: Ledger,
    *,
    policies: Sequence[str] = (BASE_ADAPTER,),
    source: Source = "simulate",
    server: Server = EMBEDDED,
    on_episode: Callable[[EpisodeResult], None] | None = None,
    on_line: LineListener | None = None,
    stop: Callable[[], bool] | None = None,
) -> SimulationReport:
    """Run every scenario under every policy, `options.repeats` times, and record each call.

    Args:
        scenarios: loaded scenarios (`load_scenarios`); only these run, never a file's neighbours.
        bot: the loaded bot (`load_bot`), or a `RemoteBot` to call where it runs.
        options: what the run is asked to do (caller, channel, seed, repeats, concurrency).
        ledger: where every episode is written.
        policies: the adapters to run (`base` for the base model); several run interleaved,
            with the same seeds, sharing `options.concurrency`.
        source: the sessions' ledger label (`gate` for the gate's paired runs).
        server: where the agent's model is served.
        on_episode: called with each episode as it ends (progress bars, job events).
        on_line: called with each line of each call as it is said, tool executions included
            (`simulate -v`); episodes run on Ray send none (their transcript comes with them).
        stop: asked before each episode starts; once true, nothing more starts, the episodes
            in flight finish and the rest are `not_run` (a cancelled service job).

    Returns:
        every episode of every policy, in one report.

    Raises:
        PipecatRLError: the run could not start or go on (a refused bot, a scenario id held
            out with other content, a persona or judge endpoint that does not answer): the
            error itself, never the task group's `ExceptionGroup` around it.
    """
    if not policies:
        raise ValueError("simulator.run needs at least one policy")

    async def both(run_one: EpisodeRunner) -> list[SimulationReport]:
        async with _endpoints(server, ledger, policies, options) as url:
            share = max(1, options.concurrency // len(policies))  # the load, split fairly
            configs = [
                SimulationConfig(
                    **{**dict(options), "concurrency": share}, llm_url=url, source=source,
                    adapter=None if policy == BASE_ADAPTER else policy,
                )
                for policy in policies
            ]  # fmt: skip
            async with asyncio.TaskGroup() as group:  # cancelled, it waits for every call
                runs = [
                    group.create_task(simulate(
                        scenarios, bot, c, ledger, on_episode=on_episode, stop=stop,
                        run_one=run_one,
                    ))  # fmt: skip
                    for c in configs
                ]
            return [r.result() for r in runs]

    try:
        with episode_runner(options) as run_one, listening(on_line):
            reports = asyncio.run(both(run_one))
    except BaseExceptionGroup as group:  # the task groups' wrapping says nothing: raise the cause
        error = first_error(group)
        raise error from error.__cause__
    return SimulationReport(
        episodes=[e for r in reports for e in r.episodes],
        heldout_set_id=scenarios.heldout_set_id,
        wall_s=max(r.wall_s for r in reports),
        server_gone=next((r.server_gone for r in reports if r.server_gone), None),
    )
