"""A Pipecat scripted scenario's turns (`turns:`), as data: what the caller says and expects.

The file is parsed by Pipecat's own parser (`pipecat.evals.scenario.EvalScenarioFile`), so a
file Pipecat accepts we accept and one it rejects is refused with its message; each parsed turn
becomes a frozen `Turn` here (Pipecat's normalisations kept: `response` read for the judge's
modality, the `name:`/`args:` shorthand as `calls:`, a pausing `user:` joined to its text, an
`audio:` recording's path resolved against the scenario file). The simulator says the turns and
scores them (`simulator.script_turns`); this module only says what they are, which of them no
mode can run (`unsupported`) and which only audio mode can (`needs_audio`: a turn played from
a recording). Pipecat's parser is imported only when a file has scripted scenarios.

A turn that sends nothing (no `user:`) only waits for the agent, as in Pipecat's harness; the
scripted caller runs one as the opening turn, whose checks apply to the agent's greeting
(`opens_waiting`). The caller's lines are then the turns after it (`spoken`), so caller line
`k` is turn `k + 1`.

Fields Pipecat ignores without a word (a key it does not know in a turn or an expectation) are
named by `unknown_keys`, so the loader can warn instead of running a check nobody wrote.

Turn-taking moves, played in audio mode (`simulator.audio.moves`): Pipecat's `send_after:
{event: bot_started_speaking, delay_ms: N}` says the turn N ms after the agent's reply to the
turn before began to sound, over it (a barge-in); our `barge_in: {after_ms: N}` or
`{after_words: N}` does the same once the caller has heard that much of the agent's voice;
`backchannel:` and `side_speech:` (`{say: ..., after_ms: N}`) are said during the agent's reply
to this turn and are no turn of the caller's; a pausing `user:` (Pipecat's `pause_ms:` parts)
is spoken with its silences. Text mode has no time on the line: a barge-in turn is sent after
the reply, asides are not sent, pauses are dropped (`with_moves` reads our keys, which
Pipecat's parser does not keep). The same moves (`Moves`) are a `script:` rule's and a
persona's (`caller:`), see `scenario`.
"""

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, model_validator

REPLY_EVENTS = frozenset({"response", "llm_response", "tts_response"})
"""The agent's reply (its text in text mode)."""
CALL_EVENTS = frozenset({"function_call", "function_call_stopped"})
SPOKE_EVENTS = frozenset({"llm_started", "bot_started_speaking", "bot_stopped_speaking"})
"""That the agent replied at all."""
USER_EVENTS = frozenset({"user_transcription", "user_started_speaking", "user_stopped_speaking"})
"""The caller's own line."""
TEXT_EVENTS = REPLY_EVENTS | CALL_EVENTS | SPOKE_EVENTS | USER_EVENTS
"""What the scripted checks can observe (in text mode and in audio mode alike)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CallSpec(_Frozen):
    """One expected function call: its name (None: any) and a subset of its arguments."""

    name: str | None = None
    args: dict[str, Any] | None = None


class SendAfter(_Frozen):
    """When a turn's input is sent: `delay_ms` after `event` (or after the previous send)."""

    event: str | None = None
    delay_ms: int = 0


class Expectation(_Frozen):
    """One event a turn expects back from the agent (Pipecat's `EvalExpectation`)."""

    event: str
    within_ms: int | None = Field(default=None, ge=0)
    """The latency budget from the turn's send: the event must arrive within it."""
    text_contains: str | None = None
    text_excludes: str | None = None
    calls: list[CallSpec] | None = None
    eval: str | None = None
    marker: str | None = None
    marker_first: StrictBool | None = None
    markers: int | None = None
    text_after: StrictBool | None = None
    check_from: str = "previous"
    absent: StrictBool = False


WORD_MS = 350
"""How long one word of the agent's takes to say (~170 words a minute, Piper's pace): the
caller counts `after_words` as that much of the agent's voice heard."""


class BargeIn(_Frozen):
    """Say the turn over the agent's reply to the turn before, once this much of it was heard."""

    after_ms: int | None = Field(default=None, gt=0)
    """Milliseconds of the agent's voice (its silences not counted)."""
    after_words: int | None = Field(default=None, gt=0)
    """Words of the agent's, counted as `WORD_MS` of its voice each."""

    @model_validator(mode="after")
    def _one(self) -> "BargeIn":
        if (self.after_ms is None) == (self.after_words is None):
            raise ValueError("give one of after_ms or after_words")
        return self

    @property
    def voice_ms(self) -> int:
        """How much of the agent's voice the caller hears before it barges in."""
        return self.after_ms if self.after_ms is not None else WORD_MS * (self.after_words or 0)


class Aside(_Frozen):
    """Something the caller says during the agent's reply that is no turn (a backchannel)."""

    say: str = Field(min_length=1)
    after_ms: int = Field(default=0, ge=0)
    """Milliseconds of the agent's voice heard in its reply before the caller says it."""


class Moves(_Frozen):
    """A caller's turn-taking moves: one vocabulary for a turn, a `script:` rule and `caller:`.

    On a turn or a rule, `barge_in` says its line over the agent's reply before it and the asides
    are said during the agent's reply to it; a scenario's `caller:` makes them on every reply.
    """

    barge_in: BargeIn | None = None
    backchannel: Aside | None = None
    side_speech: Aside | None = None

    @property
    def any(self) -> bool:
        """Whether any move is asked for."""
        return any(getattr(self, key) is not None for key in MOVE_KEYS)


MOVE_KEYS = tuple(Moves.model_fields)
"""The turn-taking moves' keys (on a turn: ours, which Pipecat's parser does not know)."""


class Turn(Moves):
    """One scripted turn: what the caller sends, and what it expects back."""

    user: str | None = None
    expect: list[Expectation] = Field(default_factory=list)
    parts: list[str | int] | None = None
    audio: str | None = None
    dtmf: str | None = None
    send_after: SendAfter | None = None
    image: str | None = None


BARGE_IN_EVENT = "bot_started_speaking"
"""The one `send_after.event` the caller can time a send from: the agent's voice, as heard."""

_TURN_KEYS = set(Turn.model_fields) - {"parts"}
_EXPECTATION_KEYS = set(Expectation.model_fields) | {"name", "args"}  # the calls shorthand


def pipecat_turns(path: Path) -> dict[str, list[Turn]]:
    """Every scripted scenario of the file, by name, as Pipecat parses it.

    Raises:
        ValueError: Pipecat rejects the file (its message).
    """
    from pipecat.evals.scenario import EvalScenarioFile
    from pipecat.evals.script import EvalScriptScenario

    return {
        s.name: [_turn(s.name, i, t) for i, t in enumerate(s.turns)]
        for s in EvalScenarioFile.load(path)
        if isinstance(s, EvalScriptScenario)
    }


def _turn(name: str, index: int, parsed: Any) -> Turn:
    try:
        return Turn.model_validate(dataclasses.asdict(parsed))
    except ValidationError as e:  # a value Pipecat passes on unchecked (`within_ms: soon`)
        error = e.errors()[0]
        field = ".".join(str(p) for p in ("turns", index, *error["loc"]))
        raise ValueError(f"{name}: {field}: {error['msg']}") from e


def with_moves(turns: Sequence[Turn], raw_turns: Sequence[Any]) -> list[Turn]:
    """`turns` with our turn-taking keys (`MOVE_KEYS`) read from the file's own turns.

    Raises:
        ValueError: a move is malformed (`turns.<i>.<key>...: why`).
    """
    out = []
    for i, (turn, raw) in enumerate(zip(turns, raw_turns, strict=True)):
        moves = {k: raw[k] for k in MOVE_KEYS if isinstance(raw, dict) and k in raw}
        try:
            out.append(Turn.model_validate({**turn.model_dump(exclude_unset=True), **moves}))
        except ValidationError as e:
            error = e.errors()[0]
            field = ".".join(str(p) for p in ("turns", i, *error["loc"]))
            raise ValueError(f"{field}: {error['msg']}") from e
    return out


_NOT_SENT = {"dtmf": "keypresses", "image": "an image for the bot"}


def unsupported(turns: Sequence[Turn]) -> str | None:
    """Why neither text mode nor the audio harness can run these turns, or None.

    A turn's `audio:` is not among them: audio mode plays it (`needs_audio`).
    """
    for t, turn in enumerate(turns, 1):
        for key, what in _NOT_SENT.items():
            if getattr(turn, key) is not None:
                return (
                    f"turn {t} uses `{key}:` ({what}), which neither text mode nor the audio "
                    "harness can send"
                )
        timed = turn.send_after is not None or turn.barge_in is not None
        if turn.send_after is not None and turn.send_after.event != BARGE_IN_EVENT:
            return (
                f"turn {t} uses `send_after:` timed from {turn.send_after.event or 'its delay'}: "
                f"the caller can time a send from `{BARGE_IN_EVENT}` only (a barge-in)"
            )
        if turn.send_after is not None and turn.barge_in is not None:
            return f"turn {t} has both `send_after:` and `barge_in:`: give one"
        if timed and (t == 1 or turn.user is None):
            return f"turn {t} barges in, but " + (
                "it says nothing (`user:`)" if turn.user is None else "no reply comes before it"
            )
        if turn.user is None and t > 1:
            return (
                f"turn {t} has no `user:` text: the scripted caller runs a turn that only waits "
                "for the agent as the opening turn (the greeting), not after the caller spoke"
            )
        if turn.user is not None and not turn.user.strip():
            return f"turn {t} has an empty `user:`: give the text the caller says"
        for e in turn.expect:
            if e.event not in TEXT_EVENTS:
                return f"turn {t} expects `{e.event}`, which the simulator cannot observe"
            if e.marker or e.marker_first is not None or e.markers is not None:
                return f"turn {t} checks LLM markers, which the simulator cannot observe"
    return None


def waits(turn: Turn) -> bool:
    """Whether the turn sends nothing and only waits for what the agent says next."""
    return turn.user is None and turn.dtmf is None


def opens_waiting(turns: Sequence[Turn]) -> bool:
    """Whether turn 1 only waits: the caller says nothing until the agent has greeted it."""
    return bool(turns) and waits(turns[0])


def spoken(turns: Sequence[Turn]) -> list[Turn]:
    """The turns the caller says, in order: caller line `k` is `spoken(turns)[k - 1]`."""
    return [turn for turn in turns if not waits(turn)]


def recordings(turns: Sequence[Turn]) -> dict[int, str]:
    """The recorded turns: turn number (1-based) -> the file played as that turn.

    `recordings(spoken(turns))` numbers them as the caller's lines instead.
    """
    return {t: turn.audio for t, turn in enumerate(turns, 1) if turn.audio is not None}


def needs_audio(turns: Sequence[Turn]) -> str | None:
    """Why text mode cannot run these turns (one plays a recording), or None."""
    recorded = recordings(turns)
    if not recorded:
        return None
    return f"turn {min(recorded)} plays a recording (`audio:`): run with --mode audio"


def untimed(turns: Sequence[Turn]) -> list[str]:
    """The `within_ms` budgets on an opening turn that only waits (`turns.0.expect.<i>.within_ms`).

    Pipecat times them from the start of the call; the transcript holds when each line was
    said, not when the call started, so these budgets are not checked.
    """
    if not opens_waiting(turns):
        return []
    return [
        f"turns.0.expect.{i}.within_ms"
        for i, e in enumerate(turns[0].expect)
        if e.within_ms is not None
    ]


def unknown_keys(raw_turns: Sequence[Any]) -> list[str]:
    """The keys of the written turns that Pipecat does not define (`turns.<i>.<key>`)."""
    found = []
    for t, turn in enumerate(raw_turns):
        if not isinstance(turn, dict):
            continue
        found += [f"turns.{t}.{k}" for k in turn if k not in _TURN_KEYS]
        for i, e in enumerate(turn.get("expect") or []):
            if isinstance(e, dict):
                found += [f"turns.{t}.expect.{i}.{k}" for k in e if k not in _EXPECTATION_KEYS]
    return found
