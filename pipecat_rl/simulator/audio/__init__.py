"""Audio mode: the call carried as paced speech (Whisper/Piper offline, Deepgram/Cartesia keyed).

`episode` wires one audio episode (agent speech slots, persona ear and mouth), `transport` the
paced 20 ms call and the caller-side heard-gap meter, `stages` where each heard gap went,
`webrtc` the same call over SmallWebRTC on loopback, `channel` the seeded perturbations,
`spoken` how the caller reads codes aloud, `services` the speech services (`whisper` the
agent's stand-in STT), `recorder` the `--record-audio` WAV of each call, `timeline` the call's
turn-taking from what each side put on the line, `moves` a scripted caller's barge-ins, asides
and pauses. Only the flag checks
(`check_transport`, `check_recording`) live here: the CLI runs them before anything heavy is
imported.
"""

import tempfile
from collections.abc import Iterable
from pathlib import Path

from pipecat_rl.errors import ConfigError


def check_transport(modes: Iterable[str], transport: str) -> None:
    """A `ConfigError` for `--transport webrtc` without an audio channel to carry."""
    if transport == "webrtc" and "audio" not in modes:
        raise ConfigError("--transport webrtc carries speech: use it with --mode audio")


def check_recording(modes: Iterable[str], folder: Path | None) -> Path | None:
    """`--record-audio DIR`, created with its parents and known writable, before any call.

    A `ConfigError` without an audio channel to record, or for a folder that cannot be made or
    written.
    """
    if folder is None:
        return None
    if "audio" not in modes:
        raise ConfigError("--record-audio records speech: use it with --mode audio (or text,audio)")
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--record-audio {folder}: not a folder; name a folder (it is created)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".pipecat-rl-probe-"):
            pass
    except OSError as e:
        raise ConfigError(
            f"--record-audio {folder}: cannot write there ({e.strerror or e}); name another folder"
        ) from e
    return folder
