"""The ledger's adapters part: registered LoRA adapters and the live pointer.

An adapter's name is never reused (vLLM keeps a stale prefix cache under a reloaded name), so a
name identifies weights. The live pointer is a history of moves: each row says which adapter
serves from when, on whose receipt, and what served before, so a rollback is one more move.

A rollback steps back through that history, as an undo does: it goes to the adapter that served
before the current one came in, and a second rollback goes one step further back, never forward
to the adapter the first one left. A move is a step back when it has no receipt and returns to
the adapter that served before the current one (what `rollback_live` writes); every other move
(a promotion, with its receipt) is a step forward (`rollback_path`).
"""

import sqlite3
import time

from pipecat_rl.errors import LedgerError, NotInLedgerError
from pipecat_rl.ledger.core import LedgerCore
from pipecat_rl.ledger.records import BASE_ADAPTER, AdapterRecord, LivePointer
from pipecat_rl.ledger.tables import (
    ADAPTERS,
    INSERT_ADAPTER,
    INSERT_LIVE,
    LIVE,
    SELECT_ADAPTER,
    SELECT_ADAPTERS,
    SELECT_LIVE,
    SELECT_LIVE_HISTORY,
)


class Adapters(LedgerCore):
    """Adapters and the live pointer."""

    def register_adapter(self, a: AdapterRecord) -> None:
        """Register an adapter; a name already registered is refused, since names never repeat."""
        if a.name == BASE_ADAPTER:
            raise LedgerError(
                f"the adapter name {BASE_ADAPTER!r} is reserved for the base model; pick another"
            )
        with self._write() as conn:
            try:
                conn.execute(INSERT_ADAPTER, ADAPTERS.params(a))
            except sqlite3.IntegrityError as e:
                raise LedgerError(
                    f"an adapter named {a.name!r} is already registered in {self.path}; adapter "
                    "names are never reused, so register these weights under a new name"
                ) from e

    def _get_adapter(self, conn: sqlite3.Connection, name: str) -> AdapterRecord:
        row = conn.execute(SELECT_ADAPTER, (name,)).fetchone()
        if row is None:
            names = [r[0] for r in conn.execute("SELECT name FROM adapters ORDER BY created_at")]
            known = ", ".join(names[-10:]) if names else "none yet"
            raise NotInLedgerError(
                f"no adapter {name!r} in the ledger {self.path} (registered: {known}); "
                f"use {BASE_ADAPTER!r} for the base model"
            )
        return ADAPTERS.record(row)

    def adapter(self, name: str) -> AdapterRecord:
        """One registered adapter by name; NotInLedgerError if it is not registered."""
        with self._read() as conn:
            return self._get_adapter(conn, name)

    def adapters(self) -> list[AdapterRecord]:
        """Every registered adapter, oldest first."""
        with self._read() as conn:
            rows = conn.execute(SELECT_ADAPTERS).fetchall()
        return [ADAPTERS.record(r) for r in rows]

    def live(self) -> LivePointer | None:
        """The current live pointer, or None if nothing was ever promoted."""
        with self._read() as conn:
            row = conn.execute(SELECT_LIVE).fetchone()
        return None if row is None else LIVE.record(row)

    def _move(
        self, conn: sqlite3.Connection, adapter: str, receipt: str | None, previous: str | None
    ) -> LivePointer:
        pointer = LivePointer(
            adapter=adapter, moved_at=time.time(), receipt=receipt, previous=previous
        )
        conn.execute(INSERT_LIVE, LIVE.params(pointer))
        return pointer

    def move_live(self, adapter: str, *, receipt: str | None = None) -> LivePointer:
        """Point live at a registered adapter (or "base"), remembering what served before.

        Before any move the base model serves, so the first move remembers "base" as previous and
        can be rolled back. Moving to the adapter that is already live changes nothing.
        """
        with self._write() as conn:
            if adapter != BASE_ADAPTER:
                self._get_adapter(conn, adapter)
            row = conn.execute(SELECT_LIVE).fetchone()
            current: LivePointer | None = None if row is None else LIVE.record(row)
            if current is not None and current.adapter == adapter:
                return current
            if current is None and adapter == BASE_ADAPTER:
                return self._move(conn, adapter, receipt, None)
            return self._move(conn, adapter, receipt, current.adapter if current else BASE_ADAPTER)

    def rollback_live(self) -> LivePointer:
        """Step live back to the adapter that served before the current one came in (a new row).

        The row has no receipt: that is what marks it a step back in the history. Raises
        LedgerError (saying "nothing to roll back to") when nothing served before.
        """
        with self._write() as conn:
            moves = [LIVE.record(r) for r in conn.execute(SELECT_LIVE_HISTORY).fetchall()]
            path = rollback_path(moves)
            if len(path) < 2:
                raise LedgerError(f"nothing to roll back to in {self.path}: {_first(moves)}")
            return self._move(conn, path[-2], None, path[-1])

    def rollback_target(self) -> str | None:
        """The adapter `rollback_live` would make live, or None when nothing served before."""
        path = rollback_path(self.live_history())
        return path[-2] if len(path) >= 2 else None

    def live_history(self) -> list[LivePointer]:
        """Every move of the live pointer, oldest first."""
        with self._read() as conn:
            rows = conn.execute(SELECT_LIVE_HISTORY).fetchall()
        return [LIVE.record(r) for r in rows]


def rollback_path(moves: list[LivePointer]) -> list[str]:
    """The adapters successive rollbacks step back through from the live one (last), oldest first.

    A promotion pushes the adapter it made live; a step back (no receipt, to the adapter below
    the current one) pops the current one. Before the first move the base model served.
    """
    path: list[str] = []
    for move in moves:
        if not path and move.previous is not None:
            path.append(move.previous)
        if len(path) >= 2 and move.receipt is None and move.adapter == path[-2]:
            path.pop()
        elif not path or path[-1] != move.adapter:
            path.append(move.adapter)
    return path


def _first(moves: list[LivePointer]) -> str:
    """Why nothing can be rolled back to, given the history."""
    if not moves:
        return "nothing was ever promoted"
    live = moves[-1].adapter
    return (
        f"{live!r} is live and nothing served before it (earlier rollbacks already stepped "
        "back to it); promote a receipt to move forward"
    )
