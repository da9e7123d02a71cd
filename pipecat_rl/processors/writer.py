"""Ledger I/O off the pipeline's hot path: one background thread per ledger file.

The recorder hands over small closures; the thread runs them in order. A failing write (the
file locked past the busy timeout, a full disk) is logged and counted, never raised into a call.
"""

import asyncio
import atexit
import queue
import threading
from collections.abc import Callable
from typing import Any

from loguru import logger

from pipecat_rl.ledger import Ledger

LedgerOp = Callable[[Ledger], Any]


class LedgerWriter:
    """Runs ledger writes in submission order on a daemon thread."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self.failed = 0
        """Writes that raised and were dropped."""
        self._queue: queue.SimpleQueue[tuple[LedgerOp, str] | threading.Event] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="pipecat-rl-ledger", daemon=True)
        self._thread.start()

    def submit(self, op: LedgerOp, what: str) -> None:
        """Queue a write; returns at once."""
        self._queue.put((op, what))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            op, what = item
            try:
                op(self.ledger)
            except Exception as e:  # a recorder must never take the call down
                self.failed += 1
                logger.error(f"pipecat-rl: could not write {what} to {self.ledger.path}: {e}")

    def flush_sync(self, timeout: float = 30.0) -> bool:
        """Block until everything submitted so far is written."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    async def flush(self, limit_s: float = 30.0) -> bool:
        """Wait (without blocking the loop) until everything submitted so far is written."""
        return await asyncio.to_thread(self.flush_sync, limit_s)


_writers: dict[int, LedgerWriter] = {}
_lock = threading.Lock()


def writer_for(ledger: Ledger) -> LedgerWriter:
    """The one writer of this ledger object (created on first use)."""
    with _lock:
        writer = _writers.get(id(ledger))
        if writer is None or writer.ledger is not ledger:
            writer = _writers[id(ledger)] = LedgerWriter(ledger)
        return writer


@atexit.register
def _flush_all() -> None:
    for writer in list(_writers.values()):
        writer.flush_sync(timeout=5.0)
