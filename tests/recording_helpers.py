"""A small harness that drives a real Pipecat pipeline turn by turn, for the recorder tests."""

import asyncio
import time
from collections.abc import Sequence

from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    EndFrame,
    Frame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMMessagesAppendFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.workers.runner import WorkerRunner


def vllm_llm(url: str, *, model: str = "base", max_tokens: int = 16, **extra) -> OpenAILLMService:
    """The bot's LLM service as a Pipecat user writes it, pointed at our vLLM."""
    return OpenAILLMService(
        api_key="none",
        base_url=url,
        settings=OpenAILLMService.Settings(
            model=model, max_tokens=max_tokens, temperature=0.0, extra=extra
        ),
    )


class Watch(FrameProcessor):
    """Collects each response's text and signals when a response ends."""

    def __init__(self):
        super().__init__()
        self.responses: list[list[str]] = []
        self.spoken: list[str] = []
        self.first_text_at: list[float] = []
        self.ended = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMFullResponseStartFrame):
            self.responses.append([])
        elif isinstance(frame, LLMTextFrame) and self.responses:
            if not self.responses[-1]:
                self.first_text_at.append(time.perf_counter())
            self.responses[-1].append(frame.text)
        elif isinstance(frame, TTSTextFrame):
            self.spoken.append(frame.text)
        elif isinstance(frame, LLMFullResponseEndFrame):
            self.ended.set()
        await self.push_frame(frame, direction)


class DelayedSTT(FrameProcessor):
    """A stand-in STT: a known delay after the user stops, then the final transcript."""

    def __init__(self, delay_s: float, text: str):
        super().__init__()
        self.delay_s, self.text = delay_s, text

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        from pipecat.frames.frames import TranscriptionFrame

        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, VADUserStoppedSpeakingFrame):
            await asyncio.sleep(self.delay_s)
            await self.push_frame(TranscriptionFrame(self.text, "caller", "", finalized=True))
            await self.push_frame(
                LLMMessagesAppendFrame([{"role": "user", "content": self.text}], run_llm=True)
            )


class DelayedTTS(FrameProcessor):
    """A stand-in TTS: first audio a known delay after the first text, then a word per step."""

    def __init__(self, first_audio_s: float, per_word_s: float = 0.0):
        super().__init__()
        self.first_audio_s, self.per_word_s = first_audio_s, per_word_s
        self._speaking = False

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMTextFrame):
            if not self._speaking:
                self._speaking = True
                await asyncio.sleep(self.first_audio_s)
                await self.push_frame(TTSAudioRawFrame(b"\0\0" * 160, 16000, 1))
                await self.push_frame(BotStartedSpeakingFrame())
            else:
                await asyncio.sleep(self.per_word_s)
            spoken = TTSTextFrame(frame.text, text_type="word")
            spoken.includes_inter_frame_spaces = True  # LLM tokens, spaces and all
            await self.push_frame(spoken)
            return
        if isinstance(frame, LLMFullResponseEndFrame) and self._speaking:
            self._speaking = False
            await self.push_frame(BotStoppedSpeakingFrame())
        await self.push_frame(frame, direction)


class Edges(BaseObserver):
    """When each frame type was first pushed downstream, in seconds on the pipeline's clock.

    A stand-in stage's sleep wakes late on a loaded machine, so a test compares what the
    recorder measured with the edges as they were pushed, not with the delay it asked for.
    """

    def __init__(self, *kinds: type[Frame]):
        super().__init__(observe_every_push=False)
        self.kinds = kinds
        self.at: dict[type[Frame], float] = {}

    async def on_push_frame(self, data: FramePushed) -> None:
        if data.direction == FrameDirection.DOWNSTREAM:
            for kind in self.kinds:
                if isinstance(data.frame, kind):
                    self.at.setdefault(kind, data.timestamp / 1e9)

    def ms(self, start: type[Frame], end: type[Frame]) -> float:
        return (self.at[end] - self.at[start]) * 1000


class Call:
    """One call: a PipelineWorker over `processors`, driven turn by turn."""

    def __init__(
        self,
        before: Sequence[FrameProcessor],
        *,
        llm: OpenAILLMService,
        after: Sequence[FrameProcessor] = (),
        observers: Sequence[BaseObserver] = (),
        **params,
    ):
        self.context = LLMContext()
        pair = LLMContextAggregatorPair(self.context)
        self.watch = Watch()
        self.llm = llm
        self.pipeline = Pipeline([*before, pair.user(), llm, *after, self.watch, pair.assistant()])
        self.worker = PipelineWorker(
            self.pipeline,
            params=PipelineParams(enable_metrics=True, **params),
            observers=list(observers),
            cancel_on_idle_timeout=False,
        )
        self._runner = WorkerRunner(handle_sigint=False)
        self._run: asyncio.Task | None = None

    async def __aenter__(self) -> "Call":
        started = asyncio.Event()

        @self.worker.event_handler("on_pipeline_started")
        async def _started(worker, frame):
            started.set()

        await self._runner.add_workers(self.worker)
        self._run = asyncio.create_task(self._runner.run())
        await asyncio.wait_for(started.wait(), 30)
        return self

    async def ask(self, text: str) -> None:
        """Send a user message that runs the LLM."""
        self.watch.ended.clear()
        await self.worker.queue_frame(
            LLMMessagesAppendFrame([{"role": "user", "content": text}], run_llm=True)
        )

    async def say(self, text: str, limit_s: float = 120) -> str:
        """Send a user message and wait for the whole response; returns its text."""
        await self.ask(text)
        await asyncio.wait_for(self.watch.ended.wait(), limit_s)
        return "".join(self.watch.responses[-1])

    async def push(self, frame: Frame) -> None:
        await self.worker.queue_frame(frame)

    async def __aexit__(self, *exc) -> None:
        await self.worker.queue_frame(EndFrame())
        await asyncio.wait_for(self._run, 60)
