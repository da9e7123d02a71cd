"""Promotion and rollback: load the adapter into the running server, then move the live pointer.

Order matters: the adapter is loaded before the pointer moves, so a call that starts right after
the move never names an adapter the server does not have. Nothing is unloaded: calls in progress
keep the adapter they started with (see `LiveAdapterSelector`).
"""

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from pipecat_rl.errors import GateError
from pipecat_rl.gate.lineage import LIVE
from pipecat_rl.gate.receipt import load_receipt
from pipecat_rl.ledger import BASE_ADAPTER, Ledger, LivePointer, NotInLedgerError
from pipecat_rl.serving import VLLMAdmin

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


def promote(receipt_path: Path, ledger: Ledger, admin: VLLMAdmin | None = None) -> LiveMove:
    """Promote a receipt's candidate: refuse unless it says PROMOTE and still applies.

    Raises:
        GateError: the verdict is not PROMOTE, the candidate or its weights are gone, or the live
            adapter the candidate was gated against is no longer live.
        ServingError: the server refused to load the adapter (the pointer did not move).
    """
    receipt = load_receipt(receipt_path)
    if receipt.verdict != "PROMOTE":
        raise GateError(
            f"the receipt {receipt_path} says {receipt.verdict} ({receipt.reason}); only a "
            "PROMOTE receipt can be promoted."
        )
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
    """Point live back at the adapter that served before the current one, loading it if needed.

    Raises:
        GateError: nothing was promoted yet, or the pointer records nothing before it.
    """
    pointer = ledger.live()
    if pointer is None or pointer.previous is None:
        raise GateError(
            "nothing to roll back to: "
            + (
                "nothing was ever promoted"
                if pointer is None
                else f"{pointer.adapter!r} has nothing recorded before it"
            )
            + "; promote a receipt instead."
        )
    server = _serve(ledger, pointer.previous, admin)
    return _moved(ledger.rollback_live(), server)
