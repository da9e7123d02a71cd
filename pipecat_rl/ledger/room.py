"""What every room of the ledger relies on from the store's core.

The `Ledger` (in `store`) is one SQLite connection behind a lock, or a Postgres pool (`dialect`),
with its transactions; each room (`sessions`, `scores`, `adapters`, `receipts`, `queue`) is a
mixin of the methods for its own tables, and reaches the ledger only through the two
transactions declared here.
"""

import sqlite3
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from pathlib import Path


class Room(ABC):
    """A part of the `Ledger`: its methods run inside the core's transactions."""

    path: Path | str
    """The SQLite file, or the Postgres URL with its password hidden (for messages)."""

    @abstractmethod
    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction (committed on success, rolled back on any error)."""

    @abstractmethod
    def _read(self) -> AbstractContextManager[sqlite3.Connection]:
        """One read transaction."""
