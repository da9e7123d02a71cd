"""What every part of the ledger relies on from the store's core.

The `Ledger` (in `store`) is one SQLite connection behind a lock, or a Postgres pool (`dialect`),
with its transactions; each part (`sessions`, `scores`, `adapters`, `receipts`, `queue`) is a
mixin of the methods for its own tables, and reaches the ledger only through the two
transactions declared here.
"""

import sqlite3
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any


class LedgerCore(ABC):
    """A part of the `Ledger`: its methods run inside the core's transactions."""

    path: Path | str
    """The SQLite file, or the Postgres URL with its password hidden (for messages)."""

    @abstractmethod
    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction (committed on success, rolled back on any error)."""

    @abstractmethod
    def _read(self) -> AbstractContextManager[sqlite3.Connection]:
        """One read transaction."""

    def rows(self, sql: str, params: tuple = ()) -> list[Any]:
        """The rows of one read-only statement, in one read transaction.

        For `ledger migrate`'s whole-table reads; the parts' methods serve everything else.
        """
        with self._read() as conn:
            return conn.execute(sql, params).fetchall()
