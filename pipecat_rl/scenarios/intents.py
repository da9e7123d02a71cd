r"""Intents: what an agent's line means, as sets of patterns a scripted caller reacts to.

A scripted caller's rule can wait for an intent (`{intent: offer_slot, say: ...}`) instead of a
spelling (`{when: "book it", ...}`): an intent is a name and a list of patterns, and it matches an
agent's line when any of its patterns does. A pattern is matched against the line after both are
normalised (`normalise`): lower case, apostrophes dropped ("can't" is "cant", "you're" is
"youre"), every other run of punctuation and whitespace one space ("09:00" is "09 00"). It
matches whole words only ("book" is not found in "booking"). In a pattern:

- `*` alone stands for up to `WILDCARD_WORDS` words ("shall i * book" matches "shall I go ahead
  and book");
- a word ending in `*` is a prefix ("book*" matches "book", "booked", "booking");
- `re:` starts a regular expression, searched in the normalised line, for what words cannot say
  (a code read out: `re:\b[a-z]{2,4} \d{3,} \d{3,}\b`).

A world pack shares its intents in one YAML file of `name: [patterns]` (the clinic's is
`examples/clinic/intents.yaml`); a scenario includes it and may add to it:
`intents: [!include ../intents.yaml, {offer_slot: ["care to take it"]}]` (`merge`).
"""

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

WILDCARD_WORDS = 6
"""Most words a `*` in a pattern stands for: far enough for an aside, not across a speech."""
REGEX_PREFIX = "re:"

_APOSTROPHES = re.compile(r"['\u2018\u2019\u02bc`]")
_NOT_WORD = re.compile(r"[^a-z0-9*]+")
_NOT_LINE_WORD = re.compile(r"[^a-z0-9]+")


def normalise(text: str) -> str:
    """`text` as intents match it: lower case, apostrophes dropped, other punctuation a space."""
    text = _APOSTROPHES.sub("", text.lower())
    return " ".join(_NOT_LINE_WORD.sub(" ", text).split())


@functools.lru_cache(maxsize=4096)  # a matrix's scenarios share their intents' patterns
def pattern_regex(pattern: str) -> str:
    """The regular expression, over a normalised line, that one pattern stands for.

    Raises:
        ValueError: the pattern says nothing (empty, or only `*`) or is a bad `re:` expression.
    """
    if pattern.startswith(REGEX_PREFIX):
        source = pattern[len(REGEX_PREFIX) :].strip()
        if not source:
            raise ValueError(f"pattern {pattern!r}: an empty regular expression")
        try:
            re.compile(source)
        except re.error as e:
            raise ValueError(f"pattern {pattern!r}: not a valid regular expression ({e})") from e
        return source
    words = _NOT_WORD.sub(" ", _APOSTROPHES.sub("", pattern.lower())).split()
    if not any(w.strip("*") for w in words):
        raise ValueError(f"pattern {pattern!r}: no words to match (write words, not only '*')")
    while words and words[0] == "*":  # a search finds the words after a leading `*` anyway
        words.pop(0)
    while words and words[-1] == "*":
        words.pop()
    joined, gap = "", ""
    for word in words:
        if word == "*":
            gap = f"(?: [a-z0-9]+){{0,{WILDCARD_WORDS}}}"
            continue
        stem = re.escape(word.replace("*", ""))
        body = f"{stem}[a-z0-9]*" if word.endswith("*") else stem
        joined += f"{gap} {body}" if joined else body
        gap = ""
    return rf"(?<![a-z0-9]){joined}(?![a-z0-9])"


def merge(sources: Any) -> dict[str, tuple[str, ...]]:
    """One intent set from a mapping, or from a list of mappings merged in order.

    A later mapping adds its patterns to an intent an earlier one named (duplicates once), and
    brings in the intents it alone names; a single pattern may be given as a string.

    Raises:
        ValueError: not a mapping of names to patterns (or a list of such mappings).
    """
    if sources is None:
        return {}
    listed = sources if isinstance(sources, list | tuple) else [sources]
    merged: dict[str, list[str]] = {}
    for i, source in enumerate(listed):
        where = f"item {i}: " if len(listed) > 1 else ""
        if not isinstance(source, Mapping):
            raise ValueError(
                f"{where}intents are a mapping of intent name to patterns (or a list of such "
                "mappings, e.g. an !include of the pack's intents.yaml), not "
                f"{type(source).__name__}"
            )
        for name, patterns in source.items():
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"{where}an intent's name must be a non-empty string: {name!r}")
            patterns = [patterns] if isinstance(patterns, str) else patterns
            if not isinstance(patterns, list | tuple) or not all(
                isinstance(p, str) for p in patterns
            ):
                raise ValueError(f"{where}intent {name!r}: its patterns must be a list of strings")
            known = merged.setdefault(name, [])
            known.extend(p for p in patterns if p not in known)
    return {name: tuple(patterns) for name, patterns in merged.items()}


def check(intents: Mapping[str, Iterable[str]]) -> None:
    """Raise `ValueError` naming the intent and pattern of the first pattern that cannot match."""
    for name, patterns in intents.items():
        if not list(patterns):
            raise ValueError(f"intent {name!r} has no patterns")
        for pattern in patterns:
            try:
                pattern_regex(pattern)
            except ValueError as e:
                raise ValueError(f"intent {name!r}: {e}") from e


class IntentMatcher:
    """Tells which intents an agent's line carries (each intent compiled once)."""

    def __init__(self, intents: Mapping[str, Iterable[str]]):
        self._compiled = {
            name: re.compile("|".join(f"(?:{pattern_regex(p)})" for p in patterns))
            for name, patterns in intents.items()
        }

    @property
    def names(self) -> list[str]:
        """The intents it knows."""
        return list(self._compiled)

    def matches(self, intent: str, line: str) -> bool:
        """Whether `line` carries `intent` (an already normalised line is fine too).

        Raises:
            KeyError: an intent this matcher does not know.
        """
        return self._compiled[intent].search(normalise(line)) is not None

    def found(self, line: str) -> list[str]:
        """Every intent `line` carries, in the order they were defined."""
        text = normalise(line)
        return [name for name, rx in self._compiled.items() if rx.search(text)]
