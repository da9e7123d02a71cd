"""What the recorder costs a live pipeline: added latency per LLM turn and frame throughput.

The same pipeline runs with and without `RLRecorder`, alternating, in one process and one run,
against a loopback server that streams like vLLM (token ids and logprobs included) so that model
timing noise does not drown the recorder's own cost. Prints JSON.
"""

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipecat.frames.frames import TextFrame  # noqa: E402

from pipecat_rl.ledger import Ledger  # noqa: E402
from pipecat_rl.processors import RLRecorder  # noqa: E402
from tests.fake_openai import serve_fake_openai  # noqa: E402
from tests.recording_helpers import Call, vllm_llm  # noqa: E402

TURNS = 40
PAUSE_S = 0.2
"""Between turns, as in a call: a caller speaks and the VAD waits stop_secs (0.2 s by default)
before the next LLM request. Without it the ledger write of turn k would land on turn k+1's
start, which no real conversation does."""
FRAMES = 3000
PIECES = [f" word{i}" for i in range(40)]


async def turn_latencies(url: str, ledger: Ledger | None) -> tuple[list[float], list[float]]:
    """Per turn: ms to the first text frame after the LLM (what a caller waits for), and ms to
    the end of the whole response."""
    before = [RLRecorder(ledger)] if ledger is not None else []
    async with Call(before, llm=vllm_llm(url)) as call:
        first, whole = [], []
        for i in range(TURNS):
            start = time.perf_counter()
            await call.say(f"turn {i}")
            whole.append((time.perf_counter() - start) * 1000)
            first.append((call.watch.first_text_at[-1] - start) * 1000)
            await asyncio.sleep(PAUSE_S)
    return first[5:], whole[5:]  # the first turns warm connections and caches


async def frame_rate(url: str, ledger: Ledger | None) -> float:
    before = [RLRecorder(ledger)] if ledger is not None else []
    async with Call(before, llm=vllm_llm(url)) as call:
        start = time.perf_counter()
        for i in range(FRAMES):
            await call.push(TextFrame(f"t{i}"))
        await call.say("done")  # the LLM turn queues behind every frame pushed before it
        return FRAMES / (time.perf_counter() - start)


async def main() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(Path(tmp) / "bench.db")
        async with serve_fake_openai(PIECES, vllm=True) as url:
            base, rec, base_whole, rec_whole, base_fps, rec_fps = [], [], [], [], [], []
            for _ in range(3):  # alternate so drift on a shared machine hits both arms alike
                first, whole = await turn_latencies(url, None)
                base, base_whole = base + first, base_whole + whole
                first, whole = await turn_latencies(url, ledger)
                rec, rec_whole = rec + first, rec_whole + whole
                base_fps.append(await frame_rate(url, None))
                rec_fps.append(await frame_rate(url, ledger))
        turns = len(ledger.training_turns())
        ledger.close()
    b, r = statistics.median(base), statistics.median(rec)
    bw, rw = statistics.median(base_whole), statistics.median(rec_whole)
    fb, fr = statistics.median(base_fps), statistics.median(rec_fps)
    return {
        "benchmark": "recorder_overhead",
        "turns_per_arm": len(base),
        "recorded_token_exact_turns": turns,
        "median_first_text_ms_without": round(b, 3),
        "median_first_text_ms_with": round(r, 3),
        "median_added_ms_per_turn": round(r - b, 3),
        "first_text_latency_ratio": round(r / b, 4),
        "median_whole_turn_ms_without": round(bw, 3),
        "median_whole_turn_ms_with": round(rw, 3),
        "whole_turn_ratio": round(rw / bw, 4),
        "frames_per_s_without": round(fb, 1),
        "frames_per_s_with": round(fr, 1),
        "throughput_ratio": round(fr / fb, 4),
        "targets": {"added_ms_per_turn": "< 1", "throughput_loss": "< 2%"},
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main()), indent=2))
