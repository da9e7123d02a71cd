"""What the recorder costs a live pipeline: added latency per LLM turn and frame throughput.

The same pipeline runs with and without `RLRecorder`, alternating, in one process and one run,
against a loopback server (its own process) that streams like vLLM, token ids and logprobs
included, so that model timing noise does not drown the recorder's own cost. The frame-rate arm
pushes text frames through a pipeline that does no work, the worst case for any observer; the
per-frame cost it reports is what to weigh against a real bot's ~100 frames/s. Prints JSON.
"""

import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from pipecat.frames.frames import TextFrame  # noqa: E402

from pipecat_rl.ledger import Ledger  # noqa: E402
from pipecat_rl.recording import RLRecorder  # noqa: E402
from pipecat_rl.serving.server import free_port  # noqa: E402
from tests.recording_helpers import Call, vllm_llm  # noqa: E402

TURNS = 40
PAUSE_S = 0.2
"""Between turns, as in a call: a caller speaks and the VAD waits stop_secs (0.2 s by default)
before the next LLM request. Without it the ledger write of turn k would land on turn k+1's
start, which no real conversation does."""
FRAMES = 3000
PIECES = 40


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


async def _wait_until_up(url: str) -> None:
    async with httpx.AsyncClient() as client:
        for _ in range(200):
            try:
                if (await client.get(f"{url}/models")).status_code == 200:
                    return
            except httpx.HTTPError:
                await asyncio.sleep(0.05)
    raise RuntimeError(f"the stand-in server at {url} did not start")


async def main() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(Path(tmp) / "bench.db")
        port = free_port()
        server = subprocess.Popen(  # noqa: ASYNC220 - started once, before anything is measured
            [sys.executable, "-m", "tests.fake_openai", "--port", str(port), "--vllm",
             "--pieces", str(PIECES)], cwd=ROOT,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}/v1"
        await _wait_until_up(url)
        try:
            base, rec, base_whole, rec_whole, base_fps, rec_fps = [], [], [], [], [], []
            for _ in range(3):  # alternate so drift on a shared machine hits both arms alike
                first, whole = await turn_latencies(url, None)
                base, base_whole = base + first, base_whole + whole
                first, whole = await turn_latencies(url, ledger)
                rec, rec_whole = rec + first, rec_whole + whole
                base_fps.append(await frame_rate(url, None))
                rec_fps.append(await frame_rate(url, ledger))
        finally:
            server.terminate()
            server.wait()
        for thread in threading.enumerate():  # the file's one writer stops after its last call
            if thread.name == "pipecat-rl-ledger":
                thread.join(10)
        writers_left = sum(t.name == "pipecat-rl-ledger" for t in threading.enumerate())
        turns = len(ledger.training_turns())
        ledger.close()
    b, r = statistics.median(base), statistics.median(rec)
    bw, rw = statistics.median(base_whole), statistics.median(rec_whole)
    fb, fr = statistics.median(base_fps), statistics.median(rec_fps)
    return {
        "benchmark": "recorder_overhead",
        "turns_per_arm": len(base),
        "recorded_token_exact_turns": turns,
        "ledger_writer_threads_left": writers_left,
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
        "added_us_per_frame": round((1 / fr - 1 / fb) * 1e6, 2),
        "targets": {"added_ms_per_turn": "< 1", "throughput_loss": "< 2%"},
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main()), indent=2))
