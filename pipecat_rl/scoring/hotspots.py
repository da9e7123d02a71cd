"""Hot spots: outcomes grouped by the axis values of a scenario matrix, and by pairs of them.

A scenario expanded from a matrix is named `template[axis=value,...]`; whoever calls this reads
the axes back (`pipecat_rl.scenarios.axes_of`) and passes them in, so scoring stays below the
scenarios. Each run is one `AxisRun`: its scenario, its axes, whether it passed (the verdict of
`outcome_passed` or `passed`, None where none was reached), its labels and its unauthorised writes.
`hot_spots` groups the runs into cells:

- one per axis value (`style=terse`) and one per pair of values of two axes (`style=terse,
  task=book`), each with its runs, verified runs, passes, pass rate (passes over verified runs,
  as in every table), failures, label counts, unauthorised writes and the scenarios behind it;
- worst first: the lowest pass rate, then the most failures, then the most writes;
- a cell with fewer verified runs than `min_runs` is flagged `few` and listed after every ranked
  cell: two failed runs are not a hot spot but a reason to run more.

Runs of a scenario without axes (a hand-written one) belong to no cell: they are left out of
every cell and counted (`HotSpots.without_axes`); the per-scenario table already shows them.
"""

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from pydantic import BaseModel, ConfigDict

DEFAULT_MIN_RUNS = 3
"""Verified runs a cell needs to be ranked; one with fewer is flagged `few`, not ranked."""


@dataclass(frozen=True)
class AxisRun:
    """One run, as the hot-spot tables count it."""

    scenario_id: str
    axes: Mapping[str, str] | None
    """Axis -> value of its scenario (`axes_of`); None or empty for a hand-written scenario."""
    passed: bool | None
    """`outcome_passed` of its stored outcome (or `passed` on its parts); None: no verdict."""
    labels: Sequence[str] = field(default_factory=tuple)
    unauthorized_writes: int = 0


class HotSpotRow(BaseModel):
    """One cell: the runs whose scenario has these axis values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cell: dict[str, str]
    """Axis -> value: one axis (a value row) or two (a pair row), in the axes' order."""
    runs: int
    verified: int
    """Runs with a verdict: the pass rate's denominator."""
    passes: int
    failures: int
    """Verified runs that did not pass."""
    pass_rate: float | None
    """Passes over verified runs; None when none was verified."""
    unauthorized_writes: int
    runs_with_writes: int
    labels: dict[str, int]
    """Each label's count over the cell's runs, most frequent first."""
    scenarios: int
    """Distinct scenarios behind the cell (runs of one scenario are not independent)."""
    few: bool
    """Fewer verified runs than `min_runs`: flagged, not ranked."""

    @property
    def name(self) -> str:
        """The cell as people read it: `style=terse, task=book`."""
        return ", ".join(f"{axis}={value}" for axis, value in self.cell.items())


class HotSpots(BaseModel):
    """Outcomes per axis value and per pair of axis values, worst first."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    axes: list[str]
    """The axes grouped by, in the order their scenarios declare them."""
    min_runs: int
    values: list[HotSpotRow]
    """One row per value of each axis: ranked rows worst first, then the `few` ones."""
    pairs: list[HotSpotRow]
    """One row per pair of values of two axes (every pair of `axes`), in the same order."""
    without_axes: int
    """Runs of scenarios without axes (hand-written), left out of every row."""

    def worst(self, n: int, *, few: bool = False) -> list[HotSpotRow]:
        """The `n` worst rows of both kinds; `few` rows only with `few`, after every ranked one."""
        rows = [r for r in (*self.values, *self.pairs) if few or not r.few]
        return sorted(rows, key=_badness)[:n]


def _badness(row: HotSpotRow) -> tuple:
    rate = 2.0 if row.pass_rate is None else row.pass_rate  # nothing verified: last
    return (row.few, rate, -row.failures, -row.unauthorized_writes, -row.verified, row.name)


def _row(cell: dict[str, str], runs: list[AxisRun], min_runs: int) -> HotSpotRow:
    verdicts = [r.passed for r in runs if r.passed is not None]
    passes = sum(verdicts)
    labels = Counter(label for r in runs for label in r.labels)
    return HotSpotRow(
        cell=cell,
        runs=len(runs),
        verified=len(verdicts),
        passes=passes,
        failures=len(verdicts) - passes,
        pass_rate=passes / len(verdicts) if verdicts else None,
        unauthorized_writes=sum(r.unauthorized_writes for r in runs),
        runs_with_writes=sum(1 for r in runs if r.unauthorized_writes),
        labels=dict(sorted(labels.items(), key=lambda kv: (-kv[1], kv[0]))),
        scenarios=len({r.scenario_id for r in runs}),
        few=len(verdicts) < min_runs,
    )


def axes_seen(runs: Iterable[AxisRun]) -> list[str]:
    """Every axis the runs' scenarios have, in the order first seen (their declared order)."""
    seen: dict[str, None] = {}
    for run in runs:
        seen.update(dict.fromkeys(run.axes or {}))
    return list(seen)


def hot_spots(
    runs: Iterable[AxisRun], by: Sequence[str] | None = None, *, min_runs: int = DEFAULT_MIN_RUNS
) -> HotSpots:
    """Group `runs` by each axis value of `by` and each pair of them (None: every axis).

    An axis of `by` that no run has makes no row. A run whose scenario lacks one of a cell's
    axes is not in that cell; one whose scenario has no axes is in none (`without_axes`).

    Raises:
        ValueError: `min_runs` is below 1.
    """
    if min_runs < 1:
        raise ValueError(f"min_runs is {min_runs}; a cell needs at least 1 verified run")
    runs = list(runs)
    present = axes_seen(runs)
    axes = present if by is None else [a for a in dict.fromkeys(by) if a in present]
    groupings = [(a,) for a in axes], list(combinations(axes, 2))
    tables: list[list[HotSpotRow]] = []
    for grouping in groupings:
        cells: dict[tuple[tuple[str, str], ...], list[AxisRun]] = {}
        for run in runs:
            have = run.axes or {}
            for group in grouping:
                if all(a in have for a in group):
                    cells.setdefault(tuple((a, have[a]) for a in group), []).append(run)
        rows = [_row(dict(key), members, min_runs) for key, members in cells.items()]
        tables.append(sorted(rows, key=_badness))
    return HotSpots(
        axes=axes,
        min_runs=min_runs,
        values=tables[0],
        pairs=tables[1],
        without_axes=sum(1 for r in runs if not r.axes),
    )
