"""Every use of a private Pipecat name, in one place, so a Pipecat upgrade breaks here only."""

from typing import Any

# -- issue 12 (audio mode): whether a bot's user aggregator runs its own VAD ----------------------


def user_aggregator_vad(aggregator: Any) -> Any:
    """The VAD analyzer an `LLMUserAggregator` was built with (its params are private), or None."""
    params = getattr(aggregator, "_params", None)
    return getattr(params, "vad_analyzer", None)
