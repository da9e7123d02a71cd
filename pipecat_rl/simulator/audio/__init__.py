"""Audio mode: the call carried as paced speech (Whisper/Piper offline, Deepgram/Cartesia keyed).

`episode` wires one audio episode (agent speech slots, persona ear and mouth), `transport` the
paced 20 ms call and the caller-side heard-gap meter, `stages` where each heard gap went,
`webrtc` the same call over SmallWebRTC on loopback, `channel` the seeded perturbations,
`spoken` how the caller reads codes aloud, `services` the speech services (`whisper` the
agent's stand-in STT). Only `check_transport` lives here: the CLI checks flags with it before
anything heavy is imported.
"""

from collections.abc import Iterable

from pipecat_rl.errors import ConfigError


def check_transport(modes: Iterable[str], transport: str) -> None:
    """A `ConfigError` for `--transport webrtc` without an audio channel to carry."""
    if transport == "webrtc" and "audio" not in modes:
        raise ConfigError("--transport webrtc carries speech: use it with --mode audio")
