"""Losses: GRPO's clipped importance-weighted objective and OPSD's two distillation losses.

Every loss takes per-token tensors and a mask and returns (loss, stats). Normalisation is the
"dapo" kind: summed over loss tokens and divided by the batch's loss-token count (passed in, so
a batch split into sequences is normalised as one).
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossStats:
    """What the metrics report about one loss evaluation: sums and extremes over its tokens."""

    tokens: int
    clipped: int
    """Tokens whose PPO ratio left the clip range on the side the advantage pushes."""
    ratio_min: float
    ratio_max: float
    ratio_sum: float
    """Of the importance ratio to the sampler, exp(log pi_theta - log mu)."""
    logp_diff_sum: float
    logp_diff_max: float
    """Of |log pi_old - log mu|: the trainer against the sampler before this batch's updates."""
    kl_sum: float
    """Of the k3 estimate of KL(pi_theta || mu) per token."""
    masked_sequence: bool


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantage: float,
    *,
    num_tokens: int,
    sampler_log_ratio: torch.Tensor | None = None,
    clip_low: float = 0.8,
    clip_high: float = 1.28,
    importance_sampling_cap: float = 3.0,
    sequence_mask_c: float = 3.0,
    beta: float = 0.0,
) -> tuple[torch.Tensor, LossStats]:
    """Clipped, importance-corrected policy loss of one sequence, divided by the batch's tokens.

    Per token, PPO's pessimistic min(r * A, clip(r) * A) with r = exp(log pi_theta - log pi_old),
    pi_old the trainer's own scores at the start of the batch, so the clip engages once earlier
    optimiser steps have moved the policy. The sampler mu (vLLM) differs from pi_old by its
    numerics and by any lag: `sampler_log_ratio` = log pi_old - log mu weights each token by
    min(pi_old / mu, cap), TRL's truncated importance sampling (`vllm_importance_sampling_cap`);
    together the weight and r make the ratio to the sampler. A sequence whose mean |log pi_old -
    log mu| exceeds `sequence_mask_c` is masked: its samples are too far off-policy to trust.
    """
    log_ratio = logprobs - old_logprobs.detach()
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, clip_low, clip_high)
    surrogate = torch.minimum(ratio * advantage, clipped * advantage)
    mismatch = (
        torch.zeros_like(log_ratio) if sampler_log_ratio is None else sampler_log_ratio.detach()
    )
    weight = torch.exp(mismatch).clamp(max=importance_sampling_cap)
    per_token = -weight * surrogate
    to_sampler = log_ratio + mismatch  # log pi_theta - log mu
    # k3 estimator of KL(pi_theta || mu): exp(-x) - 1 + x with x = log pi_theta - log mu (>= 0)
    kl = torch.exp(-to_sampler) - 1 + to_sampler
    if beta:
        per_token = per_token + beta * kl
    n = len(ratio)
    masked = bool(n and mismatch.abs().mean() > sequence_mask_c)
    loss = per_token.sum() / max(num_tokens, 1)
    if masked:
        loss = loss * 0.0
    with torch.no_grad():
        rho = torch.exp(to_sampler)
        diff = mismatch.abs()
        is_clipped = ((ratio < clip_low) & (advantage < 0)) | (
            (ratio > clip_high) & (advantage > 0)
        )
        stats = LossStats(
            tokens=n,
            clipped=int(is_clipped.sum()),
            ratio_min=float(rho.min()) if n else 1.0,
            ratio_max=float(rho.max()) if n else 1.0,
            ratio_sum=float(rho.sum()),
            logp_diff_sum=float(diff.sum()),
            logp_diff_max=float(diff.max()) if n else 0.0,
            kl_sum=float(kl.sum()),
            masked_sequence=masked,
        )
    return loss, stats


def sft_loss(logprobs: torch.Tensor, *, num_tokens: int) -> torch.Tensor:
    """Negative log-likelihood of the loss tokens, divided by the batch's tokens."""
    return -logprobs.sum() / max(num_tokens, 1)


def reverse_kl_loss(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, *, num_tokens: int
) -> torch.Tensor:
    """Per-sampled-token reverse KL(student || teacher), on the student's own samples.

    The score-function form: the per-token log ratio (detached) weights the student's logprob,
    which is an unbiased gradient of the reverse KL for on-policy samples (the cheap OPSD loss).
    """
    advantage = (teacher_logprobs - student_logprobs).detach()
    return -(advantage * student_logprobs).sum() / max(num_tokens, 1)


def forward_topk_kl_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    *,
    num_tokens: int,
    top_k: int = 20,
) -> torch.Tensor:
    """Forward KL(teacher || student) over the teacher's top-k tokens plus one tail bucket.

    At each sampled position the teacher's k most likely tokens keep their own probabilities and
    the rest is pooled into a tail, so the student matches the teacher's whole distribution at
    O(k) memory per position (the full-distribution form the self-distillation results favour).
    """
    teacher_logp = torch.log_softmax(teacher_logits.detach(), dim=-1)
    student_logp = torch.log_softmax(student_logits, dim=-1)
    k = min(top_k, teacher_logp.shape[-1])
    t_top, idx = teacher_logp.topk(k, dim=-1)
    s_top = student_logp.gather(-1, idx)
    t_tail = torch.log1p(-t_top.exp().sum(-1).clamp(max=1 - 1e-6))
    s_tail = torch.log1p(-s_top.exp().sum(-1).clamp(max=1 - 1e-6))
    t_all = torch.cat([t_top, t_tail.unsqueeze(-1)], dim=-1)
    s_all = torch.cat([s_top, s_tail.unsqueeze(-1)], dim=-1)
    kl = (t_all.exp() * (t_all - s_all)).sum(-1)
    return kl.sum() / max(num_tokens, 1)


def reverse_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """[n] KL(student || teacher) at each position over the whole vocabulary (a measurement)."""
    student_logp = torch.log_softmax(student_logits, dim=-1)
    teacher_logp = torch.log_softmax(teacher_logits, dim=-1)
    return (student_logp.exp() * (student_logp - teacher_logp)).sum(-1)


def dpo_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    *,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DPO's sigmoid loss per pair, and each pair's implicit reward margin (detached).

    Each argument is [pairs] total log p of a reply given its prompt: under the policy, and
    under the reference (the parent adapter the run starts from). The loss is
    -log σ(β ((log π_c − log ref_c) − (log π_r − log ref_r))), Rafailov et al.'s objective.
    """
    margin = beta * ((chosen - ref_chosen) - (rejected - ref_rejected))
    return -torch.nn.functional.logsigmoid(margin), margin.detach()
