"""The policy being trained: the served base model with a LoRA, and its per-token logprobs.

CPU rules (measured): fp32, a fixed thread count, no gradient checkpointing at this size, LoRA on
the seven projections only. Logprobs are computed only where they are needed (`logits_to_keep`)
and selectively (logit minus logsumexp), never as a full-vocabulary log-softmax per token.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from loguru import logger

from pipecat_rl.errors import TrainingError
from pipecat_rl.training.config import LORA_TARGETS, TrainConfig


@dataclass
class Policy:
    """A peft model on the base weights, its tokenizer, and where they came from."""

    model: Any
    tokenizer: Any
    base_dir: Path
    parent: str | None


def resolve_base(base_model: str | Path) -> Path:
    """The HF folder of the base model (a packaged name is prepared once, never downloaded)."""
    from pipecat_rl.serving.weights import prepare_model

    return prepare_model(base_model)


def load_policy(
    config: TrainConfig, parent_path: Path | None = None, *, trainable: bool = True
) -> Policy:
    """The base model with the parent's LoRA (trainable) or a fresh one of `config.rank`."""
    try:
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise TrainingError(
            "training needs torch, transformers and peft: pip install 'pipecat-rl[cpu]'"
        ) from e
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    base_dir = resolve_base(config.base_model)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if parent_path is not None:
        model = PeftModel.from_pretrained(base, parent_path, is_trainable=trainable)
        logger.info(f"Continuing from adapter {parent_path}")
    else:
        lora = LoraConfig(
            r=config.rank,
            lora_alpha=config.lora_alpha,
            target_modules=list(LORA_TARGETS),
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(base, lora)
    model.train(trainable)
    return Policy(model=model, tokenizer=tokenizer, base_dir=base_dir, parent=config.parent)


def loss_positions(loss_mask: list[bool]) -> torch.Tensor:
    """Positions whose logits predict a loss-carrying token (position t predicts token t+1)."""
    return torch.tensor([t - 1 for t, m in enumerate(loss_mask) if m and t > 0], dtype=torch.long)


def selective_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The log-probability of each target under its row of `logits` [n, vocab], selectively."""
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


GREEDY_BELOW = 1e-5
"""vLLM samples greedily below this temperature, and returns those logprobs unscaled."""


def served_temperature(temperature: float) -> float:
    """The temperature vLLM divides the logits by for a request at `temperature`."""
    return 1.0 if temperature < GREEDY_BELOW else temperature


@dataclass
class TokenScores:
    """Logprobs of a sequence's loss tokens, and what else the losses and metrics need."""

    logprobs: torch.Tensor
    """[n] log p(token) at the loss positions, at the temperature given (raw without one)."""
    raw_logprobs: torch.Tensor
    """[n] log p(token) of the unscaled logits (vLLM's raw space); `logprobs` when unscaled."""
    entropy: torch.Tensor
    """[n] entropy of the (temperature-scaled) distribution at each loss position (detached)."""
    logits: torch.Tensor | None = None
    """[n, vocab] when asked for (OPSD's distribution losses), temperature-scaled."""


def score(
    model: Any,
    input_ids: list[int],
    loss_mask: list[bool],
    *,
    temperature: float | Sequence[float] | None = None,
    keep_logits: bool = False,
) -> TokenScores:
    """Per-token logprobs of the loss-carrying tokens of one sequence under `model`.

    `temperature` divides the logits first, as vLLM does before sampling (its processed space;
    TRL scores `logits / T` too, so the gradient is that of the policy that sampled): one value
    for every token, or one per position aligned with `input_ids` (each sampled id at its own
    turn's temperature). Greedy requests count as 1, as vLLM applies them. None: the raw space.
    """
    positions = loss_positions(loss_mask)
    ids = torch.tensor([input_ids], dtype=torch.long)
    out = model(input_ids=ids, logits_to_keep=positions)
    raw = out.logits[0].float()
    targets = ids[0, positions + 1]
    scale = _temperatures(temperature, positions + 1)
    logits = raw if scale is None else raw / scale.unsqueeze(-1)
    logprobs = selective_logprobs(logits, targets)
    raw_logprobs = logprobs if scale is None else selective_logprobs(raw, targets)
    with torch.no_grad():
        probs = torch.softmax(logits, dim=-1)
        entropy = -(probs * torch.log_softmax(logits, dim=-1)).sum(-1)
    return TokenScores(
        logprobs=logprobs,
        raw_logprobs=raw_logprobs,
        entropy=entropy,
        logits=logits if keep_logits else None,
    )


def _temperatures(
    temperature: float | Sequence[float] | None, targets: torch.Tensor
) -> torch.Tensor | None:
    """The divisor of each target's logits, or None where every one is 1 (the raw space)."""
    if temperature is None:
        return None
    if isinstance(temperature, (int, float)):
        values = [served_temperature(float(temperature))] * len(targets)
    elif len(temperature) == 0:
        return None
    else:
        values = [served_temperature(float(temperature[t])) for t in targets.tolist()]
    if all(v == 1.0 for v in values):
        return None
    return torch.tensor(values, dtype=torch.float32)


def save_adapter(policy: Policy, folder: Path) -> None:
    """Write the peft adapter files (adapter_config.json + weights) to `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(folder)
