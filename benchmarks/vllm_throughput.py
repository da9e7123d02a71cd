"""vLLM single-stream and 8-stream decode throughput on the embedded model (prints JSON).

Every later benchmark divides by these figures. Both are measured in the same run, against the
same server, so their ratio is meaningful on a noisy shared machine.
"""

import asyncio
import json
import sys
import time

from openai import AsyncOpenAI

from pipecat_rl.serving.server import BASE_ALIAS, VLLMServer
from pipecat_rl.serving.weights import prepare_model

MAX_TOKENS = 64
PROMPTS = [f"Write a short note about appointment number {i}." for i in range(8)]


async def one(client: AsyncOpenAI, prompt: str) -> int:
    response = await client.chat.completions.create(
        model=BASE_ALIAS,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=MAX_TOKENS,
        temperature=0.7,
        extra_body={"ignore_eos": True},  # fixed-length generations make runs comparable
    )
    return response.usage.completion_tokens


async def measure(client: AsyncOpenAI, streams: int) -> dict:
    start = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(client, p) for p in PROMPTS[:streams])))
    elapsed = time.perf_counter() - start
    return {"streams": streams, "tokens": tokens, "seconds": round(elapsed, 3),
            "tokens_per_s": round(tokens / elapsed, 2)}  # fmt: skip


async def main() -> dict:
    model = sys.argv[1] if len(sys.argv) > 1 else "smollm2"
    async with VLLMServer(prepare_model(model)) as server:
        client = AsyncOpenAI(base_url=server.url, api_key="none")
        await one(client, "warm up")
        single = await measure(client, 1)
        multi = await measure(client, 8)
    return {
        "benchmark": "vllm_throughput",
        "model": model,
        "single_stream": single,
        "eight_streams": multi,
        "batching_speedup": round(multi["tokens_per_s"] / single["tokens_per_s"], 2),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main()), indent=2))
