"""SFT throughput on CPU against a bare peft loop, and both against this machine's matmul peak.

Production shapes: SmolLM2-135M, LoRA r16 / alpha 32 on the seven projections, four sequences of
860-980 tokens that share a 541-token prefix (the clinic's system prompt and tool schemas), loss
on assistant-like spans of the suffixes (~16% of the tokens, as in the clinic's demonstrations).
Four arms alternate in every round, in a rotating order, in one process:

- `bare_fp32` / `bare_bf16`: a plain peft step per sequence: forward with logits only at the loss
  positions (`logits_to_keep`), cross-entropy there, backward, AdamW; fp32, or bf16 autocast.
- `ours_fp32` / `ours_bf16`: `train_sft` (one shared-prefix batch per step, grad-norm, clipping,
  the cosine schedule, metrics) at each precision.

Each arm's time is the median of `ROUNDS` rounds. FLOPs are counted from the model's shapes:
frozen matmuls forward + input gradient (2x), LoRA and attention 3x, the output head at loss
positions only. `equivalent` counts every sequence in full (what one-by-one training computes);
`executed` counts the shared prefix once, as ours runs it (padding not counted: it is waste). The
peak is `torch.matmul` at the model's own shapes, fp32 and bf16, on the same threads, measured in
every round (the machine is shared: a peak taken once, at a busy moment, is not the peak): the
median over rounds of each shape's best timing. Prints JSON.
"""

import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from pipecat_rl.training.config import TrainConfig  # noqa: E402
from pipecat_rl.training.policy import load_policy, loss_positions  # noqa: E402
from pipecat_rl.training.prefix import common_prefix_len  # noqa: E402
from pipecat_rl.training.rows import TrainingSequence  # noqa: E402
from pipecat_rl.training.sft import autocast, cpu_has_bf16, train_sft  # noqa: E402

PREFIX = 541
LENGTHS = (860, 900, 940, 980)
SPAN_MASKED, SPAN_LOSS = 30, 13
"""Suffix spans: caller/tool text (masked), then an assistant reply (loss)."""
ROUNDS = 5
RANK, ALPHA = 16, 32
MATMUL_ROWS = 1024
"""Rows of the peak's matmuls: a batch's tokens, as the projections see them."""


def sequences(vocab: int) -> list[TrainingSequence]:
    """Random ids in the clinic's shapes (throughput does not depend on the values)."""
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(100, vocab, (PREFIX,), generator=gen).tolist()
    out = []
    for i, n in enumerate(LENGTHS):
        ids = prefix + torch.randint(100, vocab, (n - PREFIX,), generator=gen).tolist()
        span = SPAN_MASKED + SPAN_LOSS
        mask = [t >= PREFIX and (t - PREFIX) % span >= SPAN_MASKED for t in range(n)]
        out.append(TrainingSequence(f"s{i}", ids, mask, [0.0] * n))
    return out


def training_flops(model_config, seq: TrainingSequence, start: int = 0) -> float:
    """FLOPs of one training pass over tokens `start:` of `seq` (attending to all before them)."""
    c = model_config
    d, inter, layers = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    kv = c.num_key_value_heads * (d // c.num_attention_heads)
    shapes = [(d, d), (d, kv), (d, kv), (d, d), (d, inter), (d, inter), (inter, d)]
    tokens = len(seq.input_ids) - start
    base = 2 * sum(i * o for i, o in shapes) * layers * tokens
    lora = 2 * RANK * sum(i + o for i, o in shapes) * layers * tokens
    positions = range(start, len(seq.input_ids))
    attention = 2 * 2 * d * layers * sum(t + 1 for t in positions)
    loss = sum(1 for t in loss_positions(seq.loss_mask).tolist() if t >= start)
    head = 2 * d * c.vocab_size * loss
    return 2 * base + 3 * lora + 3 * attention + 2 * head


def matmul_peak(model_config, dtype: torch.dtype) -> dict[str, float]:
    """GFLOP/s of `torch.matmul` at the model's projection shapes (best of 5 timings each)."""
    c = model_config
    shapes = {
        "q/o": (c.hidden_size, c.hidden_size),
        "mlp_up": (c.hidden_size, c.intermediate_size),
        "mlp_down": (c.intermediate_size, c.hidden_size),
    }
    out = {}
    for name, (k, n) in shapes.items():
        a = torch.randn(MATMUL_ROWS, k).to(dtype)
        b = torch.randn(k, n).to(dtype)
        reps = 20
        torch.matmul(a, b)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                torch.matmul(a, b)
            times.append((time.perf_counter() - t0) / reps)
        out[name] = round(2 * MATMUL_ROWS * k * n / min(times) / 1e9, 2)
    return out


def bare_loop(policy, rows: list[TrainingSequence], precision: str) -> float:
    """A plain peft step per sequence, logits at the loss positions only; returns seconds."""
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    started = time.monotonic()
    for seq in rows:
        positions = loss_positions(seq.loss_mask)
        ids = torch.tensor([seq.input_ids])
        with autocast(precision):
            logits = policy.model(input_ids=ids, logits_to_keep=positions).logits[0]
        loss = torch.nn.functional.cross_entropy(logits.float(), ids[0, positions + 1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return time.monotonic() - started


def ours(policy, rows: list[TrainingSequence], precision: str) -> float:
    """`train_sft` for one epoch over `rows` (one shared-prefix batch); returns seconds."""
    config = TrainConfig(
        lr=1e-5, epochs=1, target_loss=0.0, holdout=0.0, precision=precision,
        batch_sequences=len(rows),
    )  # fmt: skip
    started = time.monotonic()
    train_sft(policy, rows, config)
    return time.monotonic() - started


def main() -> dict:
    from loguru import logger

    logger.remove()
    policy = load_policy(TrainConfig(rank=RANK, alpha=ALPHA))
    mc = policy.model.get_base_model().config
    rows = sequences(mc.vocab_size)
    prefix = common_prefix_len(rows)
    equivalent = sum(training_flops(mc, s) for s in rows)
    executed = training_flops(mc, rows[0], 0) - training_flops(mc, rows[0], prefix)
    executed += sum(training_flops(mc, s, prefix) for s in rows)
    load_before = round(os.getloadavg()[0], 2)
    arms = {
        "bare_fp32": lambda: bare_loop(policy, rows, "fp32"),
        "bare_bf16": lambda: bare_loop(policy, rows, "bf16"),
        "ours_fp32": lambda: ours(policy, rows, "fp32"),
        "ours_bf16": lambda: ours(policy, rows, "bf16"),
    }
    for run in arms.values():  # warm-up
        run()
    times: dict[str, list[float]] = {name: [] for name in arms}
    peaks: dict[str, list[dict[str, float]]] = {"fp32": [], "bf16": []}
    names = list(arms)
    for r in range(ROUNDS):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(arms[name]())
        peaks["fp32"].append(matmul_peak(mc, torch.float32))
        peaks["bf16"].append(matmul_peak(mc, torch.bfloat16))
    peak = {
        dtype: {shape: statistics.median(p[shape] for p in rounds) for shape in rounds[0]}
        for dtype, rounds in peaks.items()
    }
    medians = {name: statistics.median(t) for name, t in times.items()}
    tokens = sum(len(s.input_ids) for s in rows)
    result = {
        "model": str(policy.base_dir.name),
        "cpu": platform.processor() or platform.machine(),
        "cpu_native_bf16": cpu_has_bf16(),
        "threads": torch.get_num_threads(),
        "load_average_1m": {"before": load_before, "after": round(os.getloadavg()[0], 2)},
        "rank": RANK,
        "sequences_per_round": len(rows),
        "sequence_tokens": list(LENGTHS),
        "shared_prefix_tokens": prefix,
        "loss_tokens": sum(s.num_loss_tokens for s in rows),
        "rounds": ROUNDS,
        "matmul_peak_gflops": {
            k: {**{s: round(g, 2) for s, g in v.items()}, "peak": round(max(v.values()), 2)}
            for k, v in peak.items()
        },
        "training_gflop": {"equivalent": round(equivalent / 1e9, 1),
                           "executed_shared_prefix": round(executed / 1e9, 1)},
        "arms": {},
    }  # fmt: skip
    bf16_peak = result["matmul_peak_gflops"]["bf16"]["peak"]
    for name, seconds in medians.items():
        flops = executed if name.startswith("ours") else equivalent
        arm_peak = result["matmul_peak_gflops"][name.split("_")[1]]["peak"]
        result["arms"][name] = {
            "median_s": round(seconds, 3),
            "all_s": [round(t, 2) for t in times[name]],
            "tokens_per_s": round(tokens / seconds, 1),
            "achieved_gflops": round(flops / seconds / 1e9, 2),
            "equivalent_gflops": round(equivalent / seconds / 1e9, 2),
            "fraction_of_own_precision_peak": round(flops / seconds / 1e9 / arm_peak, 3),
            "fraction_of_bf16_peak": round(flops / seconds / 1e9 / bf16_peak, 3),
        }
    base = medians["bare_fp32"]
    result["speedup_vs_bare_fp32"] = {name: round(base / t, 2) for name, t in medians.items()}
    result["ours_bf16_vs_bare_bf16"] = round(medians["bare_bf16"] / medians["ours_bf16"], 2)
    result["bf16_vs_fp32"] = {
        "bare": round(medians["bare_fp32"] / medians["bare_bf16"], 2),
        "ours": round(medians["ours_fp32"] / medians["ours_bf16"], 2),
    }
    result["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
