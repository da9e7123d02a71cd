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
- Stages: every run says where its heard gaps went (`stages`: endpointing, STT final, turn
  analyzer, reply, TTS first audio, playout, transport; per-stage medians, and means that add
  up to the mean gap).
- `--compare R`: the agent's embedded stand-ins as Pipecat builds them (`PIPECAT_DEFAULTS`)
  against the windowed Whisper (`WINDOWED`), in R rounds of one episode of each
  `--compare-scenarios` call per arm, the arms alternating (ABBA) so drift on a shared machine
  falls on both; per arm the heard gap and its stages, and the median of the per-turn
  differences (same scenario, round and caller line).

    flock /tmp/pipecat-rl-heavy.lock python benchmarks/audio_episode.py [--levels 1 2 3 4]
        [--no-webrtc] [--compare 4]

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
from pipecat_rl.simulator.audio.services import PIPECAT_DEFAULTS, WINDOWED, embedded_speech
from pipecat_rl.simulator.audio.stages import DURATIONS

ROOT = Path(__file__).resolve().parents[1]
POOL = ROOT / "examples" / "clinic" / "handwritten" / "pool"
SCENARIO = POOL / "handoff_request.yaml"
EXPERT = str(ROOT / "examples" / "clinic" / "expert.py")


def _turns(episodes) -> list[dict]:
    """Each answered caller line: its heard gap and where it went."""
    return [
        {"scenario": e.scenario_id, "line": i, "heard_gap_ms": x.latency_ms, **x.stages_ms}
        for e in episodes
        for i, x in enumerate(t for t in e.transcript if t.speaker == "agent")
        if x.latency_ms is not None and getattr(x, "stages_ms", None)
    ]


def _stages(turns: list[dict]) -> dict:
    """Per stage, the median and the mean (the means add up to the mean heard gap)."""
    if not turns:
        return {"turns": 0}
    names = ["heard_gap_ms", *DURATIONS.values()]
    return {
        "turns": len(turns),
        "median_ms": {n: round(statistics.median(t[n] for t in turns), 1) for n in names},
        "mean_ms": {n: round(statistics.fmean(t[n] for t in turns), 1) for n in names},
    }


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
        "stages": _stages(_turns(report.episodes)),
    }


async def _compare(rounds: int, scenarios: list[Path], folder: Path) -> dict:
    """Pipecat's defaults against the windowed Whisper, ABBA, same scenarios and seeds."""
    arms = {"before": PIPECAT_DEFAULTS, "after": WINDOWED}
    turns: dict[str, list[dict]] = {"before": [], "after": []}
    outcomes: dict[str, list[str]] = {"before": [], "after": []}
    config = SimulationConfig(persona="scripted", mode="audio", concurrency=1, repeats=1)
    for r in range(rounds):
        for name in ("before", "after") if r % 4 in (0, 3) else ("after", "before"):
            with embedded_speech(arms[name]):
                ledger = Ledger(folder / f"compare-{name}-{r}.db")
                report = await simulate(load_scenarios(scenarios), load_bot(EXPERT), config, ledger)
            outcomes[name] += [e.outcome for e in report.episodes]
            turns[name] += [{"round": r, **t} for t in _turns(report.episodes)]
    key = ("round", "scenario", "line")
    after = {tuple(t[k] for k in key): t for t in turns["after"]}
    paired = [
        after[k]["heard_gap_ms"] - t["heard_gap_ms"]
        for t in turns["before"]
        if (k := tuple(t[k] for k in key)) in after
    ]
    return {
        "rounds": rounds,
        "scenarios": [p.name for p in scenarios],
        "settings": {name: vars(arm) for name, arm in arms.items()},
        **{
            name: {
                "episodes": len(outcomes[name]),
                "passed": outcomes[name].count("pass"),
                "errors": outcomes[name].count("error"),
                "stages": _stages(turns[name]),
            }
            for name in arms
        },
        "paired_turns": len(paired),
        "paired_difference_median_ms": round(statistics.median(paired), 1) if paired else None,
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
    parser.add_argument(
        "--compare",
        type=int,
        default=0,
        metavar="R",
        help="Rounds of Pipecat's defaults vs the windowed Whisper, alternating (0: skip).",
    )
    parser.add_argument("--compare-scenarios", nargs="+", type=Path,
                        default=[SCENARIO, POOL / "routine_booking.yaml"])  # fmt: skip
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        compare = None
        if args.compare:
            compare = await _compare(args.compare, args.compare_scenarios, Path(tmp))
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
                "compare": compare,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
