"""Training: LoRA adapters from the ledger — SFT warm start, GRPO, OPSD, a logprob guard.

`train(ledger, config)` is the one entry point; rows, advantages, losses and the guard are plain
functions in their own modules. Importing this package does not import torch: the trainer
(`train`) is loaded on first use, so the recorder and the CLI stay light.
"""

from typing import TYPE_CHECKING, Any

from pipecat_rl.training.config import Algo, TrainConfig, TrainResult

if TYPE_CHECKING:
    from pipecat_rl.training.trainer import train

__all__ = ["Algo", "TrainConfig", "TrainResult", "train"]


def __getattr__(name: str) -> Any:
    if name == "train":
        from pipecat_rl.training.trainer import train

        return train
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
