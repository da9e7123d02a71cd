"""Whisper on each segment once, its encoder run over a window sized to the segment.

Pipecat's `WhisperSTTService` transcribes each VAD segment through faster-whisper's
`transcribe`, which pads every segment's features to Whisper's 30 s window: for a 3-5 s caller
line the encoder, most of the cost, does six to ten times the work the audio needs. Here the
segment's log-mel features are padded to `window_s` (longer segments to the next second that
holds them, up to 30 s) and decoded once, without timestamps or temperature fallback, to a length
the segment's duration bounds; a segment longer than 30 s goes through `transcribe` as Pipecat's
does. Segments whose no-speech
probability reaches `no_speech_prob` are dropped, as Pipecat's are.

Why: a caller's line is a few seconds long, and encoding 30 s of padding for it costs several
times the CPU of encoding the line itself, on every turn of every simulated call; the transcript
is no worse for it (long digit strings are, if anything, kept more often).
"""

import asyncio
import math
from collections.abc import AsyncGenerator
from pathlib import Path

import numpy as np
from pipecat.frames.frames import Frame, TranscriptionFrame
from pipecat.services.settings import STTSettings
from pipecat.services.stt_service import SegmentedSTTService
from pipecat.transcriptions.language import Language
from pipecat.utils.time import time_now_iso8601

FRAMES_PER_S = 100
"""Whisper's log-mel frames per second."""
MAX_WINDOW_S = 30.0
"""Whisper's own window: what its encoder was trained on."""
TOKENS_PER_S = 10
MIN_TOKENS = 24
"""A decode's length cap: `MIN_TOKENS` + `TOKENS_PER_S` per second of audio. Speech, codes read
character by character included, stays well under it; a decode looping on a cut-off word stops
there instead of at Whisper's 448."""


class WindowedWhisperSTTService(SegmentedSTTService):
    """A segmented STT on faster-whisper whose encoder window fits the segment."""

    def __init__(
        self,
        *,
        model_dir: Path,
        window_s: float = 10.0,
        beam_size: int = 5,
        no_speech_prob: float = 0.4,
        **kwargs,
    ):
        """Load the model (CPU, int8) from `model_dir`; nothing is downloaded."""
        from faster_whisper import WhisperModel
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        settings = STTSettings(model=str(model_dir), language=Language.EN)
        super().__init__(settings=settings, **kwargs)
        self._whisper = WhisperModel(str(model_dir), device="cpu", compute_type="int8")
        self._tokenizer = Tokenizer(
            self._whisper.hf_tokenizer, False, task="transcribe", language="en"
        )
        self._prompt = self._whisper.get_prompt(self._tokenizer, [], without_timestamps=True)
        self._suppressed = get_suppressed_tokens(self._tokenizer, [-1])
        self._window_frames = int(window_s * FRAMES_PER_S)
        self._beam_size = beam_size
        self._no_speech_prob = no_speech_prob

    @property
    def wants_wav_segments(self) -> bool:
        """Segments come as raw 16-bit PCM, which the model reads directly."""
        return False

    def can_generate_metrics(self) -> bool:
        """Processing metrics, as Pipecat's Whisper service reports them."""
        return True

    def transcribe(self, audio: np.ndarray) -> str:
        """The text of one segment (float32 at 16 kHz), or "" if Whisper hears no speech."""
        features = self._whisper.feature_extractor(audio)
        frames = features.shape[-1]
        if frames > MAX_WINDOW_S * FRAMES_PER_S:
            segments, _ = self._whisper.transcribe(audio, language="en", beam_size=self._beam_size)
            kept = (s.text for s in segments if s.no_speech_prob < self._no_speech_prob)
            return " ".join(t.strip() for t in kept).strip()
        window = max(self._window_frames, math.ceil(frames / FRAMES_PER_S) * FRAMES_PER_S)
        cap = MIN_TOKENS + math.ceil(TOKENS_PER_S * frames / FRAMES_PER_S)
        features = np.pad(features, ((0, 0), (0, window - frames)))
        result = self._whisper.model.generate(
            self._whisper.encode(features),
            [self._prompt],
            beam_size=self._beam_size,
            max_length=min(self._whisper.max_length, cap),
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=self._suppressed,
        )[0]
        if result.no_speech_prob >= self._no_speech_prob:
            return ""
        return self._tokenizer.decode(result.sequences_ids[0]).strip()

    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame, None]:
        """Transcribe one segment (16-bit PCM) off the event loop."""
        await self.start_processing_metrics()
        samples = np.frombuffer(audio, dtype=np.int16).astype(np.float32) / 32768.0
        try:  # a failure is Pipecat's to report (the segment is lost, the call goes on)
            text = await asyncio.to_thread(self.transcribe, samples)
        finally:
            await self.stop_processing_metrics()
        if text:
            yield TranscriptionFrame(text, "", time_now_iso8601(), Language.EN)
