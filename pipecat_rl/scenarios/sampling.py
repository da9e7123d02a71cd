"""A fixed, stratified sample of a scenario set: what a cycle gates on when the set is large.

Why a sample, and why this one: the gate's minimum detectable effect falls with the number of
*scenarios* (variance between scenarios dominates; repeats of one scenario agree), so a cycle
on two cores gates on many scenarios run once rather than all of a matrix run twice. The sample
is spread evenly: each pick is a scenario of the stratum (its values on the `by` axes, e.g. a
held-out set's unit, the combination of style, task and fault) the sample holds least often, then
the one whose axis values, then pairs of values, the sample holds least often, so every stratum
is drawn once before any is drawn twice and every style, task and fault, and every pair the
hot-spot table shows, gets its share. It is fixed: the same set and size give the same
scenarios on any machine (ties go by a hash of the id, never by the run's seed), so a resumed
cycle and its receipt name the same calls. Scenarios not expanded from a template have no
axes: they are drawn by that hash.
"""

import hashlib
from collections import Counter
from collections.abc import Sequence
from itertools import combinations

from pipecat_rl.errors import ScenarioError
from pipecat_rl.scenarios.matrix import axes_of
from pipecat_rl.scenarios.scenario import Scenario, ScenarioSet

Feature = tuple[str, ...]


def _features(scenario: Scenario) -> tuple[list[Feature], list[Feature]]:
    """Its axis values, and its pairs of them (`[]`, `[]` for a scenario without axes)."""
    axes = sorted((axes_of(scenario.id) or {}).items())
    singles = [(axis, value) for axis, value in axes]
    pairs = [(*a, *b) for a, b in combinations(singles, 2)]
    return singles, pairs


def _tie(scenario: Scenario) -> str:
    return hashlib.sha256(scenario.id.encode()).hexdigest()


def stratified_sample(
    scenarios: ScenarioSet, n: int, *, by: Sequence[str] = (), what: str = "sample"
) -> ScenarioSet:
    """`n` scenarios of `scenarios`, spread over `by`'s strata and their axes.

    All of them when `n` is at least the set's size. The order of the result is the set's
    own; `heldout_set_id` is kept (the sample is a fixed function of the frozen set, `n` and
    `by`).

    Raises:
        ScenarioError: `n` is below 1, or an axis of `by` is not an axis of every scenario
            (named as `what`).
    """
    if n < 1:
        raise ScenarioError(f"{what}: {n} is not a sample size: give 1 or more scenarios")
    strata: dict[str, Feature] = {}
    for s in scenarios:
        axes = axes_of(s.id) or {}
        missing = [a for a in by if a not in axes]
        if missing:
            raise ScenarioError(
                f"{what}: {s.id} has no axis {missing[0]!r} to stratify by (its axes: "
                f"{', '.join(axes) or 'none'})"
            )
        strata[s.id] = tuple(axes[a] for a in by)
    if n >= len(scenarios):
        return scenarios
    features = {s.id: _features(s) for s in scenarios}
    drawn: Counter[Feature] = Counter()
    singles: Counter[Feature] = Counter()
    pairs: Counter[Feature] = Counter()
    left = sorted(scenarios, key=_tie)
    chosen: set[str] = set()
    for _ in range(n):

        def cost(s: Scenario) -> tuple[int, int, int, int]:
            one, two = features[s.id]
            return (
                drawn[strata[s.id]],  # without `by` every stratum is (): no preference
                sum(singles[f] for f in one),
                max((singles[f] for f in one), default=0),
                sum(pairs[f] for f in two),
            )

        best = min(left, key=cost)  # `left` is in hash order: ties go to the first
        left.remove(best)
        chosen.add(best.id)
        drawn[strata[best.id]] += 1
        one, two = features[best.id]
        singles.update(one)
        pairs.update(two)
    return scenarios.model_copy(update={"scenarios": [s for s in scenarios if s.id in chosen]})
