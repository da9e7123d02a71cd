"""A scripted caller's recorded turns: a turn's `audio:` file played in place of its TTS.

A Pipecat scripted turn may name a recording (`audio:`, resolved against the scenario file by
Pipecat's parser) that is played to the bot instead of synthesising the turn's `user:` text;
the text stays what the turn says (the caller's transcript line, what its checks read), and
what the agent's STT made of the recording fills that line's `heard`. The caller's line tap
(`transport.CallerLineTap`, before its TTS, the one place that knows which turn a reply says)
marks a recorded turn's reply `skip_tts` (Pipecat's own flag for text that is not spoken, so
the TTS passes it on silently) and follows it with a `RecordingFrame`; the caller's output
resamples that to the call's rate and plays it as it plays a synthesised line, channel
perturbations included.
"""

from dataclasses import dataclass

from pipecat.evals.audio import load_user_audio
from pipecat.frames.frames import DataFrame


@dataclass
class RecordingFrame(DataFrame):
    """A recorded caller turn, played whole: 16-bit mono PCM at `sample_rate`."""

    audio: bytes
    sample_rate: int
    path: str

    def __str__(self) -> str:
        """The frame without its bytes."""
        return f"{self.name}(path: {self.path}, rate: {self.sample_rate})"


async def read_recording(path: str) -> RecordingFrame:
    """The file as Pipecat's harness reads it (any format libsndfile reads, downmixed to mono).

    Raises:
        ValueError: the file cannot be read as audio, or is empty.
    """
    pcm, rate = await load_user_audio(path)
    return RecordingFrame(audio=pcm, sample_rate=rate, path=path)
