"""Progress of simulated calls on stderr: a bar on a terminal, a line per call elsewhere.

A rich bar written to a file or pipe shows nothing until it ends, so a CI log or `> log` of an
hour of calls was silent; there each call gets one line (`[12/96] routine_booking#1 pass (8.4 s)`)
instead. `--progress auto|bar|lines|none` chooses; auto asks whether stderr is a terminal.
"""

from types import TracebackType
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipecat_rl.cli.common import console

if TYPE_CHECKING:
    from pipecat_rl.simulator.runner import EpisodeResult

ProgressMode = Literal["auto", "bar", "lines", "none"]

ProgressOpt = Annotated[
    ProgressMode,
    typer.Option(
        "--progress",
        help="auto: a bar on a terminal, else a line per call (on stderr); bar, lines or none.",
    ),
]


def chosen(mode: ProgressMode) -> ProgressMode:
    """`auto` made concrete: a bar where stderr is a terminal, lines elsewhere."""
    if mode != "auto":
        return mode
    return "bar" if console.is_terminal else "lines"


class CallProgress:
    """Counts calls as they end and shows them as `mode` says; a context manager."""

    def __init__(self, total: int, label: str, mode: ProgressMode):
        self.total, self.label, self.mode, self.done = total, label, chosen(mode), 0
        self._bar = Progress(
            TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, disable=self.mode != "bar",
        )  # fmt: skip
        self._task = self._bar.add_task(label, total=total)

    def __enter__(self) -> "CallProgress":
        self._bar.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._bar.__exit__(kind, error, tb)

    def ended(self, episode: "EpisodeResult") -> None:
        """One call ended: advance the bar, or print its line."""
        self.done += 1
        self._bar.advance(self._task)
        if self.mode == "lines":
            console.print(
                f"{self.label} [{self.done}/{self.total}] {episode.scenario_id}#{episode.repeat} "
                f"{episode.outcome} ({episode.duration_s:.1f} s)",
                markup=False, highlight=False, soft_wrap=True,
            )  # fmt: skip
