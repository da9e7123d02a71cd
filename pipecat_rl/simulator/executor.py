"""Where a simulation's episodes run: here (`local`), or one Ray task each across a cluster (`ray`).

`simulate` decides everything about a run (which episodes, their seeds, the pairing of
policies, the held-out split) and hands each episode to the executor's episode runner. Locally
that is `runner.run_episode` in this event loop. On Ray each episode (bot and caller pipelines
and world) is one task on a node that imports the bot from its path and talks to the served
model chosen for it; the node records the episode into a scratch SQLite ledger of its own and
returns the episode's rows with its result. The driver writes them: it stays the one writer of
the ledger, whatever that is, and the tasks never touch it. The driver chooses each episode's
session id before the task starts, so a task Ray re-runs after losing its node is the same
session, and the driver writes a session it already holds never again.
"""

import asyncio
import contextlib
import dataclasses
import functools
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import (
    LatencyRecord,
    Ledger,
    NotInLedgerError,
    ScoreRecord,
    SessionRecord,
    ToolCallRecord,
    TurnRecord,
)
from pipecat_rl.recording.session import new_call_id
from pipecat_rl.scenarios import Scenario, heldout
from pipecat_rl.simulator.botloader import BotEntry, load_bot, simulation_environment
from pipecat_rl.simulator.options import SimulationOptions
from pipecat_rl.simulator.runner import (
    EpisodeResult,
    EpisodeRunner,
    SimulationConfig,
    episode_seed,
    run_episode,
    setup_files,
)

TASK_RETRIES = 3
"""How often Ray re-runs an episode whose node or worker process died (Ray's own default)."""

RAY_EXTRA = "pip install 'pipecat-rl[ray]'"


@dataclass(frozen=True)
class EpisodeRows:
    """One episode's session and every record of it, as the node's scratch ledger holds them."""

    session: SessionRecord
    turns: list[TurnRecord]
    tool_calls: list[ToolCallRecord]
    latencies: list[LatencyRecord]
    scores: list[ScoreRecord]

    @classmethod
    def read(cls, ledger: Ledger, session_id: str) -> "EpisodeRows":
        """The session `session_id` and its records, read from `ledger`."""
        return cls(
            session=ledger.session(session_id),
            turns=ledger.turns(session_id),
            tool_calls=ledger.tool_calls(session_id),
            latencies=ledger.latencies(session_id),
            scores=ledger.scores(session_id),
        )

    def write(self, ledger: Ledger) -> bool:
        """Write the episode in one transaction unless `ledger` has it; True when written.

        Checked then written without a lock between: the driver is the only writer of the
        sessions it dispatched, so nothing else writes this id in between.
        """
        try:
            ledger.session(self.session.id)
        except NotInLedgerError:
            ledger.write_session(
                self.session, self.turns, self.tool_calls, self.latencies, self.scores
            )
            return True
        logger.warning(f"episode {self.session.id} is already in the ledger: not written again")
        return False


@contextlib.contextmanager
def episode_runner(options: SimulationOptions) -> Iterator[EpisodeRunner]:
    """The episode runner `options.executor` names, ready for the whole run.

    For Ray it connects to the cluster first (and disconnects after, if it connected);
    without Ray installed it is a ConfigError naming the extra.
    """
    if options.executor == "local":
        yield run_episode
        return
    try:
        import ray
    except ImportError as e:
        raise ConfigError(f"--executor ray needs Ray, which is not installed: {RAY_EXTRA}") from e
    connected_here = not ray.is_initialized()
    if connected_here:
        # Worker logs stay in each node's Ray session logs: a run's result says what failed,
        # and the CLI's --json output stays one document.
        try:
            ray.init(address=options.ray_address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = options.ray_address or "Ray's default address"
            raise ConfigError(
                f"--executor ray: cannot connect to the Ray cluster at {where} ({e}); start "
                "one with `ray start --head`, or name it with --ray-address"
            ) from e
    try:
        yield RayEpisodes(options.ray_endpoints)
    finally:
        if connected_here:
            ray.shutdown()


class RayEpisodes:
    """Runs each episode as a Ray task and writes what it returns (an `EpisodeRunner`).

    With endpoints, each episode is sent to the served model with the fewest episodes in
    flight; without, to the run's one served URL.
    """

    def __init__(self, endpoints: tuple[str, ...] = ()):
        import ray

        self._task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(_episode_on_node)
        self._in_flight = dict.fromkeys(endpoints, 0)

    async def __call__(
        self,
        scenario: Scenario,
        bot: BotEntry,
        config: SimulationConfig,
        ledger: Ledger,
        *,
        repeat: int = 0,
        heldout_set_id: str | None = None,
    ) -> EpisodeResult:
        """Run one episode on the cluster; write its rows to `ledger` here."""
        heldout.session_split(ledger, scenario, heldout_set_id)  # records a held-out hash here
        known = ledger.heldout_hashes().get(scenario.content_hash())
        hashes = [] if known is None else [
            (scenario.content_hash(), known["scenario_id"], known["heldout_set_id"])
        ]  # fmt: skip
        from ray.exceptions import RayError

        endpoint = min(self._in_flight, key=self._in_flight.__getitem__, default=None)
        if endpoint is not None:
            config = config.model_copy(update={"llm_url": endpoint})
            self._in_flight[endpoint] += 1
        session_id = new_call_id()
        try:
            result, rows = await self._task.remote(
                scenario, _portable(bot.spec), bot.spec, config,
                repeat=repeat, heldout_set_id=heldout_set_id, hashes=hashes,
                session_id=session_id,
            )  # fmt: skip
        except RayError as e:  # the task failed past its retries: data, not a crash of the run
            logger.error(f"episode {scenario.id}#{repeat} failed on Ray: {e}")
            return EpisodeResult(
                scenario_id=scenario.id, split=scenario.split, repeat=repeat,
                seed=episode_seed(config.seed, scenario.id, repeat),
                session_id="", outcome="error",
                error=f"the Ray task failed ({type(e).__name__}): nothing was written",
            )  # fmt: skip
        finally:
            if endpoint is not None:
                self._in_flight[endpoint] -= 1
        if rows is not None:
            rows.write(ledger)
        return result


def _portable(spec: str) -> str:
    """The bot's spec with a file made absolute, so a node's worker finds it wherever it runs."""
    module, colon, name = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if module.endswith(".py"):
        return f"{Path(module).resolve()}{colon}{name}"
    return spec


@functools.cache
def _node_bot(spec: str, shown_as: str) -> BotEntry:
    """The bot, imported once per worker process (the spec as the driver wrote it, for labels)."""
    return dataclasses.replace(load_bot(spec), spec=shown_as)


def _episode_on_node(
    scenario: Scenario,
    spec: str,
    shown_as: str,
    config: SimulationConfig,
    *,
    repeat: int,
    heldout_set_id: str | None,
    hashes: list[tuple[str, str, str | None]],
    session_id: str,
) -> tuple[EpisodeResult, EpisodeRows | None]:
    """The Ray task: one episode, recorded into a scratch ledger, returned with its rows.

    The scratch ledger knows the held-out hash the driver's does, so the episode's split is
    the one a local run would record. Rows are None when the episode's write itself failed
    (its result says so).
    """
    bot = _node_bot(spec, shown_as)
    with tempfile.TemporaryDirectory(prefix="pipecat-rl-episode-") as folder:
        with Ledger(Path(folder) / "episode.db") as scratch:
            scratch.record_heldout_hashes(hashes)
            with simulation_environment(config.llm_url, setup_files()):
                episode = run_episode(
                    scenario, bot, config, scratch, repeat=repeat,
                    heldout_set_id=heldout_set_id, session_id=session_id,
                )  # fmt: skip
                result = asyncio.run(episode)
            try:
                rows = EpisodeRows.read(scratch, session_id)
            except NotInLedgerError:
                rows = None
    return result, rows
