"""The recorder: every LLM turn token-exactly and every user turn's stage latencies, per call.

`RecorderObserver` watches the worker's frames (each frame once: `observe_every_push=False`) for
what happened around the LLM: transcripts, first audio, bot speech, interruptions, tool calls.
The LLM calls themselves come from the tee on the bot's OpenAI-compatible service (`llm_tee`).
It never does I/O itself: records go to the ledger file's one `LedgerWriter` thread, and any
error is logged and counted, never raised into the call; both counts end up in the session's
metadata (`recorder: {errors, dropped_writes}`).

Turn k is the k-th LLM call of the session. Its text spoken is what TTS said between that call's
`LLMFullResponseStartFrame` and the next one; an `InterruptionFrame` while it is still speaking
marks it interrupted. A user turn (a latency row) opens with the user's speech ending or a final
transcript and closes when the next one opens or the call ends.

OpenAI Responses-API services (Pipecat Flows' default) are recorded too: the HTTP one
(`OpenAIResponsesHttpLLMService`) through its own tee (`responses_tee`), which gets prompt and
sampled ids from vLLM's final Responses event and their logprobs from one re-score of those ids
on the same server's `/v1/completions` after the stream closed (vLLM's Responses stream has no
logprobs for the stop token or tool-call tokens), and records the request as the Chat-Completions
messages and tools vLLM rendered. A turn is written once its re-score is done, and the session's
end waits for them. The WebSocket one cannot be teed (vLLM serves HTTP); its replies are recorded
as text-only demonstrations when the call ends, with a warning naming the HTTP class.
"""

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    CancelFrame,
    ClientConnectedFrame,
    FunctionCallCancelFrame,
    FunctionCallInProgressFrame,
    FunctionCallResultFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMMarkerFrame,
    LLMTextFrame,
    MetricsFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
    UserStoppedSpeakingFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.observers.user_bot_latency_observer import UserBotLatencyObserver
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.base_llm import BaseOpenAILLMService
from pipecat.services.openai.responses.llm import (
    OpenAIResponsesHttpLLMService,
    OpenAIResponsesLLMService,
)
from pipecat.services.stt_service import STTService
from pipecat.services.tts_service import TTSService

from pipecat_rl import compat
from pipecat_rl.ledger import LatencyRecord, Ledger, ToolCallRecord, TurnRecord, resolve_ledger_path
from pipecat_rl.recording.demonstration import (
    DemonstrationSource,
    collect_demonstrations,
    demonstration_sources,
)
from pipecat_rl.recording.llm_tee import LLMCall, serves_token_ids, tee_llm_service
from pipecat_rl.recording.redaction import Redactor, recording_redactor
from pipecat_rl.recording.responses_tee import ResponsesDemonstration, tee_responses_service
from pipecat_rl.recording.session import SessionInfo, current_recording, new_call_id
from pipecat_rl.recording.spoken import SpokenPart, join_spoken, spoken_part
from pipecat_rl.recording.writer import LedgerWriter, acquire_writer


@dataclass
class _Turn:
    """One LLM call while the call is in progress."""

    call: LLMCall | None = None
    spoken: list[SpokenPart] = field(default_factory=list)
    heard_tts: bool = False
    speaking: bool = True
    interrupted: bool = False
    written: bool = False


@dataclass
class _UserTurn:
    """Timestamps of one user turn, filled as its frames pass."""

    index: int
    stamps: dict[str, float] = field(default_factory=dict)
    stt_ms: float | None = None
    v2v_ms: float | None = None
    interrupted: bool = False

    def mark(self, key: str, at: float, *, once: bool = True) -> None:
        if not once or key not in self.stamps:
            self.stamps[key] = at


class RecorderObserver(BaseObserver):
    """Records one call (one PipelineWorker) into the ledger.

    Event handlers:
        on_turn_recorded(recorder, turn): after each LLM turn (a `TurnRecord`) is handed to the
            ledger writer.
    """

    def __init__(
        self,
        *,
        ledger: Ledger | str | Path,
        session: SessionInfo,
        session_id: str,
        redactor: Redactor | None = None,
        token_ids: bool | None = None,
    ):
        super().__init__(observe_every_push=False)
        self.session = session
        self.session_id = session_id
        self.redactor = redactor
        self.token_ids = token_ids
        self.errors = 0
        """Frames or calls the recorder failed to handle (the call itself went on)."""
        self._writer: LedgerWriter = acquire_writer(ledger)
        self._llms: list[BaseOpenAILLMService | OpenAIResponsesHttpLLMService] = []
        self._demos: list[Any] = []
        self._speaks = False
        """Whether the pipeline has a TTS: its turns end with their speech, not their text."""
        self._turns: list[_Turn] = []
        self._calls_seen = 0
        self._user_turn: _UserTurn | None = None
        self._user_turns = 0
        self._tools: dict[str, tuple[str, Any, float, int | None]] = {}
        self._clock_offset: float | None = None
        self._policy = session.policy
        self._ended = False
        self._opened = False
        """Whether the session's row was handed to the writer (attaching ran to its end)."""
        self._latency = UserBotLatencyObserver()
        self._latency.add_event_handler("on_latency_measured", self._on_latency_measured)
        self._events: set[asyncio.Task] = set()
        self._settling: dict[int, asyncio.Task] = {}
        compat.register_event(self, "on_turn_recorded")

    @property
    def dropped(self) -> int:
        """Writes of this session that failed even after the ledger's retries."""
        return self._writer.dropped(self.session_id)

    def _submit(self, op: Any, what: str) -> None:
        self._writer.submit(op, what, session_id=self.session_id)

    # -- wiring ------------------------------------------------------------------------------

    async def attach(self, worker: Any) -> None:
        """Tee the worker's OpenAI-compatible LLM services and open the session row."""
        for llm in _processors(worker.pipeline, _TEED):
            token_ids = (
                self.token_ids if self.token_ids is not None else await serves_token_ids(llm)
            )
            tee = (
                tee_responses_service
                if isinstance(llm, OpenAIResponsesHttpLLMService)
                else tee_llm_service
            )
            tee(llm, self._on_llm_call, token_ids=token_ids)
            self._llms.append(llm)
        # A scripted / non-OpenAI LLM's replies are recorded as demonstrations when the call ends.
        self._demos = [] if self._llms else _demonstrations(worker.pipeline)
        how = "as text only" if self._demos else "not at all (another LLM service is teed)"
        for llm in _processors(worker.pipeline, OpenAIResponsesLLMService):
            logger.warning(
                f"pipecat-rl: {llm} streams over a WebSocket, which the recorder cannot tee: its "
                f"turns are recorded {how}, with no token ids, so they cannot train. Use "
                "OpenAIResponsesHttpLLMService against vLLM to record them token-exactly"
            )
        if not self._llms and not self._demos:
            logger.warning(
                "pipecat-rl: no OpenAI-compatible LLM service in this pipeline; recording "
                "latency and tool calls only"
            )
        # A TTS says a reply's text after the LLM's end (a sentence or a word once played):
        # closing the turn at that end would lose what it said.
        self._speaks = bool(_processors(worker.pipeline, TTSService))
        # The end of the call is when the pipeline finishes, not when an EndFrame is first pushed
        # (which is before the processors have worked through what was queued ahead of it).
        worker.add_event_handler("on_pipeline_finished", self._on_pipeline_finished)
        record = self.session.record(self.session_id)
        self._submit(lambda ledger: ledger.add_session(record), f"session {self.session_id}")
        self._opened = True

    async def flush(self) -> None:
        """Wait until everything this recorder has seen is in the ledger.

        A turn whose re-score still runs (a Responses call's logprobs, bounded by its own
        timeout) is written once it settles, so it is awaited first: whoever flushes and then
        closes the bot's LLM client (the simulator, after a call) must not cut it off.
        """
        await self._rescored()
        await self._writer.flush()

    async def _rescored(self) -> None:
        """Until every turn that waited on its re-score is written (each re-score is bounded)."""
        if self._settling:
            await asyncio.wait(self._settling.values())

    # -- frames ------------------------------------------------------------------------------

    async def on_push_frame(self, data: FramePushed) -> None:
        """Route one frame to the state it updates; never raises."""
        if not isinstance(data.frame, _WATCHED):
            return
        try:
            # Pipecat's own latency observer rides on this observer's queue rather than its own.
            await self._latency.on_push_frame(data)
            self._on_frame(data)
        except Exception as e:
            self.errors += 1
            logger.error(f"pipecat-rl: recorder failed on {data.frame}: {e}")

    async def on_pipeline_started(self) -> None:
        """Forwarded to Pipecat's latency observer (it times a greeting from here)."""
        await self._latency.on_pipeline_started()

    def _now(self, data: FramePushed) -> float:
        # The pipeline clock stamps every push; one offset turns it into wall time, so queueing
        # delay between the push and this observer does not leak into the durations.
        if self._clock_offset is None:
            self._clock_offset = time.time() - data.timestamp / 1e9
        return self._clock_offset + data.timestamp / 1e9

    def _on_frame(self, data: FramePushed) -> None:
        frame = data.frame
        if data.direction != FrameDirection.DOWNSTREAM:
            return
        at = self._now(data)
        if isinstance(frame, VADUserStoppedSpeakingFrame):
            self._open_user_turn().mark("user_stopped_at", at - frame.stop_secs, once=False)
        elif isinstance(frame, UserStoppedSpeakingFrame):
            self._open_user_turn()
        elif isinstance(frame, TranscriptionFrame):
            self._open_user_turn().mark("stt_final_at", at, once=False)
        elif isinstance(frame, LLMFullResponseStartFrame) and data.source in self._llms:
            self._start_turn(at)
        elif isinstance(frame, LLMTextFrame) and data.source in self._llms:
            if self._user_turn:
                self._user_turn.mark("llm_first_token_at", at)
        elif isinstance(frame, LLMFullResponseEndFrame) and data.source in self._llms:
            if self._turns and not self._turns[-1].heard_tts and not self._speaks:
                self._close_turn(len(self._turns) - 1)  # nothing spoken: the text was the turn
        elif isinstance(frame, TTSAudioRawFrame):
            if self._user_turn and "llm_request_at" in self._user_turn.stamps:
                self._user_turn.mark("tts_first_audio_at", at)
        elif isinstance(frame, TTSTextFrame):
            if self._turns:
                self._turns[-1].spoken.append(spoken_part(frame))
                self._turns[-1].heard_tts = True
        elif isinstance(frame, BotStartedSpeakingFrame):
            if self._user_turn and "llm_request_at" in self._user_turn.stamps:
                self._user_turn.mark("bot_started_at", at)
        elif isinstance(frame, BotStoppedSpeakingFrame):
            if self._user_turn and "bot_started_at" in self._user_turn.stamps:
                self._user_turn.mark("bot_stopped_at", at)
            if self._turns:
                self._close_turn(len(self._turns) - 1)
        elif isinstance(frame, InterruptionFrame):
            self._interrupt()
        elif isinstance(frame, MetricsFrame):
            self._metrics(frame, data.source)
        elif isinstance(frame, FunctionCallInProgressFrame):
            turn_index = len(self._turns) - 1 if self._turns else None
            self._tools[frame.tool_call_id] = (frame.function_name, frame.arguments, at, turn_index)
        elif isinstance(frame, FunctionCallResultFrame):
            self._tool_done(frame.tool_call_id, frame.result, frame.error, at)
        elif isinstance(frame, FunctionCallCancelFrame):
            self._tool_done(frame.tool_call_id, None, "cancelled", at)

    def _metrics(self, frame: MetricsFrame, source: Any) -> None:
        if not self._user_turn or not isinstance(source, STTService):
            return
        for item in frame.data:
            if isinstance(item, TTFBMetricsData) and item.value > 0:
                self._user_turn.stt_ms = item.value * 1000

    async def _on_latency_measured(self, _observer: Any, latency: float) -> None:
        # Pipecat's own voice-to-voice figure (VAD stop minus stop_secs to bot speech).
        if self._user_turn is not None:
            self._user_turn.v2v_ms = latency * 1000

    # -- user turns ----------------------------------------------------------------------------

    def _open_user_turn(self) -> _UserTurn:
        current = self._user_turn
        if current is not None and "llm_request_at" not in current.stamps:
            return current  # still the same user turn: the LLM has not been asked yet
        if current is not None:
            self._write_latency(current)
        self._user_turn = _UserTurn(self._user_turns)
        self._user_turns += 1
        return self._user_turn

    def _write_latency(self, turn: _UserTurn) -> None:
        record = LatencyRecord.from_timestamps(
            self.session_id,
            turn.index,
            **turn.stamps,
            stt_ms=turn.stt_ms,
            v2v_ms=turn.v2v_ms,
            interrupted=turn.interrupted,
        )
        self._submit(lambda ledger: ledger.put_latency(record), f"latency {turn.index}")

    def _interrupt(self) -> None:
        if self._turns and self._turns[-1].speaking:
            self._turns[-1].interrupted = True
            if self._user_turn is not None:
                self._user_turn.interrupted = True
            self._close_turn(len(self._turns) - 1)

    # -- LLM turns -----------------------------------------------------------------------------

    def _start_turn(self, at: float) -> None:
        if self._turns:
            self._close_turn(len(self._turns) - 1)
        self._turns.append(_Turn())
        if self._user_turn is not None:
            self._user_turn.mark("llm_request_at", at)

    def _on_llm_call(self, call: LLMCall) -> None:
        """Called by the tee when a stream ends (on the LLM service's task)."""
        try:
            index = self._calls_seen
            self._calls_seen += 1
            while len(self._turns) <= index:
                self._turns.append(_Turn())
            self._turns[index].call = call
            if self._policy is None and call.request.get("model"):
                self._policy = str(call.request["model"])
            self._write_turn(index)  # written only once its speech is over too
        except Exception as e:
            self.errors += 1
            logger.error(f"pipecat-rl: recorder failed on an LLM call: {e}")

    def _close_turn(self, index: int) -> None:
        """The turn's speech is over (finished, interrupted, or followed by another turn)."""
        turn = self._turns[index]
        if turn.speaking:
            turn.speaking = False
            self._write_turn(index)

    def _write_turn(self, index: int) -> None:
        """Write a turn once its stream, its re-score (if any) and its speech are over: once."""
        turn = self._turns[index]
        if turn.call is None or turn.speaking or turn.written:
            return
        settling = turn.call.settling
        if settling is not None and not settling.done():
            if index not in self._settling:
                self._settling[index] = asyncio.get_running_loop().create_task(
                    self._write_when_settled(index, settling)
                )
            return
        turn.written = True
        record = self._turn_record(index, turn)
        self._submit(lambda ledger: ledger.add_turn(record), f"turn {index}")
        self._fire_turn_recorded(record)

    async def _write_when_settled(self, index: int, settling: asyncio.Task) -> None:
        await asyncio.wait([settling])  # the re-score never raises; a failed one is text only
        try:
            self._write_turn(index)
        except Exception as e:
            self.errors += 1
            logger.error(f"pipecat-rl: recorder failed on an LLM call: {e}")

    def _fire_turn_recorded(self, record: TurnRecord) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a test driving the recorder by hand): nobody can be listening
        task = loop.create_task(compat.call_event(self, "on_turn_recorded", record))
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    def _turn_record(self, index: int, turn: _Turn) -> TurnRecord:
        call = turn.call
        assert call is not None
        exact = call.token_exact
        request, text = call.request, call.text
        spoken = join_spoken(turn.spoken) if turn.heard_tts else None
        tools = [
            {"id": c["id"], "name": c["name"], "arguments": c["arguments"]}
            for _, c in sorted(call.tool_calls.items())
        ]
        ids = (call.prompt_token_ids, call.token_ids, call.logprobs) if exact else (None,) * 3
        if self.redactor is not None:
            request, text = self.redactor.value(request), self.redactor.text(text)
            spoken = self.redactor.text(spoken) if spoken is not None else None
            tools = self.redactor.value(tools)
            if not self.session.consent:
                # Token ids spell the same PII the text did: without consent they are not kept.
                ids, exact = (None,) * 3, False
        stamps = {"llm_request": call.started_at}
        if call.first_token_at is not None:
            stamps["llm_first_token"] = call.first_token_at
        if call.done_at is not None:
            stamps["llm_done"] = call.done_at
        return TurnRecord(
            session_id=self.session_id,
            index=index,
            adapter=request.get("model"),
            created_at=call.started_at,
            request=request,
            prompt_token_ids=ids[0],
            completion_token_ids=ids[1],
            logprobs=ids[2],
            token_exact=exact,
            generated_text=text,
            spoken_text=spoken,
            interrupted=turn.interrupted,
            finish_reason=call.finish_reason or ("error" if call.error else None),
            usage=call.usage,
            tool_calls=tools,
            timestamps=stamps,
            redacted=self.redactor is not None,
        )

    # -- tools and the end of the call ---------------------------------------------------------

    def _tool_done(self, call_id: str, result: Any, error: str | None, at: float) -> None:
        started = self._tools.pop(call_id, None)
        if started is None:
            return
        name, arguments, started_at, turn_index = started
        if self.redactor is not None:
            arguments, result = self.redactor.value(arguments), self.redactor.value(result)
        record = ToolCallRecord(
            session_id=self.session_id,
            turn_index=turn_index,
            call_id=call_id,
            name=name,
            arguments=arguments if isinstance(arguments, dict) else {"value": arguments},
            result=result,
            error=error,
            started_at=started_at,
            duration_ms=(at - started_at) * 1000,
        )
        self._submit(lambda ledger: ledger.add_tool_call(record), f"tool call {name}")

    async def _on_pipeline_finished(self, _worker: Any, frame: Any) -> None:
        try:
            for demo in await collect_demonstrations(self._demos, self.session_id, self.redactor):
                self._writer.submit(lambda ledger, t=demo: ledger.add_turn(t), "demonstration")
            for index in range(len(self._turns)):
                self._close_turn(index)  # a stream still open is written when it closes
            await self._rescored()  # every turn is in the ledger before the session's end row
            self._end(cancelled=isinstance(frame, CancelFrame))
        except Exception as e:
            self.errors += 1
            logger.error(f"pipecat-rl: recorder failed to close the session: {e}")

    async def cleanup(self) -> None:
        """The worker is done: a session whose pipeline never started still ends (cancelled).

        Pipecat fires no `on_pipeline_finished` for a worker cancelled before its `StartFrame`
        reached the end (a caller gone while the bot set up, the simulator's pre-flight); without
        this its session would stay open and its ledger writer would never stop.
        """
        await super().cleanup()
        self._end(cancelled=True)

    def _end(self, *, cancelled: bool) -> None:
        if self._ended:
            return
        self._ended = True
        if not self._opened:  # given up while attaching: no session row to end
            self._writer.release()
            return
        if self._user_turn is not None:
            self._write_latency(self._user_turn)
        session_id, policy, ended_at = self.session_id, self._policy, time.time()
        outcome = "cancelled" if cancelled else "completed"
        writer = self._writer

        def end(ledger: Ledger) -> None:
            # counted when this runs, so every write queued before it is in the count
            counts = {"errors": self.errors, "dropped_writes": writer.dropped(session_id)}
            ledger.end_session(
                session_id, ended_at=ended_at, outcome=outcome,
                metadata_update={"recorder": counts}, policy=policy,
            )  # fmt: skip

        self._submit(end, f"end of session {session_id}")
        writer.release()


_WATCHED = (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    ClientConnectedFrame,
    FunctionCallCancelFrame,
    FunctionCallInProgressFrame,
    FunctionCallResultFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMMarkerFrame,
    LLMTextFrame,
    MetricsFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
    UserStoppedSpeakingFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
"""What this recorder or Pipecat's latency observer looks at; everything else returns at once."""


_TEED = (BaseOpenAILLMService, OpenAIResponsesHttpLLMService)
"""The LLM services the recorder tees. Neither Responses class derives from the other, so the
WebSocket `OpenAIResponsesLLMService` is not among them: it cannot be teed (see `attach`)."""


def _demonstrations(pipeline: FrameProcessor) -> list[DemonstrationSource]:
    """The pipeline's demonstration sources, a Responses service's read through its own adapter."""
    return [
        ResponsesDemonstration(d.llm, d.aggregator)
        if isinstance(d.llm, OpenAIResponsesLLMService)
        else d
        for d in demonstration_sources(_processors(pipeline, FrameProcessor))
    ]


def _processors(root: FrameProcessor, kind: type | tuple[type, ...]) -> list[Any]:
    found, stack = [], [root]
    while stack:
        processor = stack.pop()
        if isinstance(processor, kind):
            found.append(processor)
        stack.extend(compat.child_processors(processor))
    return found


async def install(
    worker: Any,
    *,
    ledger: Ledger | str | Path | None = None,
    session: SessionInfo | None = None,
    redactor: Redactor | None = None,
    redact: bool = True,
    token_ids: bool | None = None,
) -> RecorderObserver:
    """Attach a recorder to `worker` (once); a `record_session()` context supplies defaults.

    A live call is redacted unless `redact` is False (`recording_redactor`): the eligibility
    query trains only redacted live calls, so an unredacted default would record calls that can
    never train. A simulated or gate session is redacted only by an explicit `redactor`.
    """
    existing = getattr(worker, "_pipecat_rl_recorder", None)
    if existing is not None:
        if ledger is not None or session is not None:
            logger.warning(
                f"pipecat-rl: {worker} is already recorded as {existing.session_id} (by the "
                "setup file?); the RLRecorder's own ledger and labels are not used"
            )
        return existing
    handle = current_recording()
    if handle is not None:
        ledger, session = ledger or handle.ledger, session or handle.session
        session_id = handle.session_id
    else:
        session = session or SessionInfo()
        session_id = session.call_id or new_call_id()
    if not isinstance(ledger, Ledger):
        ledger = resolve_ledger_path(ledger)  # the file's one writer opens it (once per process)
    recorder = RecorderObserver(
        ledger=ledger,
        session=session,
        session_id=session_id,
        redactor=recording_redactor(session.source, redactor=redactor, redact=redact),
        token_ids=token_ids,
    )
    worker._pipecat_rl_recorder = recorder
    worker.add_observer(recorder)
    await recorder.attach(worker)
    if handle is not None:
        handle.recorders.append(recorder)
    return recorder


class RLRecorder(FrameProcessor):
    """The one line a bot adds to its pipeline to record every call into the ledger.

    Put it anywhere in the pipeline list, e.g. right after `transport.input()`. It sees only the
    frames passing its place, so at setup it installs a `RecorderObserver` on its worker, which
    sees the rest, and tees the worker's OpenAI-compatible LLM service for token ids.

    A live call is redacted by default (`Redactor()`: phone numbers, emails, card numbers;
    `redactor=Redactor(names=[...])` adds names), since only redacted live calls train;
    `redact=False` records it as said, and it will never train.

    Raises:
        ValueError: `redact=False` together with a `redactor` (which one is meant?).
    """

    def __init__(
        self,
        ledger: Ledger | str | Path | None = None,
        *,
        call_id: str | None = None,
        source: str = "live",
        consent: bool = True,
        redactor: Redactor | None = None,
        redact: bool = True,
        token_ids: bool | None = None,
        session: SessionInfo | None = None,
        **kwargs: Any,
    ):
        if redactor is not None and not redact:
            raise ValueError(
                "RLRecorder: redact=False with a redactor; pass one or the other (redactor= to "
                "redact with it, redact=False to record unredacted calls, which never train)"
            )
        # Direct mode: frames pass straight through, with no queue and task hop of their own.
        super().__init__(enable_direct_mode=True, **kwargs)
        self._ledger = ledger
        self._session = session or SessionInfo(call_id=call_id, source=source, consent=consent)
        self._redactor = redactor
        self._redact = redact
        self._token_ids = token_ids
        self.recorder: RecorderObserver | None = None

    async def setup(self, setup: Any) -> None:
        """Install the recorder on the worker running this pipeline."""
        await super().setup(setup)
        try:
            self.recorder = await install(
                setup.pipeline_worker,
                ledger=self._ledger,
                session=self._session,
                redactor=self._redactor,
                redact=self._redact,
                token_ids=self._token_ids,
            )
        except Exception as e:  # a broken ledger must not stop the bot from taking the call
            logger.error(f"pipecat-rl: recorder not installed, this call is not recorded: {e}")

    async def process_frame(self, frame: Any, direction: FrameDirection) -> None:
        """Pass every frame on unchanged."""
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)

    async def flush(self) -> None:
        """Wait until this call is in the ledger, its end included once the worker has run.

        Writes happen off the call's path, so a bot that reads the ledger right after its call
        (to post a score, to hand the call to QA) awaits this first. No-op if never installed.
        """
        if self.recorder is not None:
            await self.recorder.flush()
