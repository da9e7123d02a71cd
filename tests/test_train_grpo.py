"""GRPO on a tiny model: each row scored at its own sampling temperature in the server's logprob
space, the gradient of the temperature-scaled policy, and several optimiser steps per batch so
the PPO clip engages (it cannot on the first step)."""

import pytest
import torch

from pipecat_rl.ledger import SessionRecord
from pipecat_rl.training.config import TrainConfig
from pipecat_rl.training.grpo import (
    build_groups,
    grpo_step,
    grpo_update,
    mini_batches,
    sequence_scores,
)
from pipecat_rl.training.rows import TrainableTurn, TrainingSequence, build_sequences
from pipecat_rl.training.sft import optimizer_for
from tests.train_helpers import sample_turn, tiny_policy

TRL_NAMES = (
    "clip_ratio", "kl", "entropy", "policy_loss", "importance_ratio/min", "importance_ratio/mean",
    "importance_ratio/max", "sampling_logp_difference/mean", "sampling_logp_difference/max",
    "grad_norm", "num_tokens",
)  # fmt: skip


def _session(sid: str, reward: float, scenario: str = "g") -> SessionRecord:
    return SessionRecord(
        id=sid, source="simulate", started_at=0.0, ended_at=1.0, scenario_hash=scenario,
        reward_parts={"verifier": reward},
    )  # fmt: skip


def _perturbed_policy(seed: int = 0):
    """A tiny policy whose LoRA already moves the logits (B != 0): every factor has a gradient."""
    policy = tiny_policy(seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return policy


def _turn(policy, sid: str, prompt: list[int], n: int, temperature: float, *, index: int = 0,
          seed: int = 0, space: str = "processed_logprobs") -> TrainableTurn:  # fmt: skip
    record = sample_turn(
        policy.model, prompt, n, temperature=temperature, session_id=sid, index=index,
        seed=seed, space=space,
    )  # fmt: skip
    return TrainableTurn.from_turn(record)


def _mixed_batch(policy, space: str = "processed_logprobs"):
    """Session a: a T=0.2 turn then a T=1 turn (one merged sequence); b at T=1; c at T=0.2."""
    first = _turn(policy, "a", [1, 5, 9], 5, 0.2, seed=1, space=space)
    history = [*first.prompt_ids, *first.sampled_ids, 2, 7]
    second = _turn(policy, "a", history, 4, 1.0, index=1, seed=2, space=space)
    others = [
        _turn(policy, "b", [1, 6, 9], 6, 1.0, seed=3, space=space),
        _turn(policy, "c", [1, 4, 9], 6, 0.2, seed=4, space=space),
    ]
    sequences, stats = build_sequences([first, second, *others])
    assert stats.merged == 1 and len(sequences) == 3
    return sequences


def _reference_logprobs(model, seq: TrainingSequence, temperature_of) -> torch.Tensor:
    """log softmax(logits / T) of each sampled id, computed directly, T per position."""
    logits = model(input_ids=torch.tensor([seq.input_ids])).logits[0]
    out = []
    for t, m in enumerate(seq.loss_mask):
        if m:
            lp = torch.log_softmax(logits[t - 1] / temperature_of(seq, t), dim=-1)
            out.append(lp[seq.input_ids[t]])
    return torch.stack(out)


def _own_temperature(seq: TrainingSequence, t: int) -> float:
    return seq.temperatures[t]


def _lora_grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_each_row_is_scored_at_its_own_temperature_in_the_servers_space():
    policy = _perturbed_policy()
    sequences = _mixed_batch(policy)
    merged = sequences[0]
    assert {merged.temperatures[t] for t, m in enumerate(merged.loss_mask) if m} == {0.2, 1.0}
    for seq in sequences:
        with torch.no_grad():
            mine = sequence_scores(policy, seq)
            reference = _reference_logprobs(policy.model, seq, _own_temperature)
        assert torch.allclose(mine.logprobs, reference, atol=1e-5)
        recorded = torch.tensor([lp for lp, m in zip(seq.sampler_logprobs, seq.loss_mask,
                                                     strict=True) if m])  # fmt: skip
        assert torch.allclose(mine.logprobs, recorded, atol=1e-5)  # what the sampler returned
    cold = sequences[2]  # all of it at T = 0.2: the raw space is another distribution
    with torch.no_grad():
        scores = sequence_scores(policy, cold)
    assert (scores.logprobs - scores.raw_logprobs).abs().max() > 0.05


def test_the_gradient_is_that_of_the_temperature_scaled_policy():
    policy = _perturbed_policy()
    sequences = _mixed_batch(policy)
    for seq, advantage in zip(sequences, (0.5, -0.25, -0.25), strict=True):
        seq.advantage = advantage
    config = TrainConfig(algo="grpo", max_grad_norm=1e9)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    grpo_step(policy, torch.optim.SGD(params, lr=0.0), sequences, config)
    mine = _lora_grads(policy.model)

    def reference(temperature_of) -> dict[str, torch.Tensor]:
        policy.model.zero_grad(set_to_none=True)
        n = sum(s.num_loss_tokens for s in sequences)
        loss = sum(
            -s.advantage * _reference_logprobs(policy.model, s, temperature_of).sum() / n
            for s in sequences
        )
        loss.backward()
        return _lora_grads(policy.model)

    scaled = reference(_own_temperature)
    raw = reference(lambda _seq, _t: 1.0)
    assert mine.keys() == scaled.keys() and len(mine) > 0
    for name in mine:
        assert torch.allclose(mine[name], scaled[name], rtol=1e-3, atol=1e-6), name
    flat = torch.cat([g.flatten() for g in mine.values()])
    flat_raw = torch.cat([raw[n].flatten() for n in mine])
    assert (flat - flat_raw).norm() > 0.1 * flat.norm()  # scoring raw logits trains another policy


def test_the_ratio_compares_like_with_like_in_either_logprobs_mode():
    policy = _perturbed_policy()
    processed = TrainConfig(algo="grpo", lr=0.0)
    raw = processed.model_copy(update={"logprobs_mode": "raw_logprobs"})
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.0)

    def difference(recorded_space: str, config: TrainConfig) -> dict:
        sequences = _mixed_batch(policy, space=recorded_space)
        return grpo_step(policy, optimizer, sequences, config)

    for space, config in (("processed_logprobs", processed), ("raw_logprobs", raw)):
        metrics = difference(space, config)
        assert metrics["sampling_logp_difference/max"] < 1e-4, space
        assert metrics["importance_ratio/min"] == pytest.approx(1.0, abs=1e-4)
        assert metrics["importance_ratio/max"] == pytest.approx(1.0, abs=1e-4)
    crossed = difference("raw_logprobs", processed)  # a server without our --logprobs-mode
    assert crossed["sampling_logp_difference/max"] > 0.05


def _group_batch(policy, n: int = 8):
    turns = [_turn(policy, f"s{i}", [1, 3 + i % 4, 9], 6, 1.0, seed=10 + i) for i in range(n)]
    sequences, _ = build_sequences(turns)
    sessions = [_session(f"s{i}", float(i % 2)) for i in range(n)]
    return sequences, sessions


def test_the_clip_engages_only_after_the_first_optimiser_step():
    policy = _perturbed_policy()
    sequences, sessions = _group_batch(policy)
    config = TrainConfig(algo="grpo", lr=3e-2, ppo_epochs=2, mini_batches=2)
    groups = build_groups(sessions, sequences, config)
    assert len(groups.sequences) == 8
    steps: list[dict] = []
    last = grpo_update(
        policy, optimizer_for(policy, config.learning_rate()), groups.sequences, config,
        on_step=steps.append,
    )  # fmt: skip
    assert [(s["epoch"], s["mini_batch"]) for s in steps] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert last == steps[-1] and last["optimizer_steps"] == 4
    for s in steps:
        assert all(name in s for name in TRL_NAMES), s
    first = steps[0]
    assert first["clip_ratio"] == 0.0
    assert first["importance_ratio/min"] == pytest.approx(1.0, abs=1e-4)
    assert first["importance_ratio/max"] == pytest.approx(1.0, abs=1e-4)
    assert max(s["clip_ratio"] for s in steps if s["epoch"] == 2) > 0.0
    assert max(s["importance_ratio/max"] for s in steps[1:]) > config.clip_high
    assert sum(s["num_tokens"] for s in steps[:2]) == sum(x.num_loss_tokens for x in sequences)


def test_one_step_per_batch_keeps_the_ratio_at_one():
    policy = _perturbed_policy()
    sequences, sessions = _group_batch(policy, 4)
    config = TrainConfig(algo="grpo", lr=3e-2, ppo_epochs=1, mini_batches=1)
    groups = build_groups(sessions, sequences, config)
    steps: list[dict] = []
    grpo_update(
        policy, optimizer_for(policy, config.learning_rate()), groups.sequences, config,
        on_step=steps.append,
    )  # fmt: skip
    assert len(steps) == 1 and steps[0]["clip_ratio"] == 0.0


def test_mini_batches_split_the_batch_in_order():
    seqs = [TrainingSequence(str(i), [1, 2], [False, True], [0.0, 0.0]) for i in range(5)]
    parts = mini_batches(seqs, 2)
    assert [[s.session_id for s in p] for p in parts] == [["0", "1", "2"], ["3", "4"]]
    assert len(mini_batches(seqs, 9)) == 5 and len(mini_batches(seqs, 1)) == 1
