"""OPSD: on-policy self-distillation from a teacher that sees a hint the student never sees.

For a judged turn, the hint (the caller's next line, the verifier's failed checks, the failure
labels, and on a live call its deciding scorer's explanation, `metadata.verdict` as
`Ledger.post_score` writes it) goes into the teacher's prompt: appended to the system message by
default, so the teacher continues the same conversation knowing more (`opsd_hint: turn` puts it
in an extra user message before the reply instead); the teacher is the incumbent, frozen, in eval
mode; both score the student's own sampled ids. Two losses (`loss.py`): per-sampled-token
reverse KL (cheap) and top-k forward KL with a tail bucket over the whole distribution.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from loguru import logger

from pipecat_rl.ledger import SessionRecord, TurnRecord
from pipecat_rl.training.config import TrainConfig
from pipecat_rl.training.loss import forward_topk_kl_loss, reverse_kl, reverse_kl_loss
from pipecat_rl.training.policy import Policy
from pipecat_rl.training.prefix import PrefixBatch, batch_scores, common_prefix_len, prefix_batches
from pipecat_rl.training.rows import (
    TrainableTurn,
    TrainingSequence,
    mini_batches,
    token_weighted,
)
from pipecat_rl.training.sft import grad_norm


@dataclass
class OPSDRow:
    """One turn: the student's ids (no hint) and the teacher's (hint inserted), same samples."""

    session_id: str
    student_ids: list[int]
    student_mask: list[bool]
    teacher_ids: list[int]
    teacher_mask: list[bool]


def _ids(rendered: Any) -> list[int]:
    return list(rendered["input_ids"] if not isinstance(rendered, list) else rendered)


def hint_block(tokenizer: Any, hint: str) -> tuple[list[int], int]:
    """(ids of a user message carrying `hint`, length of the generation header), by template.

    Rendered as the difference between a chat with and without the hint message, so it works
    with any chat template (one that adds a default system prompt included).
    """
    one = [{"role": "user", "content": "."}]
    plain = _ids(tokenizer.apply_chat_template(one, tokenize=True))
    hinted = _ids(
        tokenizer.apply_chat_template([*one, {"role": "user", "content": hint}], tokenize=True)
    )
    header = _ids(tokenizer.apply_chat_template(one, add_generation_prompt=True, tokenize=True))
    return hinted[len(plain) :], len(header) - len(plain)


def _turn_hinted(prompt: list[int], tokenizer: Any, hint: str) -> list[int]:
    block, header = hint_block(tokenizer, hint)
    cut = len(prompt) - header
    return [*prompt[:cut], *block, *prompt[cut:]]


def _system_hinted(turn: TurnRecord, tokenizer: Any, hint: str) -> list[int] | None:
    """The turn's prompt with `hint` appended to its system message.

    None when the template does not render that message (with the request's tools) as the
    prompt's start: there is no system message to hint in.
    """
    messages = turn.request.get("messages") or []
    if not messages or messages[0].get("role") != "system":
        return None
    system, tools = messages[0], turn.request.get("tools") or None
    content = system.get("content")
    if not isinstance(content, str):
        return None
    head = _ids(tokenizer.apply_chat_template([system], tools=tools, tokenize=True))
    prompt = list(turn.prompt_token_ids or ())
    if prompt[: len(head)] != head:
        return None
    told = {**system, "content": f"{content}\n\n{hint}"}
    return [*_ids(tokenizer.apply_chat_template([told], tools=tools, tokenize=True)),
            *prompt[len(head) :]]  # fmt: skip


def opsd_row(turn: TurnRecord, tokenizer: Any, hint: str, where: str = "system") -> OPSDRow:
    """The student's row and the teacher's hinted row of one sampled turn.

    `where`: `system` appends the hint to the system message, re-rendered with the request's
    tools and followed by the recorded prompt's own ids; where the prompt has no system message
    the template renders as its start, or with `turn`, the hint is an extra user message before
    the generation header.
    """
    row = TrainableTurn.from_turn(turn)
    prompt = row.prompt_ids
    teacher_prompt = _system_hinted(turn, tokenizer, hint) if where == "system" else None
    if teacher_prompt is None:
        if where == "system":
            logger.debug(f"{turn.session_id}#{turn.index}: no system message to hint in")
        teacher_prompt = _turn_hinted(prompt, tokenizer, hint)
    n = len(row.sampled_ids)
    return OPSDRow(
        session_id=turn.session_id,
        student_ids=[*prompt, *row.sampled_ids],
        student_mask=[False] * len(prompt) + [True] * n,
        teacher_ids=[*teacher_prompt, *row.sampled_ids],
        teacher_mask=[False] * len(teacher_prompt) + [True] * n,
    )


def session_hint(session: SessionRecord, turns: Sequence[TurnRecord], index: int) -> str | None:
    """What the teacher may know that the student did not, for turn `index` of `session`."""
    parts = []
    current = next((t for t in turns if t.index == index), None)
    later = next((t for t in turns if t.index == index + 1), None)
    if current is not None and later is not None:
        seen = len(current.request.get("messages") or [])
        following = (later.request.get("messages") or [])[seen:]
        said = next((m.get("content") for m in following if m.get("role") == "user"), None)
        if said:
            parts.append(f"The caller's next line will be: {said!r}.")
    failed = [c for c in session.metadata.get("checks") or [] if not c.get("passed", True)]
    if failed:
        parts.append(
            "These checks on the world's records failed at the end of this call: "
            + "; ".join(_check_text(c) for c in failed)
            + "."
        )
    if session.failure_labels:
        parts.append(f"Mistakes made in this call: {', '.join(session.failure_labels)}.")
    explanation = (session.metadata.get("verdict") or {}).get("explanation")
    if explanation:  # a live call's: why its deciding scorer passed or failed it, verbatim
        parts.append(str(explanation).strip())
    return " ".join(parts) or None


def _check_text(check: dict[str, Any]) -> str:
    """A failed check as the teacher reads it: what was checked, then what was found."""
    what, found = check.get("check"), check.get("detail")
    if what and found:
        return f"{what} ({found})"
    return str(what or found or check)


def prefix_pairs(rows: Sequence[OPSDRow], config: TrainConfig) -> list[tuple[PrefixBatch, ...]]:
    """`rows` in shared-prefix batches, the student's side and the teacher's alike.

    The turns of one step share the system prompt, the tools and each call's earlier turns;
    scored one by one, a pass runs every prompt whole for a loss on a few percent of its tokens
    (`benchmarks/opsd_prefix.py` measures the saving). The teacher's rows are batched row for
    row with the student's: hinted before the reply (`opsd_hint: turn`) they share the same
    prefixes; hinted in the system message, only what precedes the hint, since each turn's hint
    differs.
    """
    student = [TrainingSequence(r.session_id, r.student_ids, r.student_mask, []) for r in rows]
    teacher_of = {
        id(seq): TrainingSequence(r.session_id, r.teacher_ids, r.teacher_mask, [])
        for seq, r in zip(student, rows, strict=True)
    }
    pairs = []
    for batch in prefix_batches(
        student, max_sequences=config.batch_sequences, max_tokens=config.batch_tokens
    ):
        teacher = tuple(teacher_of[id(seq)] for seq in batch.sequences)
        pairs.append((batch, PrefixBatch(teacher, common_prefix_len(teacher))))
    return pairs


def opsd_step(
    student: Policy,
    teacher: Any,
    optimizer: torch.optim.Optimizer,
    rows: Sequence[OPSDRow],
    config: TrainConfig,
) -> dict[str, Any]:
    """One optimiser step of self-distillation over `rows`; returns its metrics.

    Both divergences of the student from the teacher are measured on every step, before its
    update (`kl/forward_topk`, `kl/reverse`: per loss token), whichever one it trains on (`kl`).
    Rows are scored in shared-prefix batches (`prefix_pairs`): the same loss and gradient as
    one by one, each shared prefix run once.
    """
    started = time.monotonic()
    num_tokens = sum(sum(r.student_mask) for r in rows)
    optimizer.zero_grad(set_to_none=True)
    student.model.train()
    teacher.eval()
    total, forward_kl, reverse = 0.0, 0.0, 0.0
    use_forward = config.opsd_loss == "forward_topk"
    computed = 0
    for student_batch, teacher_batch in prefix_pairs(rows, config):
        s = batch_scores(student.model, student_batch, keep_logits=True)
        with torch.no_grad():
            t = batch_scores(teacher, teacher_batch, keep_logits=True)
        computed += student_batch.computed_tokens + teacher_batch.computed_tokens
        if use_forward:
            loss = forward_topk_kl_loss(
                s.logits, t.logits, num_tokens=num_tokens, top_k=config.opsd_top_k
            )
        else:
            loss = reverse_kl_loss(s.logprobs, t.logprobs, num_tokens=num_tokens)
        loss.backward()
        total += loss.item()
        with torch.no_grad():
            if use_forward:  # the loss is the divergence, over the step's loss tokens
                forward_kl += loss.item() * num_tokens
            else:
                forward_kl += float(
                    forward_topk_kl_loss(s.logits, t.logits, num_tokens=1, top_k=config.opsd_top_k)
                )
            reverse += float(reverse_kl(s.logits, t.logits).sum())
    norm = grad_norm(student)
    torch.nn.utils.clip_grad_norm_(
        [p for p in student.model.parameters() if p.requires_grad], config.max_grad_norm
    )
    optimizer.step()
    elapsed = time.monotonic() - started
    return {
        "distill_loss": round(total, 6),
        "kl": round((forward_kl if use_forward else reverse) / max(num_tokens, 1), 6),
        "kl/forward_topk": round(forward_kl / max(num_tokens, 1), 6),
        "kl/reverse": round(reverse / max(num_tokens, 1), 6),
        "grad_norm": round(norm, 6),
        "num_tokens": num_tokens,
        "computed_tokens": computed,
        "tokens_per_s": round(sum(len(r.student_ids) for r in rows) / max(elapsed, 1e-9), 1),
        "step_time": round(elapsed, 3),
    }


DIVERGENCES = ("distill_loss", "kl", "kl/forward_topk", "kl/reverse")
"""Per-token metrics of an optimiser step, averaged over a pass by its steps' loss tokens."""


def opsd_update(
    student: Policy,
    teacher: Any,
    optimizer: torch.optim.Optimizer,
    rows: Sequence[OPSDRow],
    config: TrainConfig,
    *,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """One pass over a step's rows in `mini_batches` optimiser steps, as GRPO takes its batch.

    One optimiser step a pass barely moves the canary for a pass that costs minutes of scoring;
    the steps share that scoring. `on_step` gets each
    step's row; returns the pass: its divergences weighted by each step's loss tokens (each
    measured before its own update), the last step's grad norm, the time of all.
    """
    batches = mini_batches(rows, config.mini_batches)
    steps = []
    for index, batch in enumerate(batches, start=1):
        metrics = {
            "optimizer_step": index,
            "optimizer_steps": len(batches),
            "hinted_turns": len(batch),
            **opsd_step(student, teacher, optimizer, batch, config),
        }
        if on_step is not None:
            on_step(metrics)
        steps.append(metrics)
    return {
        **steps[-1], **token_weighted(steps, DIVERGENCES), "hinted_turns": len(rows),
        "num_tokens": sum(m["num_tokens"] for m in steps),
        "computed_tokens": sum(m["computed_tokens"] for m in steps),
        "step_time": round(sum(m["step_time"] for m in steps), 3),
    }  # fmt: skip
