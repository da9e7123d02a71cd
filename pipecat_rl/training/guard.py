"""The logprob guard: before the first update, the trainer must score what the server sampled.

Recorded completions are re-scored under the adapter that sampled them, in the space the server
returned them (vLLM's default: raw logprobs, before temperature), and compared token by token with
the recorded logprobs. The prompts are re-rendered with the trainer's chat template too, as the
server renders them (`chat.server_messages`: malformed tool arguments become `{}`), so template
drift shows as id mismatches and a policy's malformed calls do not. Over the threshold, or with
nothing to compare, the run fails with the likely cause named. The result goes into the adapter's
metadata, where the gate reads it (`gate.lineage`): a missing guard never reads as a passed one.
"""

import contextlib
import statistics
from collections.abc import Sequence
from typing import Any

import torch

from pipecat_rl.errors import GuardError
from pipecat_rl.ledger import BASE_ADAPTER, TurnRecord
from pipecat_rl.training.chat import rendered_prompt
from pipecat_rl.training.config import TrainConfig
from pipecat_rl.training.policy import Policy, score
from pipecat_rl.training.rows import TrainableTurn


def _adapter_scope(policy: Policy, adapter: str | None, base_names: set[str]) -> Any:
    """A context in which the model is the policy that sampled `adapter`, or None if unknown."""
    if adapter is None or adapter in base_names:
        return policy.model.disable_adapter()
    if policy.parent is not None and adapter == policy.parent:
        return contextlib.nullcontext()
    return None


def run_guard(
    policy: Policy,
    turns: Sequence[TurnRecord],
    config: TrainConfig,
    *,
    base_names: Sequence[str] = (BASE_ADAPTER,),
) -> dict[str, Any]:
    """Compare trainer and sampler logprobs on `turns`; the result dict, with `passed`.

    Raises:
        GuardError: over the threshold, template drift, or nothing to compare.
    """
    names = {*base_names, BASE_ADAPTER}
    missing = [t for t in turns if not t.demonstration and t.logprobs is None]
    usable = [t for t in turns if t.trainable and not t.demonstration]
    usable = usable[-config.guard_turns :]
    diffs: list[float] = []
    alt_diffs: list[float] = []
    per_adapter: dict[str, list[float]] = {}
    drift = compared = skipped = 0
    first_drift: str | None = None
    processed = config.logprobs_mode == "processed_logprobs"
    was_training = policy.model.training
    policy.model.eval()
    try:
        for turn in usable:
            scope = _adapter_scope(policy, turn.adapter, names)
            if scope is None:
                skipped += 1
                continue
            row = TrainableTurn.from_turn(turn)
            rendered = rendered_prompt(policy.tokenizer, turn.request)
            if rendered is not None and rendered != row.prompt_ids:
                drift += 1
                first_drift = first_drift or f"{turn.session_id}#{turn.index}"
            ids = [*row.prompt_ids, *row.sampled_ids]
            mask = [False] * len(row.prompt_ids) + [True] * len(row.sampled_ids)
            temperature = row.sampling.temperature or None
            with torch.no_grad(), scope:
                raw = score(policy.model, ids, mask).logprobs
                scaled = score(policy.model, ids, mask, temperature=temperature).logprobs
            recorded = torch.tensor(row.sampler_logprobs or [], dtype=torch.float32)
            mine, other = (scaled, raw) if processed else (raw, scaled)
            d = (mine - recorded).abs().tolist()
            diffs += d
            alt_diffs += (other - recorded).abs().tolist()
            per_adapter.setdefault(str(turn.adapter), []).extend(d)
            compared += 1
    finally:
        policy.model.train(was_training)
    result: dict[str, Any] = {
        "passed": False,
        "space": config.logprobs_mode,
        "compared_turns": compared,
        "compared_tokens": len(diffs),
        "skipped_turns": skipped,
        "missing_logprobs_turns": len(missing),
        "template_mismatches": drift,
        "mean_abs_diff": round(statistics.fmean(diffs), 6) if diffs else None,
        "max_abs_diff": round(max(diffs), 6) if diffs else None,
        "per_adapter": {
            k: {"tokens": len(v), "mean": round(statistics.fmean(v), 6), "max": round(max(v), 6)}
            for k, v in per_adapter.items()
        },
        "mean_threshold": config.guard_mean_threshold,
        "max_threshold": config.guard_max_threshold,
    }
    cause = _cause(result, alt_diffs, config, first_drift)
    result["cause"] = cause
    result["passed"] = cause is None
    if cause is not None:
        raise GuardError(f"logprob guard failed: {cause}", result)
    return result


def _cause(
    result: dict[str, Any], alt_diffs: list[float], config: TrainConfig, first_drift: str | None
) -> str | None:
    if result["compared_tokens"] == 0:
        why = "nothing to compare: no recorded turn sampled by this run's starting policy"
        if result["missing_logprobs_turns"]:
            why += (
                f" has logprobs ({result['missing_logprobs_turns']} turn(s) were recorded without "
                "them: record through a vLLM server so the tee asks for token ids and logprobs)"
            )
        elif result["skipped_turns"]:
            why += f" ({result['skipped_turns']} turn(s) were sampled by other adapters)"
        return why + "; simulate a few calls under it first"
    if result["template_mismatches"]:
        return (
            f"template drift: the trainer's chat template renders {result['template_mismatches']}"
            f" of {result['compared_turns']} recorded prompts differently from the server (first:"
            f" turn {first_drift}); serve and train with the same model "
            "folder (its chat_template.jinja)"
        )
    mean, worst = result["mean_abs_diff"], result["max_abs_diff"]
    if mean <= config.guard_mean_threshold and worst <= config.guard_max_threshold:
        return None
    alt = statistics.fmean(alt_diffs) if alt_diffs else None
    numbers = f"mean |Δlogp| {mean:.4f} (max {worst:.4f}) over {result['compared_tokens']} tokens"
    if alt is not None and alt <= config.guard_mean_threshold:
        other = "raw" if config.logprobs_mode == "processed_logprobs" else "processed"
        return (
            f"{numbers}, but {alt:.4f} in the {other} space: temperature / logprobs mode "
            f"mismatch; set logprobs_mode to match the server's --logprobs-mode"
        )
    return (
        f"{numbers}: the weights differ from the ones that sampled (a stale or different adapter, "
        "another base model, or truncated sampling: top-p/top-k) — check the adapter name and "
        "the served model"
    )
