"""Ledger I/O off the pipeline's hot path: one background thread per ledger file, per process.

Every session recorded into a file shares that file's writer: it is started by the first session
(`acquire_writer`) and stopped, after writing everything queued, when the last one ends
(`LedgerWriter.release`). The recorder hands over small closures; the thread runs them in order.
A write that fails even after the ledger's own retries is logged and counted against its
session (`dropped`), never raised into a call; the recorder stores that count on the session.
"""

import asyncio
import atexit
import queue
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

from pipecat_rl.ledger import Ledger
from pipecat_rl.ledger.dialect import is_url, redact

LedgerOp = Callable[[Ledger], Any]

_STOP = object()


class LedgerWriter:
    """Runs ledger writes in submission order on one daemon thread."""

    def __init__(self, ledger: Ledger, *, owned: bool = False):
        self.ledger = ledger
        self.failed = 0
        """Writes that raised and were dropped, over every session."""
        self._dropped: Counter[str] = Counter()
        self._owned = owned
        self._users = 0
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # named for its file, so a thread dump says which ledger each writer serves
        self._thread = threading.Thread(
            target=self._run, name=f"pipecat-rl-ledger {ledger.path}", daemon=True
        )
        with _lock:
            _running.add(self)
        self._thread.start()

    def submit(self, op: LedgerOp, what: str, *, session_id: str | None = None) -> None:
        """Queue a write; returns at once. A failure counts against `session_id`."""
        self._queue.put((op, what, session_id))

    def dropped(self, session_id: str) -> int:
        """Writes of this session that failed and were dropped (so far)."""
        return self._dropped[session_id]

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            if isinstance(item, threading.Event):
                item.set()
                continue
            op, what, session_id = item
            try:
                op(self.ledger)
            except Exception as e:  # a recorder must never take the call down
                self.failed += 1
                if session_id is not None:
                    self._dropped[session_id] += 1
                logger.error(f"pipecat-rl: could not write {what} to {self.ledger.path}: {e}")
        if self._owned:
            self.ledger.close()
        with _lock:
            _running.discard(self)

    @property
    def alive(self) -> bool:
        """Whether the thread still runs (it stops after its last session ends)."""
        return self._thread.is_alive()

    def flush_sync(self, timeout: float = 30.0) -> bool:
        """Block until everything submitted so far is written."""
        if not self._thread.is_alive():
            return True  # stopped: it wrote everything before it stopped
        done = threading.Event()
        self._queue.put(done)
        while not done.wait(0.2):
            timeout -= 0.2
            if not self._thread.is_alive():
                return True
            if timeout <= 0:
                return False
        return True

    async def flush(self, limit_s: float = 30.0) -> bool:
        """Wait (without blocking the loop) until everything submitted so far is written."""
        return await asyncio.to_thread(self.flush_sync, limit_s)

    def release(self) -> None:
        """One session is done with this writer; the last one out stops it (after its writes)."""
        with _lock:
            self._users -= 1
            if self._users > 0:
                return
            if _writers.get(_key(self.ledger.path)) is self:
                del _writers[_key(self.ledger.path)]
        self._queue.put(_STOP)


_writers: dict[Path | str, LedgerWriter] = {}
"""The writer in use for each ledger file."""
_running: set[LedgerWriter] = set()
"""Every writer whose thread still runs, including one released and draining its last writes."""
_lock = threading.RLock()  # re-entered: a writer is built (and registers) under it


def _key(path: Path | str) -> Path | str:
    return redact(str(path)) if is_url(path) else Path(path).expanduser().resolve()


def acquire_writer(ledger: Ledger | str | Path) -> LedgerWriter:
    """The one writer of this ledger file in this process, for one more session.

    Given a path, the writer opens (and later closes) one connection of its own; given a
    `Ledger`, the first one given is used for the file. Call `release()` when the session ends.
    """
    path = ledger.path if isinstance(ledger, Ledger) else ledger
    key = _key(path)
    with _lock:
        writer = _writers.get(key)
        if writer is None or not writer.alive or writer.ledger.closed:
            if isinstance(ledger, Ledger):
                writer = LedgerWriter(ledger)
            else:
                writer = LedgerWriter(Ledger(path), owned=True)
            _writers[key] = writer
        writer._users += 1
        return writer


@atexit.register
def _flush_all() -> None:
    """Before the interpreter exits (and kills daemon threads), let every writer drain.

    A writer released by its last session is no longer in `_writers` but may still hold that
    session's end: it is waited for too, or a call that ended just before exit would be lost.
    """
    with _lock:
        writers = list(_running)
    for writer in writers:
        writer.flush_sync(timeout=5.0)
