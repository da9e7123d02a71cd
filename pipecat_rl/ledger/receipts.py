"""The ledger's gate part: every held-out scenario hash ever seen, and the receipts the gate wrote.

A hash once seen held out stays held out, so its content never trains wherever its file later
sits. A receipt is recorded by the sha256 of its bytes: promotion accepts only a receipt the gate
recorded here, so a hand-written or edited file moves nothing.
"""

import sqlite3
import time
from collections.abc import Iterable
from typing import Any

from pipecat_rl.errors import LedgerError
from pipecat_rl.ledger.core import LedgerCore
from pipecat_rl.ledger.tables import (
    GATE_RECEIPT_COLUMNS,
    INSERT_GATE_RECEIPT,
    INSERT_HELDOUT_HASH,
    SELECT_GATE_RECEIPT,
    SELECT_HELDOUT_HASHES,
)


class Receipts(LedgerCore):
    """Held-out hashes and gate receipts."""

    def record_heldout_hashes(self, entries: Iterable[tuple[str, str, str | None]]) -> int:
        """Remember held-out scenario hashes: (scenario_hash, scenario_id, heldout_set_id).

        A hash once seen held out stays held out (the first sighting is kept), so a session of
        that content never trains wherever its file later sits. Returns how many were new.
        """
        now = time.time()
        with self._write() as conn:
            before = conn.total_changes
            for scenario_hash, scenario_id, set_id in entries:
                conn.execute(INSERT_HELDOUT_HASH, (scenario_hash, scenario_id, set_id, now))
            return conn.total_changes - before

    def heldout_hashes(self) -> dict[str, dict[str, Any]]:
        """Every held-out hash seen: hash -> {scenario_id, heldout_set_id, first_seen_at}."""
        with self._read() as conn:
            rows = conn.execute(SELECT_HELDOUT_HASHES).fetchall()
        return {
            h: {"scenario_id": sid, "heldout_set_id": set_id, "first_seen_at": seen}
            for h, sid, set_id, seen in rows
        }

    def record_gate_receipt(
        self,
        *,
        receipt_sha256: str,
        receipt_id: str,
        verdict: str,
        candidate: str,
        incumbent: str,
        heldout_set_id: str | None,
        path: str | None,
    ) -> None:
        """Record a receipt the gate wrote: the sha256 of its bytes and what it decided."""
        values = (
            receipt_sha256, receipt_id, verdict, candidate, incumbent, heldout_set_id, path,
            time.time(),
        )  # fmt: skip
        with self._write() as conn:
            try:
                conn.execute(INSERT_GATE_RECEIPT, values)
            except sqlite3.IntegrityError as e:
                raise LedgerError(
                    f"a receipt with sha256 {receipt_sha256} is already recorded in {self.path}"
                ) from e

    def gate_receipt(self, receipt_sha256: str) -> dict[str, Any] | None:
        """The gate's record of a receipt by the sha256 of its bytes, or None if it has none."""
        with self._read() as conn:
            row = conn.execute(SELECT_GATE_RECEIPT, (receipt_sha256,)).fetchone()
        return None if row is None else dict(zip(GATE_RECEIPT_COLUMNS, row, strict=True))
