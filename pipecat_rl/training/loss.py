"""Losses: GRPO's clipped importance-weighted objective and OPSD's two distillation losses.

Every loss takes per-token tensors and a mask and returns (loss, stats). Normalisation is the
"dapo" kind: summed over loss tokens and divided by the batch's loss-token count (passed in, so
a batch split into sequences is normalised as one).
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossStats:
    """What the metrics report about one loss evaluation."""

    clip_ratio: float
    ratio_min: float
    ratio_mean: float
    ratio_max: float
    logp_diff_mean: float
    logp_diff_max: float
    kl: float
    masked_sequence: bool


def grpo_loss(
    logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    advantage: float,
    *,
    num_tokens: int,
    clip_low: float = 0.8,
    clip_high: float = 1.28,
    sequence_mask_c: float = 3.0,
    beta: float = 0.0,
) -> tuple[torch.Tensor, LossStats]:
    """Clipped IS policy loss of one sequence's sampled tokens, divided by the batch's tokens.

    ratio = exp(log pi_theta - log mu) per token, mu the recorded sampler; PPO's pessimistic
    min(ratio * A, clip(ratio) * A). A sequence whose mean |log ratio| exceeds `sequence_mask_c`
    is masked (contributes nothing): its samples are too far off-policy to trust.
    """
    log_ratio = logprobs - sampler_logprobs
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, clip_low, clip_high)
    surrogate = torch.minimum(ratio * advantage, clipped * advantage)
    per_token = -surrogate
    # k3 estimator of KL(pi_theta || mu): exp(-x) - 1 + x with x = log ratio (always >= 0)
    kl = torch.exp(-log_ratio) - 1 + log_ratio
    if beta:
        per_token = per_token + beta * kl
    masked = bool(log_ratio.detach().abs().mean() > sequence_mask_c)
    loss = per_token.sum() / max(num_tokens, 1)
    if masked:
        loss = loss * 0.0
    with torch.no_grad():
        diff = log_ratio.abs()
        is_clipped = ((ratio < clip_low) & (advantage < 0)) | (
            (ratio > clip_high) & (advantage > 0)
        )
        stats = LossStats(
            clip_ratio=float(is_clipped.float().mean()) if len(ratio) else 0.0,
            ratio_min=float(ratio.min()) if len(ratio) else 1.0,
            ratio_mean=float(ratio.mean()) if len(ratio) else 1.0,
            ratio_max=float(ratio.max()) if len(ratio) else 1.0,
            logp_diff_mean=float(diff.mean()) if len(diff) else 0.0,
            logp_diff_max=float(diff.max()) if len(diff) else 0.0,
            kl=float(kl.mean()) if len(kl) else 0.0,
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
