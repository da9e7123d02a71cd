"""Shared-prefix SFT on tiny models the tests build: gradients equal to one-by-one training,
batches grouped by prefix, sessions held aside, an early stop that fires, precision by CPU."""

import random

import torch

from pipecat_rl.training.config import TrainConfig
from pipecat_rl.training.policy import score
from pipecat_rl.training.prefix import (
    MIN_SHARED,
    PrefixBatch,
    batch_scores,
    common_prefix_len,
    prefix_batches,
)
from pipecat_rl.training.rows import TrainingSequence
from pipecat_rl.training.sft import heldout_loss, holdout_split, resolve_precision, train_sft
from tests.train_helpers import tiny_policy

VOCAB = 64


def _ids(n: int, gen: torch.Generator) -> list[int]:
    return torch.randint(1, VOCAB, (n,), generator=gen).tolist()


def _sequence(sid: str, ids: list[int], loss_from: int) -> TrainingSequence:
    """Loss on two of every three tokens from `loss_from` on (assistant spans between others)."""
    mask = [t >= loss_from and t % 3 != 0 for t in range(len(ids))]
    return TrainingSequence(sid, ids, mask, [0.0] * len(ids))


def _family(prefix: list[int], lengths, gen, tag: str, loss_from: int) -> list[TrainingSequence]:
    return [_sequence(f"{tag}{i}", prefix + _ids(n, gen), loss_from) for i, n in enumerate(lengths)]


def _trainable(policy) -> list[torch.nn.Parameter]:
    return [p for p in policy.model.parameters() if p.requires_grad]


def test_a_shared_prefix_batch_has_the_one_by_one_gradient_with_lora():
    torch.set_num_threads(2)
    policy = tiny_policy(vocab=VOCAB)
    for name, param in policy.model.named_parameters():
        if "lora_B" in name:  # peft starts B at 0: make A's gradient (and the prefix's) non-zero
            torch.nn.init.normal_(param, std=0.2)
    gen = torch.Generator().manual_seed(1)
    # loss starts inside the prefix (a greeting every sequence shares) and suffixes differ in
    # length (right padding)
    sequences = _family(_ids(70, gen), (9, 31, 18, 1), gen, "s", loss_from=60)
    batch = PrefixBatch(tuple(sequences), common_prefix_len(sequences))
    assert batch.prefix_len == 70 and batch.computed_tokens < batch.num_tokens
    tokens = batch.num_loss_tokens

    policy.model.zero_grad()
    one_by_one = []
    for seq in sequences:
        logprobs = score(policy.model, seq.input_ids, seq.loss_mask).logprobs
        (-logprobs.sum() / tokens).backward()
        one_by_one.append(logprobs.detach())
    expected = [p.grad.clone() for p in _trainable(policy)]

    policy.model.zero_grad()
    scores = batch_scores(policy.model, batch)
    (-scores.logprobs.sum() / tokens).backward()
    got = [p.grad.clone() for p in _trainable(policy)]

    for mine, theirs in zip(scores.logprobs.detach().split(scores.sizes), one_by_one, strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5)
    assert max(float(g.abs().max()) for g in expected) > 1e-3  # the comparison is not of zeros
    assert max(float((a - b).abs().max()) for a, b in zip(got, expected, strict=True)) <= 1e-5


def test_batches_group_sequences_by_shared_prefix_within_their_limits():
    gen = torch.Generator().manual_seed(2)
    clinic = _family(_ids(100, gen), (5, 40, 12, 30, 8, 22, 17), gen, "c", loss_from=100)
    other = _family(_ids(MIN_SHARED, gen), (6, 9, 3), gen, "o", loss_from=MIN_SHARED)
    loner = [_sequence("x", _ids(50, gen), 10)]
    sequences = clinic + other + loner
    batches = prefix_batches(sequences, max_sequences=3, max_tokens=180, rng=random.Random(0))
    seen = [s.session_id for b in batches for s in b.sequences]
    assert sorted(seen) == sorted(s.session_id for s in sequences)
    for batch in batches:
        families = {s.session_id[0] for s in batch.sequences}
        assert len(families) == 1, families
        assert len(batch.sequences) <= 3
        assert batch.computed_tokens <= 180 or len(batch.sequences) == 1
        if families <= {"c", "o"}:
            assert batch.prefix_len >= (100 if families == {"c"} else MIN_SHARED)
    # by length within a family: padding stays below the shortest suffix in the batch
    for batch in batches:
        lengths = sorted(len(s.input_ids) for s in batch.sequences)
        assert lengths == sorted(lengths)
    assert len(prefix_batches(clinic, max_sequences=8, max_tokens=10**6)) == 1


def test_sessions_are_held_aside_whole_and_only_when_one_fits():
    gen = torch.Generator().manual_seed(3)
    sequences = [_sequence(f"s{i % 10}", _ids(8, gen), 2) for i in range(20)]  # 2 per session
    train, held = holdout_split(sequences, 0.2, seed=0)
    held_sessions = {s.session_id for s in held}
    assert len(held_sessions) == 2 and len(held) == 4
    assert not held_sessions & {s.session_id for s in train}
    assert holdout_split(sequences, 0.2, seed=0) == (train, held)
    assert holdout_split(sequences, 0.05, seed=0)[1] == []  # half a session: nothing aside


def test_the_heldout_loss_stops_training_and_the_best_epoch_is_kept():
    torch.set_num_threads(2)
    policy = tiny_policy(vocab=VOCAB)
    gen = torch.Generator().manual_seed(4)
    prefix = _ids(MIN_SHARED, gen)
    # replies favour 8 tokens (learnable from any session); the rest is noise that training
    # memorises, so the held-aside loss falls for a few epochs and then rises
    weights = torch.tensor([0.0] + [8.0] * 8 + [1.0] * (VOCAB - 9))
    sequences = [
        _sequence(f"s{i}", prefix + torch.multinomial(weights, 40, True, generator=gen).tolist(),
                  MIN_SHARED)
        for i in range(8)
    ]  # fmt: skip
    config = TrainConfig(
        epochs=30, lr=1e-2, holdout=0.25, patience=2, min_improvement=0.0, target_loss=0.0,
        precision="fp32",
    )  # fmt: skip
    rows: list[dict] = []
    summary = train_sft(policy, sequences, config, on_step=rows.append)
    epochs = [r for r in rows if "epoch_loss" in r]
    assert summary["stopped"] == "heldout" and summary["epochs"] < 30
    assert len(epochs) == summary["epochs"] and all("heldout_loss" in r for r in epochs)
    assert summary["epochs"] - summary["best_epoch"] == 2  # patience
    losses = [r["heldout_loss"] for r in epochs]
    assert summary["heldout_loss"] == min(losses) < losses[0] and min(losses) < losses[-1]
    _, held = holdout_split(sequences, config.holdout, config.seed)
    batches = prefix_batches(held, max_sequences=4, max_tokens=4096)
    restored = heldout_loss(policy, batches, "fp32")
    assert abs(restored - summary["heldout_loss"]) < 1e-5  # the best epoch's weights were kept
    steps = [r for r in rows if "grad_norm" in r]  # 6 sequences: two balanced batches of 3
    assert steps[0]["sequences"] == 3 and steps[0]["shared_prefix_tokens"] >= MIN_SHARED
    assert steps[0]["computed_tokens"] < steps[0]["num_tokens"]


def test_without_sessions_to_spare_the_target_loss_stops_training():
    policy = tiny_policy(vocab=VOCAB)
    sequences = [_sequence("only", [5, 6, 7, 8] * 6, 4)]  # one session: nothing to hold aside
    # the tiny model's frozen head (init std 0.02) keeps its loss near ln(64) = 4.16
    config = TrainConfig(epochs=50, lr=3e-2, target_loss=3.9, precision="fp32")
    rows: list[dict] = []
    summary = train_sft(policy, sequences, config, on_step=rows.append)
    assert summary["stopped"] == "target_loss" and summary["heldout_sessions"] == 0
    assert summary["loss"] <= 3.9 and summary["epochs"] < 50
    assert not any("heldout_loss" in r for r in rows)


def test_auto_precision_is_bf16_only_where_the_cpu_has_it(tmp_path):
    from pipecat_rl.training.sft import cpu_has_bf16

    with_bf16 = tmp_path / "amd"
    with_bf16.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n")
    without = tmp_path / "old"
    without.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n")
    assert cpu_has_bf16(with_bf16) and not cpu_has_bf16(without)
    assert not cpu_has_bf16(tmp_path / "missing")
    assert resolve_precision("auto", has_bf16=True) == "bf16"
    assert resolve_precision("auto", has_bf16=False) == "fp32"
    assert resolve_precision("fp32", has_bf16=True) == "fp32"
    assert resolve_precision("bf16", has_bf16=False) == "bf16"
