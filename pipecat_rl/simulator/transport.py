"""An in-process transport pair: the agent bot's transport and the persona caller's, joined.

Both sides are built on Pipecat's transport base classes, so each bot runs as it would over
Daily or a WebSocket. For the agent bot the local transport behaves like Pipecat's own: it fires
`on_client_connected` once the caller is there (and, if asked, sends the RTVI `client-ready`
message that bots greet on) and `on_client_disconnected` when the caller hangs up.

Text mode, with no real-time pacing: each caller line reaches the agent as a finalized
`TranscriptionFrame` (optionally through the ASR-noise model), followed by the appended user
message and an LLM run exactly as Pipecat's eval harness does for a text turn. The caller hears
whatever text would reach the agent's TTS (its STT and TTS are bypassed, see `botloader`),
collected at its output transport in order and once: LLM text, aggregated text (an
`LLMTextProcessor`'s sentences), TTS text and `TTSSpeakFrame`s, less text marked `skip_tts`;
once its turn is complete (no function call in flight) it reaches the caller as a transcription.
"""

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from loguru import logger
from pipecat.frames.frames import (
    AggregatedTextFrame,
    CancelFrame,
    EndFrame,
    Frame,
    FunctionCallCancelFrame,
    FunctionCallResultFrame,
    FunctionCallsStartedFrame,
    InputTransportMessageFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMMessagesAppendFrame,
    LLMMessagesUpdateFrame,
    LLMTextFrame,
    StartFrame,
    TranscriptionFrame,
    TTSSpeakFrame,
    TTSTextFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.transports.base_input import BaseInputTransport
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import BaseTransport, TransportParams
from pipecat.utils.time import time_now_iso8601

from pipecat_rl import compat
from pipecat_rl.recording.spoken import SpokenPart, join_spoken, spoken_part

Speaker = Literal["caller", "agent"]
EndReason = Literal[
    "caller_hung_up", "agent_hung_up", "max_turns", "silence", "max_duration", "error"
]

CLIENT_ID = "simulated-caller"
"""What the agent's `on_client_connected` handler receives as its client."""


@dataclass
class Line:
    """One turn of the conversation, as said and as heard."""

    speaker: Speaker
    text: str
    heard: str
    at: float
    latency_ms: float | None = None
    """For an agent line: from the caller's last line reaching it to its first text."""
    answers: int | None = None
    """For an agent line: how many caller lines the agent had been given when it began it."""


@dataclass
class _Side:
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


class LocalTransportPair:
    """The two ends of one simulated call, and its transcript.

    Use `agent` as the transport handed to the user's bot, `caller` in the persona bot.
    `done` is set when the call ends, with `end_reason` saying why.
    """

    def __init__(
        self,
        *,
        max_turns: int = 20,
        noise: Callable[[str], str] | None = None,
        send_client_ready: bool = True,
    ):
        self.max_turns = max_turns
        self.noise = noise
        self.send_client_ready = send_client_ready
        self.transcript: list[Line] = []
        self.done = asyncio.Event()
        self.end_reason: EndReason | None = None
        self.caller_connected = asyncio.Event()
        self.last_activity = time.monotonic()
        self._to_agent = _Side()
        self._to_caller = _Side()
        self._caller_sent_at: float | None = None
        self._hang_up_requested = False
        self.caller_opening: str | None = None
        """A line the caller says as soon as it connects, before any greeting."""
        self.agent_context: list[dict[str, Any]] | None = None
        """Messages that replace the agent's context when the caller connects (`context:`)."""
        self._given_at: list[float] = []
        self.caller_responding = False
        """Whether the caller's LLM is answering (set when it is asked, cleared by its turn)."""
        self.on_line: Callable[[Line], None] | None = None
        """Called with each line as it is said (`simulate -v` prints it); never raises into us."""
        self.agent = AgentTransport(self)
        self.caller = CallerTransport(self)

    @property
    def caller_turns(self) -> int:
        """How many lines the caller has said."""
        return sum(1 for line in self.transcript if line.speaker == "caller")

    def add_line(self, line: Line) -> None:
        """Add `line` to the transcript and tell `on_line`, which never breaks the call."""
        self.transcript.append(line)
        if self.on_line is not None:
            try:
                self.on_line(line)
            except Exception:  # a listener's bug is not the call's failure
                logger.exception("a transcript listener failed")

    def active(self) -> None:
        """Either side is producing a turn (text, a tool call): the line is not silent.

        In text mode a turn reaches the other side only whole, so without this a reply that
        takes `max_silence_s` to generate (a long one, on a loaded CPU) would end the call as
        silence: the machine's speed judged as the agent's behaviour.
        """
        self.last_activity = time.monotonic()

    def end(self, reason: EndReason) -> None:
        """End the call (the first reason given wins) and tell both sides."""
        if self.done.is_set():
            return
        self.end_reason = reason
        self.done.set()
        self._to_agent.queue.put_nowait(None)
        self._to_caller.queue.put_nowait(None)

    def caller_says(self, text: str) -> None:
        """A caller line, to the agent (through the noise model, if any)."""
        if self.done.is_set() or not text.strip():
            return
        heard = self.noise(text) if self.noise else text
        now = time.monotonic()
        self.add_line(Line("caller", text, heard, time.time()))
        self.last_activity = self._caller_sent_at = now
        self._to_agent.queue.put_nowait(heard)

    def request_hang_up(self) -> None:
        """The caller wants to hang up: now, or once its current turn has been said."""
        self._hang_up_requested = True
        if not self.caller_responding and not self.caller.output().responding:
            self.end("caller_hung_up")

    def caller_turn(self, text: str, first_text_at: float | None) -> None:
        """A complete caller turn (maybe empty): say it, then hang up if the caller asked to."""
        del first_text_at
        self.caller_responding = False
        self.caller_says(text)
        if self._hang_up_requested:
            self.end("caller_hung_up")

    def given_to_agent(self) -> None:
        """A caller line has just been handed to the agent's pipeline."""
        self._given_at.append(time.monotonic())

    def agent_says(self, text: str, first_text_at: float | None) -> None:
        """A complete agent turn, to the caller; ends the call once the caller is out of turns."""
        if self.done.is_set() or not text:
            return
        latency = None
        if first_text_at is not None and self._caller_sent_at is not None:
            latency = max(0.0, (first_text_at - self._caller_sent_at) * 1000.0)
        began = first_text_at if first_text_at is not None else time.monotonic()
        answers = sum(1 for at in self._given_at if at <= began)
        self.add_line(Line("agent", text, text, time.time(), latency, answers))
        self.last_activity = time.monotonic()
        if self.caller_turns >= self.max_turns:
            self.end("max_turns")
            return
        self._to_caller.queue.put_nowait(text)


def _params() -> TransportParams:
    return TransportParams(audio_in_enabled=False, audio_out_enabled=False)


class _PairInput(BaseInputTransport):
    """Reads lines from one side of the pair and pushes them into the pipeline."""

    def __init__(self, pair: LocalTransportPair, side: _Side, **kwargs):
        super().__init__(_params(), **kwargs)
        self._pair = pair
        self._side = side
        self._reader: asyncio.Task | None = None

    async def start(self, frame: StartFrame):
        """Start reading once the pipeline has started."""
        await super().start(frame)
        await self.set_transport_ready(frame)
        if self._reader is None:
            self._reader = self.create_task(self._read(), name=f"{self}::read")

    async def _stop_reader(self):
        if self._reader is not None:
            await self.cancel_task(self._reader)
            self._reader = None

    async def stop(self, frame: EndFrame):
        """Stop reading."""
        await super().stop(frame)
        await self._stop_reader()

    async def cancel(self, frame: CancelFrame):
        """Stop reading at once."""
        await super().cancel(frame)
        await self._stop_reader()

    async def _read(self):
        raise NotImplementedError

    async def _push_transcription(self, text: str, user_id: str):
        stamp = time_now_iso8601()
        await self.push_frame(
            TranscriptionFrame(text=text, user_id=user_id, timestamp=stamp, finalized=True)
        )


class _PairOutput(BaseOutputTransport):
    """Collects the LLM text of one turn and hands the complete turn to `deliver`.

    With `join_tool_turns`, a response that started function calls is held and joined with the
    response after their results, so the other side hears the whole turn, not "let me check".
    """

    def __init__(
        self,
        deliver: Callable[[str, float | None], None],
        *,
        join_tool_turns: bool = True,
        active: Callable[[], None] | None = None,
        **kwargs,
    ):
        """`active`: called on each frame of a turn in progress (`LocalTransportPair.active`)."""
        super().__init__(_params(), **kwargs)
        self._deliver = deliver
        self._join_tool_turns = join_tool_turns
        self._active = active
        self._parts: list[SpokenPart] = []
        self._first_text_at: float | None = None
        self._calls_in_flight = 0
        self._segments: set[int] = set()
        self.responding = False
        """Whether an LLM response is between its start and end frames here."""

    async def start(self, frame: StartFrame):
        """Ready at once: there is no device to open."""
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        """Note the turn's text and function calls, then behave like any output transport."""
        if direction == FrameDirection.DOWNSTREAM:
            self._observe(frame)
        await super().process_frame(frame, direction)

    def _observe(self, frame: Frame) -> None:
        if self._active is not None and isinstance(frame, _TURN_IN_PROGRESS):
            self._active()
        if isinstance(frame, LLMFullResponseStartFrame):
            # Not the first text: Pipecat's OpenAI service pushes this before its HTTP request,
            # so a gap stamped here would leave out the model's whole time to first token.
            self.responding = True
        elif isinstance(frame, TTSSpeakFrame):
            self._heard((frame.text, False))
            if not self.responding and not self._calls_in_flight:
                self._turn_done()  # spoken on its own (a greeting), not inside an LLM response
        elif isinstance(frame, (LLMTextFrame, AggregatedTextFrame)):
            if frame.skip_tts:
                return  # never spoken
            if isinstance(frame, TTSTextFrame) and frame.segment_id in self._segments:
                return  # a word of a segment already heard
            if isinstance(frame, AggregatedTextFrame):
                self._segments.add(frame.id)
            self._heard(spoken_part(frame))
        elif isinstance(frame, FunctionCallsStartedFrame) and self._join_tool_turns:
            # Pushed before the response's end frame (a call's in-progress frame comes after
            # it), so a reply that says a holding line and calls a tool is held and joined.
            self._calls_in_flight += len(frame.function_calls)
        elif isinstance(frame, (FunctionCallResultFrame, FunctionCallCancelFrame)):
            self._calls_in_flight = max(0, self._calls_in_flight - 1)
        elif isinstance(frame, LLMFullResponseEndFrame):
            self.responding = False
            if not self._calls_in_flight:
                self._turn_done()
            elif self._parts:  # a holding line, then the reply after the tool round: two sentences
                self._parts.append((" ", False))

    def _heard(self, part: SpokenPart) -> None:
        """Text the other side hears, joined at the turn's end by the recorder's rule."""
        if part[0].strip():
            self._first_text_at = self._first_text_at or time.monotonic()
        self._parts.append(part)

    def _turn_done(self) -> None:
        text, first = join_spoken(self._parts).strip(), self._first_text_at
        self._parts, self._first_text_at, self._segments = [], None, set()
        self._deliver(text, first)


_TURN_IN_PROGRESS = (
    LLMFullResponseStartFrame,
    LLMTextFrame,
    AggregatedTextFrame,
    TTSSpeakFrame,
    FunctionCallsStartedFrame,
    FunctionCallResultFrame,
    FunctionCallCancelFrame,
    LLMFullResponseEndFrame,
)
"""Frames that show a side producing its turn: the line is not silent while they flow."""


class AgentInput(_PairInput):
    """The agent bot's input: the caller connecting, speaking (as transcriptions), hanging up."""

    def __init__(self, transport: "AgentTransport", pair: LocalTransportPair, **kwargs):
        super().__init__(pair, pair._to_agent, **kwargs)
        self._transport = transport

    async def _read(self):
        await self._pair.caller_connected.wait()
        await compat.call_event(self._transport, "on_client_connected", CLIENT_ID)
        if self._pair.send_client_ready:
            await self.push_frame(InputTransportMessageFrame(message=client_ready()))
        if self._pair.agent_context is not None:
            await self.push_frame(LLMMessagesUpdateFrame(list(self._pair.agent_context)))
        while True:
            text = await self._side.queue.get()
            if text is None:
                await compat.call_event(self._transport, "on_client_disconnected", CLIENT_ID)
                return
            # As Pipecat's send-text does: let the agent's last reply land in its context
            # before the new user message is appended.
            await self.pipeline_worker.flush_pipeline()
            self._pair.given_to_agent()
            await self._push_transcription(text, CLIENT_ID)
            await self.push_frame(
                LLMMessagesAppendFrame(messages=[{"role": "user", "content": text}], run_llm=True)
            )


def client_ready() -> dict[str, Any]:
    """The RTVI `client-ready` message a Pipecat client sends once it is on the call."""
    return {
        "label": "rtvi-ai",
        "type": "client-ready",
        "id": uuid.uuid4().hex[:8],
        "data": {"version": "1.0.0", "about": {"library": "pipecat-rl simulator"}},
    }


class AgentOutput(_PairOutput):
    """The agent bot's output: complete agent turns go to the caller; its EndFrame hangs up."""

    def __init__(self, pair: LocalTransportPair, **kwargs):
        super().__init__(pair.agent_says, active=pair.active, **kwargs)
        self._pair = pair

    async def stop(self, frame: EndFrame):
        """The agent ended the call."""
        await super().stop(frame)
        self._pair.end("agent_hung_up")


class AgentTransport(BaseTransport):
    """The transport handed to the user's bot.

    Event handlers:
        on_client_connected(transport, client): the simulated caller is on the line.
        on_client_disconnected(transport, client): the caller hung up (or the call ended).
    """

    def __init__(
        self,
        pair: LocalTransportPair,
        *,
        input_name: str | None = None,
        output_name: str | None = None,
        **kwargs,
    ):
        super().__init__(input_name=input_name, output_name=output_name, **kwargs)
        self.pair = pair
        self._input = AgentInput(self, pair, name=input_name)
        self._output = AgentOutput(pair, name=output_name)
        compat.register_event(self, "on_client_connected")
        compat.register_event(self, "on_client_disconnected")

    def input(self) -> AgentInput:
        """The agent's input processor."""
        return self._input

    def output(self) -> AgentOutput:
        """The agent's output processor."""
        return self._output

    def get_client_id(self, client: Any) -> str:
        """The simulated caller's id."""
        return str(client)


class CallerInput(_PairInput):
    """The persona bot's input: what the agent says, as transcriptions."""

    def __init__(self, pair: LocalTransportPair, **kwargs):
        super().__init__(pair, pair._to_caller, **kwargs)

    async def start(self, frame: StartFrame):
        """Connect to the agent once the persona pipeline runs; say the opening line, if any."""
        await super().start(frame)
        self._pair.caller_connected.set()
        if self._pair.caller_opening:
            self._pair.caller_says(self._pair.caller_opening)

    async def _read(self):
        while True:
            text = await self._side.queue.get()
            if text is None:
                return
            await self._push_transcription(text, "agent")


class CallerTransport(BaseTransport):
    """The persona caller bot's transport."""

    def __init__(
        self,
        pair: LocalTransportPair,
        *,
        input_name: str | None = None,
        output_name: str | None = None,
        **kwargs,
    ):
        super().__init__(input_name=input_name, output_name=output_name, **kwargs)
        self.pair = pair
        self._input = CallerInput(pair, name=input_name)
        self._output = _PairOutput(
            pair.caller_turn, join_tool_turns=False, active=pair.active, name=output_name
        )

    def input(self) -> CallerInput:
        """The caller's input processor."""
        return self._input

    def output(self) -> _PairOutput:
        """The caller's output processor."""
        return self._output
