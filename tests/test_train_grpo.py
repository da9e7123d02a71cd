"""GRPO on a tiny model: each row scored at its own sampling temperature in the server's logprob
space, the gradient of the temperature-scaled policy, and several optimiser steps per batch so
the PPO clip engages (it cannot on the first step); online, groups whose rewards all agree are
redrawn (DAPO's dynamic sampling) within a budget."""

from pathlib import Path

import pytest
import torch

from pipecat_rl.ledger import SessionRecord, TurnRecord
from pipecat_rl.simulator.options import Rollouts
from pipecat_rl.training.config import TrainConfig
from pipecat_rl.training.grpo import (
    build_groups,
    dynamic_sampling,
    equal_reward_groups,
    grpo_step,
    grpo_update,
    sequence_scores,
    trained_reward,
)
from pipecat_rl.training.rows import (
    TrainableTurn,
    TrainingSequence,
    build_sequences,
    mini_batches,
)
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


def test_shuffled_mini_batches_differ_by_seed_and_cover_the_same_items():
    seqs = [TrainingSequence(str(i), [1, 2], [False, True], [0.0, 0.0]) for i in range(12)]

    def ids(seed) -> list[list[str]]:
        return [[s.session_id for s in part] for part in mini_batches(seqs, 4, seed=seed)]

    a, b = ids("0:1:1"), ids("0:1:2")
    assert a == ids("0:1:1")  # the same seed, the same order
    assert a != b and a != ids(None)  # another seed, another order; unshuffled is contiguous
    for parts in (a, b):
        assert [len(p) for p in parts] == [3, 3, 3, 3]
        assert sorted(i for p in parts for i in p) == sorted(s.session_id for s in seqs)


def test_each_ppo_pass_shuffles_the_batch_afresh_by_seed_and_step(monkeypatch):
    import pipecat_rl.training.grpo as grpo

    policy = _perturbed_policy()
    sequences, sessions = _group_batch(policy, 8)
    config = TrainConfig(algo="grpo", lr=1e-3, ppo_epochs=2, mini_batches=4, seed=5)
    groups = build_groups(sessions, sequences, config)
    batches: list[list[str]] = []

    def record(policy, optimizer, batch, config, **kwargs):
        batches.append(sorted(s.session_id for s in batch))
        return {}

    monkeypatch.setattr(grpo, "grpo_step", record)
    grpo_update(policy, None, groups.sequences, config, step=3)
    first, second = batches[:4], batches[4:]
    assert sorted(i for b in first for i in b) == sorted(i for b in second for i in b)
    assert first != second  # a pass is not the last one's order again
    expected = mini_batches(groups.sequences, 4, seed="5:3:1")
    assert first == [sorted(s.session_id for s in b) for b in expected]


# -- dynamic sampling (DAPO): redraw the groups whose rewards all agree ----------------------------


def _drawing(plan: dict[int, dict[str, list[float]]]):
    """A `Draw` that returns, for round r, sessions of the groups asked with `plan[r]`'s rewards,
    and the calls it was asked for."""
    calls: list[tuple[int, frozenset[str] | None]] = []

    def draw(resample: int, groups: frozenset[str] | None):
        calls.append((resample, groups))
        rewards = {k: v for k, v in plan[resample].items() if groups is None or k in groups}
        sessions = [_session(f"{k}-{resample}-{i}", r, k) for k, rs in rewards.items()
                    for i, r in enumerate(rs)]  # fmt: skip
        return [], sessions, 1

    return draw, calls


def test_dynamic_sampling_redraws_only_the_equal_groups_until_each_carries_variance():
    draw, calls = _drawing({
        0: {"a": [1.0, 0.0], "b": [0.0, 0.0], "c": [1.0, 1.0]},
        1: {"b": [1.0, 1.0], "c": [1.0, 1.0]},
        2: {"c": [0.0, 1.0]},
    })  # fmt: skip
    config = TrainConfig(algo="grpo", max_resample_rounds=5)
    sampled = dynamic_sampling(draw, config)
    assert calls == [(0, None), (1, frozenset({"b", "c"})), (2, frozenset({"c"}))]
    assert sampled.metrics() == {
        "frac_reward_zero_std/before_resampling": pytest.approx(2 / 3),
        "resample_rounds": 2, "resampled_groups": 3,
    }  # fmt: skip
    assert len(sampled.sessions) == 12 and sampled.dropped_off_policy == 3
    assert equal_reward_groups(sampled.sessions, trained_reward(config)) == []
    # the redrawn episodes joined their group: b's first zeros now have negative advantages
    turns = [TrainableTurn(session_id=s.id, index=0, prompt_ids=[1], sampled_ids=[2],
                           sampler_logprobs=[0.0], adapter="base", sampling={})
             for s in sampled.sessions]  # fmt: skip
    sequences, _ = build_sequences(turns)
    groups = build_groups(sampled.sessions, sequences, config)
    assert groups.frac_reward_zero_std == 0.0 and len(groups.sequences) == 12
    b = {s.session_id: s.advantage for s in groups.sequences if s.session_id.startswith("b-")}
    assert b == {"b-0-0": -0.5, "b-0-1": -0.5, "b-1-0": 0.5, "b-1-1": 0.5}


def test_dynamic_sampling_stops_at_its_budget_or_once_enough_groups_carry_variance():
    plan = {r: {"a": [1.0, 0.0], "b": [0.0, 0.0]} for r in range(4)}
    draw, calls = _drawing(plan)
    spent = dynamic_sampling(draw, TrainConfig(algo="grpo", max_resample_rounds=2))
    assert [c[0] for c in calls] == [0, 1, 2] and spent.rounds == 2
    assert equal_reward_groups(spent.sessions, trained_reward(TrainConfig())) == ["b"]
    draw, calls = _drawing(plan)
    enough = dynamic_sampling(draw, TrainConfig(algo="grpo", min_informative_groups=1))
    assert calls == [(0, None)] and enough.rounds == 0
    draw, calls = _drawing(plan)
    dynamic_sampling(draw, TrainConfig(algo="grpo", max_resample_rounds=0))
    assert calls == [(0, None)]


def test_offline_groups_with_equal_rewards_are_dropped_and_counted_aloud():
    from loguru import logger

    policy = _perturbed_policy()
    sequences, sessions = _group_batch(policy, 4)
    sessions += [_session("z0", 1.0, "z"), _session("z1", 1.0, "z")]  # a group that agrees
    lines: list[str] = []
    sink = logger.add(lines.append, format="{message}")
    try:
        groups = build_groups(sessions, sequences, TrainConfig(algo="grpo"))
    finally:
        logger.remove(sink)
    assert groups.frac_reward_zero_std == 0.5 and len(groups.sequences) == 4
    assert any("1 of 2 groups have equal rewards" in line for line in lines), lines


def _online_ledger(tmp_path, plan: dict[int, dict[str, list[float]]], monkeypatch):
    """A ledger, clinic scenarios, and `pipecat_rl.simulator.run` replaced by a fake that
    records each run's episodes with `plan`'s rewards (per run, per scenario id)."""
    from types import SimpleNamespace

    import pipecat_rl.simulator as simulator
    from pipecat_rl.ledger import Ledger
    from pipecat_rl.scenarios import load_scenarios
    from pipecat_rl.simulator.options import SimulationOptions

    pool = Path(__file__).resolve().parents[1] / "examples" / "clinic" / "handwritten" / "pool"
    scenarios = load_scenarios([pool / f"{n}.yaml" for n in (
        "routine_booking", "book_second_slot", "cancel_long_confirmation")])  # fmt: skip
    runs: list[tuple[list[str], int]] = []
    ledger = Ledger(tmp_path / "l.db")

    def run(chosen, bot, options, store, *, policies, server):
        rewards = plan[len(runs)]
        runs.append(([s.id for s in chosen], options.seed))
        episodes = []
        for s in chosen:
            for i, r in enumerate(rewards[s.id][: options.repeats]):
                sid = f"{s.id}-{len(runs)}-{i}"
                store.write_session(
                    SessionRecord(
                        id=sid, source="simulate", started_at=1.0, ended_at=2.0, split="pool",
                        scenario_id=s.id, scenario_hash=s.content_hash(), policy=policies[0],
                        outcome="pass" if r else "fail", reward_parts={"verifier": r},
                    ),
                    [TurnRecord(
                        session_id=sid, index=0, adapter=policies[0], created_at=1.0,
                        request={"model": policies[0], "temperature": 1.0},
                        prompt_token_ids=[1, 2, 3], completion_token_ids=[4, 5],
                        logprobs=[-0.1, -0.2], token_exact=True, usage={"completion_tokens": 2},
                    )],
                )  # fmt: skip
                episodes.append(SimpleNamespace(session_id=sid))
        return SimpleNamespace(episodes=episodes)

    monkeypatch.setattr(simulator, "run", run)
    rollouts = Rollouts(scenarios=scenarios, bot=None, options=SimulationOptions())
    return ledger, rollouts, runs


def test_online_grpo_resamples_the_scenarios_of_equal_groups_each_round_on_new_seeds(
    tmp_path, monkeypatch
):
    from pipecat_rl.training.trainer import _step_rows

    plan = {
        0: {"routine_booking": [1.0, 0.0], "book_second_slot": [0.0, 0.0],
            "cancel_long_confirmation": [1.0, 1.0]},
        1: {"book_second_slot": [1.0, 0.0], "cancel_long_confirmation": [1.0, 1.0]},
        2: {"cancel_long_confirmation": [0.0, 1.0]},
    }  # fmt: skip
    ledger, rollouts, runs = _online_ledger(tmp_path, plan, monkeypatch)
    config = TrainConfig(algo="grpo", group_size=2, max_resample_rounds=3)
    with ledger:
        turns, sessions, dropped, sampling = _step_rows(
            ledger, rollouts, "http://unused", "base", config, 1, {"base"}
        )
    assert [sorted(ids) for ids, _ in runs] == [
        sorted(plan[0]),
        sorted(plan[1]),
        ["cancel_long_confirmation"],
    ]
    seeds = [seed for _, seed in runs]
    assert len(set(seeds)) == 3 and seeds[0] == config.seed * 1000 + 1  # round 0 as before
    assert len(turns) == len(sessions) == 6 + 4 + 2 and dropped == 0
    assert sampling["resample_rounds"] == 2 and sampling["resampled_groups"] == 3
    assert sampling["frac_reward_zero_std/before_resampling"] == pytest.approx(2 / 3)


def test_online_grpo_stops_for_no_signal_only_once_the_resample_budget_is_spent(
    tmp_path, monkeypatch
):
    from pipecat_rl.errors import NoTrainingSignalError
    from pipecat_rl.training.trainer import _grpo_update, _step_rows

    ids = ("routine_booking", "book_second_slot", "cancel_long_confirmation")
    plan = {r: dict.fromkeys(ids, [0.0, 0.0]) for r in range(3)}
    ledger, rollouts, runs = _online_ledger(tmp_path, plan, monkeypatch)
    config = TrainConfig(algo="grpo", group_size=2, max_resample_rounds=2)
    with ledger:
        turns, sessions, dropped, sampling = _step_rows(
            ledger, rollouts, "http://unused", "base", config, 1, {"base"}
        )
    assert len(runs) == 3 and sampling["resampled_groups"] == 6
    with pytest.raises(NoTrainingSignalError, match="3 of 3 groups have equal rewards after 2 "):
        _grpo_update(None, None, turns, sessions, config, 1, print, dropped, sampling)


def test_a_step_rolls_out_a_seeded_draw_of_scenarios_per_step(tmp_path, monkeypatch):
    from pipecat_rl.training.trainer import _step_rows, step_scenarios

    ids = ("routine_booking", "book_second_slot", "cancel_long_confirmation")
    plan = {r: dict.fromkeys(ids, [1.0, 0.0]) for r in range(6)}
    ledger, rollouts, runs = _online_ledger(tmp_path, plan, monkeypatch)
    config = TrainConfig(algo="grpo", group_size=2, scenarios_per_step=2, seed=7)

    def drawn(cfg: TrainConfig, step: int) -> list[str]:
        return [s.id for s in step_scenarios(rollouts.scenarios, cfg, step)]

    by_step = [drawn(config, step) for step in range(1, 6)]
    assert by_step == [drawn(config, step) for step in range(1, 6)]  # a rerun draws the same
    assert all(len(d) == 2 and set(d) <= set(ids) for d in by_step)
    assert len({tuple(d) for d in by_step}) > 1  # a draw per step, not one fixed subset
    other = config.model_copy(update={"seed": 8})
    assert [drawn(other, step) for step in range(1, 6)] != by_step
    everything = config.model_copy(update={"scenarios_per_step": None})
    assert step_scenarios(rollouts.scenarios, everything, 1) is rollouts.scenarios
    with ledger:
        _step_rows(ledger, rollouts, "http://unused", "base", config, 2, {"base"})
    assert sorted(runs[0][0]) == sorted(by_step[1])  # step 2 simulated its own draw


def test_the_step_log_has_each_scenarios_first_round_pass_rate(tmp_path, monkeypatch):
    from pipecat_rl.training.trainer import _step_rows

    plan = {
        0: {"routine_booking": [1.0, 0.0, 0.0, 0.0], "book_second_slot": [0.0, 0.0, 0.0, 0.0],
            "cancel_long_confirmation": [1.0, 1.0, 1.0, 1.0]},
        1: {"book_second_slot": [1.0, 1.0, 1.0, 1.0], "cancel_long_confirmation": [1.0] * 4},
    }  # fmt: skip
    ledger, rollouts, runs = _online_ledger(tmp_path, plan, monkeypatch)
    config = TrainConfig(algo="grpo", group_size=4, max_resample_rounds=1)
    with ledger:
        *_, sampling = _step_rows(ledger, rollouts, "http://unused", "base", config, 1, {"base"})
    assert len(runs) == 2  # the redrawn round's passes are not in the curve
    assert {k: v for k, v in sampling.items() if k.startswith("first_round_pass_rate/")} == {
        "first_round_pass_rate/routine_booking": 0.25,
        "first_round_pass_rate/book_second_slot": 0.0,
        "first_round_pass_rate/cancel_long_confirmation": 1.0,
    }
