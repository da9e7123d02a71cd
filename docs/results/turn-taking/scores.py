"""Turn `simulate --json` outputs of several bots into one `gate --scores` file, and summarise them.

The gate pairs two *policies* of one bot (adapters); these variants are three configurations of
one bot, each simulated on the same scenarios and seeds. Each variant's episodes become scores
lines under the variant's name (`run` = the episode's repeat, so run r of two variants shares a
seed), with the reward the simulator scored and the call's `TurnTaking` record; nothing else is
carried (the heard gaps stay in the ledger, so the gate runs with --no-require-latency).

    python scores.py OUT.jsonl default=default.json no_interruptions=no_interruptions.json ...

Prints each variant's pooled turn-taking line (`scoring.turntaking.summary`, the line `simulate`
prints under its table) and one line per call (`brief`, as `ledger show` prints it).
"""

import json
import sys
from pathlib import Path

from pipecat_rl.scoring.turntaking import TurnTaking, brief, summary


def _record(raw: dict) -> TurnTaking:
    """The record from `--json`'s episode entry (which adds derived ratios to its fields)."""
    return TurnTaking.model_validate({k: v for k, v in raw.items() if k in TurnTaking.model_fields})


def main(out: Path, variants: dict[str, Path]) -> None:
    """Write `out` from each variant's `--json` file; print the summaries."""
    lines = []
    for policy, path in variants.items():
        episodes = json.loads(path.read_text())["episodes"]
        records = [_record(e["turn_taking"]) for e in episodes]
        print(f"{policy}: {summary(records)}")
        for e, record in zip(episodes, records, strict=True):
            print(f"  {e['scenario']}#{e['repeat']} {e['outcome']}: {brief(record)}")
            lines.append({
                "scenario": e["scenario"], "policy": policy, "run": e["repeat"],
                "seed": e["seed"], "reward": e["reward"], "channel": "audio",
                "transport": "local", "turn_taking": record.model_dump(),
                "meta": {"session_id": e["session_id"], "source": path.name},
            })  # fmt: skip
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))


if __name__ == "__main__":
    pairs = dict(arg.split("=", 1) for arg in sys.argv[2:])
    main(Path(sys.argv[1]), {name: Path(p) for name, p in pairs.items()})
