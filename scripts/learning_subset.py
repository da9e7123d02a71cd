"""The paired delta of a gate receipt on a declared subset of its held-out scenarios.

The pre-registered comparison (docs/results/learning-beyond-sft/) reads its targeted subset from
the full gate's per-scenario rows: the same per-scenario deltas and the same Student t interval
as the gate (`gate.stats.t_interval`), over the named scenarios only. The subset is named
scenario by scenario, or by matrix axis (`task=emergency`: every gated scenario whose id has
that value; `pipecat_rl.scenarios.axes_of`).

    python scripts/learning_subset.py RECEIPT.json SCENARIO|AXIS=VALUE [...]
"""

import json
import sys
from pathlib import Path

from pipecat_rl.gate.stats import t_interval
from pipecat_rl.scenarios import axes_of


def _selected(rows: dict[str, dict], wanted: str) -> list[str]:
    if "[" in wanted or "=" not in wanted:
        return [wanted]
    axis, value = wanted.split("=", 1)
    return [n for n in rows if (axes_of(n) or {}).get(axis) == value]


def main(receipt: Path, wanted: list[str]) -> dict:
    """The subset's deltas and interval; every named scenario must be in the receipt."""
    rows = {r["scenario"]: r for r in json.loads(receipt.read_text())["scenarios"]}
    names = list(dict.fromkeys(n for w in wanted for n in _selected(rows, w)))
    missing = [n for n in names if n not in rows]
    if missing or not names:
        raise SystemExit(f"{receipt}: no row for {', '.join(missing or wanted)}")
    deltas = [rows[n]["delta"] for n in names]
    interval = t_interval(deltas)
    return {
        "receipt": str(receipt),
        "selected_by": wanted,
        "scenarios": {n: rows[n]["delta"] for n in names},
        "candidate_mean": sum(rows[n]["candidate_mean"] for n in names) / len(names),
        "incumbent_mean": sum(rows[n]["incumbent_mean"] for n in names) / len(names),
        "mean_delta": interval.estimate,
        "ci95": [interval.low, interval.high],
        "lower_bound_above_zero": interval.low > 0,
    }


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    print(json.dumps(main(Path(sys.argv[1]), sys.argv[2:]), indent=2))
