"""Where a heard gap goes: the agent's stages between the caller's silence and its voice.

Per caller line, the moments the answer passed each stage, all on the caller's clock
(`time.monotonic`, the clock the heard-gap meter ticks on); the agent's moments are its
pipeline's push timestamps, moved onto that clock by the smallest offset seen (an observer
runs behind the push, never ahead of it). The heard gap itself stays the meter's:

    caller_end ─ vad_stop ─ stt_final ─ turn_end ─ reply ─ tts_audio ─ bot_started ─ heard

- `vad_stop`: the VAD said the caller stopped (its `stop_secs` of silence, plus its window);
- `stt_final`: the final transcript of the caller's last segment;
- `turn_end`: the user aggregator ended the turn (its turn analyzer, e.g. smart-turn);
- `reply`: the agent's first reply text (its LLM, or a scripted stand-in);
- `tts_audio`: the TTS's first audio of that reply;
- `bot_started`: the output transport started playing it;
- `heard`: the caller received the first voiced frame of it (the meter's end of the gap).

`stage_ms` turns one line's moments into consecutive durations that add up to the heard gap
(a stage whose moment is missing, or out of order, is folded into the next).
"""

from dataclasses import dataclass, field

STAGES = ("vad_stop", "stt_final", "turn_end", "reply", "tts_audio", "bot_started", "heard")
"""The moments in the order an answer passes them."""
DURATIONS = {
    "vad_stop": "endpointing_ms",
    "stt_final": "stt_ms",
    "turn_end": "turn_ms",
    "reply": "reply_ms",
    "tts_audio": "tts_first_audio_ms",
    "bot_started": "playout_ms",
    "heard": "transport_ms",
}
"""Each moment's duration: from the moment before it to it."""
_HEARING = frozenset(("vad_stop", "stt_final", "turn_end"))


@dataclass
class StageTimeline:
    """The stages of each caller line's answer: the caller's clock, seconds."""

    lines: dict[int, dict[str, float]] = field(default_factory=dict)
    """Caller line index (0-based) -> stage -> moment; frozen once the answer is heard."""
    _line: int = -1
    _current: dict[str, float] = field(default_factory=dict)
    _offset: float | None = None

    def caller_line(self, index: int) -> None:
        """The caller started line `index`: its answer's stages start afresh."""
        self._line, self._current = index, {}

    def clock(self, monotonic: float, pipeline_s: float) -> None:
        """One observation of the agent's pipeline clock against the caller's."""
        offset = monotonic - pipeline_s
        self._offset = offset if self._offset is None else min(self._offset, offset)

    def agent(self, stage: str, pipeline_s: float) -> None:
        """The agent reached `stage` at `pipeline_s` on its pipeline clock.

        Of the hearing stages (`vad_stop`, `stt_final`, `turn_end`) the latest counts (a line can
        end in several segments) and drops the answer stages seen before it (the tail of an
        earlier reply); of the answer stages, the first after them.
        """
        if self._line < 0 or self._line in self.lines:
            return
        if stage in _HEARING:
            self._current = {k: v for k, v in self._current.items() if k in _HEARING}
            self._current[stage] = pipeline_s
        elif any(k in _HEARING for k in self._current):
            self._current.setdefault(stage, pipeline_s)

    def heard(self, line: int, caller_end: float, at: float) -> None:
        """The meter took line `line`'s heard gap: from `caller_end` to `at` (caller's clock)."""
        if line != self._line or line in self.lines:
            return
        offset = self._offset or 0.0
        moments = {stage: t + offset for stage, t in self._current.items()}
        self.lines[line] = {"caller_end": caller_end, **moments, "heard": at}

    def stage_ms(self, line: int) -> dict[str, float] | None:
        """Line `line`'s stage durations (ms), summing to its heard gap; None if not heard."""
        moments = self.lines.get(line)
        if moments is None:
            return None
        out, last, heard = {}, moments["caller_end"], moments["heard"]
        for stage in STAGES:
            at = moments.get(stage)
            if at is None or not last <= at <= heard:
                out[DURATIONS[stage]] = 0.0
                continue
            out[DURATIONS[stage]] = round((at - last) * 1000.0, 1)
            last = at
        return out
