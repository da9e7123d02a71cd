"""The ledger store: one SQLite file in WAL mode that every part of the loop reads and writes.

Or one PostgreSQL database, for many bot processes on many machines: `Ledger("postgresql://...")`
runs the same parts, schema and queries; how Postgres differs is all in `dialect`.

A bot process writes from the recorder's background thread while the CLI, the trainer or the gate
read from other processes; WAL lets readers and the one writer proceed together. Every write is one
transaction, so a crash loses at most the write in flight.

This module is the core (opening, migrating, transactions, retries on a busy file) and the one
`Ledger` facade; the methods of each group of tables live in a part of their own (`sessions`,
`scores`, `adapters`, `receipts`, `queue`) that `Ledger` mixes in.
"""

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Annotated, Any

from loguru import logger
from pydantic import BeforeValidator

from pipecat_rl.errors import ConfigError, LedgerError, LedgerLockedError, NotInLedgerError
from pipecat_rl.ledger import schema as _schema
from pipecat_rl.ledger.adapters import Adapters
from pipecat_rl.ledger.dialect import PostgresStore, ledger_target, redact
from pipecat_rl.ledger.duels import Duels
from pipecat_rl.ledger.queue import JobQueue
from pipecat_rl.ledger.receipts import Receipts
from pipecat_rl.ledger.scores import Scores
from pipecat_rl.ledger.sessions import Sessions

__all__ = [
    "BUSY_TIMEOUT_S",
    "DEFAULT_LEDGER_NAME",
    "LEDGER_ENV",
    "Ledger",
    "LedgerLocation",
    "ledger_file_missing",
    "NotInLedgerError",
    "resolve_ledger_path",
]

DEFAULT_LEDGER_NAME = "pipecat-rl.db"
"""The ledger file used in the current directory when neither --ledger nor the env var is set."""

LEDGER_ENV = "PIPECAT_RL_LEDGER"
"""Environment variable naming the ledger file."""

BUSY_TIMEOUT_S = 5.0
"""How long a write waits for another process's write lock before failing."""

WRITE_RETRIES = 3
"""Further attempts at a write that found the file locked past the busy timeout."""
RETRY_BACKOFF_S = 0.5
"""The first pause before a retry; each later pause doubles it."""


def resolve_ledger_path(explicit: str | Path | None = None) -> Path | str:
    """--ledger PATH, else $PIPECAT_RL_LEDGER, else ./pipecat-rl.db in the current directory.

    One rule for every verb and library entry point, so they all find the same ledger. A
    postgresql:// URL stays a URL (str); a URL of any other scheme, or a Postgres URL without
    its driver installed, is a LedgerError naming what to pass or install.

    Raises:
        ConfigError: `explicit` is empty or blank (`--ledger ""`, an unset shell variable):
            refused rather than read as "no flag", which would write ./pipecat-rl.db unasked.
    """
    if explicit is not None:
        if not str(explicit).strip():
            raise ConfigError(
                f"--ledger {str(explicit)!r} names no ledger; pass a SQLite file or a "
                f"postgresql:// URL, or leave the flag out to use ${LEDGER_ENV} (else "
                f"./{DEFAULT_LEDGER_NAME})"
            )
        return ledger_target(explicit)
    from_env = os.environ.get(LEDGER_ENV)
    if from_env:
        return ledger_target(from_env)
    return Path.cwd() / DEFAULT_LEDGER_NAME


def ledger_file_missing(location: Path | str) -> bool:
    """Whether `location` is a SQLite file that is not there yet (a URL: the server's to say)."""
    return isinstance(location, Path) and not location.exists()


def _location(value: Any) -> Any:
    if not isinstance(value, str | Path):
        return value  # pydantic says what it is not
    try:
        return resolve_ledger_path(value)
    except (LedgerError, ConfigError) as e:  # a ValueError, so pydantic names the field
        raise ValueError(str(e)) from None


LedgerLocation = Annotated[Path | str, BeforeValidator(_location)]
"""A ledger named in a settings file (loop.yaml, the service's settings): a SQLite file path,
or a postgresql:// URL kept as written (a Path would fold its `//`); refused as `--ledger` is."""


class Ledger(Sessions, Scores, Adapters, Receipts, JobQueue, Duels):
    """The ledger: one facade over its parts, on one SQLite connection or a Postgres pool.

    Rooms: `Sessions` (sessions, turns, tool calls, latencies, scores, the closer, export and
    stats), `Scores` (scores posted for a call, a live call's verdict from them), `Adapters`
    (adapters and the live pointer), `Receipts` (held-out hashes and gate receipts), `JobQueue`
    (the side service's jobs), `Duels` (people's preference duels and votes). This class is
    their core: the connection, its transactions and the schema's migrations.

    Safe to share between threads (one connection behind a lock) and between processes (WAL with
    a busy timeout). Opening a file from an older pipecat-rl migrates it; opening one from a newer
    pipecat-rl is refused rather than guessed at. Opening also closes, `interrupted`, the sessions
    left open by writers that are gone (`close_dead_sessions`).

    `path` may be a postgresql:// URL: the same parts run on a pool of connections to it, every
    write transaction holding the ledger's one write lock (`dialect`), so many processes on
    many machines write one ledger; `path` is then the URL with its password hidden.
    """

    def __init__(self, path: str | Path, *, read_only: bool = False):
        """Open (creating and migrating) the ledger at `path`, or read it only.

        `read_only` opens an existing SQLite file without writing a byte (no WAL switch, no
        migration, no closing of dead sessions), so a ledger on a read-only mount or owned by
        another user can still be read; any write then raises `LedgerError`.
        """
        self._lock = threading.Lock()
        self.read_only = read_only
        self._conn: sqlite3.Connection | None = None
        self._postgres: PostgresStore | None = None
        target = ledger_target(path)
        if isinstance(target, str):
            self._open_postgres(target)
            return
        self.path: Path | str = target
        if read_only and not self.path.is_dir():  # a folder: the writable open's message
            self._conn = self._open_read_only(target)
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LedgerError(
                f"cannot create the folder for the ledger {self.path}: {e}; "
                "pass --ledger (or set PIPECAT_RL_LEDGER) to a writable path"
            ) from e
        if self.path.is_dir():
            raise LedgerError(
                f"the ledger path {self.path} is a directory; pass a file path such as "
                f"{self.path / DEFAULT_LEDGER_NAME}"
            )
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=BUSY_TIMEOUT_S,
                check_same_thread=False,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
            )
        except sqlite3.Error as e:
            raise LedgerError(f"cannot open the ledger {self.path}: {e}") from e
        try:
            self._configure(conn)
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._close_dead_on_open()

    def _open_read_only(self, path: Path) -> sqlite3.Connection:
        """A read-only connection that leaves no file behind.

        A ledger closed cleanly has no -wal beside it: it is read as `immutable` (SQLite then
        creates no -wal or -shm, and needs no writable folder). A -wal means a writer has it open,
        or died: `mode=ro` reads the WAL's committed pages too, and `immutable` stays the
        fallback where the folder will not take SQLite's -shm.
        """
        from urllib.parse import quote

        uri = f"file:{quote(str(path.resolve()))}"
        last: sqlite3.Error | None = None
        wal = path.with_name(path.name + "-wal").exists()
        for mode in ("mode=ro", "immutable=1") if wal else ("immutable=1",):
            conn: sqlite3.Connection | None = None
            try:
                conn = sqlite3.connect(
                    f"{uri}?{mode}", uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False,
                    isolation_level=None,
                )  # fmt: skip
                conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
                version = conn.execute("PRAGMA user_version").fetchone()[0]
            except sqlite3.DatabaseError as e:
                last = e
                if conn is not None:
                    conn.close()
                if "not a database" in str(e):
                    raise self._not_sqlite() from e
                continue
            target = len(_schema.MIGRATIONS)
            if version > target:
                conn.close()
                raise self._newer(version, target)
            if version < target:
                conn.close()
                raise LedgerError(
                    f"the ledger {path} has schema version {version} and this pipecat-rl reads "
                    f"{target}; it migrates on a writable open (any writing verb, e.g. `pipecat-rl "
                    "ledger score`), which this read-only one does not do"
                )
            return conn
        raise LedgerError(f"cannot open the ledger {path} to read it: {last}")

    def _close_dead_on_open(self) -> None:
        try:
            self.close_dead_sessions(reason="interrupted: the process writing it is gone")
        except LedgerError as e:  # best effort: a later open closes them
            logger.warning(f"pipecat-rl: could not close dead sessions in {self.path}: {e}")

    def _open_postgres(self, url: str) -> None:
        self.path = redact(url)
        self._postgres = PostgresStore(url, list(_schema.MIGRATIONS), self._newer)
        self._close_dead_on_open()

    @classmethod
    def open(cls, path: str | Path | None = None) -> "Ledger":
        """Open the ledger the CLI would use: explicit path, else $PIPECAT_RL_LEDGER, else cwd."""
        return cls(resolve_ledger_path(path))

    def __repr__(self) -> str:
        return f"Ledger({str(self.path)!r})"

    def close(self) -> None:
        """Close the connection; further calls raise LedgerError. Closing twice is harmless."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._postgres is not None:
                self._postgres.close()
                self._postgres = None

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- opening -------------------------------------------------------------------------------

    def _configure(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.DatabaseError as e:
            if getattr(e, "sqlite_errorname", "") == "SQLITE_NOTADB" or "not a database" in str(e):
                raise self._not_sqlite() from e
            raise LedgerError(f"cannot open the ledger {self.path}: {e}") from e

    def _not_sqlite(self) -> LedgerError:
        return LedgerError(
            f"{self.path} is not a SQLite file, so it cannot be a pipecat-rl ledger; "
            "pass --ledger (or set PIPECAT_RL_LEDGER) to a ledger file or a new path"
        )

    def _newer(self, version: int, target: int) -> LedgerError:
        return LedgerError(
            f"the ledger {self.path} has schema version {version}, written by a newer pipecat-rl "
            f"(this one reads up to version {target}); upgrade pipecat-rl "
            "(pip install -U pipecat-rl) to open it"
        )

    def _migrate(self, conn: sqlite3.Connection) -> None:
        migrations = list(_schema.MIGRATIONS)
        target = len(migrations)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as e:
            raise LedgerError(f"cannot read the ledger {self.path}: {e}") from e
        if version > target:
            raise self._newer(version, target)
        if version == target:
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise LedgerError(f"cannot lock the ledger {self.path} to migrate it: {e}") from e
        try:
            # Another process may have migrated between our read and our lock.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > target:
                raise self._newer(version, target)
            if version == 0:
                (tables,) = conn.execute(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table' "
                    "AND name NOT LIKE 'sqlite_%'"
                ).fetchone()
                if tables:
                    raise LedgerError(
                        f"{self.path} is a SQLite file but not a pipecat-rl ledger (it has "
                        "tables and no ledger schema version); pass --ledger to a ledger file "
                        "or a new path"
                    )
            for number in range(version + 1, target + 1):
                migration = migrations[number - 1]
                try:
                    migration.apply(conn)
                except sqlite3.Error as e:
                    raise LedgerError(
                        f"migrating the ledger {self.path} to schema version {number} "
                        f"({migration.description}) failed: {e}; the file was left unchanged at "
                        f"version {version}. Report this with the file's schema version"
                    ) from e
            conn.execute(f"PRAGMA user_version = {target}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    # -- transactions --------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        """Hold the lock for one transaction; commit on success, roll back on any error."""
        postgres = self._postgres
        if postgres is not None:
            with postgres.transaction(write=write) as pg:
                yield pg  # type: ignore[misc]  # the part of sqlite3's connection parts use
            return
        with self._lock:
            conn = self._conn
            if conn is None:
                raise LedgerError(f"the ledger {self.path} is closed; open it again to use it")
            if write and self.read_only:
                raise LedgerError(f"the ledger {self.path} was opened read-only; nothing written")
            self._begin(conn, write)
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as e:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error):
                    raise LedgerError(f"ledger {self.path}: {e}") from e
                raise

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._transaction(write=True)

    def _read(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._transaction(write=False)

    @property
    def closed(self) -> bool:
        """Whether `close()` was called (a writer must not keep using a closed ledger)."""
        return self._conn is None and self._postgres is None

    def _begin(self, conn: sqlite3.Connection, write: bool) -> None:
        """Start a transaction; a write retries a busy file with backoff before giving up."""
        pause = RETRY_BACKOFF_S
        for attempt in range(WRITE_RETRIES + 1 if write else 1):
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                return
            except sqlite3.OperationalError as e:
                busy = "locked" in str(e) or "busy" in str(e)
                if not (write and busy):
                    raise LedgerError(f"cannot start a transaction on {self.path}: {e}") from e
                if attempt == WRITE_RETRIES:
                    raise LedgerLockedError(
                        f"the ledger {self.path} stayed locked by another process through "
                        f"{WRITE_RETRIES + 1} attempts ({BUSY_TIMEOUT_S:g} s each); find the "
                        "process holding it (a long export, a stuck writer) and retry"
                    ) from e
                time.sleep(pause)
                pause *= 2
            except sqlite3.Error as e:
                raise LedgerError(f"cannot start a transaction on {self.path}: {e}") from e
