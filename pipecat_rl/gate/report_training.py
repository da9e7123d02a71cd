"""The candidate's training, as its lineage in the ledger records it: the guard and the step log.

The receipt names the adapter and its training run; the ledger's adapter record holds the run's
guard as fields, and the trainer writes one JSON line per optimiser step to
`<adapters folder>/runs/<training run id>.metrics.jsonl`, beside the adapter folders it saves
(`training.trainer.train`). The page plots those lines, so it reads them when it is written.
"""

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger

from pipecat_rl.gate.lineage import Lineage
from pipecat_rl.ledger import Ledger, NotInLedgerError

CURVES: tuple[str, ...] = (
    "loss", "policy_loss", "distill_loss", "epoch_loss", "heldout_loss",
    "reward", "kl", "clip_ratio", "frac_reward_zero_std",
)  # fmt: skip
"""Step-log metrics the page plots, whichever the algorithm logged (TRL's names: SFT logs
`loss`, GRPO `policy_loss`, `reward`, `kl`, `clip_ratio` and `frac_reward_zero_std`, OPSD
`distill_loss`)."""


@dataclass(frozen=True)
class Training:
    """One adapter's training run: what the ledger recorded and its per-step log."""

    run_id: str | None
    algo: str | None
    guard: dict[str, Any] | None
    """The guard's fields as recorded (None: the run recorded no guard)."""
    log: Path | None
    """Where the step log is (or was looked for); None without a run id."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """The log's lines in order; empty when it is missing."""
    unreadable: int = 0
    """Lines of the log that were not JSON objects (skipped)."""

    def curves(self) -> dict[str, tuple[list[int], list[float]]]:
        """Each of `CURVES` the log holds: (line numbers, values), finite numbers only."""
        out: dict[str, tuple[list[int], list[float]]] = {}
        for name in CURVES:
            points = [
                (i, value)
                for i, row in enumerate(self.rows, start=1)
                if (value := _number(row.get(name))) is not None
            ]
            if points:
                out[name] = ([i for i, _ in points], [v for _, v in points])
        return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def step_log_path(adapter_path: str, run_id: str) -> Path:
    """Where the trainer writes the step log of `run_id` (see the module docstring)."""
    return Path(adapter_path).parent / "runs" / f"{run_id}.metrics.jsonl"


def read_step_log(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The log's JSON-object lines, and how many lines were not one; ([], 0) when it is absent."""
    try:
        text = path.read_text()
    except OSError:
        return [], 0
    rows, bad = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    if bad:
        logger.warning(f"{path}: {bad} line(s) are not JSON objects; the curves leave them out")
    return rows, bad


def lineage_training(ledger: Ledger | None, lineage: Lineage) -> Training | None:
    """The training run behind `lineage`, or None (no ledger, not an adapter, not trained here)."""
    if ledger is None or lineage.kind != "adapter":
        return None
    try:
        adapter = ledger.adapter(lineage.name)
    except NotInLedgerError:
        return None
    run = adapter.training_run
    if run is None:
        return None
    run_id = run.get("id")
    guard = run.get("guard")
    log = step_log_path(adapter.path, str(run_id)) if run_id else None
    rows, bad = read_step_log(log) if log is not None else ([], 0)
    return Training(
        run_id=None if run_id is None else str(run_id),
        algo=run.get("algo"),
        guard=guard if isinstance(guard, dict) else None,
        log=log,
        rows=rows,
        unreadable=bad,
    )
