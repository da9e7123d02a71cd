"""`simulate --bot-url`: the persona calls a bot that already runs elsewhere.

The URL's scheme picks how (`transport_of`). `ws://` / `wss://`: a deployed bot, or one started
with Pipecat's development runner (`python bot.py -t websocket`, which serves
`ws://HOST:PORT/ws-client`), is reached as Pipecat's WebSocket clients reach it:
`ProtobufFrameSerializer` frames, the caller's microphone as 16 kHz audio frames, the bot's
speech back as audio frames, and the RTVI `client-ready` message bots greet on; the bot's
audio, which Pipecat's server transport sends ahead of real time, is played into the caller's
ear through a 20 ms speaker, and an interruption the bot sends drops what is queued, as a
client's playback buffer does. `http://` / `https://`: a bot the runner serves with
`-t webrtc` is called over SmallWebRTC by an aiortc peer, its offer POSTed to the runner's
`/api/offer` (`remote_webrtc`). Either way the caller is the audio persona of
`simulator.audio` (its Whisper ear, its Piper mouth, its paced 20 ms frames), and everything
below is the same.

What can be known from there is what the caller lived through: the transcript as the caller
heard it, the heard gaps, the call's length, and a judge's reading of the transcript when one
is configured. The bot's tools act on its own backend, so no world is verified (the `verifier`
part is unscored, saying why), its tool calls and what its STT heard are not seen (no tool
credit, no label that needs them), and no token ids are recorded: the session is written with
`recorded_from: caller` and never trains (`ledger.eligibility`); an agent line's text is what
the caller heard, and a caller line's `heard` stays empty. Scenarios whose checks need
the bot's inside (`context:`, `fork:`, `faults:`, scripted checks of calls or of what the bot
heard, a `function_calls` metric) are refused before any call.
"""

import asyncio
import contextlib
import dataclasses
import io
import time
import wave
from dataclasses import dataclass
from typing import Any, Literal

from loguru import logger
from pipecat.audio.utils import create_stream_resampler
from pipecat.frames.frames import (
    InputAudioRawFrame,
    InterruptionFrame,
    OutputAudioRawFrame,
    OutputTransportMessageUrgentFrame,
)
from pipecat.serializers.protobuf import ProtobufFrameSerializer

from pipecat_rl.errors import ConfigError, LedgerError, ServingError
from pipecat_rl.ledger import Ledger
from pipecat_rl.recording.session import SessionInfo, new_call_id
from pipecat_rl.scenarios import Scenario, ScenarioSet, heldout
from pipecat_rl.scenarios.turns import CALL_EVENTS
from pipecat_rl.scoring import TOOL_CREDIT, VERIFIER
from pipecat_rl.scoring import SessionOutcome as Outcome
from pipecat_rl.scoring import outcome as passed_outcome
from pipecat_rl.simulator import lines
from pipecat_rl.simulator.audio.channel import SAMPLE_RATE
from pipecat_rl.simulator.audio.transport import SILENCE, AudioTransportPair, Mouth, frames_of
from pipecat_rl.simulator.botloader import error_recorder
from pipecat_rl.simulator.judge import close_llm_client, stopped_answering
from pipecat_rl.simulator.persona import build_persona_worker, caller_notes, persona_llm
from pipecat_rl.simulator.pipecat_metrics import BACKSTOPS
from pipecat_rl.simulator.rewards import TIMEOUT, EpisodeEvidence, failure_labels, reward_parts
from pipecat_rl.simulator.runner import (
    EpisodeResult,
    SimulationConfig,
    _pipecat_parts,
    _run_worker,
    _stop,
    _watch,
    _write,
    episode_seed,
    judge_gone,
    persona_endpoint,
)
from pipecat_rl.simulator.transport import Line, client_ready

RECORDED_FROM = "caller"
"""The session's `recorded_from`: only the caller's side of the call was recorded."""
UNVERIFIED = "unverified: the bot runs elsewhere; its world cannot be read"
"""Why a remote call's `verifier` part is unscored."""
NOT_SEEN = "the bot runs elsewhere: its tool calls are not seen"
"""Why a remote call's `tool_credit` part is unscored."""
OBSERVED_LABELS = (TIMEOUT,)
"""The failure labels the caller's side can back: the others need the bot's tool calls, its
STT's words or its world (a caller line's `heard` stays empty: the bot's hearing is unknown)."""
CONNECT_TIMEOUT_S = 10.0
"""How long the WebSocket handshake or the WebRTC offer may take before the bot counts as not
answering."""
USER_TRANSCRIPTION = "user_transcription"
RemoteTransport = Literal["websocket", "webrtc"]
SCHEMES: dict[str, RemoteTransport] = {
    "ws": "websocket", "wss": "websocket", "http": "webrtc", "https": "webrtc",
}  # fmt: skip
"""What each `--bot-url` scheme calls the bot over."""
STARTS: dict[RemoteTransport, str] = {
    "websocket": "`python bot.py -t websocket`, which serves ws://localhost:7860/ws-client",
    "webrtc": "`python bot.py -t webrtc`, which takes offers at http://localhost:7860/api/offer",
}
"""How Pipecat's runner serves a bot for each transport (said when nothing answers)."""


def transport_of(url: str) -> RemoteTransport:
    """What the bot at `url` is called over, by its scheme.

    Raises:
        ConfigError: a scheme that is neither WebSocket nor HTTP (SmallWebRTC's signalling).
    """
    transport = SCHEMES.get(url.partition("://")[0].lower()) if "://" in url else None
    if transport is None:
        raise ConfigError(
            f"--bot-url {url}: give the bot's WebSocket URL (ws:// or wss://, Pipecat's runner "
            "serves ws://HOST:PORT/ws-client with -t websocket) or its SmallWebRTC URL (http:// "
            "or https://, http://HOST:PORT/api/offer with -t webrtc)"
        )
    return transport


def described(e: BaseException) -> str:
    """An exception as a reason in a sentence (its type alone when it has no message)."""
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def not_answering(url: str, e: BaseException) -> ServingError:
    """The one error for a bot that does not answer at `url`, saying how to start one there."""
    return ServingError(
        f"--bot-url {url}: nothing answers there ({described(e)}); start the bot (e.g. "
        f"{STARTS[transport_of(url)]}) or fix the URL"
    )


@dataclass(frozen=True)
class RemoteBot:
    """A bot already running at `url`, called instead of imported.

    Raises:
        ConfigError: `url`'s scheme names no transport (`transport_of`).
    """

    url: str

    def __post_init__(self) -> None:
        transport_of(self.url)

    @property
    def spec(self) -> str:
        """How the run names the bot (the ledger's `bot`, the logs)."""
        return self.url

    @property
    def transport(self) -> RemoteTransport:
        """What the bot is called over."""
        return transport_of(self.url)

    async def check(self) -> None:
        """Reach the bot once, so a bot that does not answer stops the run before a call.

        A WebSocket is opened and closed; a WebRTC offer endpoint is asked without an offer.

        Raises:
            ServingError: nothing answers at the URL, it refuses the WebSocket, or nothing
                there takes WebRTC offers.
            ConfigError: WebRTC's stack (aiortc, PyAV) is not installed.
        """
        if self.transport == "webrtc":
            from pipecat_rl.simulator.remote_webrtc import probe

            await probe(self.url)
        else:
            socket = await dial(self.url)
            await socket.close()


def call_pair(url: str, **kwargs: Any) -> "RemoteCall":
    """The caller's side of a call to the bot at `url`, over what its scheme names.

    `kwargs` are the `AudioTransportPair`'s (`max_turns`, `perturb`).
    """
    if transport_of(url) == "webrtc":
        from pipecat_rl.simulator.remote_webrtc import WebRTCCallPair

        return WebRTCCallPair(url, **kwargs)
    return WebSocketCallPair(url, **kwargs)


async def dial(url: str) -> Any:
    """A WebSocket open to the bot at `url`.

    Raises:
        ServingError: naming the URL and why it did not answer.
    """
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidHandshake, InvalidURI

    try:
        return await connect(url, open_timeout=CONNECT_TIMEOUT_S, max_size=None)
    except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as e:
        raise not_answering(url, e) from e


def check_remote(scenarios: ScenarioSet) -> None:
    """A `ConfigError` for a scenario whose checks need the bot's inside, before any call."""
    for s in scenarios:
        needs = [f for f in ("context", "fork", "faults") if getattr(s, f)]
        needs += [f"metrics: {m.name}" for m in s.metrics if m.measure == "function_calls"]
        for n, turn in enumerate(s.parsed_turns or [], 1):
            needs += [
                f"turn {n}: {e.event}"
                for e in turn.expect
                if e.event in CALL_EVENTS or e.event == USER_TRANSCRIPTION
            ]
        if needs:
            raise ConfigError(
                f"--bot-url: scenario {s.id} needs what only the bot's own process sees "
                f"({', '.join(needs)}); run it with --bot, or leave it out (-s, -p)"
            )


def _pcm(frame: InputAudioRawFrame) -> bytes:
    """The frame's audio as 16-bit mono PCM (a WAV header, if the bot adds one, stripped)."""
    audio = frame.audio
    if audio[:4] == b"RIFF":
        with wave.open(io.BytesIO(audio)) as w:
            audio = w.readframes(w.getnframes())
    if frame.num_channels > 1:
        import numpy as np

        samples = np.frombuffer(audio, dtype=np.int16).reshape(-1, frame.num_channels)
        audio = samples.mean(axis=1).astype(np.int16).tobytes()
    return audio


class RemoteCall(AudioTransportPair):
    """What every call to a bot at `url` shares, whatever carries it: there is no agent side.

    `failure` says why the call could not be made, when it could not: the episode records it
    as the call's error, rather than the persona's pipeline raising it.
    """

    def __init__(self, url: str, **kwargs: Any):
        self.url = url
        self.failure: str | None = None
        super().__init__(**kwargs)

    def _agent_transport(self) -> None:  # type: ignore[override]
        """None: the agent's transport is the bot's own, in its own process."""
        return None

    def _failed(self, why: str) -> None:
        """The call could not be made: say why, and end it."""
        self.failure = why
        self.end("error")


class WebSocketCallPair(RemoteCall):
    """The caller's side of an audio call to a bot at a WebSocket URL."""

    def __init__(self, url: str, **kwargs: Any):
        self._serializer = ProtobufFrameSerializer()
        self._socket: Any = None
        self._reader: asyncio.Task | None = None
        self._closing: asyncio.Task | None = None
        super().__init__(url, **kwargs)
        self._resampler = create_stream_resampler()
        self.speaker = Mouth(self.caller.input().receive, self.agent_audio_heard)
        """The caller's playback: the bot's audio into its ear, 20 ms a tick."""

    async def connect_caller(self) -> None:
        """Dial the bot, start hearing it, send `client-ready`; a failure ends the call."""
        try:
            self._socket = await dial(self.url)
        except ServingError as e:
            self._failed(str(e))
            return
        self.speaker.start()
        self._reader = asyncio.get_running_loop().create_task(self._hear(), name="bot-url")
        if self.send_client_ready:
            await self._send(OutputTransportMessageUrgentFrame(message=client_ready()))
        self.caller_connected.set()

    async def _send(self, frame: Any) -> None:
        payload = await self._serializer.serialize(frame)
        if payload and self._socket is not None:
            from websockets.exceptions import ConnectionClosed

            with contextlib.suppress(ConnectionClosed):  # the reader ends the call
                await self._socket.send(payload)

    async def caller_audio_out(self, pcm: bytes, at: float) -> None:
        """The caller's 20 ms frame, to the bot as an audio frame."""
        del at
        await self._send(OutputAudioRawFrame(audio=pcm, sample_rate=SAMPLE_RATE, num_channels=1))

    async def _hear(self) -> None:
        """The bot's frames until it hangs up; its speech played out before the line drops."""
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in self._socket:
                frame = await self._serializer.deserialize(message)
                if isinstance(frame, InputAudioRawFrame):
                    pcm = _pcm(frame)
                    if frame.sample_rate != SAMPLE_RATE:
                        pcm = await self._resampler.resample(pcm, frame.sample_rate, SAMPLE_RATE)
                    self.speaker.queue(frames_of(pcm))
                elif isinstance(frame, InterruptionFrame):  # the bot stopped talking: drop it
                    self.speaker.clear()
        except ConnectionClosed:
            pass
        if not self.done.is_set():
            await self.speaker.play(SILENCE)  # waits until what the bot said has been heard
            self.end("agent_hung_up")

    def end(self, reason: Any) -> None:
        """End the call, then hang up (the bot sees the caller leave)."""
        first = not self.done.is_set()
        super().end(reason)
        if first and self._socket is not None:
            self._closing = asyncio.get_running_loop().create_task(self.close())

    async def close(self) -> None:
        """Hang up and stop hearing (idempotent)."""
        if self._socket is not None:
            with contextlib.suppress(Exception):
                await self._socket.close()
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
            self._reader = None
        await self.speaker.stop()
        closing, self._closing = self._closing, None
        if closing is not None and closing is not asyncio.current_task():
            await asyncio.gather(closing, return_exceptions=True)


async def run_remote_episode(
    scenario: Scenario,
    bot: RemoteBot,
    config: SimulationConfig,
    ledger: Ledger,
    *,
    repeat: int = 0,
    heldout_set_id: str | None = None,
    session_id: str | None = None,
) -> EpisodeResult:
    """One audio call of `scenario` to the bot at `bot.url`, scored and recorded as heard.

    The episode runner of a `RemoteBot` (`runner.simulate` picks it): its arguments are
    `run_episode`'s, its result an `EpisodeResult` like any other, with `verifier` unscored.
    """
    from pipecat_rl.simulator.audio.episode import AudioEpisode

    seed = episode_seed(config.seed, scenario.id, repeat)
    started = time.monotonic()
    split, set_id = heldout.session_split(ledger, scenario, heldout_set_id)
    info = SessionInfo(
        call_id=session_id or new_call_id(), source=config.source, scenario_id=scenario.id,
        scenario_hash=scenario.content_hash(), split=split,  # type: ignore[arg-type]
        heldout_set_id=set_id, seed=seed, repeat=repeat,
        metadata={
            "bot": bot.spec, "bot_url": bot.url, "recorded_from": RECORDED_FROM, "mode": "audio",
            "transport": bot.transport, "persona": config.persona, "goal": scenario.goal,
        },
    )  # fmt: skip
    result = EpisodeResult(
        scenario_id=scenario.id, split=split, repeat=repeat, seed=seed,
        session_id=str(info.call_id), outcome=Outcome.ERROR, mode="audio",
    )  # fmt: skip
    audio = AudioEpisode.build(
        scenario, seed, stt=config.stt, tts=config.tts, bot_url=bot.url,
        record_audio=config.record_audio, repeat=repeat, session_id=str(info.call_id),
    )  # fmt: skip
    pair: RemoteCall = audio.pair  # type: ignore[assignment]
    lines.watch(pair, None, scenario.id, repeat, config.mode)  # its tools run in the bot's process
    llm_persona = config.persona == "llm" and not scenario.scripted
    endpoint = persona_endpoint(scenario, config, config.llm_url) if llm_persona else None
    caller_llm = persona = persona_task = None
    errors: list[str] = []
    line = asyncio.create_task(pair.done.wait(), name="bot-url line")  # the bot's end of it
    try:
        caller_llm = persona_llm(scenario, config.persona, endpoint=endpoint, pair=pair)
        persona = build_persona_worker(scenario, pair, caller_llm, audio.persona_stages())
        persona.add_event_handler("on_pipeline_error", error_recorder(errors, fatal_only=True))
        persona_task = asyncio.create_task(_run_worker(persona), name="the caller")
        await _watch(pair, line, scenario, [errors])
    except asyncio.CancelledError:  # Ctrl-C, a cancelled job: hang up, record it, stop
        result.outcome = Outcome.INTERRUPTED
        result.error = "interrupted: the run was stopped before this call ended"
    except Exception as e:  # a broken call is data, not a crash of the run
        logger.exception(f"episode {scenario.id}#{repeat} against {bot.url} failed")
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        pair.end("error")  # no-op once the call has ended
        line.cancel()
        if persona is not None and persona_task is not None:
            await persona.cancel()
            await _stop(persona_task, [])
        await audio.close()
        if caller_llm is not None:
            result.caller = caller_notes(caller_llm)
            await close_llm_client(caller_llm)
    result.end_reason, result.transcript = pair.end_reason, [_as_heard(x) for x in pair.transcript]
    result.call_s, result.audio_wav = pair.audio_seconds, audio.finish_recording()
    if result.outcome == Outcome.INTERRUPTED:
        with contextlib.suppress(LedgerError):
            _write(ledger, info, result)
        raise asyncio.CancelledError
    result.error = pair.failure or ("; ".join(f"persona {e}" for e in errors) or None)
    if result.error is None and endpoint is not None and result.end_reason in BACKSTOPS:
        gone = await stopped_answering(endpoint, "persona")
        if gone is not None:
            result.error = f"{gone}: the caller went quiet, so the call has no verdict"
    judged: dict[str, float] = {}
    if result.error is None:
        judged = await _pipecat_parts(scenario, result, config, time.time())
        result.error = await judge_gone(scenario, result, config, judged)
        if result.error is not None:
            judged = {}
    result.score_details |= {VERIFIER: {"reason": UNVERIFIED}, TOOL_CREDIT: {"reason": NOT_SEEN}}
    evidence = EpisodeEvidence(scenario, (), (), result.transcript, result.end_reason, judged)
    result.reward_parts = {k: v for k, v in reward_parts(evidence).items() if k != TOOL_CREDIT}
    result.reward = config.rubric.shown(result.reward_parts)
    result.labels = [x for x in failure_labels(evidence) if x in OBSERVED_LABELS]
    result.outcome = Outcome.ERROR if result.error else passed_outcome(result.reward_parts)
    result.duration_s = time.monotonic() - started
    try:
        _write(ledger, info, result)
    except LedgerError as e:  # after the ledger's own retries: the run must not say "pass"
        result.outcome = Outcome.ERROR
        result.error = f"the ledger could not record this episode ({e}): it is not fully written"
    return result


def _as_heard(line: Line) -> Line:
    """An agent line as the caller knows it: its words as heard, no stages inside the bot.

    The bot's own text and its stage times are not seen from here; the judge and the checks
    read `text`, so it holds what the caller's STT heard.
    """
    if line.speaker != "agent":
        return line
    return dataclasses.replace(line, text=line.heard, stages_ms=None)  # type: ignore[call-arg]


def announce(url: str) -> str:
    """What the CLI says once at start: where the bot runs, and what that leaves unknown."""
    return (
        f"the bot at {url} runs elsewhere: recorded from the caller's side only; its world is "
        "not verified"
    )
