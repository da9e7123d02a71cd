"""Regression tests that can fire at the repeats the gate runs: exact tests on discordant pairs.

A paired run is discordant when the two arms' scores differ by more than the tie band: the
candidate lost it (worse) or won it (better); runs that agree say nothing about a difference.
If a unit did not get worse, each of its discordant runs is a loss with probability at most 1/2
(for pass/fail scores, p_inc (1 - p_cand) <= p_cand (1 - p_inc) whenever p_cand >= p_inc), so
P(Binomial(D, 1/2) >= W) for W losses of D discordant runs is an exact, conservative p-value:
McNemar's exact test, one-sided.

Units (`GateConfig.regression_tests`):

- `pooled`: every paired run of every scenario, one test;
- `groups`: each named group of scenarios (`regression_groups`, say one per intent), pooled;
- `scenarios`: each scenario on its own runs.

Every unit tested forms one family, controlled by Holm at `regression_alpha` (the chance that any
unit that did not get worse is confirmed is at most alpha). A unit of N paired runs reaches at
best p = 2^-N (all lost, none won), and Holm's first step needs alpha / m over m tests, so it can
confirm anything only with N >= log2(m / alpha): one scenario at 24 scenarios and alpha 0.05
needs 9 repeats. `check_design` refuses a configuration in which a configured kind of test could
never fire, naming the repeats it needs; each test records the smallest loss it could confirm.
"""

import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pipecat_rl.errors import ConfigError
from pipecat_rl.gate.config import GateConfig, RegressionKind
from pipecat_rl.gate.stats import Result, binomial_tail, holm

POOLED_UNIT = "all scenarios"


@dataclass(frozen=True)
class Unit:
    """One hypothesis of the family: a kind, a name, and the scenarios (by index) it pools."""

    kind: RegressionKind
    name: str
    members: tuple[int, ...]


class RegressionTest(Result):
    """One unit's exact test, and where it stands in the family."""

    kind: RegressionKind
    unit: str
    scenarios: int
    pairs: int
    worse: int
    """Discordant paired runs the candidate lost (scored below the incumbent beyond the band)."""
    better: int
    p_value: float
    """P(Binomial(worse + better, 1/2) >= worse): small means the unit surely got worse."""
    tested: bool
    """False when the unit has too few runs to be confirmed at all (left out of the family)."""
    adjusted_p: float | None
    """Holm-adjusted over the tested units; the unit is confirmed when this is <= alpha."""
    confirmed: bool
    fewest_losses: int | None
    """The fewest lost runs (with none won) that would confirm this unit; None: untested."""


def group_members(groups: Mapping[str, Sequence[str]], scenario_ids: Sequence[str]) -> dict:
    """Each group's scenario indices, by its glob patterns over scenario ids.

    Raises:
        ConfigError: a group matches no scenario, or a scenario matches two groups.
    """
    out: dict[str, tuple[int, ...]] = {}
    owner: dict[int, str] = {}
    for name, patterns in groups.items():
        members = tuple(
            i
            for i, sid in enumerate(scenario_ids)
            if any(fnmatch.fnmatch(sid, p) for p in patterns)
        )
        if not members:
            raise ConfigError(
                f"regression group {name!r} ({', '.join(patterns)}) matches none of the "
                f"{len(scenario_ids)} scenarios gated; fix its patterns or remove it"
            )
        for i in members:
            if i in owner:
                raise ConfigError(
                    f"scenario {scenario_ids[i]!r} is in regression groups {owner[i]!r} and "
                    f"{name!r}; a scenario may be in one group only"
                )
            owner[i] = name
        out[name] = members
    return out


def units(config: GateConfig, scenario_ids: Sequence[str]) -> list[Unit]:
    """The family's units, in the order of `config.regression_tests`."""
    out: list[Unit] = []
    for kind in config.regression_tests:
        if kind == "pooled":
            out.append(Unit(kind, POOLED_UNIT, tuple(range(len(scenario_ids)))))
        elif kind == "groups":
            members = group_members(config.regression_groups, scenario_ids)
            out += [Unit(kind, name, m) for name, m in members.items()]
        else:
            out += [Unit(kind, sid, (i,)) for i, sid in enumerate(scenario_ids)]
    return out


def losses_to_confirm(tests: int, alpha: float) -> int:
    """The fewest lost runs (none won) that pass Holm's first step: 2^-w <= alpha / tests."""
    return max(1, math.ceil(math.log2(max(1, tests) / alpha) - 1e-12))


def testable(family: Sequence[Unit], pairs: Sequence[int], alpha: float) -> list[bool]:
    """Which units have the runs to be confirmed at all: N >= `losses_to_confirm` of the family.

    A unit that could not be confirmed even losing all its runs is left out of Holm's family
    (the choice depends on run counts only, never on outcomes, so the error control holds) and
    shown as untested.
    """
    need = losses_to_confirm(len(family), alpha)
    return [sum(pairs[i] for i in u.members) >= need for u in family]


def check_design(config: GateConfig, scenario_ids: Sequence[str], repeats: int) -> list[Unit]:
    """The units that can fire at `repeats` runs per scenario; refuse a requested kind that cannot.

    A kind of test the configuration names explicitly (`regression_tests` set in the file or by a
    flag) must be able to fire in every one of its units. The default pooled test on a gate too
    small for it is left out and reported as untested instead.

    Raises:
        ConfigError: a unit of an explicitly requested kind could not be confirmed even if the
            candidate lost every one of its runs; the message names the repeats it needs.
    """
    family = units(config, scenario_ids)
    able = testable(family, [repeats] * len(scenario_ids), config.regression_alpha)
    if "regression_tests" in config.model_fields_set:
        need = losses_to_confirm(len(family), config.regression_alpha)
        for unit, ok in zip(family, able, strict=True):
            if ok:
                continue
            size = len(unit.members)
            what = {"pooled": "the pooled", "groups": f"group {unit.name!r}'s",
                    "scenarios": "a per-scenario"}[unit.kind]  # fmt: skip
            level, minimum = config.regression_alpha / len(family), math.ceil(need / size)
            merge = " (or merge small groups)" if unit.kind == "groups" else ""
            raise ConfigError(
                f"{what} regression test cannot fire at {repeats} repeat(s): {size} "
                f"scenario(s) x {repeats} run(s), all lost, reach p = 2^-{size * repeats} at "
                f"best, and Holm over {len(family)} test(s) at regression_alpha "
                f"{config.regression_alpha:g} needs p <= {level:.3g}. Run at least {minimum} "
                f"repeats, or drop `{unit.kind}` from regression_tests{merge}"
            )
    return [u for u, ok in zip(family, able, strict=True) if ok]


def membership(family: Sequence[Unit], n_scenarios: int) -> np.ndarray:
    """The units x scenarios 0/1 matrix that sums scenario counts into unit counts."""
    matrix = np.zeros((len(family), n_scenarios))
    for row, unit in enumerate(family):
        matrix[row, list(unit.members)] = 1.0
    return matrix


def discordant(candidate: np.ndarray, incumbent: np.ndarray, band: float):
    """Per scenario (last axis: runs), how many paired runs were lost and won beyond `band`."""
    diff = np.asarray(candidate, float) - np.asarray(incumbent, float)
    return (diff < -band).sum(axis=-1), (diff > band).sum(axis=-1)


def family_tests(
    worse: np.ndarray, better: np.ndarray, matrix: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Unit losses, wins, p-values, Holm-adjusted p-values and confirmations (vectorised).

    `worse` and `better` are per-scenario counts along the last axis; `matrix` is `membership`.
    """
    unit_worse = np.rint(np.asarray(worse, float) @ matrix.T).astype(int)
    unit_better = np.rint(np.asarray(better, float) @ matrix.T).astype(int)
    p = binomial_tail(unit_worse, unit_worse + unit_better)
    adjusted, confirmed = holm(p, alpha)
    return unit_worse, unit_better, p, adjusted, confirmed


def regression_family(
    worse: Sequence[int],
    better: Sequence[int],
    pairs: Sequence[int],
    scenario_ids: Sequence[str],
    config: GateConfig,
) -> list[RegressionTest]:
    """Every unit's test on one gate's per-scenario counts (see the module docstring).

    Units without the runs to be confirmed are listed untested; Holm runs over the others.
    """
    family = units(config, scenario_ids)
    if not family:
        return []
    able = testable(family, pairs, config.regression_alpha)
    need = losses_to_confirm(len(family), config.regression_alpha)
    matrix = membership(family, len(scenario_ids))
    w, b, p, _, _ = family_tests(np.asarray(worse), np.asarray(better), matrix, 1.0)
    tested = [i for i, ok in enumerate(able) if ok]
    adjusted, confirmed = (
        holm(p[tested], config.regression_alpha) if tested else (np.array([]), np.array([]))
    )
    position = {i: k for k, i in enumerate(tested)}
    unit_pairs = np.rint(matrix @ np.asarray(pairs, float)).astype(int)
    return [
        RegressionTest(
            kind=u.kind,
            unit=u.name,
            scenarios=len(u.members),
            pairs=int(unit_pairs[i]),
            worse=int(w[i]),
            better=int(b[i]),
            p_value=float(p[i]),
            tested=able[i],
            adjusted_p=float(adjusted[position[i]]) if able[i] else None,
            confirmed=bool(confirmed[position[i]]) if able[i] else False,
            fewest_losses=need if able[i] else None,
        )  # fmt: skip
        for i, u in enumerate(family)
    ]


# -- a fixed regression suite -------------------------------------------------------------------

SUITE_UNIT = "the regression suite"
"""The suite's one unit, as the receipt names it."""


def suite_tests(
    worse: Sequence[int],
    better: Sequence[int],
    pairs: Sequence[int],
    scenario_ids: Sequence[str],
    config: GateConfig,
) -> list[RegressionTest]:
    """The regression suite's one exact test: every paired run of its scenarios pooled.

    A suite (`loop.yaml`'s `regressions:`, e.g. `ledger fork --failed`) holds calls that went
    wrong before, and asks one question of a candidate: is it surely worse than the incumbent
    there? "No regression", not "better": the suite never adds to the paired score the
    verdict promotes on. Pooled, because at the repeats a gate runs a test per scenario can
    never fire (a scenario reaches p = 2^-K at best); at `config.regression_alpha`, alone in its
    family.
    """
    own = GateConfig(regression_alpha=config.regression_alpha, regression_tests=("pooled",))
    tests = regression_family(worse, better, pairs, scenario_ids, own)
    return [t.model_copy(update={"unit": SUITE_UNIT}) for t in tests]


def check_suite_design(scenarios: int, repeats: int, alpha: float, where: str) -> None:
    """Refuse a suite whose test could never fire: all its runs lost would not confirm a loss.

    Raises:
        ConfigError: `scenarios` x `repeats` runs reach p = 2^-n > `alpha` at best; the message
            names `where` (the suite's setting) and the repeats it needs.
    """
    need = losses_to_confirm(1, alpha)
    if scenarios * repeats >= need:
        return
    raise ConfigError(
        f"{where}: {scenarios} scenario(s) x {repeats} repeat(s) is {scenarios * repeats} paired "
        f"run(s); losing all of them reaches p = 2^-{scenarios * repeats} at best, above "
        f"regression_alpha {alpha:g}, so the suite's no-regression test could never fire. Run "
        f"at least {math.ceil(need / max(1, scenarios))} repeats, or add scenarios (the suite "
        f"needs {need} paired runs)"
    )
