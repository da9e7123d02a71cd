"""Turn-taking of one call, measured from the caller's side of the line: the one record of it.

The simulator fills it (audio mode: from the audio each side put on the line, on one clock), the
ledger keeps it on the session (`metadata["turn_taking"]`), and `simulate`, `ledger show` and the
gate read it from there. Text mode has no audio, so no overlap, yield or silence: its record says
`unavailable` and why, and nothing reads zeros from it as if they were measured.

Names follow the anchors where they exist: LiveKit's simulations (time to yield, false
interruptions, overlap ratio, awkward silences) and tau-voice (yield rate, selectivity).
"""

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pipecat_rl.scoring.quantile import P50, P95, quantile_or_none

AWKWARD_SILENCE_MS = 2000.0
"""Nobody on the line for longer than this, inside a call, is an awkward silence."""

MISSED_BARGE_IN_MS = 1500.0
"""An agent still talking this long after the caller started over it missed the barge-in."""

METADATA_KEY = "turn_taking"
"""Where a session's record lives in the ledger (`SessionRecord.metadata`)."""


class TurnTaking(BaseModel):
    """One call's turn-taking. Counts are whole events; times in milliseconds."""

    model_config = ConfigDict(extra="forbid")

    channel: Literal["audio", "text"]
    unavailable: str | None = None
    """Why nothing below was measured (text mode: no audio on the line); None when measured."""
    caller_turns: int = 0
    """Caller turns that reached the line (spoken, or sent in text mode)."""
    barge_ins: int = 0
    """Times the caller started speaking while the agent's audio was playing, meaning to take
    the turn (a scripted interruption, or any caller speech over the agent that is not a
    backchannel or side speech)."""
    time_to_yield_ms: list[float] = Field(default_factory=list)
    """Per barge-in: caller's speech start to the agent's audio stop. A missed barge-in's is
    here too (how long the agent talked over the caller), so a time-to-yield check sees an agent
    that never yields as the slowest, not as one with nothing to measure."""
    missed_barge_ins: int = 0
    """Barge-ins the agent talked through for longer than `MISSED_BARGE_IN_MS` (or to its end)."""
    backchannels: int = 0
    """Caller backchannels ("mm-hm") and side speech or noise played while the agent spoke."""
    false_interruptions: int = 0
    """Of those, the ones that stopped the agent's audio (it should have kept talking)."""
    overlap_ms: float = 0.0
    """Time both sides were audible at once."""
    talk_ms: float = 0.0
    """Time at least one side was audible (the denominator of `overlap_ratio`)."""
    awkward_silences: int = 0
    """Gaps longer than `AWKWARD_SILENCE_MS` with nobody audible, between the call's first and last
    sound."""
    premature_responses: int = 0
    """Agent speech that started inside a caller's mid-turn pause (before the caller finished)."""
    unanswered_turns: int = 0
    """Caller turns after which the agent said nothing before the caller spoke again or the call
    ended."""

    @property
    def measured(self) -> bool:
        """Whether the figures were measured (audio), not left at their defaults (text)."""
        return self.unavailable is None

    @property
    def overlap_ratio(self) -> float | None:
        """Share of talk time with both sides audible; None when nothing was audible."""
        return self.overlap_ms / self.talk_ms if self.talk_ms > 0 else None

    @property
    def yield_rate(self) -> float | None:
        """Share of barge-ins the agent yielded to in time; None with no barge-in."""
        if not self.barge_ins:
            return None
        return (self.barge_ins - self.missed_barge_ins) / self.barge_ins


def text_mode() -> TurnTaking:
    """The record of a text-mode call: nothing here can be measured without audio."""
    return TurnTaking(
        channel="text",
        unavailable="text mode: no audio on the line, so no overlap, yield or silence to time",
    )


def as_json(record: TurnTaking | None) -> dict | None:
    """The record as `simulate --json` shows it: its fields and the ratios derived from them."""
    if record is None:
        return None
    return {
        **record.model_dump(),
        "overlap_ratio": record.overlap_ratio,
        "yield_rate": record.yield_rate,
    }


def brief(record: TurnTaking) -> str:
    """One measured call in a line (`ledger show`): what happened, each figure only if it did."""
    parts = []
    if record.barge_ins:
        parts.append(f"yield {record.barge_ins - record.missed_barge_ins}/{record.barge_ins}")
    if record.time_to_yield_ms:
        parts.append(f"{max(record.time_to_yield_ms):.0f} ms")
    if record.backchannels:
        parts.append(f"false int {record.false_interruptions}/{record.backchannels}")
    if record.overlap_ratio is not None:
        parts.append(f"overlap {record.overlap_ratio:.0%}")
    for count, label in ((record.awkward_silences, "silence"),
                         (record.premature_responses, "premature"),
                         (record.unanswered_turns, "unanswered")):  # fmt: skip
        if count:
            parts.append(f"{label}×{count}")
    return " · ".join(parts) or "—"


def summary(records: Sequence[TurnTaking | None]) -> str | None:
    """One line over many calls (`simulate`'s table): pooled counts, time to yield P50/P95.

    None when no call was measured (text mode, or no record).
    """
    measured = [r for r in records if r is not None and r.measured]
    if not measured:
        return None
    barge_ins = sum(r.barge_ins for r in measured)
    yielded = barge_ins - sum(r.missed_barge_ins for r in measured)
    ttys = [ms for r in measured for ms in r.time_to_yield_ms]
    p50, p95 = quantile_or_none(ttys, P50), quantile_or_none(ttys, P95)
    talk = sum(r.talk_ms for r in measured)
    overlap = f"{sum(r.overlap_ms for r in measured) / talk:.0%}" if talk else "—"
    parts = [
        f"barge-ins yielded {yielded}/{barge_ins}",
        "time to yield " + ("—" if p50 is None else f"P50 {p50:.0f} / P95 {p95:.0f} ms"),
        f"false interruptions {sum(r.false_interruptions for r in measured)}"
        f"/{sum(r.backchannels for r in measured)}",
        f"overlap {overlap}",
        f"awkward silences {sum(r.awkward_silences for r in measured)}",
        f"premature {sum(r.premature_responses for r in measured)}",
        f"unanswered {sum(r.unanswered_turns for r in measured)}",
    ]
    return f"turn-taking ({len(measured)} audio calls): " + " · ".join(parts)


def read(metadata: dict) -> TurnTaking | None:
    """A session's record from its metadata; None for a session recorded before it existed."""
    raw = metadata.get(METADATA_KEY)
    return None if raw is None else TurnTaking.model_validate(raw)
