"""The audio side of the local transport pair: paced 20 ms frames both ways, and a heard-gap meter.

Each side has a *mouth*: a 20 ms clock that sends one frame per tick to the other side's
input, speech when it has some queued and silence otherwise, so both directions carry a
continuous stream as on a call (VAD, endpointing, smart-turn and interruptions see real
silences). The agent's output transport plays its TTS audio through its mouth, one slot per
frame, so `BotStartedSpeaking`/`BotStoppedSpeaking` and Pipecat's latency observers fire at
play time; the caller's output queues each synthesised line, or a scripted turn's recording
(`recordings`), perturbed by the channel (see `channel`), on its mouth.

Where time runs faster than real time (only where nothing in the pipeline can tell): TTS
synthesis and STT transcription run as fast as the CPU allows (as with a streaming service
that returns early), and the caller's line is synthesised whole before it is played. Audio on
the wire never runs faster than real time: a tick that comes late (a busy CPU) sends the
frames it owes at once, up to 100 ms, and then re-anchors the clock rather than bursting more.

The caller-side meter (`HeardLatencyMeter`) takes, per caller line, the gap between the end of
the caller's own speech (its last voiced frame, judged on the clean line) and the first voiced
agent frame it receives afterwards: the heard gap, at 20 ms resolution.
"""

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from pipecat.audio.utils import create_file_resampler, create_stream_resampler
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    CancelFrame,
    ClientConnectedFrame,
    EndFrame,
    Frame,
    InputAudioRawFrame,
    InputTransportMessageFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMMessagesUpdateFrame,
    LLMTextFrame,
    OutputAudioRawFrame,
    StartFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStoppedFrame,
    TTSTextFrame,
    UserStoppedSpeakingFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.observers.user_bot_latency_observer import UserBotLatencyObserver
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import LLMService
from pipecat.services.stt_service import STTService
from pipecat.transports.base_input import BaseInputTransport
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import BaseTransport, TransportParams
from pipecat.utils.time import time_now_iso8601

from pipecat_rl import compat
from pipecat_rl.recording.spoken import SpokenPart, join_spoken, spoken_part
from pipecat_rl.simulator.audio.channel import FRAME_SAMPLES, SAMPLE_RATE, VOICED_RMS
from pipecat_rl.simulator.audio.moves import CallerMoves, spoken_with_pauses
from pipecat_rl.simulator.audio.recorder import CallRecording, Side
from pipecat_rl.simulator.audio.recordings import RecordingFrame, read_recording
from pipecat_rl.simulator.audio.stages import StageTimeline
from pipecat_rl.simulator.audio.timeline import LineTimeline, UtteranceKind
from pipecat_rl.simulator.transport import CLIENT_ID, Line, LocalTransportPair, client_ready

FRAME_BYTES = FRAME_SAMPLES * 2
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
SILENCE = bytes(FRAME_BYTES)
MAX_CATCH_UP_S = 0.1
HANG_UP_GRACE_S = 1.0
"""How long the caller stays quiet after asking to hang up before the line drops."""
HEARING_SETTLE_S = 0.7
"""The caller answers once the agent has been quiet this long after its last transcript."""
HEARING_PATIENCE_S = 5.0
"""How long past `HEARING_SETTLE_S` a caller waits out an agent whose reply stalls mid-way."""

Deliver = Callable[[bytes, float], Awaitable[None]]


def voiced(pcm: bytes) -> bool:
    """Whether a 16-bit PCM frame carries speech (by energy)."""
    if not pcm:
        return False
    samples = np.frombuffer(pcm, dtype=np.int16).astype(np.float32)
    return float(np.sqrt(np.mean(samples**2))) > VOICED_RMS


def frames_of(pcm: bytes) -> list[bytes]:
    """`pcm` cut into 20 ms frames, the last padded with silence."""
    out = [pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm), FRAME_BYTES)]
    if out and len(out[-1]) < FRAME_BYTES:
        out[-1] = out[-1] + bytes(FRAME_BYTES - len(out[-1]))
    return out


Tag = tuple[UtteranceKind, int]
"""Which utterance a caller frame belongs to: a turn line (by line index) or an aside."""


@dataclass
class _Slot:
    pcm: bytes
    voiced: bool
    played: asyncio.Future | None = None
    tag: Tag | None = None


class Mouth:
    """A 20 ms clock that sends queued speech, or silence, to `deliver` on every tick.

    `on_sent` is told each frame as it goes: voiced or not, when, and the tag it was queued with.
    """

    def __init__(
        self, deliver: Deliver, on_sent: Callable[[bool, float, Tag | None], None] | None = None
    ):
        self._deliver = deliver
        self._on_sent = on_sent
        self._queue: collections.deque[_Slot] = collections.deque()
        self._task: asyncio.Task | None = None

    @property
    def busy(self) -> bool:
        """Whether speech is queued."""
        return bool(self._queue)

    def start(self) -> None:
        """Start ticking (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="mouth")

    async def stop(self) -> None:
        """Stop ticking; queued speech is dropped."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.clear()

    def clear(self) -> None:
        """Drop queued speech (an interruption)."""
        while self._queue:
            slot = self._queue.popleft()
            if slot.played is not None and not slot.played.done():
                slot.played.set_result(None)

    def queue(
        self, frames: list[bytes], voiced_mask: list[bool] | None = None, tag: Tag | None = None
    ) -> None:
        """Queue speech to be played, without waiting for it."""
        mask = [voiced(f) for f in frames] if voiced_mask is None else list(voiced_mask)
        mask = (mask + [False] * len(frames))[: len(frames)]  # resampling may shift a frame
        self._queue.extend(_Slot(f, v, tag=tag) for f, v in zip(frames, mask, strict=True))

    async def play(self, frame: bytes) -> None:
        """Play one frame: wait for its slot (the pace of the output)."""
        slot = _Slot(frame, voiced(frame), asyncio.get_running_loop().create_future())
        self._queue.append(slot)
        await slot.played

    async def _run(self) -> None:
        anchor, n = time.monotonic(), 0
        while True:
            n += 1
            delay = anchor + n * FRAME_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            elif -delay > MAX_CATCH_UP_S:
                anchor, n = time.monotonic(), 0
            slot = self._queue.popleft() if self._queue else _Slot(SILENCE, False)
            at = time.monotonic()
            if slot.played is not None and not slot.played.done():
                slot.played.set_result(None)
            if self._on_sent is not None:
                self._on_sent(slot.voiced, at, slot.tag)
            await self._deliver(slot.pcm, at)


@dataclass
class HeardLatencyMeter:
    """Caller-side heard gap per caller line: its last voiced frame to the agent's next one."""

    gaps_ms: dict[int, float] = field(default_factory=dict)
    """Caller line index (0-based) -> heard gap in milliseconds."""
    on_gap: Callable[[int, float, float], None] | None = None
    """Told each gap as it is taken: (line, caller's end of speech, agent's first voice)."""
    _caller_last_voice: float | None = None
    _awaiting: bool = False
    _line: int = -1

    def caller_line(self, index: int) -> None:
        """The caller started line `index` (its voiced frames follow)."""
        self._line = index

    def caller_frame(self, is_voiced: bool, at: float) -> None:
        """A frame the caller sent."""
        if is_voiced:
            self._caller_last_voice = at + FRAME_S  # the frame's end
            self._awaiting = self._line >= 0

    def agent_frame(self, is_voiced: bool, at: float) -> None:
        """A frame the caller received from the agent."""
        if is_voiced and self._awaiting and self._caller_last_voice is not None:
            if self._line not in self.gaps_ms:
                self.gaps_ms[self._line] = (at - self._caller_last_voice) * 1000.0
                if self.on_gap is not None:
                    self.on_gap(self._line, self._caller_last_voice, at)
            self._awaiting = False


@dataclass
class AudioLine(Line):
    """A transcript line of an audio call: an agent line also says where its heard gap went."""

    stages_ms: dict[str, float] | None = None
    """For an agent line with a heard gap: its stage durations (`stages.stage_ms`)."""


class AudioTransportPair(LocalTransportPair):
    """A simulated call carried as paced 16 kHz audio; the transcript as said and as heard.

    Caller lines are `Line("caller", said, heard-by-the-agent's-STT)`; agent lines are
    `Line("agent", spoken-by-its-TTS, heard-by-the-caller's-STT, heard gap, answers)`, where a
    turn answers the caller lines the agent's voice followed (none, for a greeting that began
    before the caller's first line was heard).
    """

    def __init__(
        self,
        *,
        max_turns: int = 20,
        perturb: Callable[[bytes], tuple[bytes, list[bool]]] | None = None,
        send_client_ready: bool = True,
    ):
        super().__init__(max_turns=max_turns, send_client_ready=send_client_ready)
        self.perturb = perturb
        self.stages = StageTimeline()
        """Where each caller line's heard gap went, stage by stage (see `stages`)."""
        self.meter = HeardLatencyMeter(on_gap=self.stages.heard)
        self.v2v_ms: dict[int, float] = {}
        """Caller line index -> the agent pipeline's own voice-to-voice figure."""
        self.agent_spoken: list[SpokenPart] = []
        """What the agent's TTS said since its last turn, joined by the recorder's rule."""
        self._agent_reply_played = asyncio.Event()
        self._agent_reply_played.set()
        self.caller_speaking = False
        self._caller_quiet_since: float | None = None
        self.audio_seconds = 0.0
        """How long the call has run on the wire (the caller's mouth ticks)."""
        self.recording: CallRecording | None = None
        """`--record-audio`: the call's stereo WAV, told every frame each side sends."""
        self.timeline = LineTimeline(FRAME_S)
        """What each side put on the line, for the call's turn-taking (`timeline.measure`)."""
        self.moves: CallerMoves | None = None
        """A scripted caller's barge-ins and asides, timed by the agent's voice (`moves`)."""
        self.agent = self._agent_transport()
        self.caller = AudioCallerTransport(self)

    def _agent_transport(self) -> BaseTransport:
        """The transport the agent's bot is given (here: the paced local one)."""
        return AudioAgentTransport(self)

    async def connect_caller(self) -> None:
        """The caller dials in (its pipeline has started); the agent sees it connect."""
        self.caller_connected.set()

    async def close(self) -> None:
        """Let go of what the call holds once it is over (the local pair holds nothing)."""

    async def caller_audio_out(self, pcm: bytes, at: float) -> None:
        """A 20 ms frame leaves the caller's mouth for the agent."""
        await self.agent.input().receive(pcm, at)

    def record(self, side: Side, pcm: bytes, at: float) -> None:
        """A frame of `side` went by on the line (recorded, when the call is)."""
        if self.recording is not None:
            self.recording.add(side, pcm, at)

    def agent_audio_heard(self, is_voiced: bool, at: float, tag: Tag | None = None) -> None:
        """An agent frame reached the caller: the heard-gap meter, timeline, moves, activity.

        While the caller is still saying its line, the agent's voice is no answer to it (it
        talks over the caller): the meter waits for voice after the line.
        """
        del tag  # the agent's frames carry none
        self.timeline.agent(is_voiced, at)
        busy = self.caller.mouth.busy
        if not busy:
            self.meter.agent_frame(is_voiced, at)
        if is_voiced:
            self.last_activity = at
        if self.moves is not None:
            asides = self.moves.agent_frame(is_voiced, at, self.caller_turns, busy, FRAME_S)
            for kind, n, pcm in asides:
                self.caller.output().play(pcm, (kind, n))

    def agent_cut(self) -> None:
        """The agent's output dropped speech it had queued: it was interrupted while speaking."""
        self.timeline.cut(time.monotonic())

    def agent_interrupted(self) -> None:
        """Mark the agent's line as cut off: the one being said, or the one a barge-in ended."""
        if self.agent_spoken:
            self.agent_spoken.append(("[interrupted]", False))
            return
        last = next((x for x in reversed(self.transcript) if x.speaker == "agent"), None)
        if last is not None and not last.text.endswith("[interrupted]"):
            last.text = f"{last.text} [interrupted]".strip()

    def request_hang_up(self) -> None:
        """The caller hangs up once its last line has been synthesised and played.

        The request (the persona's `end_call`) can overtake that line's text on its way to the
        TTS, so the call ends only after the caller has been quiet `HANG_UP_GRACE_S`.
        """
        self._hang_up_requested = True

    # -- caller side -----------------------------------------------------------------------

    def caller_line(self, text: str) -> None:
        """The persona said a line (its text, before TTS); the agent's STT fills `heard`."""
        if self.done.is_set() or not text.strip():
            return
        self.meter.caller_line(self.caller_turns)
        self.stages.caller_line(self.caller_turns)
        self.add_line(Line("caller", text, "", time.time()))
        self.last_activity = time.monotonic()

    def caller_sent(self, is_voiced: bool, at: float, tag: Tag | None = None) -> None:
        """A frame left the caller's mouth (an aside's is no line: the meter leaves it out)."""
        self.audio_seconds += FRAME_S
        self.timeline.caller(is_voiced, at, tag)
        if tag is None or tag[0] == "turn":
            self.meter.caller_frame(is_voiced, at)
        if is_voiced:
            self.last_activity = at
        if is_voiced or self.caller.mouth.busy or self.caller_speaking:
            self._caller_quiet_since = None
        elif self._caller_quiet_since is None:
            self._caller_quiet_since = at
        elif self._hang_up_requested and at - self._caller_quiet_since >= HANG_UP_GRACE_S:
            self.end("caller_hung_up")

    def agent_heard_caller(self, text: str) -> None:
        """The agent's STT transcribed some of the caller's speech."""
        line = next((x for x in reversed(self.transcript) if x.speaker == "caller"), None)
        if line is not None:
            line.heard = f"{line.heard} {text}".strip()

    # -- agent side ------------------------------------------------------------------------

    def agent_replying(self, replying: bool) -> None:
        """The agent's reply began at its output transport (True) or has all been played (False).

        A pause inside a reply (its TTS slower than real time on a busy machine) is not the end of
        the agent's turn: the caller waits it out (`agent_reply_played`).
        """
        if replying:
            self._agent_reply_played.clear()
        else:
            self._agent_reply_played.set()

    async def agent_reply_played(self) -> None:
        """Return once the agent's current reply (if any) has all been played."""
        await self._agent_reply_played.wait()

    def agent_turn_heard(self, heard: str) -> bool:
        """The caller heard a whole agent turn; False once the call is over (no reply)."""
        if self.done.is_set():
            return False
        spoken = join_spoken(self.agent_spoken).strip()
        self.agent_spoken = []
        gap = self.meter.gaps_ms.get(self.caller_turns - 1) if self.caller_turns else None
        answers = max(self.meter.gaps_ms, default=-1) + 1  # the lines its voice has followed
        stages = self.stages.stage_ms(self.caller_turns - 1) if gap is not None else None
        self.add_line(AudioLine("agent", spoken, heard, time.time(), gap, answers, stages))
        self.last_activity = time.monotonic()
        if self.caller_turns >= self.max_turns:
            self.end("max_turns")
            return False
        return True


def _audio_params(**kwargs) -> TransportParams:
    return TransportParams(audio_in_sample_rate=SAMPLE_RATE, **kwargs)


class _AudioInput(BaseInputTransport):
    """Receives the other side's 20 ms frames and pushes them as `InputAudioRawFrame`s."""

    def __init__(self, pair: AudioTransportPair, **kwargs):
        super().__init__(_audio_params(audio_in_enabled=True), **kwargs)
        self._pair = pair
        self._ready = False
        self._resampler = create_stream_resampler()

    async def start(self, frame: StartFrame):
        """Ready to receive once the pipeline has started."""
        await super().start(frame)
        await self.set_transport_ready(frame)
        self._ready = True

    async def stop(self, frame: EndFrame):
        """Stop receiving."""
        self._ready = False
        await super().stop(frame)

    async def cancel(self, frame: CancelFrame):
        """Stop receiving at once."""
        self._ready = False
        await super().cancel(frame)

    async def receive(self, pcm: bytes, at: float) -> None:
        """A frame from the wire (dropped until the pipeline runs)."""
        if not self._ready:
            return
        rate = self.sample_rate or SAMPLE_RATE
        if rate != SAMPLE_RATE:
            pcm = await self._resampler.resample(pcm, SAMPLE_RATE, rate)
        await self.push_audio_frame(InputAudioRawFrame(audio=pcm, sample_rate=rate, num_channels=1))


class AudioAgentInput(_AudioInput):
    """The agent's input: the caller connecting, its audio, hanging up."""

    def __init__(self, transport: "AudioAgentTransport", pair: AudioTransportPair, **kwargs):
        super().__init__(pair, **kwargs)
        self._transport = transport
        self._events: asyncio.Task | None = None

    async def start(self, frame: StartFrame):
        """Start, then tell the bot the caller is on the line once it is."""
        await super().start(frame)
        if self._events is None:
            self._events = self.create_task(self._call_events(), name=f"{self}::events")

    async def _call_events(self) -> None:
        await self._pair.caller_connected.wait()
        await compat.call_event(self._transport, "on_client_connected", CLIENT_ID)
        await self.push_frame(ClientConnectedFrame())  # after the handlers, as SmallWebRTC does
        if self._pair.send_client_ready:
            await self.push_frame(InputTransportMessageFrame(message=client_ready()))
        await self._pair.done.wait()
        await compat.call_event(self._transport, "on_client_disconnected", CLIENT_ID)

    async def _stop_events(self) -> None:
        if self._events is not None:
            await self.cancel_task(self._events)
            self._events = None

    async def stop(self, frame: EndFrame):
        """Stop."""
        await super().stop(frame)
        await self._stop_events()

    async def cancel(self, frame: CancelFrame):
        """Stop at once."""
        await super().cancel(frame)
        await self._stop_events()


class _MouthOutput(BaseOutputTransport):
    """An output transport that talks through a `Mouth`, ticking from start to stop."""

    mouth: Mouth

    async def start(self, frame: StartFrame):
        """Start the mouth (the other side hears silence until this side speaks)."""
        await super().start(frame)
        await self.set_transport_ready(frame)
        self.mouth.start()

    async def stop(self, frame: EndFrame):
        """Stop the mouth once the pipeline has drained."""
        await super().stop(frame)
        await self.mouth.stop()

    async def cancel(self, frame: CancelFrame):
        """Stop at once."""
        await super().cancel(frame)
        await self.mouth.stop()


class AudioAgentOutput(_MouthOutput):
    """The agent's output: its TTS audio played through its mouth to the caller, paced."""

    def __init__(self, pair: AudioTransportPair, **kwargs):
        super().__init__(TransportParams(audio_out_enabled=True), **kwargs)
        self._pair = pair
        self._resampler = create_stream_resampler()
        self._carry = bytearray()
        self.mouth = Mouth(pair.caller.input().receive, pair.agent_audio_heard)

    async def stop(self, frame: EndFrame):
        """The agent ended the call (after its audio has played)."""
        await super().stop(frame)
        self._pair.end("agent_hung_up")

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        """Behave like any output transport; an interruption stops the talking now."""
        if isinstance(frame, InterruptionFrame):  # the caller barged in
            self.mouth.clear()
            self._carry.clear()
        await super().process_frame(frame, direction)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        """Play one chunk in real time (one 20 ms slot per whole frame; the rest carries over)."""
        pcm = frame.audio
        if frame.sample_rate != SAMPLE_RATE:
            pcm = await self._resampler.resample(pcm, frame.sample_rate, SAMPLE_RATE)
        self._carry.extend(pcm)
        while len(self._carry) >= FRAME_BYTES:
            chunk = bytes(self._carry[:FRAME_BYTES])
            del self._carry[:FRAME_BYTES]
            await self.mouth.play(chunk)
        return True


class AudioAgentTransport(BaseTransport):
    """The transport handed to the user's bot in audio mode (same events as the text one)."""

    def __init__(
        self,
        pair: AudioTransportPair,
        *,
        input_name: str | None = None,
        output_name: str | None = None,
        **kwargs,
    ):
        super().__init__(input_name=input_name, output_name=output_name, **kwargs)
        self.pair = pair
        self._input = AudioAgentInput(self, pair, name=input_name)
        self._output: AudioAgentOutput | None = None
        self._output_label = output_name
        compat.register_event(self, "on_client_connected")
        compat.register_event(self, "on_client_disconnected")

    def input(self) -> AudioAgentInput:
        """The agent's input processor."""
        return self._input

    def output(self) -> AudioAgentOutput:
        """The agent's output processor (built on first use: it needs the caller's input)."""
        if self._output is None:
            self._output = AudioAgentOutput(self.pair, name=self._output_label)
        return self._output

    def get_client_id(self, client) -> str:
        """The simulated caller's id."""
        return str(client)


class AudioCallerInput(_AudioInput):
    """The persona's ear: the agent's audio, as frames."""

    async def receive(self, pcm: bytes, at: float) -> None:
        """A frame of the agent's, as the caller receives it (the call's right channel)."""
        if self._ready:  # before its pipeline runs, the caller hears nothing
            self._pair.record("agent", pcm, at)
        await super().receive(pcm, at)

    async def start(self, frame: StartFrame):
        """Connect to the agent once the persona pipeline runs; speak the opening line, if any."""
        await super().start(frame)
        if self._pair.moves is not None:
            await self._pair.moves.prepare()
        await self._pair.connect_caller()
        if self._pair.caller_opening:
            self._pair.caller_line(self._pair.caller_opening)
            self._pair.caller_speaking = True
            await self.push_frame(TTSSpeakFrame(self._pair.caller_opening, append_to_context=False))


class AudioCallerOutput(_MouthOutput):
    """The persona's mouth: each synthesised utterance or recording, perturbed, then played."""

    def __init__(self, pair: AudioTransportPair, **kwargs):
        super().__init__(TransportParams(audio_out_enabled=False), **kwargs)
        self._pair = pair
        self._utterance = bytearray()
        self._resampler = create_stream_resampler()
        self.mouth = Mouth(self._deliver, pair.caller_sent)

    async def _deliver(self, pcm: bytes, at: float) -> None:
        self._pair.record("caller", pcm, at)
        await self._pair.caller_audio_out(pcm, at)

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        """Take the persona's TTS audio off the pipeline and play it, a whole utterance at once."""
        if isinstance(frame, RecordingFrame):  # a recorded turn: already whole
            await FrameProcessor.process_frame(self, frame, direction)
            pcm = frame.audio
            if frame.sample_rate != SAMPLE_RATE:
                resampler = create_file_resampler()
                pcm = await resampler.resample(pcm, frame.sample_rate, SAMPLE_RATE)
            self._play(pcm)
            self._pair.caller_speaking = False
            return
        if isinstance(frame, TTSAudioRawFrame):
            # Only the frame processor's bookkeeping: this audio is played by the mouth, whole,
            # not streamed through the output transport's media sender.
            await FrameProcessor.process_frame(self, frame, direction)
            pcm = frame.audio
            if frame.sample_rate != SAMPLE_RATE:
                pcm = await self._resampler.resample(pcm, frame.sample_rate, SAMPLE_RATE)
            self._utterance.extend(pcm)
            self._pair.caller_speaking = True
            return
        if isinstance(frame, TTSStoppedFrame):
            self._flush()
        await super().process_frame(frame, direction)

    def _flush(self) -> None:
        pcm, self._utterance = bytes(self._utterance), bytearray()
        self._play(pcm)
        self._pair.caller_speaking = False

    def _play(self, pcm: bytes) -> None:
        self.play(pcm, ("turn", self._pair.caller_turns - 1))

    def play(self, pcm: bytes, tag: Tag) -> None:
        """Queue an utterance on the mouth, through the channel's perturbations."""
        if pcm:
            if self._pair.perturb is not None:
                pcm, mask = self._pair.perturb(pcm)
                self.mouth.queue(frames_of(pcm), mask, tag)
            else:
                self.mouth.queue(frames_of(pcm), tag=tag)


class AudioCallerTransport(BaseTransport):
    """The persona caller bot's transport in audio mode."""

    def __init__(
        self,
        pair: AudioTransportPair,
        *,
        input_name: str | None = None,
        output_name: str | None = None,
        **kwargs,
    ):
        super().__init__(input_name=input_name, output_name=output_name, **kwargs)
        self.pair = pair
        self._input = AudioCallerInput(pair, name=input_name)
        self._output = AudioCallerOutput(pair, name=output_name)

    @property
    def mouth(self) -> Mouth:
        """The caller's mouth."""
        return self._output.mouth

    def input(self) -> AudioCallerInput:
        """The caller's input processor."""
        return self._input

    def output(self) -> AudioCallerOutput:
        """The caller's output processor."""
        return self._output


# -- processors of the persona's audio pipeline ------------------------------------------------


class CallerLineTap(FrameProcessor):
    """Between the persona LLM and its TTS: each complete reply is a caller line.

    A scripted turn played from a recording (`recorded`: caller line, 1-based -> file) is not
    spoken: its reply passes on marked `skip_tts` and its `RecordingFrame` follows (see
    `recordings`); so is a line said with pauses (`recorded` gives its parts: `moves`). The
    tap decides it, as the one processor that adds caller lines after the opening, so the turn
    a reply says is the pair's next line when the reply starts.
    """

    def __init__(
        self,
        pair: AudioTransportPair,
        recorded: Mapping[int, str | tuple[str | int, ...]] | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self._pair = pair
        self._parts: list[str] = []
        self._recorded = dict(recorded or {})
        self._recording: int | None = None
        """The recorded turn the passing reply would say, if it is one."""

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        """Collect the reply's text; at its end, tell the pair what the caller says."""
        await super().process_frame(frame, direction)
        if direction != FrameDirection.DOWNSTREAM:
            await self.push_frame(frame, direction)
            return
        opening = isinstance(frame, TTSSpeakFrame) and self._pair.caller_turns == 1
        if opening and 1 in self._recorded:  # the line said on connecting: played, not spoken
            await self._play(1)
            return
        if isinstance(frame, LLMFullResponseStartFrame):
            upcoming = self._pair.caller_turns + 1
            self._recording = upcoming if upcoming in self._recorded else None
        if self._recording is not None and isinstance(
            frame, (LLMFullResponseStartFrame, LLMTextFrame, LLMFullResponseEndFrame)
        ):
            frame.skip_tts = True
        said = None
        if isinstance(frame, LLMTextFrame):
            self._parts.append(frame.text)
            self._pair.caller_speaking = bool(frame.text.strip()) or self._pair.caller_speaking
        elif isinstance(frame, LLMFullResponseEndFrame):
            text, self._parts = "".join(self._parts).strip(), []
            before = self._pair.caller_turns
            self._pair.caller_line(text)
            if self._pair.caller_turns > before:  # a line was said (not empty, call not over)
                said = self._recording
            self._recording = None
        await self.push_frame(frame, direction)
        if said is not None:
            await self._play(said)

    async def _play(self, turn: int) -> None:
        path = self._recorded.pop(turn)  # each turn is said once
        if not isinstance(path, str):  # a pausing line: its text and silences (`moves`)
            await self.push_frame(await spoken_with_pauses(path))
            return
        try:
            recording = await read_recording(path)
        except ValueError as e:  # the loader read it: it changed since
            await self.push_error(f"turn {turn}: cannot play {path}: {e}", exception=e, fatal=True)
            return
        await self.push_frame(recording)


class PersonaHearing(FrameProcessor):
    """After the persona's STT: joins what it heard into one agent turn, passed on when it ends.

    The agent's turn ends, as a caller judges it, when the agent has been quiet
    `HEARING_SETTLE_S` after its last transcript (a pause between sentences does not end it),
    the persona's STT has transcribed all it heard, and the reply the agent was speaking has
    been played. A busy machine (CI, rollouts beside the call) slows the STT and starves the
    agent's TTS between sentences; neither is the agent yielding the turn, so both are waited
    out, for at most `patience_s` (then the caller speaks up, as a person would). A barge-in
    (`moves`) ends the agent's turn at once, as heard so far, so the caller's next line goes over
    the agent; what was heard so far is told to the moves as it comes, for a caller whose
    barge-in hangs on it (a rule keyed on what the agent means).
    """

    def __init__(
        self,
        pair: AudioTransportPair,
        *,
        text_per_segment: bool,
        settle_s: float = HEARING_SETTLE_S,
        patience_s: float = HEARING_PATIENCE_S,
        **kwargs,
    ):
        """Hear through `pair`; `text_per_segment`: the STT before answers each VAD segment once.

        Pipecat's `SegmentedSTTService` (Whisper) does: a segment not yet transcribed is text to
        come, and the turn is not over before it has come.
        """
        super().__init__(**kwargs)
        self._pair = pair
        self._text_per_segment = text_per_segment
        self._settle_s = settle_s
        self._patience_s = patience_s
        self._heard: list[str] = []
        self._speaking = False
        self._untranscribed = 0
        self._transcribed = asyncio.Event()
        self._transcribed.set()
        self._timer: asyncio.Task | None = None
        self._barge_ins: asyncio.Task | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        """Hold transcripts until the agent's turn is over."""
        await super().process_frame(frame, direction)
        if isinstance(frame, StartFrame) and self._pair.moves is not None and not self._barge_ins:
            self._barge_ins = self.create_task(self._barge_in(), name=f"{self}::barge_in")
        if isinstance(frame, VADUserStartedSpeakingFrame):
            self._speaking = True
            await self._cancel_timer()
        elif isinstance(frame, VADUserStoppedSpeakingFrame):
            self._speaking = False
            if self._text_per_segment:
                self._owe(+1)
            if self._heard:
                await self._restart_timer()
        if isinstance(frame, TranscriptionFrame):
            self._owe(-1)
            self._heard.append(frame.text.strip())
            if self._pair.moves is not None:
                self._pair.moves.heard(self._so_far())
            if not self._speaking:
                await self._restart_timer()
            return
        await self.push_frame(frame, direction)

    async def cleanup(self):
        """The call is over: an agent turn still settling is not heard."""
        await super().cleanup()
        await self._cancel_timer()
        if self._barge_ins is not None:
            await self.cancel_task(self._barge_ins)
            self._barge_ins = None

    async def _barge_in(self) -> None:
        moves = self._pair.moves
        assert moves is not None  # started only for a call with moves
        while True:
            await moves.barge_in_due.wait()
            moves.barge_in_due.clear()
            await self._cancel_timer()
            await self._hand_over()

    def _so_far(self) -> str:
        """What the caller has heard of the agent's turn so far."""
        return " ".join(h for h in self._heard if h)

    def _owe(self, segments: int) -> None:
        self._untranscribed = max(0, self._untranscribed + segments)
        if self._untranscribed:
            self._transcribed.clear()
        else:
            self._transcribed.set()

    async def _restart_timer(self) -> None:
        await self._cancel_timer()
        self._timer = self.create_task(self._settle(), name=f"{self}::settle")

    async def _cancel_timer(self) -> None:
        if self._timer is not None:
            await self.cancel_task(self._timer)
            self._timer = None

    async def _settle(self) -> None:
        await asyncio.sleep(self._settle_s)  # cancelled if the agent speaks again meanwhile
        try:
            async with asyncio.timeout(self._patience_s):
                await self._transcribed.wait()
                await self._pair.agent_reply_played()
        except TimeoutError:
            pass  # a segment that yields no text, a reply that never ends: speak up anyway
        self._timer = None
        await self._hand_over()

    async def _hand_over(self) -> None:
        """The agent's turn is over as the caller heard it: pass it on to the caller's turn."""
        self._owe(-self._untranscribed)
        heard, self._heard = self._so_far(), []
        if self._pair.agent_turn_heard(heard):
            await self.push_frame(
                TranscriptionFrame(text=heard, user_id="agent", timestamp=time_now_iso8601())
            )


class AgentHearingObserver(BaseObserver):
    """On the agent's worker: what its STT heard, what its TTS said, and its own v2v.

    It also hands the bot the scenario's starting `context:` once the caller has connected (the
    transport's `ClientConnectedFrame`, pushed after the bot's own connection handlers).

    Frames are taken where they enter the agent's output transport (whichever transport that is:
    the paced local one or SmallWebRTC): the TTS text the caller is about to hear, and an
    interruption that cuts the agent off while it speaks (marked `[interrupted]` in its line).
    The in-agent voice-to-voice figure is Pipecat's `UserBotLatencyObserver` (VAD stop minus
    stop_secs to bot speech), kept per caller line so it can stand beside the heard gap even when
    the recorder could not split user turns (a bot whose LLM is not OpenAI-compatible).
    """

    def __init__(self, pair: AudioTransportPair, **kwargs):
        super().__init__(**kwargs)
        self._pair = pair
        self._stages = pair.stages
        self._seen: set[int] = set()
        self._bot_speaking = False
        self._latency = UserBotLatencyObserver()
        self._latency.add_event_handler("on_latency_measured", self._on_v2v)

    async def _on_v2v(self, _observer, latency: float) -> None:
        if self._pair.caller_turns:
            self._pair.v2v_ms.setdefault(self._pair.caller_turns - 1, latency * 1000.0)

    async def on_pipeline_started(self):
        """Start Pipecat's latency observer's clock."""
        await self._latency.on_pipeline_started()

    async def on_push_frame(self, data: FramePushed):
        """Note each final transcript, each spoken text and each barge-in; time voice to voice."""
        await self._latency.on_push_frame(data)
        frame, at = data.frame, data.timestamp / 1e9
        self._stages.clock(time.monotonic(), at)
        if isinstance(frame, TTSAudioRawFrame):  # many: never added to `_seen`
            self._stages.agent("tts_audio", at)
        elif isinstance(frame, LLMTextFrame) and isinstance(data.source, LLMService):
            self._stages.agent("reply", at)
        if isinstance(frame, LLMFullResponseEndFrame) and isinstance(
            data.source, BaseOutputTransport
        ):  # leaves the output once the reply's audio before it has played
            self._pair.agent_replying(False)
        if frame.id in self._seen:
            return
        if isinstance(frame, TranscriptionFrame) and isinstance(data.source, STTService):
            self._seen.add(frame.id)
            self._stages.agent("stt_final", at)
            self._pair.agent_heard_caller(frame.text)
        elif isinstance(frame, (VADUserStoppedSpeakingFrame, UserStoppedSpeakingFrame)):
            self._seen.add(frame.id)
            vad = isinstance(frame, VADUserStoppedSpeakingFrame)
            self._stages.agent("vad_stop" if vad else "turn_end", at)
        elif isinstance(frame, ClientConnectedFrame):
            self._seen.add(frame.id)
            context = self._pair.agent_context
            if context is not None and isinstance(data.source, BaseInputTransport):
                # as Pipecat's harness sends it: once the bot has set itself up for the caller
                await data.source.push_frame(LLMMessagesUpdateFrame(list(context)))
        elif isinstance(frame, (BotStartedSpeakingFrame, BotStoppedSpeakingFrame)):
            self._seen.add(frame.id)
            self._bot_speaking = isinstance(frame, BotStartedSpeakingFrame)
            if self._bot_speaking:
                self._stages.agent("bot_started", at)
        elif isinstance(data.destination, BaseOutputTransport):
            if isinstance(frame, TTSTextFrame) and data.direction == FrameDirection.DOWNSTREAM:
                self._seen.add(frame.id)
                self._pair.agent_spoken.append(spoken_part(frame))
            elif isinstance(frame, LLMFullResponseStartFrame):
                self._seen.add(frame.id)
                self._pair.agent_replying(True)
            elif isinstance(frame, InterruptionFrame):
                self._seen.add(frame.id)
                self._pair.agent_replying(False)
                if self._bot_speaking:  # its text so far was not all heard: say so
                    self._pair.agent_interrupted()
                    self._pair.agent_cut()
