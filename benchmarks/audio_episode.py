"""Audio-mode cost: real-time factor of one episode, and how many run at once before it degrades.

Each episode is the clinic's `handoff_request` in audio mode (Piper + Whisper on both sides,
Silero VAD, smart-turn, paced 20 ms frames) against the clinic's scripted expert and the scripted
caller, so no LLM server is involved: the cost measured is the audio channel's own.

- RTF = wall time of the episode / call duration on the wire (1.0 is real time; audio is paced,
  so it cannot be below 1).
- Concurrency: `level` episodes at once, for each level; the level's median heard gap is compared
  with the same episodes run alone earlier in the same run. The sustained level is the highest
  whose median heard gap is within 10% of the alone figure and whose episodes all pass.
- Transport: the same episode three times alone over the local pair, then three times over
  SmallWebRTC on loopback (`--transport webrtc`: Opus, aiortc's jitter buffers); the ratio and
  the difference of their median heard gaps are what WebRTC adds.

    flock /tmp/pipecat-rl-heavy.lock python benchmarks/audio_episode.py [--levels 1 2 3 4]
        [--no-webrtc]

Prints one JSON document.
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from loguru import logger

from pipecat_rl.ledger import Ledger
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "examples" / "clinic" / "scenarios" / "pool" / "handoff_request.yaml"
EXPERT = str(ROOT / "examples" / "clinic" / "expert.py")


async def _level(n: int, folder: Path, transport: str = "local", repeats: int = 0) -> dict:
    ledger = Ledger(folder / f"level-{n}-{transport}-{repeats}.db")
    config = SimulationConfig(
        persona="scripted", mode="audio", concurrency=n, repeats=repeats or n, transport=transport
    )
    started = time.monotonic()
    report = await simulate(load_scenarios([SCENARIO]), load_bot(EXPERT), config, ledger)
    wall = time.monotonic() - started
    gaps = [ms for e in report.episodes for ms in e.latencies_ms]
    return {
        "transport": transport,
        "concurrency": n,
        "episodes": len(report.episodes),
        "passed": sum(1 for e in report.episodes if e.outcome == "pass"),
        "errors": sum(1 for e in report.episodes if e.outcome == "error"),
        "wall_s": round(wall, 2),
        "rtf": [round(e.duration_s / e.call_s, 3) for e in report.episodes if e.call_s],
        "heard_gap_median_ms": round(statistics.median(gaps), 1) if gaps else None,
        "heard_gap_max_ms": round(max(gaps), 1) if gaps else None,
    }


def _ratio(webrtc: dict | None, alone: dict) -> float | None:
    if not webrtc or not webrtc["heard_gap_median_ms"] or not alone["heard_gap_median_ms"]:
        return None
    return round(webrtc["heard_gap_median_ms"] / alone["heard_gap_median_ms"], 3)


def _added(webrtc: dict | None, alone: dict) -> float | None:
    if not webrtc or not webrtc["heard_gap_median_ms"] or not alone["heard_gap_median_ms"]:
        return None
    return round(webrtc["heard_gap_median_ms"] - alone["heard_gap_median_ms"], 1)


async def main() -> None:
    """Run every level and print the JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--no-webrtc", action="store_true", help="Skip the WebRTC alone run.")
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        alone = await _level(1, Path(tmp))
        webrtc = None
        if not args.no_webrtc:  # 3 calls one after another on each transport, side by side
            local_3 = await _level(1, Path(tmp), "local", repeats=3)
            webrtc = await _level(1, Path(tmp), "webrtc", repeats=3)
        levels = [alone] + [await _level(n, Path(tmp)) for n in args.levels if n > 1]
    base = alone["heard_gap_median_ms"]
    sustained = 1
    for level in levels:
        gap = level["heard_gap_median_ms"]
        level["degradation"] = round(gap / base - 1, 3) if gap and base else None
    for level in levels:  # the highest level before the first one that degrades or fails
        ok = level["errors"] == 0 and level["passed"] == level["episodes"]
        if not (ok and level["degradation"] is not None and level["degradation"] <= 0.10):
            break
        sustained = level["concurrency"]
    print(
        json.dumps(
            {
                "benchmark": "audio_episode",
                "scenario": SCENARIO.name,
                "rtf_alone": alone["rtf"][0] if alone["rtf"] else None,
                "heard_gap_alone_ms": base,
                "sustained_concurrency": sustained,
                "levels": levels,
                "local_alone_x3": None if webrtc is None else local_3,
                "webrtc_alone_x3": webrtc,
                "webrtc_heard_gap_ratio": None if webrtc is None else _ratio(webrtc, local_3),
                "webrtc_added_heard_gap_ms": None if webrtc is None else _added(webrtc, local_3),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
