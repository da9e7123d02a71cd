"""`--record-audio`: each audio call as one stereo WAV, both sides on one clock, as on the line.

Left is the caller as the agent receives it (its mouth's 20 ms frames, after the scenario's
channel perturbations; over WebRTC, before the Opus codec), right is the agent as the caller
receives it (over WebRTC, after the codec and jitter buffer); 16-bit PCM at the line's rate.
Both are placed by the time each frame went by (`time.monotonic()`, the mouths' clock), so a
side that sent nothing is silence there and the two channels line up with what happened: a
frame the mouth sent late while catching up (`transport.MAX_CATCH_UP_S`) keeps its place in
the stream, and a stretch the mouth skipped is silence. Frames are never dropped or overlapped:
a burst after a stall (WebRTC's decoder catching up) follows the stall's silence in order.

The file is opened when the call is set up, appended to as audio flows (what both channels
have settled is written; a side quiet for `SETTLE_S` is filled with silence, so about a second
at most is held per channel) and its header fixed up when it is closed. A recording that cannot
be written is dropped with a warning; it never stops the call.
"""

import contextlib
import re
import wave
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
from loguru import logger

from pipecat_rl.simulator.audio.channel import SAMPLE_RATE

Side = Literal["caller", "agent"]

SETTLE_S = 0.5
"""A side that sent nothing for this long is written as silence up to then (the other's pace)."""
GAP_S = 0.12
"""A frame further than this past its side's stream starts after silence (the mouth's catch-up
is 100 ms: anything later was a stretch it skipped, or a side that had not started)."""
WRITE_S = 0.5
"""Settled audio is written in pieces of at least this long (one write, not one per frame)."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._#=,+-]+")


def recording_path(folder: Path, scenario_id: str, repeat: int, session_id: str) -> Path:
    """`<scenario id>#<repeat>-<session id>.wav` in `folder`, each unsafe character run as `_`.

    Unsafe: anything but letters, digits and `. _ # = , + -` (a matrix id's brackets and
    spaces, a path separator); the scenario part is cut to 120 characters. The path is
    absolute, so the session's `audio_wav` is found from any working directory.
    """
    name = f"{_UNSAFE.sub('_', scenario_id)[:120]}#{repeat}-{_UNSAFE.sub('_', session_id)}"
    return folder.absolute() / f"{name.lstrip('.') or '_'}.wav"


class CallRecording:
    """One call's stereo WAV, written as the call goes (see the module's docstring)."""

    def __init__(self, path: Path, rate: int = SAMPLE_RATE):
        self.path = path
        self.rate = rate
        self.error: str | None = None
        """Why the recording stopped, if it could not be written."""
        self._t0: float | None = None
        self._written = 0
        """Samples per channel already in the file; `_pending` starts there."""
        self._pending: dict[Side, bytearray] = {"caller": bytearray(), "agent": bytearray()}
        self._gap = round(GAP_S * rate)
        self._settle = round(SETTLE_S * rate)
        self._piece = round(WRITE_S * rate)
        self._file: BinaryIO | None = None
        self._wav: wave.Wave_write | None = None
        try:
            self._file = open(path, "wb")  # open for the call: closed by `close`
            self._wav = wave.open(self._file, "wb")
            self._wav.setnchannels(2)
            self._wav.setsampwidth(2)
            self._wav.setframerate(rate)
        except (OSError, wave.Error) as e:
            self._fail(e)

    def add(self, side: Side, pcm: bytes, at: float) -> None:
        """A frame of `side` went by at `at` (`time.monotonic()`)."""
        if self._wav is None:
            return
        if self._t0 is None:
            self._t0 = at
        due = round((at - self._t0) * self.rate)
        if due - self._end(side) > self._gap:  # the side sent nothing meanwhile: silence
            self._pad(side, due)
        self._pending[side].extend(pcm[: len(pcm) - len(pcm) % 2])
        for other in self._pending:  # a side quiet for SETTLE_S: silence up to then
            self._pad(other, due - self._settle)
        self._write(self._piece)

    def close(self) -> Path | None:
        """Write what is left (the shorter side padded with silence), fix the header up.

        Returns the file, or None when it could not be written (`error` says why).
        """
        if self._wav is None:
            return None
        end = max(self._end(side) for side in self._pending)
        for side in self._pending:
            self._pad(side, end)
        self._write(1)
        if self._wav is None:  # the last write failed
            return None
        try:
            self._wav.close()  # fixes the header up
            self._wav = None
            if self._file is not None:
                self._file.close()
            self._file = None
        except (OSError, wave.Error) as e:
            self._fail(e)
        return None if self.error else self.path

    def _end(self, side: Side) -> int:
        return self._written + len(self._pending[side]) // 2

    def _pad(self, side: Side, until: int) -> None:
        short = until - self._end(side)
        if short > 0:
            self._pending[side].extend(bytes(2 * short))

    def _write(self, at_least: int) -> None:
        """Interleave and write what both sides hold, once it is `at_least` samples."""
        n = min(len(b) for b in self._pending.values()) // 2
        if n < at_least or self._wav is None:
            return
        stereo = np.empty(2 * n, dtype="<i2")
        for channel, side in enumerate(("caller", "agent")):
            pending = self._pending[side]
            stereo[channel::2] = np.frombuffer(bytes(pending[: 2 * n]), dtype="<i2")
            del pending[: 2 * n]
        self._written += n
        try:
            self._wav.writeframesraw(stereo.tobytes())  # the header is fixed up on close
        except (OSError, wave.Error) as e:
            self._fail(e)

    def _fail(self, error: Exception) -> None:
        self.error = f"{type(error).__name__}: {error}"
        logger.warning(f"--record-audio: {self.path} could not be written ({self.error}): dropped")
        for f in (self._wav, self._file):
            with contextlib.suppress(OSError, wave.Error):
                if f is not None:
                    f.close()
        self._wav = self._file = None
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)  # no half-written file left to be mistaken
        for pending in self._pending.values():
            pending.clear()
