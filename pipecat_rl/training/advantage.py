"""Group advantages and training rewards: plain functions, swappable without touching the trainer.

GRPO's advantage is the reward minus its group's mean (dividing by the group's std is optional and
off by default: it inflates ±0.1 shaping noise into full-size advantages). A group whose rewards
are all equal carries no gradient: it is dropped and counted (`frac_reward_zero_std`).
"""

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipecat_rl.ledger import SessionRecord
from pipecat_rl.scoring.rubric import DEFAULT_RUBRIC, Rubric

RewardFn = Callable[[SessionRecord], float | None]
"""A session's training reward (None: not usable, e.g. the scenario verifies nothing)."""

ZERO_STD = 1e-9
"""Rewards closer than this count as equal."""


def rubric_reward(
    rubric: Rubric, *, shaped: bool = True, positive_tool_credit: bool = True
) -> RewardFn:
    """A session's training reward by `rubric` (its authoritative score, plus shaped parts)."""
    return lambda session: rubric.reward(
        session.reward_parts, shaped=shaped, positive_tool_credit=positive_tool_credit
    )


outcome_reward = rubric_reward(DEFAULT_RUBRIC, shaped=False)
"""The authoritative score (`ledger.outcome`: the verifier, else judged success)."""
shaped_reward = rubric_reward(DEFAULT_RUBRIC)
"""The authoritative score plus the default rubric's shaped tool credit (±0.1 per execution)."""


@dataclass(frozen=True)
class GroupAdvantages:
    """The advantages of one group, or why it carries no gradient."""

    key: str
    rewards: list[float]
    advantages: list[float]
    zero_std: bool


def group_advantages(
    key: str, rewards: Sequence[float], *, scale_std: bool = False
) -> GroupAdvantages:
    """Reward minus the group mean (optionally over the group std); zero-variance flagged."""
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0
    zero = std < ZERO_STD
    if zero:
        advantages = [0.0] * len(rewards)
    else:
        advantages = [(r - mean) / (std if scale_std else 1.0) for r in rewards]
    return GroupAdvantages(key, list(rewards), advantages, zero)


def frac_zero_std(groups: dict[str, list[float]]) -> float | None:
    """Share of groups whose rewards are all equal (None for no groups)."""
    if not groups:
        return None
    zero = sum(1 for rewards in groups.values() if group_advantages("", rewards).zero_std)
    return zero / len(groups)
