"""Time per cycle stage, and the share of wall time spent in LLM generation, training and harness.

Reads a cycle's events.jsonl (default: the committed clinic run under docs/results/) and prints
JSON. LLM time is the wall time during which at least one LLM request was in flight (the union
of the recorded turns' request → last token intervals, measured by the cycle per stage);
training is the train stage's training runs; the harness is everything else (simulated callers,
the bot's pipeline, worlds, verifiers, vLLM start-up, the ledger, the gate's statistics).
"""

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
DEFAULT = RESULTS / "cycle-clinic" / "events.jsonl"


def main(path: Path) -> dict:
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    stages = {e["stage"]: e["result"] for e in events if e["event"] == "stage_finished"}
    walls = {name: result["wall_s"] for name, result in stages.items()}
    total = sum(walls.values())
    llm = sum(stages.get(s, {}).get("llm_busy_s", 0.0) for s in ("filter", "evaluate"))
    training = sum(r.get("wall_s", 0.0) for r in stages.get("train", {}).get("runs", []))
    starts = [e["at"] for e in events if e["event"] == "cycle_started"]
    ends = [e["at"] for e in events if e["event"] == "cycle_ended"]
    return {
        "events": str(path),
        "stage_wall_s": walls,
        "stages_total_s": round(total, 1),
        "invocations": len(starts),
        "elapsed_s": round(ends[-1] - starts[0], 1) if starts and ends else None,
        "share": {
            "llm_generation": round(llm / total, 3) if total else None,
            "training": round(training / total, 3) if total else None,
            "harness": round((total - llm - training) / total, 3) if total else None,
        },
        "seconds": {
            "llm_generation": round(llm, 1),
            "training": round(training, 1),
            "harness": round(total - llm - training, 1),
        },  # fmt: skip
    }


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    if not target.is_file():
        sys.stderr.write(f"no events file at {target}; run `pipecat-rl cycle` first\n")
        sys.exit(1)
    print(json.dumps(main(target), indent=2))
