"""The gate: decide whether a candidate adapter may replace the live one, and promote it.

Modules, in the order data flows:

- `inputs`: runs from a scores file, the ledger or the simulator, as one `GateData`;
- `lineage`: who the candidate and incumbent are, and the training guard's state;
- `stats`, `latency`, `cost`, `regressions`, `safety`: pure statistics (the paired t interval and
  the exact sign-flip test over scenarios, regression tests whose error rate is known at the
  repeats configured, paired latency ratios and P95 intervals over scenarios, safety per arm,
  cost); `operating` simulates the verdict's error rates (the benchmark's table);
- `verdict`: one check per rule, then PROMOTE / REJECT / INCONCLUSIVE;
- `evaluate`: all of the above on one `GateData`, producing the `GateReceipt`;
- `run`: `run_gate`, the one gate sequence (evidence → evaluate → receipt written and recorded);
- `simulate`: the gate's own paired runs, through `simulator.run`;
- `receipt`, `report_html`: the receipt as JSON, Markdown and a self-contained HTML page (its
  plots in `report_plots`, the candidate's guard and training curves read by `report_training`);
- `promote`: verify a receipt against the ledger and its own numbers, load the adapter into the
  server and move the live pointer (and back).
"""

from pipecat_rl.gate.config import GateConfig, PriceTable, load_gate_config
from pipecat_rl.gate.evaluate import evaluate
from pipecat_rl.gate.inputs import (
    GateData,
    InputSource,
    RunResult,
    hash_scenario_files,
    load_ledger_runs,
    load_scores,
)
from pipecat_rl.gate.lineage import (
    Lineage,
    ledger_lineage,
    resolve_policy,
    unknown_lineage,
)
from pipecat_rl.gate.promote import LiveMove, promote, rollback, verify_receipt
from pipecat_rl.gate.receipt import GateReceipt, load_receipt, render_markdown, write_receipt
from pipecat_rl.gate.run import Evidence, FromLedger, FromScores, GateRun, Simulated, run_gate
from pipecat_rl.gate.verdict import EXIT_CODES, Verdict

__all__ = [
    "EXIT_CODES",
    "Evidence",
    "FromLedger",
    "FromScores",
    "GateConfig",
    "GateData",
    "GateReceipt",
    "GateRun",
    "InputSource",
    "Lineage",
    "LiveMove",
    "PriceTable",
    "RunResult",
    "Simulated",
    "Verdict",
    "evaluate",
    "hash_scenario_files",
    "ledger_lineage",
    "load_gate_config",
    "load_ledger_runs",
    "load_receipt",
    "load_scores",
    "promote",
    "render_markdown",
    "resolve_policy",
    "rollback",
    "run_gate",
    "unknown_lineage",
    "verify_receipt",
    "write_receipt",
]
