"""Shared-prefix batches: sequences that start alike train together, their prefix computed once.

A voice agent's system prompt, tool schemas and greeting are most of each SFT sequence. A
batch runs that common prefix once with the KV cache on, repeats the cache across the batch and
runs the right-padded suffixes against it. Nothing is detached: the suffixes' gradient reaches the
prefix's LoRA activations through the cached keys and values, so one batch's gradient is the sum
of its sequences' one-by-one gradients (tested to 1e-5 in fp32). Right padding needs no attention
mask: under the causal mask a real token never attends a pad after it, and pads carry no loss.
"""

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipecat_rl.training.policy import loss_positions, selective_logprobs
from pipecat_rl.training.rows import TrainingSequence

MIN_SHARED = 64
"""Sequences share a batch only if their common prefix is at least this many tokens."""


@dataclass(frozen=True)
class PrefixBatch:
    """Sequences trained in one step and the length of the token prefix they all start with."""

    sequences: tuple[TrainingSequence, ...]
    prefix_len: int

    @property
    def width(self) -> int:
        """The padded suffix length (the longest suffix)."""
        return max(len(s.input_ids) for s in self.sequences) - self.prefix_len

    @property
    def computed_tokens(self) -> int:
        """Token positions the forward pass runs: the prefix once, every suffix padded."""
        return self.prefix_len + len(self.sequences) * self.width

    @property
    def num_tokens(self) -> int:
        """Tokens of the sequences themselves (what one-by-one training would run)."""
        return sum(len(s.input_ids) for s in self.sequences)

    @property
    def num_loss_tokens(self) -> int:
        """Loss-carrying tokens over the batch (its loss normaliser)."""
        return sum(s.num_loss_tokens for s in self.sequences)


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def common_prefix_len(sequences: Sequence[TrainingSequence]) -> int:
    """Tokens all `sequences` start with, leaving each at least one token of suffix."""
    first = sequences[0].input_ids
    shared = min(len(s.input_ids) for s in sequences) - 1
    for seq in sequences[1:]:
        shared = min(shared, _lcp(first, seq.input_ids))
    return max(shared, 0)


def _split(seqs: list[TrainingSequence], max_sequences: int, max_tokens: int) -> list[list]:
    """Length-sorted `seqs` cut into near-equal contiguous chunks within both limits."""
    chunks = -(-len(seqs) // max_sequences)
    size, extra = divmod(len(seqs), chunks)
    out, start = [], 0
    for i in range(chunks):
        end = start + size + (i < extra)
        out.append(seqs[start:end])
        start = end
    fitted = []
    for chunk in out:
        batch = PrefixBatch(tuple(chunk), common_prefix_len(chunk))
        if len(chunk) > 1 and batch.computed_tokens > max_tokens:
            half = len(chunk) // 2
            fitted += _split(chunk[:half], max_sequences, max_tokens)
            fitted += _split(chunk[half:], max_sequences, max_tokens)
        else:
            fitted.append(chunk)
    return fitted


def prefix_batches(
    sequences: Sequence[TrainingSequence],
    *,
    max_sequences: int,
    max_tokens: int,
    rng: random.Random | None = None,
) -> list[PrefixBatch]:
    """Group `sequences` by a shared prefix, then cut each group into batches of similar length.

    Sorting the ids puts sequences with the longest common prefixes next to each other; a group
    ends where the next sequence shares fewer than `MIN_SHARED` tokens. Inside a group, sorting by
    length keeps padding small. `max_tokens` bounds the positions one forward runs (memory);
    `rng` shuffles the batches' order (their membership is fixed by the data).
    """
    ordered = sorted(sequences, key=lambda s: s.input_ids)
    groups: list[list[TrainingSequence]] = []
    for seq in ordered:
        if groups and _lcp(groups[-1][-1].input_ids, seq.input_ids) >= MIN_SHARED:
            groups[-1].append(seq)
        else:
            groups.append([seq])
    batches = []
    for group in groups:
        group.sort(key=lambda s: len(s.input_ids))
        for chunk in _split(group, max(max_sequences, 1), max_tokens):
            batches.append(PrefixBatch(tuple(chunk), common_prefix_len(chunk)))
    if rng is not None:
        rng.shuffle(batches)
    return batches


@dataclass(frozen=True)
class BatchScores:
    """Logprobs of a batch's loss tokens, sequence after sequence, in the raw space."""

    logprobs: torch.Tensor
    """[n] log p(token) at every sequence's loss positions, in the batch's order."""
    entropy: torch.Tensor
    """[n] entropy at each loss position (detached)."""
    sizes: tuple[int, ...]
    """Loss tokens per sequence (`logprobs.split(sizes)` gives each sequence's)."""
    logits: torch.Tensor | None = None
    """[n, vocab] at the loss positions, when asked for (OPSD's distribution losses)."""


def batch_scores(model: Any, batch: PrefixBatch, *, keep_logits: bool = False) -> BatchScores:
    """Per-token logprobs of each sequence's loss tokens, the shared prefix run once.

    Equal to `policy.score` on each sequence alone. The decoder's hidden states are gathered at
    each sequence's loss positions (from the prefix's row or its own suffix row) and only those
    go through the output head.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    seqs, p = batch.sequences, batch.prefix_len
    prefix_hidden, cache = None, None
    if p:
        out = decoder(input_ids=torch.tensor([seqs[0].input_ids[:p]]), use_cache=True)
        prefix_hidden, cache = out.last_hidden_state[0], out.past_key_values
        cache.batch_repeat_interleave(len(seqs))
    width = batch.width
    suffixes = torch.tensor([s.input_ids[p:] + [0] * (width - len(s.input_ids) + p) for s in seqs])
    hidden = decoder(input_ids=suffixes, past_key_values=cache, use_cache=p > 0).last_hidden_state
    rows, targets, sizes = [], [], []
    for b, seq in enumerate(seqs):
        positions = loss_positions(seq.loss_mask)
        picked = hidden[b, positions[positions >= p] - p]
        if prefix_hidden is not None:
            picked = torch.cat([prefix_hidden[positions[positions < p]], picked])
        rows.append(picked)
        targets.append(torch.tensor(seq.input_ids)[positions + 1])
        sizes.append(len(positions))
    logits = head(torch.cat(rows)).float()
    logprobs = selective_logprobs(logits, torch.cat(targets))
    with torch.no_grad():
        entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    return BatchScores(
        logprobs=logprobs, entropy=entropy, sizes=tuple(sizes),
        logits=logits if keep_logits else None,
    )  # fmt: skip
