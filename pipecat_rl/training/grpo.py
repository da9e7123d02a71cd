"""GRPO: groups of episodes of one scenario, advantages within the group, one clipped IS step.

`build_groups` turns scored sessions into advantage-carrying sequences (zero-variance groups
dropped and counted, under the outcome-only and the shaped reward side by side); `grpo_step`
is one optimiser step over them. Both are plain functions: swap the reward, the advantage or the
loss without copying a trainer.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipecat_rl.ledger import SessionRecord
from pipecat_rl.training.advantage import (
    RewardFn,
    frac_zero_std,
    group_advantages,
    rubric_reward,
)
from pipecat_rl.training.config import TrainConfig
from pipecat_rl.training.loss import grpo_loss
from pipecat_rl.training.policy import Policy, score
from pipecat_rl.training.rows import TrainingSequence, sequences_tokens
from pipecat_rl.training.sft import grad_norm

LossFn = Callable[..., tuple[torch.Tensor, Any]]


@dataclass
class Groups:
    """Sequences with their advantages, and how many groups carried gradient."""

    sequences: list[TrainingSequence]
    groups: int
    zero_std_groups: int
    rewards: list[float]
    frac_zero_std_outcome: float | None
    frac_zero_std_shaped: float | None

    @property
    def frac_reward_zero_std(self) -> float | None:
        """Share of groups dropped for equal rewards under the reward trained on."""
        return self.zero_std_groups / self.groups if self.groups else None


def group_key(session: SessionRecord) -> str:
    """Episodes of the same scenario content form a group."""
    return session.scenario_hash or session.scenario_id or session.id


def build_groups(
    sessions: Sequence[SessionRecord],
    sequences: Sequence[TrainingSequence],
    config: TrainConfig,
    *,
    reward_fn: RewardFn | None = None,
) -> Groups:
    """Advantages per group of sessions; a zero-variance group's sequences are dropped."""
    reward_fn = reward_fn or rubric_reward(config.rubric, shaped=config.shaped_reward)
    by_group: dict[str, list[SessionRecord]] = {}
    for s in sessions:
        if reward_fn(s) is not None:
            by_group.setdefault(group_key(s), []).append(s)
    with_shaping = rubric_reward(config.rubric), rubric_reward(config.rubric, shaped=False)
    shaped = {k: [with_shaping[0](s) or 0.0 for s in v] for k, v in by_group.items()}
    outcome = {k: [with_shaping[1](s) or 0.0 for s in v] for k, v in by_group.items()}
    advantage: dict[str, float] = {}
    zero = 0
    rewards: list[float] = []
    for key, members in by_group.items():
        values = [float(reward_fn(s)) for s in members]  # type: ignore[arg-type]
        rewards += values
        result = group_advantages(key, values, scale_std=config.scale_std)
        zero += result.zero_std
        if not result.zero_std:
            advantage.update({s.id: a for s, a in zip(members, result.advantages, strict=True)})
    kept = []
    for seq in sequences:
        if seq.session_id in advantage:
            seq.advantage = advantage[seq.session_id]
            kept.append(seq)
    return Groups(
        sequences=kept,
        groups=len(by_group),
        zero_std_groups=zero,
        rewards=rewards,
        frac_zero_std_outcome=frac_zero_std(outcome),
        frac_zero_std_shaped=frac_zero_std(shaped),
    )


def grpo_step(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    sequences: Sequence[TrainingSequence],
    config: TrainConfig,
    *,
    loss_fn: LossFn = grpo_loss,
) -> dict[str, Any]:
    """One optimiser step over `sequences` (advantages set); returns its metrics."""
    started = time.monotonic()
    num_tokens = sequences_tokens(sequences)
    optimizer.zero_grad(set_to_none=True)
    policy.model.train()
    total_loss, entropies, stats = 0.0, [], []
    for seq in sequences:
        scores = score(policy.model, seq.input_ids, seq.loss_mask)
        sampler = _aligned(seq)
        loss, stat = loss_fn(
            scores.logprobs,
            sampler,
            seq.advantage,
            num_tokens=num_tokens,
            clip_low=config.clip_low,
            clip_high=config.clip_high,
            sequence_mask_c=config.sequence_mask_c,
            beta=config.beta,
        )
        loss.backward()
        total_loss += loss.item()
        entropies.append(float(scores.entropy.mean()))
        stats.append(stat)
    norm = grad_norm(policy)
    torch.nn.utils.clip_grad_norm_(
        [p for p in policy.model.parameters() if p.requires_grad], config.max_grad_norm
    )
    optimizer.step()
    elapsed = time.monotonic() - started
    tokens = sum(len(s.input_ids) for s in sequences)
    return {
        "policy_loss": round(total_loss, 6),
        "kl": _mean([s.kl for s in stats]),
        "clip_ratio": _mean([s.clip_ratio for s in stats]),
        "sampling_logp_difference/mean": _mean([s.logp_diff_mean for s in stats]),
        "sampling_logp_difference/max": max((s.logp_diff_max for s in stats), default=0.0),
        "importance_ratio/min": min((s.ratio_min for s in stats), default=1.0),
        "importance_ratio/mean": _mean([s.ratio_mean for s in stats]),
        "importance_ratio/max": max((s.ratio_max for s in stats), default=1.0),
        "masked_sequences": sum(s.masked_sequence for s in stats),
        "grad_norm": round(norm, 6),
        "entropy": _mean(entropies),
        "num_tokens": num_tokens,
        "tokens_per_s": round(tokens / max(elapsed, 1e-9), 1),
        "step_time": round(elapsed, 3),
    }


def _aligned(seq: TrainingSequence) -> torch.Tensor:
    """The sampler's logprobs at the loss positions `score` returns (position 0 never scores)."""
    values = [lp for t, (lp, m) in enumerate(zip(seq.sampler_logprobs, seq.loss_mask, strict=True))
              if m and t > 0]  # fmt: skip
    return torch.tensor(values, dtype=torch.float32)


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 6) if values else 0.0
