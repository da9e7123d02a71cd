"""What each side put on the line, on one clock, and the call's turn-taking measured from it.

The audio pair tells `LineTimeline` every 20 ms frame either mouth sends (the caller's tagged
with the utterance it belongs to: a turn line, a backchannel, side speech) and every time the
agent's output dropped speech it had queued (an interruption that cut it off). `measure` turns
that into a `TurnTaking` (see `scoring.turntaking`), with no Pipecat in sight, so it is tested
on planted timelines. Its rules:

- the agent's speech is its voiced frames joined across silences shorter than `SPEECH_GAP_MS`
  (between words and sentences); a *stretch* ends at a longer silence, and starts at an *onset*;
- a caller turn line that starts inside an agent stretch is a barge-in; the agent yielded at the
  end of that stretch (time to yield = that end minus the line's start), and missed it when the
  stretch went on longer than `MISSED_BARGE_IN_MS` (its time is kept too: an agent that talks
  through a barge-in has the longest time to yield, not none);
- a backchannel or side speech that starts inside an agent stretch counts in `backchannels`; it
  is a false interruption when the agent's output was cut between its start and
  `MISSED_BARGE_IN_MS` after its end (or the next caller line, whichever comes first);
- an agent onset inside a caller line, while the caller is silent in it (a pause mid-sentence),
  is a premature response (one per line);
- a caller line with no agent onset after it, before the next caller line (or the call's end),
  is unanswered; the caller's last line is not counted when the caller hung up after it (it
  waited for no answer);
- a silence longer than `AWKWARD_SILENCE_MS` with nothing voiced from either side, between the
  call's first and last sound, is awkward, unless it lies inside a caller line (the caller's
  own pause: it holds the turn).
"""

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pipecat_rl.scoring.turntaking import AWKWARD_SILENCE_MS, MISSED_BARGE_IN_MS, TurnTaking

UtteranceKind = Literal["turn", "backchannel", "side_speech"]
Span = tuple[float, float]
"""A stretch of sound, (start, end) in seconds on the line's clock."""

SPEECH_GAP_MS = 500.0
"""An agent silence shorter than this is inside its speech (a gap between words or sentences)."""


@dataclass
class Utterance:
    """One caller utterance as it went on the line: its kind and its voiced spans, in order."""

    kind: UtteranceKind
    spans: list[Span] = field(default_factory=list)

    @property
    def start(self) -> float:
        """When its first voiced frame began."""
        return self.spans[0][0]

    @property
    def end(self) -> float:
        """When its last voiced frame ended."""
        return self.spans[-1][1]


def _add(spans: list[Span], start: float, end: float) -> None:
    """Append a voiced frame, merged with the last span when it follows on (within 1 ms)."""
    if spans and start - spans[-1][1] <= 0.001:
        spans[-1] = (spans[-1][0], max(spans[-1][1], end))
    else:
        spans.append((start, end))


def _union(spans: Sequence[Span], gap_s: float = 0.0) -> list[Span]:
    """The spans merged where they overlap or lie less than `gap_s` apart."""
    out: list[Span] = []
    for start, end in sorted(spans):
        if out and start - out[-1][1] < gap_s + 1e-9:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _length(spans: Sequence[Span]) -> float:
    return sum(end - start for start, end in spans)


def _intersection(a: Sequence[Span], b: Sequence[Span]) -> float:
    """Total time covered by both of two merged span lists."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _stretch_at(stretches: Sequence[Span], t: float) -> Span | None:
    """The agent stretch that is sounding at `t`, if any."""
    i = bisect.bisect_right(stretches, (t, float("inf"))) - 1
    return stretches[i] if i >= 0 and stretches[i][0] <= t < stretches[i][1] else None


def measure(
    caller: Sequence[Utterance],
    agent: Sequence[Span],
    cuts: Sequence[float] = (),
    *,
    caller_hung_up: bool = False,
) -> TurnTaking:
    """The turn-taking of one call from its caller utterances, agent voice and agent cuts."""
    utterances = sorted((u for u in caller if u.spans), key=lambda u: u.start)
    stretches = _union(agent, SPEECH_GAP_MS / 1000.0)
    onsets = [start for start, _ in stretches]
    record = TurnTaking(channel="audio")
    turns = [u for u in utterances if u.kind == "turn"]
    record.caller_turns = len(turns)
    bound_s = MISSED_BARGE_IN_MS / 1000.0
    for u in utterances:
        over = _stretch_at(stretches, u.start)
        if u.kind != "turn":
            if over is not None:
                record.backchannels += 1
                later = [t.start for t in turns if t.start > u.start]
                until = min([u.end + bound_s, *later])  # a cut after a turn line is its yield
                if any(u.start <= cut <= until for cut in cuts):
                    record.false_interruptions += 1
            continue
        if over is not None:
            record.barge_ins += 1
            took = over[1] - u.start
            if took > bound_s:
                record.missed_barge_ins += 1
            record.time_to_yield_ms.append(round(took * 1000.0, 1))
        inside = [t for t in onsets if u.start < t < u.end]
        if any(not any(s <= t < e for s, e in u.spans) for t in inside):
            record.premature_responses += 1
    for i, u in enumerate(turns):
        if caller_hung_up and i == len(turns) - 1:
            break
        following = turns[i + 1].start if i + 1 < len(turns) else float("inf")
        if not any(u.end <= t < following for t in onsets):
            record.unanswered_turns += 1
    caller_sound = _union([s for u in utterances for s in u.spans])
    agent_sound = _union(agent)
    sound = _union([*caller_sound, *agent_sound])
    record.talk_ms = round(_length(sound) * 1000.0, 1)
    record.overlap_ms = round(_intersection(caller_sound, agent_sound) * 1000.0, 1)
    held = [(u.start, u.end) for u in turns]
    for (_, gap_start), (gap_end, _) in zip(sound, sound[1:], strict=False):
        if (gap_end - gap_start) * 1000.0 <= AWKWARD_SILENCE_MS:
            continue
        if not any(s <= gap_start and gap_end <= e for s, e in held):
            record.awkward_silences += 1
    return record


class LineTimeline:
    """The frames each side sent on one call, kept as voiced spans (see the module docstring)."""

    def __init__(self, frame_s: float = 0.02):
        self._frame_s = frame_s
        self._utterances: dict[object, Utterance] = {}
        self._agent: list[Span] = []
        self._cuts: list[float] = []

    def caller(self, voiced: bool, at: float, tag: tuple[UtteranceKind, int] | None) -> None:
        """A frame left the caller's mouth; `tag` names its utterance (None: the idle line)."""
        if not voiced or tag is None:
            return
        utterance = self._utterances.setdefault(tag, Utterance(tag[0]))
        _add(utterance.spans, at, at + self._frame_s)

    def agent(self, voiced: bool, at: float) -> None:
        """A frame of the agent's reached the caller."""
        if voiced:
            _add(self._agent, at, at + self._frame_s)

    def cut(self, at: float) -> None:
        """The agent's output dropped speech it had not played (it was interrupted)."""
        self._cuts.append(at)

    def measure(self, *, caller_hung_up: bool) -> TurnTaking:
        """The call's turn-taking so far."""
        return measure(
            list(self._utterances.values()), self._agent, self._cuts, caller_hung_up=caller_hung_up
        )
