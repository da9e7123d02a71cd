"""SFT: filtered behaviour cloning on sequences that passed (demonstrations included).

Sequences that share a prefix (the system prompt, tools and greeting: most of a voice agent's
sequence) train together, the prefix computed once per step (`prefix`). A slice of the sessions
is held aside: its loss after each epoch picks the epoch count, and the run stops once it has not
improved for `patience` epochs, keeping the best epoch's weights (a fixed target loss may never
be reached, and then every epoch is paid). AdamW with a cosine schedule over the most steps the
run may take; bf16 autocast where the CPU computes bf16 natively (weights and gradients stay
fp32).
"""

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from loguru import logger

from pipecat_rl.errors import NoTrainingSignalError, TrainingError
from pipecat_rl.training.config import TrainConfig
from pipecat_rl.training.loss import sft_loss
from pipecat_rl.training.policy import Policy
from pipecat_rl.training.prefix import PrefixBatch, batch_scores, prefix_batches
from pipecat_rl.training.rows import TrainingSequence

StepCallback = Callable[[dict[str, Any]], None]
"""Called with each step's metrics (TRL names), and with each epoch's (`heldout_loss`)."""

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""CPU flags of native bf16 matmuls; without them bf16 is emulated and slower than fp32."""


def optimizer_for(policy: Policy, lr: float) -> torch.optim.Optimizer:
    """AdamW over the trainable (LoRA) parameters only."""
    params = [p for p in policy.model.parameters() if p.requires_grad]
    if not params:
        raise TrainingError("the policy has no trainable parameters (is the LoRA frozen?)")
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)


def cosine(step: int, total: int) -> float:
    """The cosine schedule's factor at `step` of `total` (1 at the start, 0 at the end)."""
    return 0.5 * (1 + math.cos(math.pi * min(step, total) / max(total, 1)))


def grad_norm(policy: Policy) -> float:
    """The L2 norm of the trainable parameters' gradients."""
    norms = [p.grad.norm() for p in policy.model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


def cpu_has_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX), per /proc/cpuinfo."""
    try:
        flags = next((ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        return False
    return any(flag in flags.split() for flag in BF16_FLAGS)


def resolve_precision(precision: str, *, has_bf16: bool | None = None) -> Literal["fp32", "bf16"]:
    """`auto` becomes bf16 on a CPU with native bf16 and fp32 elsewhere."""
    if precision != "auto":
        return "bf16" if precision == "bf16" else "fp32"
    return "bf16" if (cpu_has_bf16() if has_bf16 is None else has_bf16) else "fp32"


def autocast(precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CPU for `bf16` (weights and gradients stay fp32); nothing for fp32."""
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def holdout_split(
    sequences: Sequence[TrainingSequence], fraction: float, seed: int
) -> tuple[list[TrainingSequence], list[TrainingSequence]]:
    """(train, held aside): `fraction` of the sessions (seeded), each session wholly on one side.

    A fraction worth less than one whole session holds nothing aside.
    """
    sessions = sorted({s.session_id for s in sequences})
    random.Random(seed).shuffle(sessions)
    held = set(sessions[: int(fraction * len(sessions))])
    return (
        [s for s in sequences if s.session_id not in held],
        [s for s in sequences if s.session_id in held],
    )


def _batches(config: TrainConfig, sequences: Sequence[TrainingSequence], rng=None) -> list:
    return prefix_batches(
        sequences, max_sequences=config.batch_sequences, max_tokens=config.batch_tokens, rng=rng
    )


def heldout_loss(policy: Policy, batches: Sequence[PrefixBatch], precision: str) -> float:
    """Mean negative log-likelihood per loss token over `batches`, without gradients."""
    total, tokens = 0.0, 0
    with torch.no_grad(), autocast(precision):
        for batch in batches:
            total -= float(batch_scores(policy.model, batch).logprobs.sum())
            tokens += batch.num_loss_tokens
    return total / max(tokens, 1)


@contextlib.contextmanager
def _eval_mode(model: Any) -> Iterator[None]:
    model.eval()
    try:
        yield
    finally:
        model.train()


def _trainable_state(policy: Policy) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}


def _restore(policy: Policy, state: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if name in state:
                param.copy_(state[name])


def train_sft(
    policy: Policy,
    sequences: Sequence[TrainingSequence],
    config: TrainConfig,
    *,
    on_step: StepCallback | None = None,
) -> dict[str, Any]:
    """Train `policy` on `sequences`; returns the summary metrics."""
    if not sequences:
        raise NoTrainingSignalError(
            "SFT has no rows: no passed session or demonstration to imitate; simulate the "
            "scripted expert (or a passing policy) first"
        )
    emit = on_step or (lambda _: None)
    precision = resolve_precision(config.precision)
    train_rows, held_rows = holdout_split(sequences, config.holdout, config.seed)
    held = _batches(config, held_rows)
    rng = random.Random(config.seed)
    optimizer = optimizer_for(policy, config.learning_rate())
    per_epoch = len(_batches(config, train_rows))
    total = config.epochs * per_epoch
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine(s, total))
    params = [p for p in policy.model.parameters() if p.requires_grad]
    step, tokens_seen, started = 0, 0, time.monotonic()
    best: tuple[float, int, dict[str, torch.Tensor]] | None = None
    epoch_loss, stopped = float("nan"), "epochs"
    logger.info(
        f"SFT: {len(train_rows)} sequences in {per_epoch} shared-prefix batches per epoch, "
        f"{len(held_rows)} held aside, {precision}"
    )
    policy.model.train()
    for epoch in range(1, config.epochs + 1):
        nll, loss_tokens = 0.0, 0
        for batch in _batches(config, train_rows, rng):
            t0 = time.monotonic()
            with autocast(precision):
                scores = batch_scores(policy.model, batch)
            n = batch.num_loss_tokens
            loss = sft_loss(scores.logprobs, num_tokens=n)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm = grad_norm(policy)
            torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
            optimizer.step()
            schedule.step()
            step += 1
            tokens_seen += batch.num_tokens
            nll += loss.item() * n
            loss_tokens += n
            elapsed = time.monotonic() - t0
            emit({
                "step": step,
                "total_steps": total,
                "epoch": epoch,
                "loss": round(loss.item(), 6),
                "grad_norm": round(norm, 6),
                "entropy": round(float(scores.entropy.mean()), 6),
                "learning_rate": schedule.get_last_lr()[0],
                "sequences": len(batch.sequences),
                "num_tokens": batch.num_tokens,
                "computed_tokens": batch.computed_tokens,
                "shared_prefix_tokens": batch.prefix_len,
                "num_loss_tokens": n,
                "tokens_per_s": round(batch.num_tokens / max(elapsed, 1e-9), 1),
                "step_time": round(elapsed, 3),
            })  # fmt: skip
        epoch_loss = nll / max(loss_tokens, 1)
        row: dict[str, Any] = {"step": step, "total_steps": total, "epoch": epoch,
                               "epoch_loss": round(epoch_loss, 6)}  # fmt: skip
        if held:
            with _eval_mode(policy.model):
                held_loss = heldout_loss(policy, held, precision)
            if best is None or held_loss < best[0] * (1 - config.min_improvement):
                best = (held_loss, epoch, _trainable_state(policy))
            row |= {"heldout_loss": round(held_loss, 6), "best_epoch": best[1]}
        emit(row)
        if best is not None and epoch - best[1] >= config.patience:
            stopped = "heldout"
            break
        if config.target_loss and epoch_loss <= config.target_loss:
            stopped = "target_loss"
            break
    if best is not None and best[1] != epoch:
        _restore(policy, best[2])
    return {
        "loss": round(epoch_loss, 6),
        "epochs": epoch,
        "best_epoch": best[1] if best else epoch,
        "heldout_loss": round(best[0], 6) if best else None,
        "heldout_sessions": len({s.session_id for s in held_rows}),
        "stopped": stopped,
        "steps": step,
        "sequences": len(train_rows),
        "batches_per_epoch": per_epoch,
        "precision": precision,
        "loss_tokens": sum(s.num_loss_tokens for s in train_rows),
        "tokens_per_s": round(tokens_seen / max(time.monotonic() - started, 1e-9), 1),
        "train_time_s": round(time.monotonic() - started, 1),
    }
