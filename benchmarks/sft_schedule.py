"""SFT schedules on the clinic's demonstrations: the held-aside loss per epoch, per arm.

    pipecat-rl simulate examples/clinic/handwritten/pool --bot examples/clinic/expert.py \\
        --persona scripted --no-server --ledger /tmp/demos.db
    python benchmarks/sft_schedule.py /tmp/demos.db --arm 4:3e-4 --arm 4:1e-3 > schedule.json

Each arm (`sequences per step:lr`) trains a fresh LoRA (r16, the trainer's defaults otherwise:
bf16 where the CPU has it, 15% of the sessions held aside, patience 1, at most 10 epochs) on the
same rows with the same seed, and reports every epoch's training and held-aside loss, where the
run stopped and why, and its wall time. Prints JSON.
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipecat_rl.ledger import Ledger  # noqa: E402
from pipecat_rl.training.config import TrainConfig  # noqa: E402
from pipecat_rl.training.policy import load_policy  # noqa: E402
from pipecat_rl.training.sft import train_sft  # noqa: E402
from pipecat_rl.training.trainer import sft_rows  # noqa: E402


def run_arm(ledger: Ledger, batch: int, lr: float, epochs: int) -> dict:
    """One schedule from a fresh LoRA; its epochs' losses and summary."""
    config = TrainConfig(batch_sequences=batch, lr=lr, epochs=epochs)
    policy = load_policy(config)
    sequences, _, info = sft_rows(ledger, policy, config)
    rows: list[dict] = []
    started = time.monotonic()
    summary = train_sft(policy, sequences, config, on_step=rows.append)
    return {
        "batch_sequences": batch,
        "lr": lr,
        "rows": info,
        "epochs": [
            {k: r.get(k) for k in ("epoch", "step", "epoch_loss", "heldout_loss")}
            for r in rows
            if "epoch_loss" in r
        ],
        "summary": summary,
        "wall_s": round(time.monotonic() - started, 1),
    }


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ledger", type=Path)
    parser.add_argument("--arm", action="append", default=[], help="sequences:lr, e.g. 4:1e-3")
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    arms = [(int(b), float(lr)) for b, lr in (a.split(":") for a in args.arm or ["4:3e-4"])]
    with Ledger(args.ledger) as ledger:
        return {"arms": [run_arm(ledger, b, lr, args.epochs) for b, lr in arms]}


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
