"""Channel perturbations of the caller's audio, seeded, from the scenario's `channel` block.

Applied to what the caller says on its way to the agent (the agent's STT hears the perturbed
audio; the caller's own hearing and the heard-gap meter get the agent's audio clean):

- `speaking_rate`: a tape-speed change (resampling: pitch moves with the rate), applied per line;
- `snr_db`: background noise mixed at that signal-to-noise ratio over the line's speech power,
  from `background_noise` (a WAV file, looped) or generated (seeded pink-ish noise);
- `telephony`: an 8 kHz mu-law (G.711) round trip, band-limiting and quantising as a phone line;
- `packet_loss`: each 20 ms frame dropped (zeroed) with this probability.

All randomness comes from one `numpy` generator seeded per episode, so the same seed gives the
same audio bit for bit.
"""

import wave
from pathlib import Path

import numpy as np
import soxr

from pipecat_rl.errors import ScenarioError
from pipecat_rl.scenarios.scenario import Channel

SAMPLE_RATE = 16_000
"""The wire's sample rate (16-bit mono PCM) in both directions."""
FRAME_SAMPLES = SAMPLE_RATE // 50
"""One 20 ms frame."""
VOICED_RMS = 150.0
"""A frame is voiced when its RMS (16-bit) is above this (Piper speech is ~2000-6000)."""


def _load_noise(path: Path) -> np.ndarray:
    try:
        with wave.open(str(path), "rb") as f:
            if f.getsampwidth() != 2:
                raise ScenarioError(f"{path}: background noise must be 16-bit PCM WAV")
            rate, channels = f.getframerate(), f.getnchannels()
            data = np.frombuffer(f.readframes(f.getnframes()), dtype=np.int16)
    except (OSError, wave.Error) as e:
        raise ScenarioError(f"{path}: cannot read background noise: {e}") from e
    audio = data.reshape(-1, channels).mean(axis=1).astype(np.float32)
    if rate != SAMPLE_RATE:
        audio = soxr.resample(audio, rate, SAMPLE_RATE)
    if not len(audio):
        raise ScenarioError(f"{path}: background noise file is empty")
    return audio


def mulaw_round_trip(audio: np.ndarray, rate: int = SAMPLE_RATE) -> np.ndarray:
    """Down to 8 kHz, mu-law encode (G.711, mu = 255, 8 bits) and decode, back up to `rate`."""
    narrow = soxr.resample(audio.astype(np.float32), rate, 8000)
    x = np.clip(narrow / 32768.0, -1.0, 1.0)
    encoded = np.sign(x) * np.log1p(255.0 * np.abs(x)) / np.log1p(255.0)
    quantised = np.round((encoded + 1.0) * 127.5) / 127.5 - 1.0
    decoded = np.sign(quantised) * ((1.0 + 255.0) ** np.abs(quantised) - 1.0) / 255.0
    return soxr.resample((decoded * 32768.0).astype(np.float32), 8000, rate)


class ChannelPerturbation:
    """Perturbs each caller line's PCM (16 kHz mono int16) as the scenario's channel says."""

    def __init__(self, channel: Channel, seed: int, *, noise_file: Path | None = None):
        self.channel = channel
        self._rng = np.random.default_rng(seed)
        self._noise = _load_noise(noise_file) if noise_file else None
        self._noise_at = 0

    def _noise_like(self, n: int) -> np.ndarray:
        if self._noise is not None:
            idx = (self._noise_at + np.arange(n)) % len(self._noise)
            self._noise_at = int((self._noise_at + n) % len(self._noise))
            return self._noise[idx]
        white = self._rng.standard_normal(n + 1).astype(np.float32)
        return (white[1:] + 0.7 * white[:-1]).astype(np.float32)  # tilted toward low frequencies

    def __call__(self, pcm: bytes) -> tuple[bytes, list[bool]]:
        """The perturbed line, and which of its 20 ms frames carry speech (judged clean).

        Its length changes with the speaking rate only.
        """
        c = self.channel
        audio = np.frombuffer(pcm, dtype=np.int16).astype(np.float32)
        if c.speaking_rate != 1.0:
            audio = soxr.resample(audio, SAMPLE_RATE * c.speaking_rate, SAMPLE_RATE)
        frames = -(-len(audio) // FRAME_SAMPLES)
        padded = np.zeros(frames * FRAME_SAMPLES, dtype=np.float32)
        padded[: len(audio)] = audio
        rms = np.sqrt(np.mean(padded.reshape(frames, FRAME_SAMPLES) ** 2, axis=1))
        voiced_mask = [bool(v > VOICED_RMS) for v in rms]
        if c.snr_db is not None:
            speech = audio[np.abs(audio) > 300.0]
            power = float(np.mean(speech**2)) if len(speech) else float(np.mean(audio**2))
            noise = self._noise_like(len(audio))
            noise_power = float(np.mean(noise**2)) or 1.0
            audio = audio + noise * np.sqrt(power / (noise_power * 10 ** (c.snr_db / 10)))
        if c.telephony:
            audio = mulaw_round_trip(audio)
        if c.packet_loss > 0:
            frames = len(audio) // FRAME_SAMPLES
            lost = self._rng.random(frames) < c.packet_loss
            for i in np.flatnonzero(lost):
                audio[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES] = 0.0
        return np.clip(audio, -32768, 32767).astype(np.int16).tobytes(), voiced_mask
