"""Simulated episodes: one persona caller bot against the user's bot, many at once.

An episode builds a fresh world, a transport pair and a persona caller, runs the user's bot on
the agent side inside `record_session(...)` (so the recorder writes its turns token-exactly) and the
simulator's episode context (so its worker is adapted, see `botloader`), watches the call until
it ends (hang-up, `max_turns`, silence, `max_duration_s`), shuts both bots down, verifies the
world, scores the scenario's `success` and `metrics` as Pipecat would (`pipecat_metrics`), and
writes the reward, its parts (each also a ledger score), the labels and the world's tool
executions to the ledger. Before any episode, `simulate` checks that every persona and judge
endpoint answers and runs the bot once up to its pipeline's setup (`preflight`), so an LLM
service that cannot be pointed at the served model stops the run before a call is made. A
persona or judge that stops answering mid-run, or answers a question with HTTP 404 or 5xx,
makes the calls it left without a caller or a verdict harness errors, and no further episode
starts (`services_gone`): a verdict is never made up for a call nobody judged. Episodes run
concurrently (asyncio), which is what lets vLLM batch. A failed simulated call is data
(outcome "error" with its reason), never a crash of the run.
"""

import asyncio
import contextlib
import hashlib
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from loguru import logger
from pipecat.pipeline.worker import PipelineWorker
from pipecat.workers.runner import WorkerRunner
from pydantic import field_validator

from pipecat_rl.errors import ConfigError, LedgerError
from pipecat_rl.ledger import LatencyRecord, Ledger, ScoreRecord, ToolCallRecord
from pipecat_rl.recording.session import SessionInfo, new_call_id, record_session
from pipecat_rl.scenarios import Scenario, ScenarioSet, heldout, loading
from pipecat_rl.scoring import (
    P50,
    P95,
    TurnTaking,
    authoritative_score,
    outcome_passed,
    pass_hat_k,
    quantile_or_none,
    turntaking,
)
from pipecat_rl.scoring import SessionOutcome as Outcome
from pipecat_rl.scoring import outcome as passed_outcome
from pipecat_rl.serving.roots import openai_base_url
from pipecat_rl.simulator import lines, setup_file
from pipecat_rl.simulator.asr_noise import AsrNoiseModel
from pipecat_rl.simulator.audio import check_transport
from pipecat_rl.simulator.botloader import (
    BotEntry,
    Episode,
    SimulationRunnerArguments,
    episode_context,
    error_recorder,
    simulation_environment,
)
from pipecat_rl.simulator.fork import ForkRun
from pipecat_rl.simulator.judge import (
    LLM_FLAG,
    Endpoint,
    ToolCallSeen,
    check_reachable,
    close_llm_client,
    judge_block,
    judge_call,
    resolve_endpoint,
    stopped_answering,
)
from pipecat_rl.simulator.options import SimulationOptions, Source
from pipecat_rl.simulator.persona import build_persona_worker, caller_notes, persona_llm
from pipecat_rl.simulator.pipecat_metrics import BACKSTOPS, score_scenario
from pipecat_rl.simulator.rewards import (
    EpisodeEvidence,
    failure_labels,
    reward_parts,
    seen_executions,
)
from pipecat_rl.simulator.script_turns import score_turns
from pipecat_rl.simulator.transport import EndReason, Line, LocalTransportPair
from pipecat_rl.simulator.world import CheckResult, ToolExecution, World

if TYPE_CHECKING:  # it imports this module
    from pipecat_rl.simulator.remote import RemoteBot

SHUTDOWN_GRACE_S = 5.0
"""How long a bot gets to stop on its own after the call ends, before it is cancelled."""

PREFLIGHT_TIMEOUT_S = 30.0
"""How long the pre-flight run waits for the bot to set its pipeline up."""


class SimulationConfig(SimulationOptions):
    """One run of episodes: the options, plus what `simulator.run` chose for them."""

    llm_url: str | None = None
    """The served model for the agent and the LLM persona, as its /v1 root (`serving.roots`)."""
    adapter: str | None = None
    """The model name the agent's requests carry: an adapter, or None for `base`."""
    source: Source = "simulate"
    """The ledger label of the sessions: `gate` for the gate's paired runs."""

    @field_validator("llm_url")
    @classmethod
    def _llm_root(cls, url: str | None) -> str | None:
        """The served URL as its /v1 root, so every client of the run agrees on its routes."""
        return None if url is None else openai_base_url(url, LLM_FLAG)


@dataclass
class EpisodeResult:
    """One episode: how it went, what it earned, and why."""

    scenario_id: str
    split: str
    repeat: int
    seed: int
    session_id: str
    outcome: Outcome
    reward: float = 0.0
    reward_parts: dict[str, float] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)
    end_reason: EndReason | None = None
    transcript: list[Line] = field(default_factory=list)
    executions: list[ToolExecution] = field(default_factory=list)
    """Every tool execution the recorder saw: the world's tools and the bot's own handlers."""
    world_executions: list[ToolExecution] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    duration_s: float = 0.0
    error: str | None = None
    bypassed: list[str] = field(default_factory=list)
    """The bot's speech services replaced by pass-throughs (text mode)."""
    redirected: list[str] = field(default_factory=list)
    """The bot's LLM services pointed at the served model."""
    score_details: dict[str, dict[str, Any]] = field(default_factory=dict)
    """What each Pipecat score (`judge:*`, `metric:*`) carries beside its value."""
    mode: Literal["text", "audio"] = "text"
    speech: list[str] = field(default_factory=list)
    """Audio mode: the bot's speech services stood in for, and a VAD added, if any."""
    call_s: float | None = None
    """Audio mode: how long the call ran on the wire (its real-time duration)."""
    v2v_ms: dict[int, float] = field(default_factory=dict)
    """Audio mode: the agent pipeline's own voice-to-voice figure per user turn."""
    audio_wav: str | None = None
    """Audio mode with `record_audio`: the call's stereo WAV (`simulator.audio.recorder`)."""
    caller: dict[str, Any] = field(default_factory=dict)
    """What a scripted caller says of the call: `fallbacks` (lines that restated its need when
    nothing the agent said matched) and `caller_gave_up` (it hung up after repeated non-answers)."""
    fork: dict[str, Any] = field(default_factory=dict)
    """A fork's replay (`simulator.fork.ForkRun.report`): its call, turn, hand-off and world."""
    turn_taking: TurnTaking | None = None
    """The call's turn-taking from the caller's side (text mode: why it is unavailable)."""

    @property
    def passed(self) -> bool | None:
        """Whether the call passed (`scoring.outcome_passed`); None where no verdict was reached."""
        return outcome_passed(self.outcome)

    @property
    def unscored(self) -> dict[str, str]:
        """The parts this episode has no value for, each with why (recorded, never dropped).

        A judge that could not answer, a metric with nothing to measure, a check not run.
        """
        return {
            name: str(detail["reason"])
            for name, detail in self.score_details.items()
            if name not in self.reward_parts and detail.get("reason")
        }

    @property
    def latencies_ms(self) -> list[float]:
        """The agent's response latencies in this episode."""
        return [line.latency_ms for line in self.transcript if line.latency_ms is not None]


def episode_seed(seed: int, scenario_id: str, repeat: int) -> int:
    """The seed of one episode: the same for the same run seed, scenario and repeat."""
    digest = hashlib.sha256(f"{seed}:{scenario_id}:{repeat}".encode()).hexdigest()
    return int(digest[:8], 16)


async def _run_worker(worker: PipelineWorker) -> None:
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


async def _watch(
    pair: LocalTransportPair,
    bot_task: asyncio.Task,
    scenario: Scenario,
    errors: list[list[str]],
) -> None:
    """Wait until the call ends, the bot returns, a pipeline errs or a limit is reached."""
    started = time.monotonic()
    while not pair.done.is_set():
        if any(errors):
            pair.end("error")
        elif bot_task.done():
            pair.end("agent_hung_up")
        elif time.monotonic() - pair.last_activity > scenario.max_silence_s:
            pair.end("silence")
        elif time.monotonic() - started > scenario.max_duration_s:
            pair.end("max_duration")
        else:
            try:
                await asyncio.wait_for(pair.done.wait(), timeout=0.1)
            except TimeoutError:
                pass


async def _stop(task: asyncio.Task, workers: list[PipelineWorker]) -> None:
    """Let `task` finish on its own; then cancel its workers; then the task itself."""
    done, _ = await asyncio.wait({task}, timeout=SHUTDOWN_GRACE_S)
    if done:
        return
    # Said because a bot that never stops on its own (a missed disconnect handler) costs every
    # episode this grace; tests read it to tell a clean end from a cancelled one.
    logger.debug(f"{task.get_name()} did not stop within {SHUTDOWN_GRACE_S:g} s: cancelling it")
    for worker in workers:
        await worker.cancel()
    done, _ = await asyncio.wait({task}, timeout=SHUTDOWN_GRACE_S)
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=SHUTDOWN_GRACE_S)


async def _stop_cancelled(
    pair: LocalTransportPair, episode: Episode, persona: PipelineWorker | None,
    persona_task: asyncio.Task | None, bot_task: asyncio.Task | None, handle: Any,
) -> None:  # fmt: skip
    """End a cancelled episode's call and pipelines, and flush what its recorder holds.

    Left running, the bot's and the caller's runners would be cancelled only by
    `asyncio.run`'s own shutdown, with the call never ended, and that shutdown waits for them:
    one Ctrl-C would hang the process instead of stopping it.
    """
    pair.end("error")
    for worker in episode.workers:
        await worker.cancel()
    if bot_task is not None:
        await _stop(bot_task, [])
    if persona is not None:
        await persona.cancel()
    if persona_task is not None:
        await _stop(persona_task, [])
    if handle is not None:
        await handle.flush()


def persona_endpoint(
    scenario: Scenario, options: SimulationOptions, served_url: str | None
) -> Endpoint | None:
    """Where the scenario's LLM persona runs (flag, `simulator:` block, served model)."""
    return resolve_endpoint(
        scenario.simulator, flag_url=options.persona_llm_url, flag_model=options.persona_model,
        served_url=served_url, where="simulator", flag="--persona-llm-url",
        path=scenario.source_path,
    )  # fmt: skip


def judge_endpoint(
    scenario: Scenario, options: SimulationOptions, served_url: str | None
) -> Endpoint | None:
    """Where the scenario's judge runs (flag, `judge.eval:` block, served model)."""
    return resolve_endpoint(
        judge_block(scenario), flag_url=options.judge_llm_url, flag_model=options.judge_model,
        served_url=served_url, where="judge.eval", flag="--judge-llm-url",
        path=scenario.source_path,
    )  # fmt: skip


def check_endpoints(
    scenarios: ScenarioSet, options: SimulationOptions, served_url: str | None = None
) -> None:
    """Resolve every persona and judge endpoint and ask each for its models, before any episode.

    `served_url` is a server that already runs (a given one, or the run's own once started), so
    it is asked too, and so is a persona or judge on it: without it every call would end with
    no agent, no caller or no verdict. None: the embedded server is not started yet, and
    nothing is on it. Every URL is taken by the one rule of `serving.roots`.

    Raises:
        ConfigError: a block names a provider the simulator cannot reach offline, or a URL is
            no OpenAI-compatible root (`serving.roots`); the message names the flag to use.
        ServingError: an endpoint does not answer, refuses the key or is not an
            OpenAI-compatible `/v1` root (HTTP 404): a service is unavailable, before any call.
    """
    served = openai_base_url(served_url, LLM_FLAG) if served_url else None
    named: list[tuple[Endpoint, str]] = []
    for scenario in scenarios:
        judge = judge_endpoint(scenario, options, served)
        if judge is not None:
            named.append((judge, "--judge-llm-url"))
        if options.persona == "llm" and not scenario.scripted:
            persona = persona_endpoint(scenario, options, served)
            if persona is not None:
                named.append((persona, "--persona-llm-url"))
    if served is not None:  # the bot's own server, last: a role on it is named by its flag
        named.append((Endpoint(served, "base"), LLM_FLAG))
    check_reachable(named)


async def judge_gone(
    scenario: Scenario, result: "EpisodeResult", config: SimulationConfig, judged: dict[str, float]
) -> str | None:
    """Why this call has no verdict when its judge left parts unanswered and is now gone.

    A judge that timed out once leaves those parts unscored (the call keeps its other parts); a
    judge that stopped answering makes the call a harness error, so nothing the judge never
    said is stored, trained on or paired.
    """
    unanswered = [n for n, d in result.score_details.items() if n not in judged and d.get("reason")]
    endpoint = judge_endpoint(scenario, config, config.llm_url)
    if not unanswered or endpoint is None:
        return None
    gone = await stopped_answering(endpoint, "judge")
    return None if gone is None else f"{gone}: {', '.join(unanswered)} not judged, so no verdict"


async def services_gone(scenario: Scenario, config: SimulationConfig) -> str | None:
    """Why a service this scenario's calls need is gone (LLM server, persona, judge), or None."""
    if config.llm_url:
        reason = await server_gone(config.llm_url)
        if reason:
            return reason
    llm_persona = config.persona == "llm" and not scenario.scripted
    for role, endpoint in (
        ("persona", persona_endpoint(scenario, config, config.llm_url) if llm_persona else None),
        ("judge", judge_endpoint(scenario, config, config.llm_url)),
    ):
        reason = None if endpoint is None else await stopped_answering(endpoint, role)
        if reason:
            return reason
    return None


def _calls_seen(executions: list[ToolExecution]) -> list[ToolCallSeen]:
    return [ToolCallSeen(e.name, e.arguments, e.started_at) for e in executions]


async def _pipecat_parts(
    scenario: Scenario, result: "EpisodeResult", config: SimulationConfig, ended_at: float
) -> dict[str, float]:
    """The scenario's Pipecat parts (`judge:success`, `judge:<m>`, `metric:<m>`) for one run."""
    endpoint = judge_endpoint(scenario, config, config.llm_url)
    calls = _calls_seen(result.executions)
    timeout_s = config.judge_timeout_s
    if scenario.scripted:
        parts, result.score_details = await score_turns(
            scenario, result.transcript, calls, endpoint, timeout_s
        )
        return parts
    judgement, unjudged = None, "no judge to ask (no served model and no --judge-llm-url)"
    if endpoint is not None:  # a run a limit ended is judged too; it just cannot succeed
        try:
            judgement = await judge_call(scenario, result.transcript, calls, endpoint, timeout_s)
        except Exception as e:  # a judge that fails leaves the run unjudged, never guessed
            unjudged = f"the judge failed: {type(e).__name__}: {e}"
            logger.warning(f"judge: could not judge {scenario.id}: {unjudged}")
    else:
        logger.debug(f"judge: no judge for {scenario.id} (no served model): success not judged")
    score = score_scenario(
        scenario, result.transcript, calls, judgement=judgement,
        end_reason=result.end_reason, ended_at=ended_at, unjudged=unjudged,
    )  # fmt: skip
    result.score_details = score.details()
    return score.parts()


async def preflight(bot: BotEntry, scenario: Scenario, config: SimulationConfig) -> None:
    """Run the bot once up to its pipeline's setup, no caller connected, and stop it.

    The setup hook adapts its pipeline as in an episode (`botloader.prepare_worker`), so an LLM
    service the simulator would refuse is found here, before any episode, and taken out of the
    pipeline before a frame reaches it. What the run records goes to a throwaway ledger.

    Raises:
        ConfigError: naming the refused service and what to do.
    """
    pair = LocalTransportPair(max_turns=1)
    world = World(scenario, seed=0)
    episode = Episode(world=world, llm_url=config.llm_url, model=config.adapter or "base")
    with tempfile.TemporaryDirectory(prefix="pipecat-rl-preflight-") as folder:
        with Ledger(Path(folder) / "preflight.db") as scratch:
            info = SessionInfo(call_id=new_call_id(), source=config.source)
            with record_session(scratch, info) as handle, episode_context(episode):
                runner_args = SimulationRunnerArguments(
                    world=world, llm_url=config.llm_url, model=episode.model,
                    session_id=handle.session_id, body={"scenario": scenario.id, "preflight": True},
                )  # fmt: skip
                bot_task = asyncio.create_task(bot.run(pair.agent, runner_args), name="the bot")
            prepared = asyncio.create_task(episode.prepared.wait())
            await asyncio.wait({bot_task, prepared}, timeout=PREFLIGHT_TIMEOUT_S,
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            prepared.cancel()
            pair.end("error")
            for worker in episode.workers:
                await worker.cancel()
            await _stop(bot_task, [])
            if bot_task.done() and not bot_task.cancelled() and bot_task.exception():
                logger.debug(f"pre-flight: the bot raised {bot_task.exception()!r}")  # episodes say
            await handle.flush()
            await episode.close_clients()
    world.close()
    if episode.refused:
        raise ConfigError(episode.refused[0])
    if not episode.prepared.is_set():
        logger.warning(
            f"pre-flight: {bot.spec} set up no pipeline within {PREFLIGHT_TIMEOUT_S:.0f} s; its "
            "LLM services will be checked as each episode starts"
        )


async def run_episode(
    scenario: Scenario,
    bot: BotEntry,
    config: SimulationConfig,
    ledger: Ledger,
    *,
    repeat: int = 0,
    heldout_set_id: str | None = None,
    session_id: str | None = None,
) -> EpisodeResult:
    """Run one simulated call of `scenario` against `bot` and record it in `ledger`.

    `session_id` is the episode's id when its dispatcher chose one (a retried Ray task keeps
    it, so the episode is one session however often it ran); None draws a fresh one. A fork
    (`scenario.fork`) replays its recorded turns first; a replay that is not the recording is a
    harness error naming the turn (`simulator.fork`).
    """
    seed = episode_seed(config.seed, scenario.id, repeat)
    started = time.monotonic()
    model = config.adapter or "base"
    split, set_id = heldout.session_split(ledger, scenario, heldout_set_id)  # by content
    info = SessionInfo(
        call_id=session_id or new_call_id(),
        source=config.source,
        scenario_id=scenario.id,
        scenario_hash=scenario.content_hash(),
        split=split,  # type: ignore[arg-type]
        heldout_set_id=set_id,
        policy=model,
        seed=seed,
        repeat=repeat,
        metadata={
            "bot": bot.spec, "mode": config.mode, "persona": config.persona,
            "goal": scenario.goal,  # what decontamination compares besides the caller's lines
            **({"transport": config.transport} if config.mode == "audio" else {}),
        },  # fmt: skip
    )
    result = EpisodeResult(
        scenario_id=scenario.id,
        split=split,
        repeat=repeat,
        seed=seed,
        session_id=str(info.call_id),
        outcome="error",
    )
    world = World(scenario, seed=seed)
    noise = scenario.channel.asr_noise
    episode = Episode(
        world=world,
        llm_url=config.llm_url,
        model=model,
        max_tokens=config.max_tokens,
        temperature=config.temperature,
        seed=seed,
    )
    recorded = []
    audio = None
    if config.mode == "audio":  # audio mode: see simulator.audio (kept apart from text mode)
        from pipecat_rl.simulator.audio.episode import AudioEpisode

        audio = AudioEpisode.build(
            scenario, seed, stt=config.stt, tts=config.tts, transport=config.transport,
            agent_params=bot.webrtc_transport_params() if config.transport == "webrtc" else None,
            record_audio=config.record_audio, repeat=repeat, session_id=str(info.call_id),
        )  # fmt: skip
        audio.adapt(episode)
        pair: LocalTransportPair = audio.pair
    else:
        pair = LocalTransportPair(
            max_turns=scenario.max_turns, noise=AsrNoiseModel(noise, seed) if noise else None
        )
    lines.watch(pair, world, scenario.id, repeat, config.mode)  # `simulate -v`, line by line
    fork = None
    if scenario.fork is not None:  # a recorded call's first turns, replayed (`simulator.fork`)
        fork = episode.fork = ForkRun(
            scenario.fork, scenario.id, world=world, llm_url=config.llm_url, pair=pair,
            end_call=lambda: pair.end("error"),
        )  # fmt: skip
    caller_llm = persona = persona_task = bot_task = handle = endpoint = None
    try:
        llm_persona = config.persona == "llm" and not scenario.scripted
        endpoint = persona_endpoint(scenario, config, config.llm_url) if llm_persona else None
        caller_llm = persona_llm(scenario, config.persona, endpoint=endpoint, pair=pair)
        stages = audio.persona_stages() if audio else None
        persona = build_persona_worker(scenario, pair, caller_llm, stages, fork=fork)
        persona_errors: list[str] = []
        persona.add_event_handler(
            "on_pipeline_error", error_recorder(persona_errors, fatal_only=True)
        )
        persona_task = asyncio.create_task(_run_worker(persona), name="the caller")
        with record_session(ledger, info) as handle, episode_context(episode):
            runner_args = SimulationRunnerArguments(
                world=world,
                llm_url=config.llm_url,
                model=model,
                session_id=handle.session_id,
                body={"scenario": scenario.id, "repeat": repeat, "seed": seed},
            )
            bot_task = asyncio.create_task(bot.run(pair.agent, runner_args), name="the bot")
        await _watch(pair, bot_task, scenario, [episode.errors, persona_errors])
        await _stop(bot_task, episode.workers)
        await persona.cancel()
        await _stop(persona_task, [])
        await handle.flush()
        recorded = ledger.tool_calls(handle.session_id)
        if handle.dropped:  # the call ran, but the ledger does not hold all of it
            result.error = (
                f"{handle.dropped} recorder write(s) to the ledger failed (locked or full?): "
                "this session is not fully written"
            )
        elif bot_task.done() and not bot_task.cancelled() and bot_task.exception():
            error = bot_task.exception()
            result.error = f"the bot raised {type(error).__name__}: {error}"
        elif fork is not None and fork.problem is not None:  # the replay is not the recording
            result.error = fork.problem
        elif world.harness_errors:
            result.error = "; ".join(world.harness_errors)
        elif episode.refused:
            result.error = episode.refused[0]
        elif episode.errors or persona_errors:
            result.error = "; ".join(episode.errors + [f"persona {e}" for e in persona_errors])
        elif fork is not None:
            result.error = fork.failure()  # it never reached the candidate: nothing to compare
    except asyncio.CancelledError:  # Ctrl-C, a cancelled job: end this call, then stop
        await _stop_cancelled(pair, episode, persona, persona_task, bot_task, handle)
        if audio is not None:
            result.audio_wav = audio.finish_recording()  # the call so far, its header fixed up
        await episode.close_clients()
        if caller_llm is not None:
            await close_llm_client(caller_llm)
        world.close()
        result.outcome = Outcome.INTERRUPTED
        result.error = "interrupted: the run was stopped before this call ended"
        result.end_reason, result.transcript = pair.end_reason, list(pair.transcript)
        with contextlib.suppress(LedgerError):  # a write that fails leaves it open: resumable
            _write(ledger, info, result)
        raise
    except Exception as e:  # a broken episode is data, not a crash of the run
        logger.exception(f"episode {scenario.id}#{repeat} failed")
        result.error = f"{type(e).__name__}: {e}"
    if audio is not None:
        await audio.close()  # a WebRTC call's peers (the local pair holds nothing)
    await episode.close_clients()  # in this loop: a client closed after it logs tracebacks
    if caller_llm is not None:
        result.caller = caller_notes(caller_llm)
        await close_llm_client(caller_llm)
    ended_at = time.time()
    result.end_reason = pair.end_reason
    result.transcript = list(pair.transcript)
    result.world_executions = list(world.executions)
    result.executions = seen_executions(recorded, result.world_executions)
    result.checks = world.verify()
    result.bypassed, result.redirected = episode.bypassed, episode.redirected
    result.mode = config.mode
    result.fork = fork.report() if fork is not None else {}
    result.turn_taking = (
        audio.pair.timeline.measure(caller_hung_up=pair.end_reason == "caller_hung_up")
        if audio is not None
        else turntaking.text_mode()
    )
    if audio is not None:
        result.speech = audio.agent_speech.notes
        result.call_s = audio.pair.audio_seconds
        result.v2v_ms = dict(audio.pair.v2v_ms)
        result.audio_wav = audio.finish_recording()  # closed by `audio.close()` above
    world.close()
    if not episode.workers and result.error is None:
        result.error = "the bot built no PipelineWorker (is --bot a Pipecat bot?)"
    if result.error is None and endpoint is not None and result.end_reason in BACKSTOPS:
        gone = await stopped_answering(endpoint, "persona")  # the caller went quiet: gone?
        if gone is not None:
            result.error = f"{gone}: the caller went quiet, so the call has no verdict"
    judged = {}
    if result.error is None:
        judged = await _pipecat_parts(scenario, result, config, ended_at)
        result.error = await judge_gone(scenario, result, config, judged)
        if result.error is not None:
            judged = {}  # what the judge did say stays in the details, never a reward
    evidence = EpisodeEvidence(
        scenario=scenario,
        executions=result.executions,
        checks=result.checks,
        transcript=result.transcript,
        end_reason=result.end_reason,
        judged=judged,
    )
    result.reward_parts = reward_parts(evidence)
    result.reward = config.rubric.shown(result.reward_parts)
    result.labels = failure_labels(evidence)
    result.outcome = "error" if result.error else passed_outcome(result.reward_parts)
    result.duration_s = time.monotonic() - started
    try:
        _write(ledger, info, result)
    except LedgerError as e:  # after the ledger's own retries: the run must not say "pass"
        result.outcome = "error"
        result.error = f"the ledger could not record this episode ({e}): it is not fully written"
    return result


def _write(ledger: Ledger, info: SessionInfo, result: EpisodeResult) -> None:
    """The episode's outcome, reward parts, labels, checks and world executions: one write."""
    session_id = result.session_id
    recorded = {lat.user_turn: lat for lat in ledger.latencies(session_id)}
    scores = []
    for name, value in result.reward_parts.items():
        detail: dict[str, Any] = result.score_details.get(name, {})
        if name == "verifier":
            detail = {"checks": [vars(c) for c in result.checks]}
        scores.append(ScoreRecord(session_id=session_id, name=name, value=value, detail=detail))
    ledger.finish_episode(
        info.record(session_id),  # written only if no recorder ran (the bot started no worker)
        ended_at=time.time(),
        outcome=result.outcome,
        reward=result.reward,
        reward_parts=result.reward_parts,
        failure_labels=result.labels,
        metadata_update={
            "end_reason": result.end_reason,
            "error": result.error,
            "bypassed": result.bypassed,
            "redirected": result.redirected,
            "transcript": [vars(line) for line in result.transcript],
            "checks": [vars(c) for c in result.checks],
            "unscored": result.unscored,
            **result.caller,
            **({"fork": result.fork} if result.fork else {}),
            **({"speech": result.speech, "call_s": result.call_s} if result.call_s else {}),
            **({"audio_wav": result.audio_wav} if result.audio_wav else {}),
            **(
                {turntaking.METADATA_KEY: result.turn_taking.model_dump()}
                if result.turn_taking
                else {}
            ),
        },
        latencies=caller_side_latencies(result, recorded),
        scores=scores,
        tool_calls=[
            ToolCallRecord(
                session_id=session_id,
                turn_index=None,
                call_id=execution.call_id,
                name=execution.name,
                arguments=execution.arguments,
                result=execution.result,
                error=execution.error,
                started_at=execution.started_at,
                duration_ms=execution.duration_ms,
                state_diff={"world": execution.state_diff, "fault": execution.fault},
            )
            for execution in result.world_executions
        ],
    )


def caller_side_latencies(
    result: EpisodeResult, recorded: dict[int, LatencyRecord]
) -> list[LatencyRecord]:
    """Per user turn, what the caller lived through: the heard gap (audio) or the response gap.

    User turn k is the agent's answer to the caller's k-th line (0-based); the greeting, which
    answers no caller line, has none. In audio mode the agent's own v2v (Pipecat's observer, kept
    per caller line) is written only for a session whose recorder timed no v2v at all: the
    recorder numbers the agent's user turns by its VAD, which splits a line said with a pause,
    so mixing the two put one measurement on two consecutive turns.
    """
    recorder_timed = any(r.v2v_ms is not None for r in recorded.values())
    out, caller_lines = [], 0
    for line in result.transcript:
        if line.speaker == "caller":
            caller_lines += 1
        elif line.latency_ms is not None and caller_lines:
            turn = caller_lines - 1
            values: dict[str, float | None] = {"response_gap_ms": round(line.latency_ms, 3)}
            if result.mode == "audio":
                values = {
                    "heard_gap_ms": values["response_gap_ms"],
                    "v2v_ms": None if recorder_timed else result.v2v_ms.get(turn),
                }
            out.append(LatencyRecord(session_id=result.session_id, user_turn=turn, **values))
    return out


# -- many episodes -----------------------------------------------------------------------------

EpisodeRunner = Callable[..., Awaitable[EpisodeResult]]
"""Runs one episode as `run_episode` does, with its arguments: here, or on a Ray node."""


@dataclass(frozen=True)
class ScenarioSummary:
    """One scenario over its runs."""

    scenario_id: str
    split: str
    runs: int
    passes: int
    verified: int
    errors: int
    mean_reward: float
    """The training reward by the run's rubric (authoritative + weighted shaped/judged parts)."""
    mean_score: float | None
    """The authoritative score over verified runs: the scale the gate pairs (None: none)."""
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    labels: dict[str, int]
    pass_hat_k: float | None

    @property
    def pass_rate(self) -> float | None:
        """Passes over verified runs (None when nothing was verified)."""
        return self.passes / self.verified if self.verified else None


def summarise(episodes: list[EpisodeResult]) -> list[ScenarioSummary]:
    """Per-scenario pass rate, mean reward, latency quantiles, labels and pass^k (k = runs)."""
    by_scenario: dict[str, list[EpisodeResult]] = {}
    for e in episodes:
        if e.outcome == Outcome.NOT_RUN:
            continue  # never started: no figure to count it in
        by_scenario.setdefault(e.scenario_id, []).append(e)
    out = []
    for scenario_id, runs in by_scenario.items():
        verified = [r.passed for r in runs if r.passed is not None]
        latencies = [ms for r in runs for ms in r.latencies_ms]
        scores = [authoritative_score(r.reward_parts) for r in runs if r.passed is not None]
        out.append(
            ScenarioSummary(
                scenario_id=scenario_id,
                split=runs[0].split,
                runs=len(runs),
                passes=sum(1 for p in verified if p),
                verified=len(verified),
                errors=sum(1 for r in runs if r.outcome == Outcome.ERROR),
                mean_reward=statistics.fmean(r.reward for r in runs),
                mean_score=statistics.fmean(scores) if scores else None,
                latency_p50_ms=quantile_or_none(latencies, P50),
                latency_p95_ms=quantile_or_none(latencies, P95),
                labels=dict(Counter(label for r in runs for label in r.labels)),
                pass_hat_k=(
                    pass_hat_k(sum(verified), len(verified), len(verified)) if verified else None
                ),
            )
        )
    return out


@dataclass
class SimulationReport:
    """Every episode of a simulation and the held-out set it ran."""

    episodes: list[EpisodeResult]
    heldout_set_id: str | None
    wall_s: float

    @property
    def summaries(self) -> list[ScenarioSummary]:
        """Per-scenario figures."""
        return summarise(self.episodes)

    server_gone: str | None = None
    """Why episodes were not run: the LLM server, persona or judge stopped serving mid-run."""

    @property
    def harness_errors(self) -> int:
        """Episodes the harness could not run to the end."""
        return sum(1 for e in self.episodes if e.outcome == Outcome.ERROR)

    @property
    def not_run(self) -> int:
        """Episodes never started because the LLM server was gone."""
        return sum(1 for e in self.episodes if e.outcome == Outcome.NOT_RUN)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready summary (the CLI's --json)."""
        return {
            "heldout_set_id": self.heldout_set_id,
            "wall_s": round(self.wall_s, 3),
            "server_gone": self.server_gone,
            "episodes": [
                {
                    "session_id": e.session_id,
                    "scenario": e.scenario_id,
                    "split": e.split,
                    "repeat": e.repeat,
                    "seed": e.seed,
                    "outcome": e.outcome,
                    "reward": e.reward,
                    "reward_parts": e.reward_parts,
                    "unscored": e.unscored,
                    "labels": e.labels,
                    "end_reason": e.end_reason,
                    "error": e.error,
                    "mode": e.mode,
                    "turns": len(e.transcript),
                    "duration_s": round(e.duration_s, 3),
                    "turn_taking": turntaking.as_json(e.turn_taking),
                }
                for e in self.episodes
            ],
            "scenarios": [{**vars(s), "pass_rate": s.pass_rate} for s in self.summaries],
        }


async def simulate(
    scenarios: ScenarioSet,
    bot: "BotEntry | RemoteBot",
    config: SimulationConfig,
    ledger: Ledger,
    *,
    on_episode: Callable[[EpisodeResult], None] | None = None,
    stop: Callable[[], bool] | None = None,
    run_one: "EpisodeRunner | None" = None,
) -> SimulationReport:
    """Run every scenario `repeats` times (or its own `runs`), `concurrency` at a time.

    `stop` is asked before each episode starts: once it says yes, nothing more starts (the
    episodes in flight finish, so none is cut half-written) and the rest are `not_run`.
    `run_one` runs each episode (`run_episode` here, by default; `simulator.executor` gives
    the Ray one); seeds, pairing and the held-out split are decided the same either way. A
    `RemoteBot` (`simulate --bot-url`) is called where it runs, here, by
    `remote.run_remote_episode`, once it has answered at its URL.
    """
    run_one = run_one or run_episode
    remote = _remote_bot(bot)
    if remote is not None:  # a bot already running elsewhere: called, never imported
        from pipecat_rl.simulator.remote import check_remote, run_remote_episode

        check_remote(scenarios)
        run_one = run_remote_episode
    started = time.monotonic()
    scenarios = loading.runnable(scenarios, config.mode)  # recorded turns play in audio only
    for scenario in scenarios:  # a scenario whose world cannot be built is a usage error
        World(scenario).close()
    heldout.check_against_ledger(ledger, scenarios)  # one id, one content, before any episode
    check_transport([config.mode], config.transport)
    if config.mode == "audio":  # so is a missing speech model or key (before any call starts)
        from pipecat_rl.simulator.audio.episode import check_audio

        check_audio(
            scenarios, stt=config.stt, tts=config.tts, transport=config.transport,
            record_audio=config.record_audio,
        )  # fmt: skip
    if config.transport == "webrtc":
        bot.webrtc_transport_params()  # a bot whose own params fail says so now, not per call
    gate = asyncio.Semaphore(max(1, config.concurrency))
    jobs = [
        (scenario, repeat)
        for scenario in scenarios
        for repeat in range(config.repeats or scenario.runs)
    ]

    gone: list[str] = []  # set once the LLM server stops answering: start nothing more

    async def one(scenario: Scenario, repeat: int) -> EpisodeResult:
        async with gate:
            if gone or (stop is not None and stop()):
                why = "the LLM server was gone" if gone else "the run was stopped"
                result = _not_run(scenario, repeat, config, why)
            else:
                result = await run_one(
                    scenario,
                    bot,
                    config,
                    ledger,
                    repeat=repeat,
                    heldout_set_id=scenarios.heldout_set_id,
                )
                if result.outcome == Outcome.ERROR and not gone:
                    reason = await services_gone(scenario, config)
                    if reason and not gone:
                        gone.append(reason)
                        logger.error(f"{reason}: starting no more episodes")
        if on_episode is not None:
            on_episode(result)
        return result

    check_endpoints(scenarios, config, config.llm_url)
    with simulation_environment(config.llm_url, setup_files()):
        if remote is not None:  # its pre-flight: it answers at its URL
            await remote.check()
        elif jobs:
            await preflight(bot, jobs[0][0], config)
        # A task group, not gather: cancelled (Ctrl-C), gather ends at its first cancelled
        # child while calls still run, and asyncio's shutdown then hangs on their runners; a
        # group waits until every call has ended and written itself `interrupted`
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(s, r)) for s, r in jobs]
    return SimulationReport(
        episodes=[t.result() for t in tasks],
        heldout_set_id=scenarios.heldout_set_id,
        wall_s=time.monotonic() - started,
        server_gone=gone[0] if gone else None,
    )


def _remote_bot(bot: Any) -> "RemoteBot | None":
    """`bot` when it is one already running elsewhere (`simulate --bot-url`), else None."""
    from pipecat_rl.simulator.remote import RemoteBot

    return bot if isinstance(bot, RemoteBot) else None


def _not_run(
    scenario: Scenario, repeat: int, config: SimulationConfig, why: str
) -> EpisodeResult:
    """An episode never started (no session is written: nothing happened to record)."""
    return EpisodeResult(
        scenario_id=scenario.id,
        split=scenario.split,
        repeat=repeat,
        seed=episode_seed(config.seed, scenario.id, repeat),
        session_id="",
        outcome=Outcome.NOT_RUN,
        error=f"not run: {why}",
    )


async def server_gone(llm_url: str) -> str | None:
    """Why the LLM server at `llm_url` cannot serve (None while it answers at all)."""
    import httpx

    from pipecat_rl.serving.server import VLLMAdmin

    admin = VLLMAdmin(llm_url, timeout=5.0)
    try:
        async with httpx.AsyncClient(timeout=5.0) as client:
            # vLLM answers /v1/models from its API process even once its engine is dead; its
            # /health says 503 then (a server without /health answers 404: not a verdict)
            health = await client.get(f"{admin.root}/health", headers=admin.headers)
            if health.status_code >= 500:
                return (
                    f"the LLM server at {admin.root} reports its engine is gone (/health "
                    f"{health.status_code}); its log says why"
                )
            await client.get(f"{admin.root}/v1/models", headers=admin.headers)
    except httpx.HTTPError as e:
        return f"the LLM server at {admin.root} stopped answering ({type(e).__name__})"
    return None


def setup_files() -> list[Path]:
    """The `PIPECAT_SETUP_FILES` a simulation needs: the simulator's, then the recorder's.

    The simulator's goes first so the recorder wraps the LLM client the simulator points at
    the served model.
    """
    files = [Path(setup_file.__file__)]
    try:
        from pipecat_rl.recording import setup_file_path
    except ImportError:  # recorder not installed in this build: episodes still run, unrecorded
        logger.warning("the pipecat-rl recorder is unavailable: turns will not be recorded")
    else:
        files.append(setup_file_path())
    return files


def total_episodes(scenarios: ScenarioSet, options: SimulationOptions) -> int:
    """How many episodes `simulate` will run (per policy)."""
    return sum(options.repeats or s.runs for s in scenarios)
