"""Decontamination at training time: a call that replays a held-out call never trains.

The second defence of the held-out rule (the first is identity by meaning, `heldout`): whatever
scenario a session claims to come from, if its caller said what the caller of a held-out call
said, it is a held-out call. It works as LLM benchmark decontamination does (GPT-3 drops a
document sharing a 13-gram with a benchmark; Llama 2 counts the share of a sample's tokens
inside n-grams it shares with the benchmark, skipping the ones too common to tell anything),
with the whole call as the unit:

- **words**: `identity.words`, so NFKC, invisible characters removed, case-folded, runs of
  letters and digits (punctuation and spacing never matter);
- **a call's text** (`CallText`): its caller's lines (the user messages of its turns), and its
  goal where known for both calls compared;
- **units**: each line's n-grams of `NGRAM` = 8 words, and a line shorter than that as one unit
  (callers speak in short lines: "Tom Baker.", "Yes, that suits me."). A unit never runs from
  one line into the next: two common lines back to back are not a long shared passage;
- **common units** say nothing about one call: a unit found in the calls of two or more
  different held-out scenarios (`COMMON_IN`) is the domain's or the bot's (the bot's own "(The
  phone rings. Greet the caller.)", a patient's name, "Yes, please.") and is neither counted nor
  matched. With a single held-out scenario in the ledger nothing is common yet;
- **telling lines**: a line (or the goal) with a unit that is not common. Call B **says** a
  telling line of call A when units B has cover at least half of that line's telling words;
- **coverage** of call A by call B: the share of A's telling lines that B says. It is judged
  only when A has at least `NGRAM` telling words and the lines B says hold at least `NGRAM` of
  them: a few words in common ("Thank you.") are a phrase, not a call;
- **overlap** of a call with one held-out call: the larger of its coverage by the held-out call
  (most of this call is that call) and the held-out call's coverage by it (this call holds most
  of that call: a copy padded with lines of its own);
- a call **is contaminated** when its overlap with one held-out call is more than
  `THRESHOLD` = 0.5: most of its telling lines. A shared phrase or a stock line in common is a
  minority of a call's lines, so a legitimately different call that shares phrases stays.

Measured on the clinic (its 21 pool and 24 held-out scenarios, each recorded once with the
scripted expert): no pool call is dropped (the share of legitimate pool calls removed is 0; the
highest overlap of one with a held-out call is 0.33), and a verbatim copy of 19 of the 24
held-out calls is recognised under another scenario's name. The other 5 are the terse callers
("Checkup." "Jan Kowalczyk." "Yes." "Bye."): fewer than 8 telling words, too little to tell a
copy from a call that happens to be alike; a copy of their scenario is identity's to catch.
Pure functions over text, no ledger and no torch; the ledger's training query applies them
(`Ledger.training_selection`).
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipecat_rl.scenarios.identity import words

NGRAM = 8
"""Words per n-gram: long enough that no stock sentence of everyday talk decides alone."""

THRESHOLD = 0.5
"""A call whose overlap with one held-out call is more than this is that call ("most of it")."""

COMMON_IN = 2
"""A unit in the calls of this many different held-out scenarios is common (not evidence)."""

Unit = tuple[str, ...]


@dataclass(frozen=True)
class CallText:
    """What a call's caller said (and wanted, where known): the text decontamination compares."""

    id: str
    caller_lines: tuple[str, ...]
    """The caller's lines in order (a recorded call's user messages)."""
    goal: str | None = None
    """The scenario's goal, where the ledger knows it; compared only when both calls have one."""
    scenario: str | None = None
    """The scenario it ran (its hash): calls of one held-out scenario share their units."""


@dataclass(frozen=True)
class Overlap:
    """A call found to replay a held-out call, and by how much."""

    call_id: str
    heldout_id: str
    """The held-out call it overlaps most."""
    share: float
    """Its overlap (see the module docstring)."""


@dataclass(frozen=True)
class _Line:
    """One line of a call (or its goal) as units, each with the word positions it covers."""

    units: tuple[tuple[Unit, range], ...]
    goal: bool


class _Call:
    """A call as lines of units: the caller's lines, then the goal."""

    def __init__(self, call: CallText, n: int):
        self.id = call.id
        self.scenario = call.scenario or f"call:{call.id}"
        texts = [(line, False) for line in call.caller_lines]
        texts += [(call.goal, True)] if call.goal else []
        self.lines: list[_Line] = []
        for text, goal in texts:
            said = words(text)
            tag = ("goal",) if goal else ()
            if len(said) >= n:
                units = tuple(
                    (tag + tuple(said[i : i + n]), range(i, i + n))
                    for i in range(len(said) - n + 1)
                )
            else:
                units = (((*tag, "\0line", *said), range(len(said))),) if said else ()
            self.lines.append(_Line(units, goal))
        self.has_goal = any(line.goal for line in self.lines)
        self.units = {unit for line in self.lines for unit, _ in line.units}

    def covered(self, by: "_Call", common: set[Unit], n: int) -> float | None:
        """The share of this call's telling lines that `by` says too (None: too little to tell).

        A line is telling when a unit of it is not common; `by` says it too when units `by`
        has cover at least half of its telling words. Too little to tell: fewer than `n` telling
        words, or fewer than `n` in the lines `by` says too (a few words in common are a phrase,
        not a call).
        """
        goals = self.has_goal and by.has_goal
        lines = said = telling_words = said_words = 0
        for line in self.lines:
            if line.goal and not goals:
                continue
            telling: set[int] = set()
            shared: set[int] = set()
            for unit, positions in line.units:
                if unit not in common:
                    telling.update(positions)
                    if unit in by.units:
                        shared.update(positions)
            if telling:
                lines += 1
                telling_words += len(telling)
                if 2 * len(shared) >= len(telling):
                    said += 1
                    said_words += len(telling)
        if telling_words < n or said_words < n:
            return None
        return said / lines


class HeldoutIndex:
    """The held-out calls, indexed by unit, to test candidate calls against."""

    def __init__(
        self, heldout: Iterable[CallText], *, n: int = NGRAM, threshold: float = THRESHOLD
    ):
        if n < 1 or not 0 <= threshold < 1:
            raise ValueError(f"n={n} must be >= 1 and threshold={threshold} in [0, 1)")
        self.n = n
        self.threshold = threshold
        self._calls = [_Call(c, n) for c in heldout]
        scenarios: dict[Unit, set[str]] = {}
        for call in self._calls:
            for unit in call.units:
                scenarios.setdefault(unit, set()).add(call.scenario)
        self.common = {u for u, found in scenarios.items() if len(found) >= COMMON_IN}
        """Units in the calls of several held-out scenarios: the domain's, not one call's."""
        self._by_unit: dict[Unit, list[int]] = {}
        for i, call in enumerate(self._calls):
            for unit in call.units - self.common:
                self._by_unit.setdefault(unit, []).append(i)

    def __len__(self) -> int:
        return len(self._calls)

    def _overlap(self, mine: _Call, held: _Call) -> float:
        shares = (
            mine.covered(held, self.common, self.n),
            held.covered(mine, self.common, self.n),
        )
        return max((s for s in shares if s is not None), default=0.0)

    def best(self, call: CallText) -> Overlap | None:
        """The held-out call `call` overlaps most, however little (None: it shares no unit)."""
        mine = _Call(call, self.n)
        sharing = sorted({i for unit in mine.units for i in self._by_unit.get(unit, ())})
        found = [(self._overlap(mine, self._calls[i]), i) for i in sharing]
        if not found:
            return None
        share, i = max(found, key=lambda f: (f[0], -f[1]))
        return Overlap(call_id=call.id, heldout_id=self._calls[i].id, share=round(share, 4))

    def match(self, call: CallText) -> Overlap | None:
        """The held-out call `call` overlaps most, if by more than the threshold; else None."""
        best = self.best(call)
        return best if best is not None and best.share > self.threshold else None


def contaminated(
    candidates: Sequence[CallText],
    heldout: Iterable[CallText],
    *,
    n: int = NGRAM,
    threshold: float = THRESHOLD,
) -> dict[str, Overlap]:
    """The candidate calls that replay a held-out call, by id (an empty dict: none does)."""
    if not candidates:
        return {}
    index = HeldoutIndex(heldout, n=n, threshold=threshold)
    if not len(index):
        return {}
    return {c.id: o for c in candidates if (o := index.match(c)) is not None}
