"""DPO: people's picks between two replies at the same moment of a call.

Each decisive vote (`a` or `b`) of a duel is one pair: the duel's prompt ids, the chosen reply's
ids and the rejected reply's, exactly as the rater was shown them (`ledger.duels`); ties and
`both_bad` say nothing about which is better and are counted, never trained, and a duel whose
call may not train (held out, or replaying a held-out call) is never a pair
(`Ledger.trainable_votes`). The reference is the policy the run starts from, the parent
adapter: its log-probabilities of every pair are taken once, before the first update, so no
second model is held. Both replies of a pair share their prompt, computed once per pair
(`prefix.batch_scores`).
"""

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipecat_rl.ledger import Ledger
from pipecat_rl.training.config import TrainConfig
from pipecat_rl.training.loss import dpo_loss
from pipecat_rl.training.policy import Policy
from pipecat_rl.training.prefix import PrefixBatch, batch_scores, common_prefix_len
from pipecat_rl.training.rows import TrainingSequence, mini_batches
from pipecat_rl.training.sft import grad_norm, optimizer_for


@dataclass(frozen=True)
class DPOPair:
    """One rater's pick of one duel, as ids."""

    duel_id: str
    session_id: str
    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]

    def batch(self) -> PrefixBatch:
        """Both replies after the shared prompt: one forward, the prompt run once."""
        seqs = tuple(
            TrainingSequence(
                session_id=self.session_id,
                input_ids=[*self.prompt_ids, *ids],
                loss_mask=[False] * len(self.prompt_ids) + [True] * len(ids),
                sampler_logprobs=[],
            )
            for ids in (self.chosen_ids, self.rejected_ids)
        )
        return PrefixBatch(seqs, common_prefix_len(seqs))


def dpo_pairs(ledger: Ledger) -> tuple[list[DPOPair], dict[str, int]]:
    """The pairs the ledger's votes give, and the votes kept out per reason (`kept_out`).

    Raises:
        NoTrainingSignalError: no vote picks a reply of a duel that may train.
    """
    selection = ledger.trainable_votes()
    selection.require()
    duels = {d.id: d for d in ledger.duels()}
    pairs = []
    for vote in selection.votes:
        duel = duels[vote.duel_id]
        chosen, rejected = (
            (duel.reply_a, duel.reply_b) if vote.choice == "a" else (duel.reply_b, duel.reply_a)
        )
        pairs.append(
            DPOPair(
                duel_id=duel.id, session_id=duel.session_id, prompt_ids=duel.prompt_token_ids,
                chosen_ids=chosen.token_ids, rejected_ids=rejected.token_ids,
            )
        )  # fmt: skip
    return pairs, selection.kept_out


def _logps(model: Any, pair: DPOPair) -> tuple[torch.Tensor, torch.Tensor]:
    """Total log p of the chosen and the rejected reply under `model` (raw space)."""
    scores = batch_scores(model, pair.batch())
    chosen, rejected = scores.logprobs.split(scores.sizes)
    return chosen.sum(), rejected.sum()


def train_dpo(
    policy: Policy,
    pairs: Sequence[DPOPair],
    config: TrainConfig,
    *,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """`config.steps` passes over `pairs`, each in `config.mini_batches` optimiser steps.

    Returns the summary (TRL's DPO names: `rewards/accuracies`, `rewards/margins`, ...).
    """
    emit = on_step or (lambda _: None)
    policy.model.eval()
    with torch.no_grad():  # the reference: the parent, as the run starts
        reference = [tuple(float(x) for x in _logps(policy.model, p)) for p in pairs]
    policy.model.train()
    optimizer = optimizer_for(policy, config.learning_rate())
    params = [p for p in policy.model.parameters() if p.requires_grad]
    rng = random.Random(config.seed)
    order = list(range(len(pairs)))
    step, started, last = 0, time.monotonic(), {}
    total = config.steps * len(mini_batches(order, config.mini_batches))
    for epoch in range(1, config.steps + 1):
        rng.shuffle(order)
        for batch in mini_batches(order, config.mini_batches):
            t0 = time.monotonic()
            optimizer.zero_grad(set_to_none=True)
            losses, margins, chosen_logps, rejected_logps = [], [], [], []
            for i in batch:
                chosen, rejected = _logps(policy.model, pairs[i])
                ref_c, ref_r = reference[i]
                loss, margin = dpo_loss(
                    chosen.unsqueeze(0), rejected.unsqueeze(0), torch.tensor([ref_c]),
                    torch.tensor([ref_r]), beta=config.dpo_beta,
                )  # fmt: skip
                (loss.sum() / len(batch)).backward()
                losses.append(float(loss))
                margins.append(float(margin))
                chosen_logps.append(float(chosen))
                rejected_logps.append(float(rejected))
            norm = grad_norm(policy)
            torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
            optimizer.step()
            step += 1
            beta = config.dpo_beta
            rewards_c = [c - reference[i][0] for c, i in zip(chosen_logps, batch, strict=True)]
            rewards_r = [r - reference[i][1] for r, i in zip(rejected_logps, batch, strict=True)]
            last = {
                "step": step, "total_steps": total, "epoch": epoch,
                "loss": round(statistics.fmean(losses), 6),
                "rewards/margins": round(statistics.fmean(margins), 6),
                "rewards/accuracies": round(sum(m > 0 for m in margins) / len(margins), 4),
                "rewards/chosen": round(beta * statistics.fmean(rewards_c), 6),
                "rewards/rejected": round(beta * statistics.fmean(rewards_r), 6),
                "logps/chosen": round(statistics.fmean(chosen_logps), 4),
                "logps/rejected": round(statistics.fmean(rejected_logps), 4),
                "pairs": len(batch), "grad_norm": round(norm, 6),
                "step_time": round(time.monotonic() - t0, 3),
            }  # fmt: skip
            emit(last)
    return {
        **{k: v for k, v in last.items() if k not in ("step", "total_steps", "epoch")},
        "steps": step, "pairs_trained": len(pairs), "beta": config.dpo_beta,
        "train_time_s": round(time.monotonic() - started, 1),
    }  # fmt: skip
