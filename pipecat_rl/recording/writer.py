"""Ledger I/O off the pipeline's hot path: one background thread per ledger file, per process.

Every session recorded into a file shares that file's writer: it is started by the first session
(`acquire_writer`) and stopped, after writing everything queued, when the last one ends
(`LedgerWriter.release`). The recorder hands over small closures; the thread runs them in order.
Given a path or URL, the thread also opens the ledger (a Postgres server may take seconds to
answer, or never): a call never waits for it. A write that fails even after the ledger's own
retries, or finds the ledger unopenable, is logged and counted against its session (`dropped`),
never raised into a call; the recorder stores that count on the session.
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
    """Runs ledger writes in submission order on one daemon thread.

    Given a `Ledger`, it writes to it; given a path or URL, the thread opens the ledger first
    (and closes it when it stops), so opening never runs on the caller's path.
    """

    def __init__(self, ledger: Ledger | Path | str):
        self._owned = not isinstance(ledger, Ledger)
        self.ledger: Ledger | None = None if self._owned else ledger
        """The ledger written to; None until the thread has opened it (or when it could not)."""
        self.name = str(ledger.path if isinstance(ledger, Ledger) else redact(str(ledger)))
        self.key = _key(ledger.path if isinstance(ledger, Ledger) else ledger)
        self.unopened: Exception | None = None
        """Why the thread could not open the ledger (every write is then dropped)."""
        self.failed = 0
        """Writes that raised and were dropped, over every session."""
        self._target = ledger
        self._dropped: Counter[str] = Counter()
        self._users = 0
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # named for its file, so a thread dump says which ledger each writer serves
        self._thread = threading.Thread(
            target=self._run, name=f"pipecat-rl-ledger {self.name}", daemon=True
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

    def _drop(self, session_id: str | None) -> None:
        self.failed += 1
        if session_id is not None:
            self._dropped[session_id] += 1

    def _open(self) -> None:
        try:
            self.ledger = Ledger(self._target)
        except Exception as e:  # counted per write below, like any other failed write
            self.unopened = e
            logger.error(
                f"pipecat-rl: cannot open the ledger {self.name}, so the calls recorded into it "
                f"now are not: {e}"
            )

    def _run(self) -> None:
        if self._owned:
            self._open()
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            if isinstance(item, threading.Event):
                item.set()
                continue
            op, what, session_id = item
            if self.ledger is None:  # it could not be opened (said once, in `_open`)
                self._drop(session_id)
                continue
            try:
                op(self.ledger)
            except Exception as e:  # a recorder must never take the call down
                self._drop(session_id)
                logger.error(f"pipecat-rl: could not write {what} to {self.name}: {e}")
        if self._owned and self.ledger is not None:
            self.ledger.close()
        with _lock:
            _running.discard(self)

    @property
    def alive(self) -> bool:
        """Whether the thread still runs (it stops after its last session ends)."""
        return self._thread.is_alive()

    @property
    def usable(self) -> bool:
        """Whether a new session may share this writer: it runs, its ledger open or opening."""
        if not self.alive or self.unopened is not None:
            return False
        return self.ledger is None or not self.ledger.closed

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
            if _writers.get(self.key) is self:
                del _writers[self.key]
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

    Given a path, the writer opens (on its thread) and later closes one connection of its own;
    given a `Ledger`, the first one given is used for the file. Returns at once, without I/O.
    A writer that could not open its ledger is replaced for the next session, so a server that
    was down is tried again. Call `release()` when the session ends.
    """
    key = _key(ledger.path if isinstance(ledger, Ledger) else ledger)
    with _lock:
        writer = _writers.get(key)
        if writer is None or not writer.usable:
            writer = LedgerWriter(ledger)
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
