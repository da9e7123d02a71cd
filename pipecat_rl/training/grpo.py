"""GRPO: groups of episodes of one scenario, advantages within the group, clipped IS steps.

`build_groups` turns scored sessions into advantage-carrying sequences (zero-variance groups
dropped and counted, under the outcome-only and the shaped reward side by side). Online,
`dynamic_sampling` first redraws the groups whose rewards all agree (DAPO's dynamic sampling,
capped by `max_resample_rounds`), so a step trains on groups that carry gradient. `grpo_update`
runs several optimiser steps (`grpo_step`) over one batch of them, PPO-style, against the policy
that started the batch and importance-corrected towards the sampler. Every sequence is scored at
the temperature its turns were sampled at, as vLLM sampled it. All plain functions: swap the
reward, the advantage or the loss without copying a trainer.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from loguru import logger

from pipecat_rl.ledger import SessionRecord, TurnRecord
from pipecat_rl.training.advantage import (
    RewardFn,
    frac_zero_std,
    group_advantages,
    rubric_reward,
)
from pipecat_rl.training.config import TrainConfig
from pipecat_rl.training.loss import grpo_loss
from pipecat_rl.training.policy import Policy, TokenScores, score
from pipecat_rl.training.rows import TrainingSequence, mini_batches, sequences_tokens
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


def trained_reward(config: TrainConfig, *, shaped: bool | None = None) -> RewardFn:
    """The reward `config` trains on: the rubric's authoritative part, shaped or not.

    Tool credit's positive side only where `config.positive_tool_credit` asks for it;
    `shaped`: as `config.shaped_reward` (None), or the other way, for the step log.
    """
    return rubric_reward(
        config.rubric,
        shaped=config.shaped_reward if shaped is None else shaped,
        positive_tool_credit=config.positive_tool_credit,
    )


def rewards_by_group(
    sessions: Sequence[SessionRecord], reward_fn: RewardFn
) -> dict[str, list[tuple[SessionRecord, float]]]:
    """The sessions with a reward, by group (`group_key`), each beside its reward."""
    by_group: dict[str, list[tuple[SessionRecord, float]]] = {}
    for s in sessions:
        reward = reward_fn(s)
        if reward is not None:
            by_group.setdefault(group_key(s), []).append((s, float(reward)))
    return by_group


def equal_reward_groups(sessions: Sequence[SessionRecord], reward_fn: RewardFn) -> list[str]:
    """The groups whose rewards all agree: zero advantage everywhere, so no gradient."""
    return [
        key
        for key, members in rewards_by_group(sessions, reward_fn).items()
        if group_advantages(key, [r for _, r in members]).zero_std
    ]


def build_groups(
    sessions: Sequence[SessionRecord],
    sequences: Sequence[TrainingSequence],
    config: TrainConfig,
    *,
    reward_fn: RewardFn | None = None,
) -> Groups:
    """Advantages per group of sessions; a zero-variance group's sequences are dropped (logged)."""
    by_group = rewards_by_group(sessions, reward_fn or trained_reward(config))
    with_shaping = trained_reward(config, shaped=True), trained_reward(config, shaped=False)
    shaped = {k: [with_shaping[0](s) or 0.0 for s, _ in v] for k, v in by_group.items()}
    outcome = {k: [with_shaping[1](s) or 0.0 for s, _ in v] for k, v in by_group.items()}
    advantage: dict[str, float] = {}
    zero = 0
    rewards: list[float] = []
    for key, pairs in by_group.items():
        members = [s for s, _ in pairs]
        values = [r for _, r in pairs]
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
    if zero:
        logger.info(
            f"GRPO: {zero} of {len(by_group)} groups have equal rewards and carry no gradient: "
            f"dropped; {len(kept)} sequences of {len(by_group) - zero} groups train"
        )
    return Groups(
        sequences=kept,
        groups=len(by_group),
        zero_std_groups=zero,
        rewards=rewards,
        frac_zero_std_outcome=frac_zero_std(outcome),
        frac_zero_std_shaped=frac_zero_std(shaped),
    )


Draw = Callable[[int, frozenset[str] | None], tuple[list[TurnRecord], list[SessionRecord], int]]
"""One round of a step's episodes: round 0 of every group (None), each later round of the groups
named (their `group_key`s). Returns the new episodes' trainable turns, their sessions and the
count of turns dropped as sampled by a too-old adapter (`trainer.rl_rows`)."""


@dataclass
class Sampled:
    """A step's episodes after dynamic sampling, and what the resampling took."""

    turns: list[TurnRecord]
    sessions: list[SessionRecord]
    dropped_off_policy: int
    frac_zero_std_first: float | None
    """`frac_reward_zero_std` of the first round, before any group was redrawn."""
    rounds: int = 0
    """Resample rounds run after the first."""
    resampled_groups: int = 0
    """Groups redrawn, summed over the rounds."""

    def metrics(self) -> dict[str, Any]:
        """What the step logs beside `frac_reward_zero_std` (which is after resampling)."""
        return {
            "frac_reward_zero_std/before_resampling": self.frac_zero_std_first,
            "resample_rounds": self.rounds,
            "resampled_groups": self.resampled_groups,
        }


def dynamic_sampling(
    draw: Draw, config: TrainConfig, *, reward_fn: RewardFn | None = None
) -> Sampled:
    """Draw a step's episodes, then redraw the groups whose rewards all agree (DAPO).

    A group of equal rewards carries no advantage, so its episodes cost a rollout and train
    nothing. Up to `max_resample_rounds` more rounds rerun those groups only, until
    `min_informative_groups` (default: every group drawn) carry variance. The redrawn episodes
    join their group, whose earlier rewards still count in its mean. When the budget is spent,
    the step trains on the groups that carry variance, and stops for no signal if none does.
    """
    reward_fn = reward_fn or trained_reward(config)
    turns, sessions, dropped = draw(0, None)
    groups = len(rewards_by_group(sessions, reward_fn))
    equal = equal_reward_groups(sessions, reward_fn)
    sampled = Sampled(turns, sessions, dropped, len(equal) / groups if groups else None)
    wanted = config.min_informative_groups or groups
    while equal and groups - len(equal) < wanted and sampled.rounds < config.max_resample_rounds:
        sampled.rounds += 1
        sampled.resampled_groups += len(equal)
        more_turns, more_sessions, more_dropped = draw(sampled.rounds, frozenset(equal))
        sampled.turns += more_turns
        sampled.sessions += more_sessions
        sampled.dropped_off_policy += more_dropped
        groups = len(rewards_by_group(sampled.sessions, reward_fn))
        equal = equal_reward_groups(sampled.sessions, reward_fn)
    if sampled.rounds:
        logger.info(
            f"GRPO dynamic sampling: redrew {sampled.resampled_groups} group(s) over "
            f"{sampled.rounds} more round(s); frac_reward_zero_std "
            f"{sampled.frac_zero_std_first:.2f} before, {len(equal) / groups:.2f} after"
        )
    return sampled


@dataclass(frozen=True)
class OldPolicy:
    """One sequence under the policy that started the batch, scored once before its updates."""

    logprobs: torch.Tensor
    """[n] log pi_old at the sampling temperatures (the PPO ratio's denominator)."""
    sampler_log_ratio: torch.Tensor
    """[n] log pi_old - log mu, in the server's logprob space (the truncated IS weight's log)."""


def sequence_scores(policy: Policy, seq: TrainingSequence) -> TokenScores:
    """`seq`'s loss tokens under `policy`, each at the temperature it was sampled at."""
    return score(policy.model, seq.input_ids, seq.loss_mask, temperature=seq.temperatures or None)


def sampler_space(scores: TokenScores, config: TrainConfig) -> torch.Tensor:
    """The scores in the space the server returned its logprobs in (`config.logprobs_mode`)."""
    return scores.logprobs if config.logprobs_mode == "processed_logprobs" else scores.raw_logprobs


def old_policy(policy: Policy, seq: TrainingSequence, config: TrainConfig) -> OldPolicy:
    """Score `seq` without gradient: the reference every optimiser step on this batch uses."""
    with torch.no_grad():
        scores = sequence_scores(policy, seq)
    return OldPolicy(scores.logprobs, sampler_space(scores, config) - _aligned(seq))


def grpo_update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    sequences: Sequence[TrainingSequence],
    config: TrainConfig,
    *,
    step: int = 1,
    loss_fn: LossFn = grpo_loss,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """`ppo_epochs` passes over one batch, each in `mini_batches` optimiser steps.

    The batch is scored once first (pi_old); every step's ratio is against it, so after the
    first step the clip sees how far the policy moved. With a single step per batch that scoring
    is skipped: pi_old is the policy itself (ratio 1). Each pass shuffles the batch (by
    `config.seed`, `step` and the pass) before splitting it, so a mini-batch mixes scenarios
    instead of holding whole groups in the order they were simulated. Returns the last step's
    metrics.
    """
    passes = [
        mini_batches(sequences, config.mini_batches, seed=f"{config.seed}:{step}:{epoch}")
        for epoch in range(1, config.ppo_epochs + 1)
    ]
    steps = sum(len(batches) for batches in passes)
    policy.model.train()
    old = {id(s): old_policy(policy, s, config) for s in sequences} if steps > 1 else None
    metrics: dict[str, Any] = {}
    n = 0
    for epoch, batches in enumerate(passes, start=1):
        for index, batch in enumerate(batches, start=1):
            n += 1
            olds = [old[id(s)] for s in batch] if old is not None else None
            metrics = {
                "optimizer_step": n,
                "optimizer_steps": steps,
                "epoch": epoch,
                "mini_batch": index,
                **grpo_step(policy, optimizer, batch, config, old=olds, loss_fn=loss_fn),
            }
            if on_step is not None:
                on_step(metrics)
    return metrics


def grpo_step(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    sequences: Sequence[TrainingSequence],
    config: TrainConfig,
    *,
    old: Sequence[OldPolicy] | None = None,
    loss_fn: LossFn = grpo_loss,
) -> dict[str, Any]:
    """One optimiser step over `sequences` (advantages set); returns its metrics (TRL's names).

    `old`: each sequence under the policy that started the batch; None: the policy as it is now.
    """
    started = time.monotonic()
    num_tokens = sequences_tokens(sequences)
    optimizer.zero_grad(set_to_none=True)
    policy.model.train()
    total_loss, entropy_sum, stats = 0.0, 0.0, []
    for i, seq in enumerate(sequences):
        scores = sequence_scores(policy, seq)
        if old is None:
            reference = OldPolicy(
                scores.logprobs.detach(), sampler_space(scores, config).detach() - _aligned(seq)
            )
        else:
            reference = old[i]
        loss, stat = loss_fn(
            scores.logprobs,
            reference.logprobs,
            seq.advantage,
            num_tokens=num_tokens,
            sampler_log_ratio=reference.sampler_log_ratio,
            clip_low=config.clip_low,
            clip_high=config.clip_high,
            importance_sampling_cap=config.importance_sampling_cap,
            sequence_mask_c=config.sequence_mask_c,
            beta=config.beta,
        )
        loss.backward()
        total_loss += loss.item()
        entropy_sum += float(scores.entropy.sum())
        stats.append(stat)
    norm = grad_norm(policy)
    torch.nn.utils.clip_grad_norm_(
        [p for p in policy.model.parameters() if p.requires_grad], config.max_grad_norm
    )
    optimizer.step()
    elapsed = time.monotonic() - started
    tokens = sum(len(s.input_ids) for s in sequences)
    counted = max(sum(s.tokens for s in stats), 1)
    return {
        "policy_loss": round(total_loss, 6),
        "kl": round(sum(s.kl_sum for s in stats) / counted, 6),
        "clip_ratio": round(sum(s.clipped for s in stats) / counted, 6),
        "sampling_logp_difference/mean": round(sum(s.logp_diff_sum for s in stats) / counted, 6),
        "sampling_logp_difference/max": max((s.logp_diff_max for s in stats), default=0.0),
        "importance_ratio/min": min((s.ratio_min for s in stats), default=1.0),
        "importance_ratio/mean": round(sum(s.ratio_sum for s in stats) / counted, 6),
        "importance_ratio/max": max((s.ratio_max for s in stats), default=1.0),
        "masked_sequences": sum(s.masked_sequence for s in stats),
        "grad_norm": round(norm, 6),
        "entropy": round(entropy_sum / counted, 6),
        "num_tokens": num_tokens,
        "tokens_per_s": round(tokens / max(elapsed, 1e-9), 1),
        "step_time": round(elapsed, 3),
    }


def _aligned(seq: TrainingSequence) -> torch.Tensor:
    """The sampler's logprobs at the loss positions `score` returns (position 0 never scores)."""
    values = [lp for t, (lp, m) in enumerate(zip(seq.sampler_logprobs, seq.loss_mask, strict=True))
              if m and t > 0]  # fmt: skip
    return torch.tensor(values, dtype=torch.float32)
