"""What the other side heard, joined from the text frames a bot's TTS path pushed.

One rule for the recorder's `spoken_text` and both simulator transports, so a transcript reads
the same wherever it was taken. Pipecat marks each text frame with `includes_inter_frame_spaces`:
LLM tokens (and some TTS word streams) carry their own spaces, while the sentences and words a
TTS reports do not. Joining those with "" glued sentences ("Certainly.May I have your name?");
joining tokens with " " splits words ("Cert ainly"). This follows Pipecat's own
`concatenate_aggregated_text` (a space between parts unless both carry their spaces), without
doubling a space a part already has at the seam, and without one after Chinese or Japanese text,
which puts none between sentences (a TTS's sentence frames there are unmarked, like any).
"""

import unicodedata
from collections.abc import Iterable
from typing import Protocol

SpokenPart = tuple[str, bool]
"""A piece of spoken text and whether it carries its own spaces to its neighbours."""


class _Text(Protocol):
    text: str
    includes_inter_frame_spaces: bool


def spoken_part(frame: _Text) -> SpokenPart:
    """The part a Pipecat text frame (LLM, aggregated or TTS text) adds to what was spoken."""
    return frame.text, bool(frame.includes_inter_frame_spaces)


def join_spoken(parts: Iterable[SpokenPart]) -> str:
    """The parts as one line: spaced where the frames did not carry a space of their own."""
    text, last_spaced = "", False
    for part, spaced in parts:
        if not part:
            continue
        seam_has_space = not text or text[-1].isspace() or part[0].isspace()
        if not (spaced and last_spaced) and not seam_has_space and not _unspaced(text[-1]):
            text += " "
        text += part
        last_spaced = spaced
    return text


def _unspaced(char: str) -> bool:
    """Whether `char` is of a script written without spaces (Chinese, Japanese; not Korean)."""
    wide = unicodedata.east_asian_width(char) in ("W", "F")
    return wide and not unicodedata.name(char, "").startswith("HANGUL")
