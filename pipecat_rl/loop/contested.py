"""The scenarios RL trains on, and why each is there: chosen as the gate will see the policy.

From runs of the policy RL starts from at the bot's own temperature (the one the gate samples
at), a pool scenario is in when the policy fails it at least once there, however rarely: those
failures are what the gate will count. A scenario where acting is wrong (its checks hold on its
world as given, so any write can only break them: an out-of-scope caller, a price question) is
in even when every run passed: without it a step's groups all reward acting, and the policy
learns to act where it must not (issue 34: GRPO lost most on such scenarios). A scenario passed
in every run where acting is right, or with no verified run, is left out: no signal there.
"""

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from pipecat_rl.scenarios import Scenario


def runs_by_scenario(episodes: Iterable[Any]) -> dict[str, list[bool]]:
    """Each scenario's verified runs, from a simulation report's episodes (`EpisodeResult`).

    Unverified runs (`passed` None) are left out.
    """
    by: dict[str, list[bool]] = {}
    for e in episodes:
        if e.passed is not None:
            by.setdefault(e.scenario_id, []).append(e.passed)
    return by


def acting_is_wrong(scenario: Scenario) -> bool:
    """Whether the scenario's checks all hold on its world as given.

    Then a call that writes nothing passes and any write can only fail it (a refusal, an
    out-of-scope call, a price question).
    """
    from pipecat_rl.simulator.world import World

    if not scenario.verify:
        return False
    world = World(scenario)
    try:
        return all(check.passed for check in world.verify())
    finally:
        world.close()


def rl_scenarios(runs: Mapping[str, Sequence[bool]], restraint: Collection[str]) -> dict[str, str]:
    """The scenarios RL trains on, each with why, from `runs` at the gate's temperature.

    Args:
        runs: per scenario id, its verified runs (passed or not).
        restraint: the ids of scenarios where acting is wrong (`acting_is_wrong`).
    """
    chosen: dict[str, str] = {}
    for scenario, verdicts in sorted(runs.items()):
        passes, n = sum(verdicts), len(verdicts)
        why = []
        if passes < n:
            why.append(f"fails {n - passes} of {n} at the gate's temperature")
        if scenario in restraint:
            why.append(f"acting is wrong (passes {passes} of {n})")
        if why:
            chosen[scenario] = "; ".join(why)
    return chosen
