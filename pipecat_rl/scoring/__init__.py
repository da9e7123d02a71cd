"""Scoring: the vocabulary every stage shares, defined once.

- `outcome`: how a session ended (`SessionOutcome`), the authoritative part and what "passed"
  means (`passed` on reward parts, `outcome_passed` on a stored outcome);
- `rubric`: the reward as named, weighted parts, each with its role;
- `score`: the score the gate pairs (`gate_score`);
- `passk`: pass^k per scenario and a policy's curve;
- `hotspots`: pass rate, failures and writes per matrix axis value and pair of values;
- `quantile`: the one quantile estimator behind every P50/P95;
- `turntaking`: one call's turn-taking as measured from the caller's side (`TurnTaking`).

It imports nothing of Pipecat, the ledger or the stages: the recorder, the simulator, the trainer,
the gate and the CLI all read it, and none of them re-derives it.
"""

from pipecat_rl.scoring.hotspots import AxisRun, HotSpotRow, HotSpots, hot_spots
from pipecat_rl.scoring.outcome import (
    AUTHORITATIVE_PARTS,
    CHECKS_HELD,
    JUDGED_SUCCESS,
    PASS_SCORE,
    SHAPED_PARTS,
    TOOL_CREDIT,
    VERIFIER,
    VIOLATIONS,
    SessionOutcome,
    authoritative_part,
    authoritative_score,
    outcome,
    outcome_passed,
    passed,
    score_passed,
)
from pipecat_rl.scoring.passk import pass_hat_k, pass_k_curve
from pipecat_rl.scoring.quantile import P50, P95, p95, quantile, quantile_or_none
from pipecat_rl.scoring.rubric import DEFAULT_RUBRIC, Rubric
from pipecat_rl.scoring.score import gate_score
from pipecat_rl.scoring.turntaking import TurnTaking

__all__ = [
    "AUTHORITATIVE_PARTS",
    "CHECKS_HELD",
    "DEFAULT_RUBRIC",
    "JUDGED_SUCCESS",
    "P50",
    "P95",
    "PASS_SCORE",
    "SHAPED_PARTS",
    "TOOL_CREDIT",
    "VERIFIER",
    "VIOLATIONS",
    "AxisRun",
    "HotSpotRow",
    "HotSpots",
    "Rubric",
    "SessionOutcome",
    "TurnTaking",
    "authoritative_part",
    "authoritative_score",
    "gate_score",
    "hot_spots",
    "outcome",
    "outcome_passed",
    "p95",
    "pass_hat_k",
    "pass_k_curve",
    "passed",
    "quantile",
    "quantile_or_none",
    "score_passed",
]
