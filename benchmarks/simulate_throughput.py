"""Simulated calls per minute at concurrency 1, 4, 8 on vLLM-cpu, and the simulator's overhead.

Overhead = wall time of the simulation / wall time vLLM alone needs to generate the same tokens
at the same concurrency. Every chat request the simulation makes (agent and persona) is captured
with its episode and its completion length; the replay sends the same requests straight to vLLM,
one episode's requests in sequence (each turn waits for the last, as in a call), `concurrency`
episodes at once, forcing the same completion lengths (`min_tokens` = `max_tokens`, EOS ignored).

    python benchmarks/simulate_throughput.py [--llm-url URL] [--episodes-per-level 8]

Prints one JSON document.
"""

import argparse
import asyncio
import contextvars
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from loguru import logger
from openai import AsyncOpenAI
from openai.resources.chat.completions import AsyncCompletions

from pipecat_rl.ledger import Ledger
from pipecat_rl.serving.server import VLLMServer, openai_base_url
from pipecat_rl.serving.weights import prepare_model
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, runner, simulate

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ["out_of_scope", "price_question", "handoff_request", "medical_advice_bait"]
MAX_TURNS = 3
MAX_TOKENS = 32

_episode: contextvars.ContextVar[str | None] = contextvars.ContextVar("episode", default=None)
_captured: dict[str, list[dict]] = {}


def _capture() -> None:
    """Record every chat request's messages and completion length, by episode."""
    original_episode, original_create = runner.run_episode, AsyncCompletions.create

    async def run_episode(scenario, *args, repeat=0, **kwargs):
        _episode.set(f"{scenario.id}#{repeat}")
        return await original_episode(scenario, *args, repeat=repeat, **kwargs)

    async def create(self, **kwargs):
        key = _episode.get()
        response = await original_create(self, **kwargs)
        entry = {"messages": kwargs.get("messages"), "tools": kwargs.get("tools"), "tokens": 0}
        if key is not None:
            _captured.setdefault(key, []).append(entry)
        if not kwargs.get("stream"):
            entry["tokens"] = response.usage.completion_tokens if response.usage else 0
            return response

        return _Counted(response, entry)

    runner.run_episode = run_episode
    AsyncCompletions.create = create


class _Counted:
    """The response stream, counting completion tokens as it is read (else it delegates)."""

    def __init__(self, stream, entry: dict):
        self._stream, self._entry = stream, entry

    def __getattr__(self, name: str):
        return getattr(self._stream, name)

    async def __aiter__(self):
        async for chunk in self._stream:
            if chunk.usage is not None:
                self._entry["tokens"] = chunk.usage.completion_tokens
            elif chunk.choices and (chunk.choices[0].delta.content or ""):
                self._entry["tokens"] += 1
            yield chunk


async def _replay(url: str, concurrency: int) -> float:
    """vLLM alone: the captured requests, episode by episode, `concurrency` at a time."""
    client = AsyncOpenAI(base_url=url, api_key="none")
    gate = asyncio.Semaphore(concurrency)

    async def episode(requests: list[dict]) -> None:
        async with gate:
            for r in requests:
                n = max(1, r["tokens"])
                extra = {"min_tokens": n, "ignore_eos": True}
                args = {"tools": r["tools"]} if r["tools"] else {}
                await client.chat.completions.create(
                    model="base", messages=r["messages"], max_tokens=n, extra_body=extra, **args
                )

    started = time.monotonic()
    await asyncio.gather(*(episode(reqs) for reqs in _captured.values()))
    return time.monotonic() - started


async def _level(url: str, concurrency: int, episodes: int) -> dict:
    pool = ROOT / "examples" / "clinic" / "handwritten" / "pool"
    loaded = load_scenarios([pool / f"{name}.yaml" for name in SCENARIOS])
    loaded = loaded.model_copy(
        update={"scenarios": [s.model_copy(update={"max_turns": MAX_TURNS}) for s in loaded]}
    )
    repeats = max(1, episodes // len(loaded.scenarios))
    config = SimulationConfig(
        llm_url=url, concurrency=concurrency, repeats=repeats, max_tokens=MAX_TOKENS
    )
    bot = load_bot(str(ROOT / "examples" / "clinic" / "bot.py"))
    _captured.clear()
    with Ledger(Path(tempfile.mkdtemp()) / "bench.db") as ledger:
        report = await simulate(loaded, bot, config, ledger)
    vllm_alone = await _replay(url, concurrency)
    tokens = sum(r["tokens"] for reqs in _captured.values() for r in reqs)
    return {
        "concurrency": concurrency,
        "episodes": len(report.episodes),
        "harness_errors": report.harness_errors,
        "wall_s": round(report.wall_s, 2),
        "calls_per_minute": round(len(report.episodes) / report.wall_s * 60, 2),
        "llm_requests": sum(len(r) for r in _captured.values()),
        "completion_tokens": tokens,
        "vllm_alone_s": round(vllm_alone, 2),
        "overhead": round(report.wall_s / vllm_alone, 3) if vllm_alone else None,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm-url", default=os.environ.get("PIPECAT_RL_LLM_URL"))
    parser.add_argument("--episodes-per-level", type=int, default=8)
    parser.add_argument("--levels", default="1,4,8")
    args = parser.parse_args()
    # As `pipecat-rl simulate` does: Pipecat's debug log of every request would be measured too.
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    for key in ("DEEPGRAM_API_KEY", "CARTESIA_API_KEY"):
        os.environ.pop(key, None)
    _capture()
    levels = [int(c) for c in args.levels.split(",")]
    results = []
    if args.llm_url:
        url = openai_base_url(args.llm_url)
        for c in levels:
            results.append(await _level(url, c, max(args.episodes_per_level, c)))
    else:
        async with VLLMServer(prepare_model("smollm2"), max_num_seqs=max(levels)) as server:
            for c in levels:
                results.append(await _level(server.url, c, max(args.episodes_per_level, c)))
    print(json.dumps({"benchmark": "simulate_throughput", "target_overhead": 1.25,
                      "max_turns": MAX_TURNS, "max_tokens": MAX_TOKENS, "levels": results},
                     indent=2))  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
