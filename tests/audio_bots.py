"""Bots for the audio tests: an agent that answers the end of the caller's speech after a delay.

It endpoints on the caller's frames themselves (energy, 200 ms of silence, frame-aligned, so
no VAD-window jitter), pushes Pipecat's VAD frames so Pipecat's own latency observer times it,
and answers `delay_s` later with the same pre-rendered Piper line: nothing but the delay differs
between two runs (no STT, LLM or TTS timing noise). The caller's heard gap must move by it.

The stalling agent says a two-sentence reply with `STALL_S` of silence between its sentences,
as a TTS starved of CPU does: one reply, which a caller must not take for two turns.
"""

import asyncio
from functools import cache

import numpy as np
import soxr
from pipecat.frames.frames import (
    Frame,
    InputAudioRawFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.utils.text.base_text_aggregator import AggregationType
from pipecat.workers.runner import WorkerRunner

from pipecat_rl.simulator.audio.services import PIPER_VOICE, piper_voice_dir
from pipecat_rl.simulator.audio.transport import voiced

REPLY = "Sure, one moment please."
QUESTION = "How can I help you today?"
DELAY_S = 0.4
# The gate test's planted delay: larger than any stall a loaded runner has added to the undelayed
# bot's heard gap (CI once saw 1,220 ms), so no late frame can hide it from a P95 over 3 scenarios.
LATE_S = 2.0
STALL_S = 2.5
STOP_SECS = 0.2


@cache
def spoken_pcm(text: str = REPLY) -> bytes:
    """`text` spoken by the packaged Piper voice, 16 kHz mono int16."""
    from piper import PiperVoice

    voice = PiperVoice.load(piper_voice_dir() / f"{PIPER_VOICE}.onnx")
    pcm = b"".join(chunk.audio_int16_bytes for chunk in voice.synthesize(text))
    audio = np.frombuffer(pcm, dtype=np.int16).astype(np.float32)
    return soxr.resample(audio, voice.config.sample_rate, 16000).astype(np.int16).tobytes()


class AnswerAfter(FrameProcessor):
    """Speaks `REPLY` `delay_s` after the caller's speech ends (more speech cancels it)."""

    def __init__(self, delay_s: float, stall_s: float | None = None, **kwargs):
        super().__init__(**kwargs)
        self._delay_s = delay_s
        self._stall_s = stall_s
        self._pending: asyncio.Task | None = None
        self._speaking = False
        self._silent_frames = 0

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        """Endpoint the caller's audio; schedule a reply at each end of its speech."""
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if not isinstance(frame, InputAudioRawFrame):
            return
        if voiced(frame.audio):
            self._silent_frames = 0
            if not self._speaking:
                self._speaking = True
                if self._pending:
                    await self.cancel_task(self._pending)
                    self._pending = None
                await self.broadcast_frame(VADUserStartedSpeakingFrame, start_secs=0.0)
            return
        self._silent_frames += 1
        if self._speaking and self._silent_frames * 0.02 >= STOP_SECS:
            self._speaking = False
            await self.broadcast_frame(VADUserStoppedSpeakingFrame, stop_secs=STOP_SECS)
            self._pending = self.create_task(self._answer())

    async def _answer(self) -> None:
        await asyncio.sleep(self._delay_s)  # the agent's known delay: the quantity under test
        await self.push_frame(LLMFullResponseStartFrame())
        await self.push_frame(TTSStartedFrame())
        await self._say(REPLY)
        if self._stall_s is not None:
            await asyncio.sleep(self._stall_s)  # what a starved TTS does between sentences
            await self._say(QUESTION)
        await self.push_frame(TTSStoppedFrame())
        await self.push_frame(LLMFullResponseEndFrame())
        self._pending = None

    async def _say(self, text: str) -> None:
        pcm = spoken_pcm(text)
        await self.push_frame(TTSTextFrame(text, aggregated_by=AggregationType.SENTENCE))
        step = 16000 * 2 // 50
        for i in range(0, len(pcm), step):
            await self.push_frame(TTSAudioRawFrame(pcm[i : i + step], 16000, 1))


async def _run(transport, delay_s: float, stall_s: float | None = None) -> None:
    spoken_pcm(REPLY), spoken_pcm(QUESTION)
    pipeline = Pipeline(
        [
            transport.input(),
            AnswerAfter(delay_s, stall_s),
            transport.output(),
        ]
    )
    worker = PipelineWorker(pipeline, params=PipelineParams(audio_out_sample_rate=16000))

    @transport.event_handler("on_client_disconnected")
    async def disconnected(_transport, _client):
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


async def run_bot(transport, runner_args):
    """The agent with no added delay."""
    await _run(transport, 0.0)


async def run_bot_delayed(transport, runner_args):
    """The same agent, every reply `DELAY_S` later."""
    await _run(transport, DELAY_S)


async def run_bot_late(transport, runner_args):
    """The same agent, every reply `LATE_S` later."""
    await _run(transport, LATE_S)


async def run_bot_stalling(transport, runner_args):
    """The agent whose every reply stalls `STALL_S` between its two sentences."""
    await _run(transport, 0.0, STALL_S)
