"""Trainable rows: typed turns from the ledger, merged into sequences by the prefix property.

`TrainableTurn` is the only thing the trainer accepts. A session's turns become one sequence while
each turn's prompt ids start with the previous turn's prompt + sampled ids exactly (so nothing is
re-tokenised and each turn's context is what the model saw); otherwise a new sequence starts.
Only sampled ids carry loss: system prompt, caller text, tool results and template tokens are
masked.
"""

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from pipecat_rl.ledger import TurnRecord


class Sampling(BaseModel):
    """The sampling settings a turn was drawn with (part of the policy)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None

    @classmethod
    def of(cls, request: dict[str, Any]) -> "Sampling":
        """From a request as sent (missing values are the server's defaults)."""
        extra = request.get("extra_body") or {}

        def pick(name: str) -> Any:
            value = request.get(name)
            return extra.get(name) if value is None else value

        temperature, top_p, top_k = pick("temperature"), pick("top_p"), pick("top_k")
        return cls(
            temperature=1.0 if temperature is None else float(temperature),
            top_p=1.0 if top_p is None else float(top_p),
            top_k=None if top_k is None or int(top_k) <= 0 else int(top_k),
        )


class TrainableTurn(BaseModel):
    """One LLM call as a training row: ids the policy saw and sampled, and how it sampled them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_id: str
    index: int
    prompt_ids: list[int]
    sampled_ids: list[int]
    sampler_logprobs: list[float] | None
    """One per sampled id as the server returned them; None for a demonstration."""
    adapter: str | None
    """The adapter (or `base`) that sampled it; for a demonstration, the scripted policy's name."""
    sampling: Sampling
    demonstration: bool = False

    @classmethod
    def from_turn(cls, turn: TurnRecord, tokenizer: Any = None) -> "TrainableTurn":
        """From a ledger turn: token-exact turns as recorded, demonstrations rendered.

        A demonstration has no ids of its own; it is rendered with `tokenizer`'s chat template
        (the served model's), so it needs one.
        """
        if turn.demonstration:
            from pipecat_rl.recording.demonstration import render_demonstration

            if tokenizer is None:
                raise ValueError("a demonstration turn needs the served model's tokenizer")
            prompt, completion = render_demonstration(turn, tokenizer)
            return cls(
                session_id=turn.session_id,
                index=turn.index,
                prompt_ids=prompt,
                sampled_ids=completion,
                sampler_logprobs=None,
                adapter=turn.adapter,
                sampling=Sampling(temperature=0.0),
                demonstration=True,
            )
        if not turn.trainable:
            raise ValueError(f"turn {turn.session_id}#{turn.index} is not token-exact")
        return cls(
            session_id=turn.session_id,
            index=turn.index,
            prompt_ids=list(turn.prompt_token_ids or ()),
            sampled_ids=list(turn.completion_token_ids or ()),
            sampler_logprobs=list(turn.logprobs or ()),
            adapter=turn.adapter,
            sampling=Sampling.of(turn.request),
        )


@dataclass
class TrainingSequence:
    """Token ids of one or more merged turns, the loss mask, and the sampler's logprobs."""

    session_id: str
    input_ids: list[int]
    loss_mask: list[bool]
    """True at the positions of sampled ids (the only ones that carry loss)."""
    sampler_logprobs: list[float]
    """Aligned with `input_ids`; 0.0 where masked or unknown (demonstrations)."""
    turns: list[int] = field(default_factory=list)
    adapters: list[str | None] = field(default_factory=list)
    advantage: float = 0.0
    temperatures: list[float] = field(default_factory=list)
    """Aligned with `input_ids`: the temperature each sampled id was drawn at (empty: all 1.0)."""

    @property
    def num_loss_tokens(self) -> int:
        """How many positions carry loss."""
        return sum(self.loss_mask)


@dataclass(frozen=True)
class SequenceStats:
    """How turns became sequences (the prefix property's hit rate)."""

    turns: int
    sequences: int
    merged: int
    """Turns appended to the sequence of the turn before them."""
    split: int
    """Turns that started a new sequence although their session had one (prefix broken)."""
    dropped: int
    """Turns left out because their sequence would exceed `max_len`."""


def turn_sequence(turn: TrainableTurn) -> TrainingSequence:
    """One turn as a sequence of its own: its prompt, then its sampled ids carrying the loss."""
    n_prompt, n_sampled = len(turn.prompt_ids), len(turn.sampled_ids)
    logprobs = turn.sampler_logprobs or [0.0] * n_sampled
    return TrainingSequence(
        session_id=turn.session_id,
        input_ids=[*turn.prompt_ids, *turn.sampled_ids],
        loss_mask=[False] * n_prompt + [True] * n_sampled,
        sampler_logprobs=[0.0] * n_prompt + list(logprobs),
        turns=[turn.index],
        adapters=[turn.adapter],
        temperatures=[1.0] * n_prompt + [turn.sampling.temperature] * n_sampled,
    )


def _extends(seq: TrainingSequence, turn: TrainableTurn) -> bool:
    n = len(seq.input_ids)
    return len(turn.prompt_ids) >= n and turn.prompt_ids[:n] == seq.input_ids


def build_sequences(
    turns: Iterable[TrainableTurn], *, max_len: int | None = None, merge: bool = True
) -> tuple[list[TrainingSequence], SequenceStats]:
    """Merge each session's turns (in index order) into sequences by the prefix property."""
    by_session: dict[str, list[TrainableTurn]] = {}
    for t in turns:
        by_session.setdefault(t.session_id, []).append(t)
    out: list[TrainingSequence] = []
    merged = split = dropped = count = 0
    for session_turns in by_session.values():
        current: TrainingSequence | None = None
        for turn in sorted(session_turns, key=lambda t: t.index):
            count += 1
            if max_len is not None and len(turn.prompt_ids) + len(turn.sampled_ids) > max_len:
                dropped += 1
                continue
            if current is not None and merge and _extends(current, turn):
                n = len(current.input_ids)
                extra = turn.prompt_ids[n:]
                grown = n + len(extra) + len(turn.sampled_ids)
                if max_len is None or grown <= max_len:
                    logprobs = turn.sampler_logprobs or [0.0] * len(turn.sampled_ids)
                    current.input_ids += [*extra, *turn.sampled_ids]
                    current.loss_mask += [False] * len(extra) + [True] * len(turn.sampled_ids)
                    current.sampler_logprobs += [0.0] * len(extra) + list(logprobs)
                    sampled_at = [turn.sampling.temperature] * len(turn.sampled_ids)
                    current.temperatures += [1.0] * len(extra) + sampled_at
                    current.turns.append(turn.index)
                    current.adapters.append(turn.adapter)
                    merged += 1
                    continue
            elif current is not None and merge:
                split += 1
            current = turn_sequence(turn)
            out.append(current)
    stats = SequenceStats(
        turns=count, sequences=len(out), merged=merged, split=split, dropped=dropped
    )
    return out, stats


def sequences_tokens(sequences: Sequence[TrainingSequence]) -> int:
    """Loss-carrying tokens over `sequences` (the batch's normaliser)."""
    return sum(s.num_loss_tokens for s in sequences)


Item = TypeVar("Item")


def mini_batches(
    items: Sequence[Item], n: int, *, seed: int | str | None = None
) -> list[list[Item]]:
    """`items` in `n` near-equal parts (fewer when there are fewer items), shuffled by `seed`.

    One optimiser step each, for GRPO's sequences and OPSD's rows alike. Unshuffled (`seed`
    None) the parts are contiguous: GRPO's sequences come group by group, so each step would
    see one or two scenarios only; shuffled, every step sees a mix.
    """
    if seed is not None:
        items = random.Random(seed).sample(list(items), len(items))
    n = max(1, min(n, len(items)))
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        out.append(list(items[start:end]))
        start = end
    return out


def token_weighted(steps: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[str, float]:
    """Per-token metrics of a pass's optimiser steps, averaged by each step's `num_tokens`."""
    tokens = sum(m["num_tokens"] for m in steps)
    return {
        key: round(sum(m[key] * m["num_tokens"] for m in steps) / max(tokens, 1), 6) for key in keys
    }
