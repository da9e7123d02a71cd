"""Defaults every entry point reads: the CLI's options, the service's request bodies, `loop.yaml`.

One place, so that `pipecat-rl train --rank 32`, a service job with `rank: 32` and a loop file
with `rank: 32` train the same adapter, and a default changed here changes every way in.
"""

MODEL = "smollm2"
"""The packaged model the embedded default serves (`serving.weights.PACKAGED_MODELS`)."""

CONCURRENCY = 4
"""Simulated calls at once for `simulate`, `gate` and the API (the model server's headroom on
2 cores; a GPU server takes more)."""

LOOP_CONCURRENCY = 8
"""Simulated calls at once in the night loop, which owns the server it starts."""

LORA_RANK = 16
"""LoRA rank on every projection."""


def lora_alpha(rank: int) -> int:
    """LoRA alpha for a rank: twice it (a scale of 2 whatever the rank), wherever none is given."""
    return 2 * rank


GROUP_SIZE = 8
"""Rollouts per scenario per online step (GRPO's group, RFT's round): a group of 8 of a scenario
passed 7 times in 8 holds a failure, and so carries signal, 2 times in 3 (1 - (7/8)^8); one of 4,
2 times in 5."""

TRAIN_TEMPERATURE = 1.0
"""GRPO / OPSD exploration temperature, recorded with each sampled turn."""

ADAPTER_PREFIX = "policy"
"""The first part of a trained adapter's name (`<prefix>-<algo>-v<n>-<hash>`); a loop file's
`adapter_prefix` names a project's own."""
