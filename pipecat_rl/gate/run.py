"""`gate.run_gate`: the one gate sequence, from evidence to a recorded receipt.

Simulate the held-out set (or read the ledger, or a scores file) → hash the scenario files →
record the held-out hashes → evaluate → write the receipt → record it in the ledger. The `gate`
verb, the service's gate job and the cycle's evaluate stage are thin callers of `run_gate`, so
every receipt any of them writes is one `promote` accepts (or refuses) for the same reasons.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pipecat_rl.gate.config import GateConfig
from pipecat_rl.gate.evaluate import evaluate
from pipecat_rl.gate.inputs import GateData, hash_scenario_files, load_ledger_runs, load_scores
from pipecat_rl.gate.lineage import Lineage, ledger_lineage, resolve_policy, unknown_lineage
from pipecat_rl.gate.receipt import GateReceipt, write_receipt
from pipecat_rl.gate.regressions import check_design
from pipecat_rl.ledger import Ledger

if TYPE_CHECKING:  # the simulator imports Pipecat: only when the gate runs its own episodes
    from pipecat_rl.scenarios import ScenarioSet
    from pipecat_rl.simulator.botloader import BotEntry
    from pipecat_rl.simulator.options import SimulationOptions
    from pipecat_rl.simulator.simulation import Server

SCORES_GUARD = "guard unavailable: results came from a scores file, with no training run to read"


@dataclass(frozen=True)
class Simulated:
    """The gate runs both policies on the held-out scenarios itself (`options.repeats` = K)."""

    scenarios: "ScenarioSet"
    bot: "BotEntry"
    options: "SimulationOptions"
    server: "Server"
    files: Path | None = None
    """The scenario file or folder, hashed byte for byte into the receipt."""
    stop: Callable[[], bool] | None = None
    """Asked before each episode; once true nothing more starts and no receipt is written."""
    on_episode: Callable[[Any], None] | None = None
    """Called with each call as it ends (progress on a terminal, events in a cycle's log)."""


@dataclass(frozen=True)
class FromLedger:
    """The gate decides from held-out sessions already in the ledger."""

    heldout_set: str | None = None
    source: Literal["gate", "simulate"] | None = None
    files: Path | None = None


@dataclass(frozen=True)
class FromScores:
    """The gate decides from a scores JSONL file (one line per run)."""

    path: Path
    files: Path | None = None


Evidence = Simulated | FromLedger | FromScores


@dataclass(frozen=True)
class GateRun:
    """A decided gate: the receipt, where it was written (json, md, html), and its runs."""

    receipt: GateReceipt
    paths: dict[str, Path]
    data: GateData


def gather(
    ledger: Ledger,
    candidate: str,
    incumbent: str,
    evidence: Evidence,
    settings: GateConfig,
) -> tuple[GateData, Lineage, Lineage]:
    """The runs to decide from, and both policies' lineage.

    Raises:
        ConfigError: the gate's own runs could not confirm a regression its config asks to test
            (refused before any episode runs).
    """
    judged = settings.judged_metrics
    # `live` is the ledger's live adapter whatever the runs come from: a scores file names the
    # adapters it ran, never "live".
    names = resolve_policy(ledger, candidate), resolve_policy(ledger, incumbent)
    if isinstance(evidence, FromScores):
        return (
            load_scores(evidence.path, *names, judged=judged),
            unknown_lineage(candidate, names[0], SCORES_GUARD),
            unknown_lineage(incumbent, names[1], SCORES_GUARD),
        )
    if isinstance(evidence, Simulated):
        from pipecat_rl.gate.simulate import run_paired_simulations  # imports Pipecat

        repeats = evidence.options.repeats or min(s.runs for s in evidence.scenarios)
        check_design(settings, [s.id for s in evidence.scenarios], repeats)  # before any call

        data = run_paired_simulations(
            ledger, evidence.scenarios, *names, evidence.bot, evidence.options, evidence.server,
            judged, stop=evidence.stop, on_episode=evidence.on_episode,
        )  # fmt: skip
    else:
        data = load_ledger_runs(
            ledger, *names, heldout_set=evidence.heldout_set, source=evidence.source,
            judged=judged,
        )  # fmt: skip
    return (
        data,
        ledger_lineage(ledger, candidate, names[0]),
        ledger_lineage(ledger, incumbent, names[1]),
    )


def _hashed(data: GateData, files: Path | None) -> GateData:
    """`data` with the sha256 of each scenario file behind it, for the receipt."""
    if files is None:
        return data
    hashed = hash_scenario_files(files)
    return replace(data, source=data.source.model_copy(update={"scenario_files": hashed}))


def run_gate(
    ledger: Ledger,
    candidate: str,
    incumbent: str,
    evidence: Evidence,
    settings: GateConfig,
    out: Path,
    *,
    suite: Simulated | None = None,
) -> GateRun:
    """Decide on `candidate` against `incumbent` from `evidence`; write and record the receipt.

    Every scenario hash the gate decided on is recorded as held out (it never trains again),
    and the receipt's sha256 is recorded so that `promote` can check it. `suite` is a fixed
    regression suite both policies also run (after the held-out set, same options): it
    decides only its no-regression check (`regressions.suite_tests`), and its hashes are held
    out too.
    """
    data, cand, inc = gather(ledger, candidate, incumbent, evidence, settings)
    data = _hashed(data, evidence.files)
    suite_data = None
    if suite is not None:
        from pipecat_rl.gate.simulate import run_paired_simulations  # imports Pipecat

        suite_data = run_paired_simulations(
            ledger, suite.scenarios, data.candidate, data.incumbent, suite.bot, suite.options,
            suite.server, settings.judged_metrics, stop=suite.stop, on_episode=suite.on_episode,
        )  # fmt: skip
        suite_data = _hashed(suite_data, suite.files)
    ledger.record_heldout_hashes(
        (r.scenario_hash, r.scenario, d.source.heldout_set_id)
        for d in (data, *([suite_data] if suite_data else []))
        for r in d.runs
        if r.scenario_hash
    )
    receipt = evaluate(data, settings, cand, inc, suite_data)
    return GateRun(receipt, write_receipt(receipt, out, ledger), data)
