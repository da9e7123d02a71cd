"""A caller's turn-taking moves in audio mode: barge-ins, asides and pauses, timed.

What the scenario asks for (`scenarios.turns`: `send_after`, `barge_in`, `backchannel`,
`side_speech`, a pausing `user:`; the same moves on a `script:` rule or in `caller:`) is timed
here from what the caller hears: the agent's voiced frames as they reach it. The reply to the
caller's line `k` is the agent's voice after that line has been played; the clock of each move
is that reply's voice:

- a barge-in turn (the next line) is due once the caller has heard `barge_in`'s share of the
  reply's voice, or `send_after.delay_ms` after the reply began to sound (Pipecat's
  `bot_started_speaking` anchor, wall time); the caller's hearing then ends the agent's turn as
  heard so far and the scripted caller says the line over the agent (`transport.PersonaHearing`);
- an aside is played on the caller's mouth once `after_ms` of the reply's voice was heard,
  tagged as no turn, so the heard-gap meter and the turn counts leave it out;
- a pausing line is spoken with its silences, as a recording is played (`recordings`).

A scripted scenario's turns plan every move line by line. A caller that decides as it goes (a
`Listener`: the `script:` rules, or the LLM persona's `caller:` moves) is asked instead: at
each reply for the asides to say during it, and, each time its ear has transcribed more of the
reply (`heard`), whether its answer to what it heard so far is said over the agent, and after
how much of the reply's voice. So a rule keyed on an intent barges in only once the words that
carry it were heard, and never into a reply that has ended.

Asides and pausing lines are rendered with the embedded Piper voice, whatever TTS speaks the
caller's other lines (a keyed one included).
"""

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Protocol

import numpy as np
import soxr

from pipecat_rl.scenarios import Scenario
from pipecat_rl.scenarios.turns import BargeIn, Moves, Turn, opens_waiting, spoken
from pipecat_rl.simulator.audio.channel import SAMPLE_RATE
from pipecat_rl.simulator.audio.recordings import RecordingFrame
from pipecat_rl.simulator.audio.timeline import UtteranceKind


@dataclass(frozen=True)
class _Due:
    """A barge-in: the line to say, and when (agent voice heard, or wall time into the reply)."""

    voice_ms: float | None
    wall_ms: float | None


@dataclass(frozen=True)
class _Aside:
    kind: UtteranceKind
    say: str
    after_ms: float


@cache
def _voice():
    from piper import PiperVoice

    from pipecat_rl.simulator.audio.services import PIPER_VOICE, piper_voice_dir

    return PiperVoice.load(piper_voice_dir() / f"{PIPER_VOICE}.onnx")


def piper_pcm(text: str) -> bytes:
    """`text` said by the embedded Piper voice: 16-bit mono PCM at the wire's rate."""
    voice = _voice()
    pcm = b"".join(chunk.audio_int16_bytes for chunk in voice.synthesize(text))
    audio = np.frombuffer(pcm, dtype=np.int16).astype(np.float32)
    return soxr.resample(audio, voice.config.sample_rate, SAMPLE_RATE).astype(np.int16).tobytes()


async def spoken_with_pauses(parts: Sequence[str | int]) -> RecordingFrame:
    """A pausing line (text and `pause_ms:` silences) as one stretch of audio, played whole."""

    def render() -> bytes:
        return b"".join(
            bytes(int(SAMPLE_RATE * part / 1000) * 2) if isinstance(part, int) else piper_pcm(part)
            for part in parts
        )

    pcm = await asyncio.to_thread(render)
    return RecordingFrame(audio=pcm, sample_rate=SAMPLE_RATE, path="(spoken with pauses)")


def pausing_lines(turns: Sequence[Turn]) -> dict[int, tuple[str | int, ...]]:
    """Caller line (1-based) -> its text and pauses, for each line said with a pause."""
    return {
        k: tuple(turn.parts)
        for k, turn in enumerate(spoken(turns), 1)
        if turn.parts is not None and any(isinstance(p, int) for p in turn.parts)
    }


class Listener(Protocol):
    """A caller that decides its moves as the call goes, asked as the agent's reply sounds."""

    def barge_in(self, heard: str) -> BargeIn | None:
        """The barge-in its answer to `heard` (the agent's reply so far) makes; None: it waits."""
        ...

    def asides(self) -> Moves:
        """The asides to say during the agent's reply to the caller's last line."""
        ...


class CallerMoves:
    """The moves of one call, fired by the agent's voice as the caller hears it.

    Keys are the caller's line count when the reply they ride on plays: 0 for the agent's
    greeting before the caller's first line, `k` for the reply to line `k`.
    """

    def __init__(self, turns: Sequence[Turn] = (), asked: Iterable[Moves] = ()):
        """Plan `turns` (a scripted scenario's) line by line.

        `asked`: the moves a `Listener` (`listen`) may make as the call goes, whose asides are
        rendered before the call.
        """
        self._barge_ins: dict[int, _Due] = {}
        self._asides: dict[int, list[_Aside]] = {}
        self._asked = [m for m in asked if m.any]
        self._listener: Listener | None = None
        self._due_now: _Due | None = None
        """The listener's barge-in into the reply playing, for what was heard of it so far."""
        said = 0
        if opens_waiting(turns):
            self._asides[0] = _asides_of(turns[0])
        for turn in spoken(turns):
            if turn.barge_in is not None:
                self._barge_ins[said] = _Due(turn.barge_in.voice_ms, None)
            elif turn.send_after is not None:
                self._barge_ins[said] = _Due(None, turn.send_after.delay_ms)
            said += 1
            self._asides[said] = _asides_of(turn)
        self._audio: dict[str, bytes] = {}
        self._reply: int | None = None
        self._began: float | None = None
        self._heard_ms = 0.0
        self._played: set[tuple[int, int]] = set()
        self.barge_in_due = asyncio.Event()
        """Set when the caller should say its next line now, over the agent."""
        self._barged: set[int] = set()

    @classmethod
    def of(cls, scenario: Scenario) -> "CallerMoves":
        """The moves `scenario` asks for: its turns', its `caller:` and its `script:` rules'."""
        rules = scenario.script.rules if scenario.script else []
        asked = [m for m in (scenario.caller, *rules) if m is not None]
        return cls(scenario.parsed_turns or [], asked)

    @property
    def any(self) -> bool:
        """Whether the call has any timed move."""
        return bool(self._barge_ins) or any(self._asides.values()) or bool(self._asked)

    @property
    def barged_into(self) -> int | None:
        """The reply the caller last barged into (keyed as the moves are), if any."""
        return max(self._barged, default=None)

    def listen(self, listener: Listener | None) -> None:
        """Ask `listener` for the moves as the call goes (the caller's policy; None: nobody)."""
        self._listener = listener

    def heard(self, text: str) -> None:
        """What the caller's ear has made of the agent's reply so far (all of it, joined)."""
        if self._listener is not None:
            self._due_now = _due(self._listener.barge_in(text))

    async def prepare(self) -> None:
        """Render the asides' audio (in a thread: Piper is CPU work) before the call starts."""
        texts = {a.say for asides in self._asides.values() for a in asides}
        texts |= {a.say for moves in self._asked for a in _asides_of(moves)}
        for text in texts - set(self._audio):
            self._audio[text] = await asyncio.to_thread(piper_pcm, text)

    def agent_frame(
        self, voiced: bool, at: float, said: int, caller_busy: bool, frame_s: float
    ) -> list[tuple[UtteranceKind, int, bytes]]:
        """An agent frame the caller heard; the asides to play now (kind, id, audio).

        `said` is how many lines the caller has said, `caller_busy` whether it is still saying
        the last one (the agent's voice then is no reply to it).
        """
        if said != self._reply:
            self._reply, self._began, self._heard_ms = said, None, 0.0
            if self._listener is not None:
                self._asides[said] = _asides_of(self._listener.asides())
                self.heard("")
        if not voiced or caller_busy:
            return []
        self._began = at if self._began is None else self._began
        self._heard_ms += frame_s * 1000.0
        due = self._barge_ins.get(said, self._due_now)
        if due is not None and said not in self._barged:
            wall_ms = (at - self._began) * 1000.0
            if (due.voice_ms is not None and self._heard_ms >= due.voice_ms) or (
                due.wall_ms is not None and wall_ms >= due.wall_ms
            ):
                self._barged.add(said)
                self.barge_in_due.set()
        out = []
        for i, aside in enumerate(self._asides.get(said, [])):
            if (said, i) not in self._played and self._heard_ms >= aside.after_ms:
                self._played.add((said, i))
                out.append((aside.kind, said * 10 + i, self._audio[aside.say]))
        return out


def _asides_of(moves: Moves) -> list[_Aside]:
    return [
        _Aside(kind, aside.say, aside.after_ms)
        for kind, aside in (("backchannel", moves.backchannel), ("side_speech", moves.side_speech))
        if aside is not None
    ]


def _due(barge_in: BargeIn | None) -> _Due | None:
    return None if barge_in is None else _Due(barge_in.voice_ms, None)
