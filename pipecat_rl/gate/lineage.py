"""Who the candidate and incumbent are: adapter lineage and the training guard's state.

Guard states, and what the verdict does with them:

- `passed`: the training run recorded a guard value that passed.
- `failed`: it recorded one that failed. Rejects.
- `missing`: the lineage records a training run but no guard value. Rejects: a guard that is
  absent must not read as one that passed.
- `unavailable`: nothing to read a guard from (an imported adapter, a policy known only from a
  scores file, a name the ledger does not know). Reported; rejects only with `require_guard`.
- `not_applicable`: the base model, which no training run changed.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from pipecat_rl.errors import GateError
from pipecat_rl.ledger import BASE_ADAPTER, Ledger, NotInLedgerError

GuardState = Literal["passed", "failed", "missing", "unavailable", "not_applicable"]

LIVE = "live"
"""The policy name that means "whatever the ledger's live pointer serves now"."""


class Lineage(BaseModel):
    """A policy as the receipt records it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requested: str
    """The name given on the command line (may be `live`)."""
    name: str
    """The resolved policy name the runs were recorded under."""
    kind: Literal["adapter", "base", "unknown"]
    path: str | None = None
    base_model: str | None = None
    parent: str | None = None
    created_at: float | None = None
    training_run_id: str | None = None
    training_sessions: int | None = None
    guard: GuardState
    guard_detail: str


def resolve_policy(ledger: Ledger, requested: str) -> str:
    """The policy name behind `requested`: `live` reads the live pointer, others pass through.

    Raises:
        GateError: `live` was asked for but the ledger has no live pointer yet.
    """
    if requested != LIVE:
        return requested
    pointer = ledger.live()
    if pointer is None:
        raise GateError(
            "the ledger has no live adapter yet; pass --incumbent base (or an adapter name)."
        )
    return pointer.adapter


def base_lineage(requested: str) -> Lineage:
    """Lineage of the base model: no adapter record and no training run."""
    return Lineage(
        requested=requested,
        name=BASE_ADAPTER,
        kind="base",
        guard="not_applicable",
        guard_detail="base model: no training run changed it",
    )


def unknown_lineage(requested: str, name: str, why: str) -> Lineage:
    """Lineage of a policy the gate has no record of (for example one from a scores file)."""
    if name == BASE_ADAPTER:
        return base_lineage(requested)
    return Lineage(
        requested=requested, name=name, kind="unknown", guard="unavailable", guard_detail=why
    )


def ledger_lineage(ledger: Ledger, requested: str, name: str) -> Lineage:
    """Lineage of `name` from the ledger's adapter record, with the training guard's state."""
    if name == BASE_ADAPTER:
        return base_lineage(requested)
    try:
        adapter = ledger.adapter(name)
    except NotInLedgerError:
        return unknown_lineage(
            requested, name, f"guard unavailable: the ledger has no adapter named {name!r}"
        )
    run = adapter.training_run
    guard, detail = _guard_state(run)
    return Lineage(
        requested=requested,
        name=name,
        kind="adapter",
        path=adapter.path,
        base_model=adapter.base_model,
        parent=adapter.parent,
        created_at=adapter.created_at,
        training_run_id=None if run is None else str(run.get("id")),
        training_sessions=len(adapter.training_data),
        guard=guard,
        guard_detail=detail,
    )


def _guard_state(run: dict[str, Any] | None) -> tuple[GuardState, str]:
    if run is None:
        return "unavailable", "guard unavailable: imported adapter, no training run to read"
    run_id = run.get("id")
    guard = run.get("guard")
    if not isinstance(guard, dict) or not isinstance(guard.get("passed"), bool):
        return "missing", f"training run {run_id} recorded no guard value"
    facts = ", ".join(f"{k}={v}" for k, v in guard.items() if k != "passed")
    suffix = f" ({facts})" if facts else ""
    if guard["passed"]:
        return "passed", f"training run {run_id}: guard passed{suffix}"
    return "failed", f"training run {run_id}: guard failed{suffix}"
