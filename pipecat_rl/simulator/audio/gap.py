"""The channel gap: the same scenarios, seeds and adapter down text and audio, label by label.

For each failure label that the channel can move (misheard slot, tool error, dead loop,
unauthorised write), the share of text-mode episodes that carry it, the share of audio-mode
episodes that do, and the difference (audio - text): what speech in the loop costs the agent.
Rendered as a terminal table, JSON (`--json`) and a section of a self-contained HTML page.
"""

import html
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from rich.table import Table

from pipecat_rl.scoring import SessionOutcome
from pipecat_rl.simulator.rewards import DEAD_LOOP, MISHEARD_SLOT, TOOL_ERROR, UNAUTHORISED_WRITE

GAP_LABELS = (MISHEARD_SLOT, TOOL_ERROR, DEAD_LOOP, UNAUTHORISED_WRITE)


class LabelGap(BaseModel):
    """One label's rate in each channel and the difference."""

    model_config = ConfigDict(frozen=True)

    label: str
    text_rate: float | None
    audio_rate: float | None
    difference: float | None
    """audio_rate - text_rate (None when either channel ran no episode)."""


class ChannelGap(BaseModel):
    """Per-label rates of one text run and one audio run of the same scenarios and seeds."""

    model_config = ConfigDict(frozen=True)

    text_episodes: int
    audio_episodes: int
    labels: list[LabelGap]
    note: str = "rates are over episodes that ran (harness errors excluded)"


def _rate(label: str, episodes: Sequence) -> float | None:
    ran = [e for e in episodes if e.outcome != SessionOutcome.ERROR]
    return sum(1 for e in ran if label in e.labels) / len(ran) if ran else None


def channel_gap(text: Sequence, audio: Sequence) -> ChannelGap:
    """The gap between the episodes (`EpisodeResult`s) of a text run and an audio run."""
    rows = []
    for label in GAP_LABELS:
        t, a = _rate(label, text), _rate(label, audio)
        diff = None if t is None or a is None else round(a - t, 6)
        rows.append(LabelGap(label=label, text_rate=t, audio_rate=a, difference=diff))
    return ChannelGap(
        text_episodes=sum(1 for e in text if e.outcome != SessionOutcome.ERROR),
        audio_episodes=sum(1 for e in audio if e.outcome != SessionOutcome.ERROR),
        labels=rows,
    )


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value * 100:+.0f} pp" if signed else f"{value * 100:.0f}%"


def gap_table(gap: ChannelGap) -> Table:
    """The gap as a terminal table."""
    table = Table(
        title=f"channel gap ({gap.text_episodes} text vs {gap.audio_episodes} audio episodes)",
        title_justify="left",
    )
    for column in ("label", "text", "audio", "audio - text"):
        table.add_column(column, justify="left" if column == "label" else "right")
    for row in gap.labels:
        table.add_row(
            row.label, _pct(row.text_rate), _pct(row.audio_rate), _pct(row.difference, True)
        )
    return table


def gap_section(gap: ChannelGap) -> str:
    """The gap as an HTML section (a table and one bar per channel and label)."""
    rows = []
    for row in gap.labels:
        bars = "".join(
            f'<div class="bar {cls}" style="width:{(rate or 0) * 100:.1f}%" '
            f'title="{cls} {_pct(rate)}"></div>'
            for cls, rate in (("text", row.text_rate), ("audio", row.audio_rate))
        )
        rows.append(
            f"<tr><td>{html.escape(row.label)}</td><td>{_pct(row.text_rate)}</td>"
            f"<td>{_pct(row.audio_rate)}</td><td>{_pct(row.difference, True)}</td>"
            f'<td class="bars">{bars}</td></tr>'
        )
    return (
        '<section id="channel-gap"><h2>Channel gap</h2>'
        f"<p>{gap.text_episodes} text and {gap.audio_episodes} audio episodes of the same "
        f"scenarios and seeds; {html.escape(gap.note)}.</p>"
        "<table><thead><tr><th>label</th><th>text</th><th>audio</th><th>audio − text</th>"
        "<th></th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></section>"
    )


_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:60em}
table{border-collapse:collapse}
td,th{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child{text-align:left}.bars{width:16em}
.bar{height:.6em;margin:.15em 0}.bar.text{background:#4878d0}.bar.audio{background:#ee854a}"""


def write_gap_page(gap: ChannelGap, path: Path) -> Path:
    """A self-contained HTML page holding the gap section (no scripts, no external files)."""
    path.parent.mkdir(parents=True, exist_ok=True)  # as `mkdir -p`: --gap-html reports/gap.html
    path.write_text(
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>pipecat-rl channel gap</title><style>{_STYLE}</style></head>"
        f"<body><h1>pipecat-rl simulate: text vs audio</h1>{gap_section(gap)}</body></html>",
        encoding="utf-8",
    )
    return path
