"""Text-mode agents with planted model time: `run_bot`'s k-th reply comes `DELAYS_S[k]` after
the caller's line; `run_bot_streaming` streams its first reply a word every `WORD_GAP_S`.

Like Pipecat's OpenAI service, it pushes `LLMFullResponseStartFrame` as soon as the request
starts, then its text once the (planted) model time has passed: a response gap stamped at the
start frame would read ~0 ms whatever the delay.
"""

import asyncio

from pipecat.frames.frames import (
    Frame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TranscriptionFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

DELAYS_S = (1.2, 0.2, 2.2)
"""Per answered caller line; they differ by a second, so a figure on the wrong turn shows."""


class _Answering(FrameProcessor):
    """Passes every frame on and answers each caller line with `answer(k)` (k from 0)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._answered = 0

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, TranscriptionFrame):
            self._answered += 1
            # as Pipecat's OpenAI service: the start frame before the model's first token
            await self.push_frame(LLMFullResponseStartFrame())
            await self.answer(self._answered - 1)

    async def answer(self, k: int) -> None:
        raise NotImplementedError


class PacedAnswers(_Answering):
    """Answers each caller line: start frame at once, its text `DELAYS_S[k]` later."""

    async def answer(self, k: int) -> None:
        k = min(k, len(DELAYS_S) - 1)
        await asyncio.sleep(DELAYS_S[k])  # the model's time: the quantity under test
        await self.push_frame(LLMTextFrame(f"Answer {k + 1}."))
        await self.push_frame(LLMFullResponseEndFrame())


STREAMED = ("Answer", "one,", "said", "slowly,", "word", "by", "word.")
WORD_GAP_S = 0.3
"""Between the streamed reply's words: the whole reply takes longer than its scenario's
`max_silence_s`, no gap does."""


class StreamedThenStuck(_Answering):
    """Streams `STREAMED` in answer to the first caller line; to the next, starts a response
    and never says anything (a request that hangs)."""

    async def answer(self, k: int) -> None:
        if k > 0:
            return
        for i, word in enumerate(STREAMED):
            await asyncio.sleep(WORD_GAP_S)  # the model's time for the next token
            await self.push_frame(LLMTextFrame(word if i == 0 else f" {word}"))
        await self.push_frame(LLMFullResponseEndFrame())


async def run_bot(transport, runner_args):
    await _run(transport, PacedAnswers())


async def run_bot_streaming(transport, runner_args):
    await _run(transport, StreamedThenStuck())


async def _run(transport, agent: FrameProcessor):
    worker = PipelineWorker(
        Pipeline([transport.input(), agent, transport.output()]),
        params=PipelineParams(),
    )

    @transport.event_handler("on_client_disconnected")
    async def disconnected(_transport, _client):
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()
