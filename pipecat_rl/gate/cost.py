"""Cost per successful call: recorded usage times a configured price table.

A candidate that wins by talking more pays for it in tokens and TTS audio; dividing a policy's
total cost by its number of passing runs puts that next to the reward delta.
"""

from collections.abc import Sequence

from pydantic import ConfigDict, Field

from pipecat_rl.gate.config import PriceTable
from pipecat_rl.gate.stats import Result


class Usage(Result):
    """What one call consumed: finite, non-negative counts and durations."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    prompt_tokens: int = Field(0, ge=0)
    completion_tokens: int = Field(0, ge=0)
    stt_seconds: float = Field(0.0, ge=0)
    """Audio streamed to STT: the call's duration for a streaming STT."""
    tts_seconds: float = Field(0.0, ge=0)
    """Audio the bot spoke."""


class CostSummary(Result):
    """A policy's cost over its runs; `per_success_usd` is None when no run passed."""

    runs: int
    successes: int
    total_usd: float
    per_call_usd: float
    per_success_usd: float | None
    mean_completion_tokens: float
    mean_tts_seconds: float


def call_cost(usage: Usage, prices: PriceTable) -> float:
    """USD for one call: tokens per million, STT and TTS per minute."""
    return (
        usage.prompt_tokens * prices.llm_input_usd_per_mtok / 1e6
        + usage.completion_tokens * prices.llm_output_usd_per_mtok / 1e6
        + usage.stt_seconds / 60.0 * prices.stt_usd_per_min
        + usage.tts_seconds / 60.0 * prices.tts_usd_per_min
    )


def cost_summary(usages: Sequence[Usage], successes: int, prices: PriceTable) -> CostSummary:
    """Total, per-call and per-successful-call cost of one policy's runs."""
    if not usages:
        raise ValueError("no runs to cost")
    total = sum(call_cost(u, prices) for u in usages)
    runs = len(usages)
    return CostSummary(
        runs=runs,
        successes=successes,
        total_usd=total,
        per_call_usd=total / runs,
        per_success_usd=total / successes if successes else None,
        mean_completion_tokens=sum(u.completion_tokens for u in usages) / runs,
        mean_tts_seconds=sum(u.tts_seconds for u in usages) / runs,
    )
