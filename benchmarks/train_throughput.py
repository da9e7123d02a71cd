"""Training tokens/s of our trainer on CPU against a bare peft forward+backward loop.

The same SmolLM2 rows (rank-8 LoRA on the seven projections, 512-token rows, the last 128 tokens
carrying loss), alternating arms in one process and one run: the bare loop is peft's model, a
full-vocabulary cross-entropy over the loss positions, backward and AdamW; ours is `train_sft`
(selective logprobs at the loss positions only, grad-norm, clipping, the cosine schedule, the
metrics callback). Target: ours >= 0.8x the bare loop. Prints JSON.
"""

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from pipecat_rl.training.config import TrainConfig  # noqa: E402
from pipecat_rl.training.policy import load_policy  # noqa: E402
from pipecat_rl.training.rows import TrainingSequence  # noqa: E402
from pipecat_rl.training.sft import train_sft  # noqa: E402

ROW_TOKENS = 512
LOSS_TOKENS = 128
ROWS = 4
ROUNDS = 2


def rows(vocab: int) -> list[TrainingSequence]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(ROWS):
        ids = torch.randint(100, vocab, (ROW_TOKENS,), generator=gen).tolist()
        mask = [False] * (ROW_TOKENS - LOSS_TOKENS) + [True] * LOSS_TOKENS
        out.append(TrainingSequence(f"s{i}", ids, mask, [0.0] * ROW_TOKENS))
    return out


def bare_loop(policy, sequences: list[TrainingSequence]) -> float:
    """A plain peft step per row: forward, cross-entropy on the loss positions, backward, AdamW."""
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    started = time.monotonic()
    for seq in sequences:
        ids = torch.tensor([seq.input_ids])
        labels = ids.clone()
        labels[0, : ROW_TOKENS - LOSS_TOKENS] = -100
        loss = policy.model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return ROWS * ROW_TOKENS / (time.monotonic() - started)


def ours(policy, sequences: list[TrainingSequence], config: TrainConfig) -> float:
    started = time.monotonic()
    train_sft(policy, sequences, config, on_step=lambda _: None)
    return ROWS * ROW_TOKENS / (time.monotonic() - started)


def main() -> dict:
    config = TrainConfig(rank=8, alpha=16, epochs=1, target_loss=0.0)
    policy = load_policy(config)
    sequences = rows(len(policy.tokenizer))
    bare_loop(policy, sequences[:1])  # warm-up
    bare, mine = [], []
    for _ in range(ROUNDS):
        bare.append(bare_loop(policy, sequences))
        mine.append(ours(policy, sequences, config))
    b, m = max(bare), max(mine)
    return {
        "model": str(policy.base_dir.name),
        "rank": 8,
        "row_tokens": ROW_TOKENS,
        "loss_tokens_per_row": LOSS_TOKENS,
        "rows_per_round": ROWS,
        "rounds": ROUNDS,
        "threads": torch.get_num_threads(),
        "bare_peft_tokens_per_s": round(b, 1),
        "ours_tokens_per_s": round(m, 1),
        "ratio": round(m / b, 3),
        "target_ratio": 0.8,
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
