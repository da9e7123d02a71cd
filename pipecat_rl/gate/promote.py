"""Promotion and rollback: load the adapter into the running server, then move the live pointer.

A receipt is never trusted as written. Before anything moves, `verify_receipt` refuses, saying
which rule failed:

1. `not_recorded`: the sha256 of receipt.json's bytes is not one the gate recorded in this
   ledger (the file was edited, or was gated into another ledger);
2. `verdict`: the recorded verdict (or candidate / incumbent) is not what the file says, or the
   verdict is not PROMOTE;
3. `same_policy`: the candidate is the incumbent;
4. `scores_input`: the runs came from a scores file, which anyone can write and the ledger cannot
   vouch for (allowed only with `allow_scores_receipt`, the CLI's `--allow-scores-receipt`);
5. `statistics`: recomputing the receipt's interval, regressions and checks from its own
   per-scenario table (`evaluate.recheck`) does not give PROMOTE, or disagrees with what it says.

Order matters: the adapter is loaded before the pointer moves, so a call that starts right after
the move never names an adapter the server does not have. Nothing is unloaded: calls in progress
keep the adapter they started with (see `LiveAdapterSelector`).
"""

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from pipecat_rl.errors import GateError
from pipecat_rl.gate.evaluate import recheck
from pipecat_rl.gate.lineage import LIVE
from pipecat_rl.gate.receipt import GateReceipt, load_receipt, receipt_sha256
from pipecat_rl.ledger import BASE_ADAPTER, Ledger, LivePointer, NotInLedgerError
from pipecat_rl.serving.server import VLLMAdmin

ServerAction = Literal["loaded", "already_loaded", "base_model", "not_touched"]


class LiveMove(BaseModel):
    """What a promote or rollback did."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    adapter: str
    previous: str | None
    receipt: str | None
    server: ServerAction
    """`not_touched` when no LLM server URL was given: only the pointer moved."""


def _serve(ledger: Ledger, name: str, admin: VLLMAdmin | None) -> ServerAction:
    """Make sure the server can answer requests for `name` (loading it if needed)."""
    if name == BASE_ADAPTER:
        if admin is not None and (merged := admin.merged_policy()) is not None:
            raise GateError(
                f"the server at {admin.root} serves {Path(merged.adapter).name} merged into its "
                "weights, so it has no base model; restart it without --merged first."
            )
        return "base_model"
    try:
        adapter = ledger.adapter(name)
    except NotInLedgerError as e:
        raise GateError(f"adapter {name!r} no longer exists in {ledger.path}: {e}") from e
    if not Path(adapter.path).exists():
        raise GateError(
            f"adapter {name!r} is registered but its weights at {adapter.path} are gone; "
            "restore them or gate another adapter."
        )
    if admin is None:
        return "not_touched"
    if name in admin.models():
        return "already_loaded"
    admin.load_adapter(name, adapter.path)
    return "loaded"


def _moved(pointer: LivePointer, server: ServerAction) -> LiveMove:
    return LiveMove(
        adapter=pointer.adapter, previous=pointer.previous, receipt=pointer.receipt, server=server
    )


def _refused(rule: str, message: str) -> GateError:
    """A refusal that names its rule first, so a person or a script can tell which failed."""
    return GateError(f"promotion refused ({rule}): {message}")


def verify_receipt(
    receipt_path: Path, ledger: Ledger, *, allow_scores_receipt: bool = False
) -> GateReceipt:
    """The receipt, if the gate recorded exactly these bytes and its own numbers say PROMOTE.

    A receipt gated from a scores file is refused unless `allow_scores_receipt`.

    Raises:
        GateError: the file is missing or not a receipt, or it is refused: the message starts
            `promotion refused (<rule>)` with the rule that failed (see the module docstring).
    """
    receipt = load_receipt(receipt_path)
    file = receipt_path / "receipt.json" if receipt_path.is_dir() else receipt_path
    sha = receipt_sha256(file)
    row = ledger.gate_receipt(sha)
    if row is None:
        raise _refused(
            "not_recorded",
            f"{file} (sha256 {sha[:16]}...) is not a receipt the gate recorded in {ledger.path}: "
            "it was edited after the gate wrote it, or gated into another ledger. Run "
            "`pipecat-rl gate` again with this --ledger.",
        )
    recorded = (row["verdict"], row["candidate"], row["incumbent"])
    stated = (receipt.verdict, receipt.candidate.name, receipt.incumbent.name)
    if recorded != stated:
        raise _refused(
            "verdict",
            f"the ledger recorded this receipt as {recorded[0]} for {recorded[1]!r} vs "
            f"{recorded[2]!r}, but it says {stated[0]} for {stated[1]!r} vs {stated[2]!r}.",
        )
    if receipt.verdict != "PROMOTE":
        raise _refused(
            "verdict",
            f"the receipt {receipt_path} says {receipt.verdict} ({receipt.reason}); only a "
            "PROMOTE receipt can be promoted.",
        )
    if receipt.candidate.name == receipt.incumbent.name:
        raise _refused(
            "same_policy",
            f"the candidate and the incumbent are both {receipt.candidate.name!r}; nothing "
            "was compared.",
        )
    if receipt.input.kind == "scores" and not allow_scores_receipt:
        raise _refused(
            "scores_input",
            f"the receipt was gated from the scores file {receipt.input.path} (sha256 "
            f"{(receipt.input.sha256 or 'unknown')[:16]}...), whose runs the ledger does not "
            "hold: anyone can write such a file. Gate the candidate from its runs (`pipecat-rl "
            "gate --scenarios ... --bot ...` or `--from-ledger`), or pass --allow-scores-receipt "
            "if you trust the file.",
        )
    verdict, problems = recheck(receipt)
    if verdict.decision != "PROMOTE" or problems:
        said = "; ".join(problems) or f"recomputed, {verdict.reason}"  # it names its verdict
        said = said.rstrip(".")
        raise _refused(
            "statistics", f"the receipt's own statistics do not support PROMOTE: {said}."
        )
    return receipt


def promote(
    receipt_path: Path,
    ledger: Ledger,
    admin: VLLMAdmin | None = None,
    *,
    allow_scores_receipt: bool = False,
) -> LiveMove:
    """Promote a receipt's candidate: refuse unless it verifies and still applies.

    `allow_scores_receipt` lets a receipt gated from a scores file through (`verify_receipt`).

    Raises:
        GateError: the receipt fails `verify_receipt` (the message names the rule), the
            candidate or its weights are gone, or the adapter it was gated against as live is no
            longer live.
        ServingError: the server refused to load the adapter (the pointer did not move).
    """
    receipt = verify_receipt(receipt_path, ledger, allow_scores_receipt=allow_scores_receipt)
    if receipt.incumbent.requested == LIVE and receipt.incumbent.name != LIVE:
        # The gate resolved `live` through the ledger: it must still be what serves.
        pointer = ledger.live()
        live_now = BASE_ADAPTER if pointer is None else pointer.adapter
        if live_now != receipt.incumbent.name:
            raise GateError(
                f"the candidate was gated against the live adapter {receipt.incumbent.name!r}, "
                f"but {live_now!r} is live now; gate it again against --incumbent live."
            )
    name = receipt.candidate.name
    server = _serve(ledger, name, admin)
    file = receipt_path / "receipt.json" if receipt_path.is_dir() else receipt_path
    return _moved(ledger.move_live(name, receipt=str(file.resolve())), server)


def rollback(ledger: Ledger, admin: VLLMAdmin | None = None) -> LiveMove:
    """Step live back to the adapter that served before the current one, loading it if needed.

    Two rollbacks go two steps back through the promotions, never forward again to the adapter
    the first one left (`Ledger.rollback_live`).

    Raises:
        GateError: nothing was promoted yet, or earlier rollbacks already stepped back to the
            first adapter that served (the message says "nothing to roll back to").
    """
    target = ledger.rollback_target()
    if target is None:
        pointer = ledger.live()
        raise GateError(
            "nothing to roll back to: "
            + (
                "nothing was ever promoted"
                if pointer is None
                else f"{pointer.adapter!r} is live and nothing served before it"
            )
            + "; promote a receipt instead."
        )
    server = _serve(ledger, target, admin)
    return _moved(ledger.rollback_live(), server)
