"""Progress on stderr: a bar (or spinner) on a terminal, lines elsewhere.

A rich bar written to a file or pipe shows nothing until it ends, so a CI log or `> log` of an
hour of calls was silent; there each call gets one line (`[12/96] routine_booking#1 pass (8.4 s)`)
instead. `--progress auto|bar|lines|none` chooses; auto asks whether stderr is a terminal. A
server that takes a minute and a half to start (`llm serve`) shows what it is doing the same way.
"""

from types import TracebackType
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.status import Status

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


class StartupProgress:
    """What a starting server is doing and for how long: a spinner, or a line per stage.

    In `lines` mode a stage that lasts gets a line every `TICK_S` too, so a log never goes quiet
    for longer than that. A context manager; `update` it as often as it likes.
    """

    TICK_S = 15.0

    def __init__(self, label: str, mode: ProgressMode):
        self.label, self.mode = label, chosen(mode)
        self._status = Status(label, console=console)
        self._said: tuple[str | None, float] | None = None
        """The stage the last line named, and when."""

    def __enter__(self) -> "StartupProgress":
        if self.mode == "bar":
            self._status.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._status.stop()

    def update(self, elapsed_s: float, stage: str | None) -> None:
        """The server has been starting for `elapsed_s` and is at `stage` (None: not said yet)."""
        doing = stage or "starting"
        if self.mode == "bar":
            self._status.update(f"{self.label}: {doing} ({elapsed_s:.0f} s)")
        elif self.mode == "lines" and (
            self._said is None or stage != self._said[0] or elapsed_s - self._said[1] >= self.TICK_S
        ):
            self._said = (stage, elapsed_s)
            console.print(
                f"{self.label}: {doing} ({elapsed_s:.0f} s)",
                markup=False, highlight=False, soft_wrap=True,
            )  # fmt: skip
