"""The misheard-slot rate through whole audio episodes, clean vs background noise at set SNRs.

The clinic's digit-heavy cancel calls (the caller reads a confirmation number; the agent's
Whisper hears it; the scripted expert cancels with what it heard) run in audio mode once per
condition with the same seeds: clean, then with generated noise at each `--snr` mixed over the
caller's speech (the scenario's `channel.snr_db`, set here on an in-memory copy). Per condition:
how many episodes carry `misheard_slot` (a tool argument close to a scenario fact but not it),
`misheard_recovered`, and how many pass. Not a timing: the noise is seeded per episode (the
caller's Piper voice is not: each synthesis of a line differs a little).

`--compare` runs every condition twice, the agent's embedded stand-ins as Pipecat builds them
(`PIPECAT_DEFAULTS`) and with the windowed Whisper (`WINDOWED`), the two arms alternating per
condition: whether a setting that shortens the heard gap makes the agent mishear more.

    flock /tmp/pipecat-rl-heavy.lock python benchmarks/misheard_vs_snr.py [--snr 10 0] [-k 1]
        [--compare]

Prints one JSON document.
"""

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from loguru import logger

from pipecat_rl.ledger import Ledger
from pipecat_rl.scenarios import ScenarioSet
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate
from pipecat_rl.simulator.audio.services import PIPECAT_DEFAULTS, WINDOWED, embedded_speech
from pipecat_rl.simulator.rewards import MISHEARD_RECOVERED, MISHEARD_SLOT

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "examples" / "clinic" / "handwritten"
DIGIT_HEAVY = (
    "pool/cancel_long_confirmation.yaml",
    "pool/cancel_wrong_number.yaml",
    "heldout/heldout_cancel_long_number.yaml",
    "heldout/heldout_misheard_confirmation.yaml",
)
EXPERT = str(ROOT / "examples" / "clinic" / "expert.py")
ARMS = {"pipecat": PIPECAT_DEFAULTS, "windowed": WINDOWED}
SUMMARY = ("arm", "snr_db", "episodes", "errors", "passed", "misheard_slot", "misheard_recovered")


def _with_snr(scenarios: ScenarioSet, snr_db: float | None) -> ScenarioSet:
    """The same scenarios in audio mode, with noise at `snr_db` (None: clean)."""
    copies = [
        s.model_copy(
            update={"channel": s.channel.model_copy(update={"mode": "audio", "snr_db": snr_db})}
        )
        for s in scenarios
    ]
    return scenarios.model_copy(update={"scenarios": copies})


async def _condition(
    scenarios: ScenarioSet, snr_db: float | None, repeats: int, tmp: Path, arm: str = "pipecat"
):
    ledger = Ledger(tmp / f"snr-{snr_db}-{arm}.db")
    config = SimulationConfig(persona="scripted", mode="audio", concurrency=1, repeats=repeats)
    started = time.monotonic()
    with embedded_speech(ARMS[arm]):
        report = await simulate(_with_snr(scenarios, snr_db), load_bot(EXPERT), config, ledger)
    episodes = report.episodes
    return {
        "arm": arm,
        "snr_db": snr_db,
        "episodes": len(episodes),
        "errors": sum(1 for e in episodes if e.outcome == "error"),
        "passed": sum(1 for e in episodes if e.outcome == "pass"),
        "misheard_slot": sum(1 for e in episodes if MISHEARD_SLOT in e.labels),
        "misheard_recovered": sum(1 for e in episodes if MISHEARD_RECOVERED in e.labels),
        "wall_s": round(time.monotonic() - started, 1),
        "per_episode": [
            {
                "scenario": e.scenario_id,
                "seed": e.seed,
                "outcome": e.outcome,
                "labels": e.labels,
                "heard": [x.heard for x in e.transcript if x.speaker == "caller"],
                "tool_arguments": [x.arguments for x in e.executions],
            }
            for e in episodes
        ],
    }


async def main() -> None:
    """Run every condition and print the JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snr", type=float, nargs="*", default=[10.0, 0.0])  # none: clean only
    parser.add_argument("-k", "--repeats", type=int, default=1)
    parser.add_argument("--compare", action="store_true", help="Both arms, alternating.")
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    scenarios = load_scenarios([SCENARIOS / name for name in DIGIT_HEAVY])
    conditions = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, snr in enumerate([None, *args.snr]):
            both = ["pipecat", "windowed"][:: 1 if i % 2 else -1]
            arms = both if args.compare else ["pipecat"]
            for arm in arms:
                conditions.append(await _condition(scenarios, snr, args.repeats, Path(tmp), arm))
    print(
        json.dumps(
            {
                "benchmark": "misheard_vs_snr",
                "scenarios": list(DIGIT_HEAVY),
                "repeats": args.repeats,
                "arms": {arm: vars(ARMS[arm]) for arm in sorted({c["arm"] for c in conditions})},
                "summary": [{k: c[k] for k in SUMMARY} for c in conditions],
                "conditions": conditions,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
