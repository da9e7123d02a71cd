"""Agents for the turn-taking tests: a long first reply, and a known way of taking interruptions.

Like `audio_bots`, each endpoints on the caller's frames themselves (energy, `STOP_S` of silence)
and says pre-rendered Piper lines, so nothing but the planted behaviour differs between them:

- `run_bot_yielding` stops talking (Pipecat's `broadcast_interruption`, what its user turn
  strategies do) once the caller has spoken `MIN_BARGE_IN_MS` over it, and ignores anything
  shorter said over it (a backchannel: no interruption, no reply);
- `run_bot_stubborn` never interrupts itself (as a bot that disables interruptions does): it
  talks through the caller and answers it after;
- `run_bot_jumpy` stops at the first voiced frame over it (a VAD-only interruption with no
  minimum), so a backchannel cuts it off.
"""

import asyncio

from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    Frame,
    InputAudioRawFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.utils.text.base_text_aggregator import AggregationType
from pipecat.workers.runner import WorkerRunner

from pipecat_rl.simulator.audio.transport import MAX_CATCH_UP_S, voiced
from tests.audio_bots import spoken_pcm

LONG = (
    "We are open from eight in the morning until six in the evening on weekdays, from nine "
    "until one on Saturdays, and we are closed on Sundays and on public holidays, when the "
    "dentist on call can be reached through the emergency line."
)
SHORT = "Sure, Saturday is nine to one."
MIN_BARGE_IN_MS = 500
EARLIEST_YIELD_MS = MIN_BARGE_IN_MS - 1000 * MAX_CATCH_UP_S
"""The shortest time to yield the caller can measure for a bot that yields after hearing
`MIN_BARGE_IN_MS` of it: the caller's mouth never sends a frame before it is due, but a late
tick sends the frames it owes at once, up to `MAX_CATCH_UP_S`, so on a busy machine the bot may
have its 500 ms of audio 100 ms sooner by the caller's clock (433 ms was measured beside vLLM)."""
STOP_S = 0.6
"""The end of the caller's speech: longer than the pause at a comma, so no reply starts in it."""


class InterruptibleAgent(FrameProcessor):
    """Answers each end of the caller's speech: the first time with `LONG`, then `SHORT`."""

    def __init__(self, min_barge_in_ms: float | None, **kwargs):
        """`min_barge_in_ms`: caller speech over the agent that stops it (None: nothing does)."""
        super().__init__(**kwargs)
        self._min_ms = min_barge_in_ms
        self._replies = 0
        self._bot_speaking = False
        self._talking_over = False
        self._speaking = False
        self._voiced_ms = 0.0
        self._silent = 0
        self._reply: asyncio.Task | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        """Endpoint the caller; interrupt as configured; reply at each end of its speech."""
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, (BotStartedSpeakingFrame, BotStoppedSpeakingFrame)):
            self._bot_speaking = isinstance(frame, BotStartedSpeakingFrame)
        if not isinstance(frame, InputAudioRawFrame):
            return
        if voiced(frame.audio):
            self._silent = 0
            if not self._speaking:
                self._speaking, self._voiced_ms = True, 0.0
                self._talking_over = self._bot_speaking
            self._voiced_ms += 20.0
            if self._talking_over and self._min_ms is not None and self._voiced_ms >= self._min_ms:
                self._talking_over = False  # it has the turn now
                await self.broadcast_interruption()
            return
        self._silent += 1
        if self._speaking and self._silent * 0.02 >= STOP_S:
            self._speaking = False
            if self._talking_over and self._min_ms is not None:
                return  # said over the agent and too short to stop it: a backchannel
            self._reply = self.create_task(self._answer())

    async def _answer(self) -> None:
        text = LONG if self._replies == 0 else SHORT
        self._replies += 1
        await self.push_frame(LLMFullResponseStartFrame())
        await self.push_frame(TTSStartedFrame())
        await self.push_frame(TTSTextFrame(text, aggregated_by=AggregationType.SENTENCE))
        pcm, step = spoken_pcm(text), 16000 * 2 // 50
        for i in range(0, len(pcm), step):
            await self.push_frame(TTSAudioRawFrame(pcm[i : i + step], 16000, 1))
        await self.push_frame(TTSStoppedFrame())
        await self.push_frame(LLMFullResponseEndFrame())


async def _run(transport, min_barge_in_ms: float | None) -> None:
    spoken_pcm(LONG), spoken_pcm(SHORT)
    agent = InterruptibleAgent(min_barge_in_ms)
    pipeline = Pipeline([transport.input(), agent, transport.output()])
    worker = PipelineWorker(pipeline, params=PipelineParams(audio_out_sample_rate=16000))

    @transport.event_handler("on_client_disconnected")
    async def disconnected(_transport, _client):
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


async def run_bot_yielding(transport, runner_args):
    """Yields to a caller who speaks `MIN_BARGE_IN_MS` over it; talks through a backchannel."""
    await _run(transport, MIN_BARGE_IN_MS)


async def run_bot_stubborn(transport, runner_args):
    """Never interrupted."""
    await _run(transport, None)


async def run_bot_jumpy(transport, runner_args):
    """Stopped by the first frame of caller speech over it."""
    await _run(transport, 20.0)
