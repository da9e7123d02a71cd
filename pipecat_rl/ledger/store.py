"""The ledger store: one SQLite file in WAL mode that every part of the loop reads and writes.

A bot process writes from the recorder's background thread while the CLI, the trainer or the gate
read from other processes; WAL lets readers and the one writer proceed together. Every write is one
transaction, so a crash loses at most the write in flight.
"""

import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, TextIO

from loguru import logger
from pydantic import ValidationError

from pipecat_rl.errors import LedgerError, LedgerLockedError, NotInLedgerError
from pipecat_rl.ledger import schema as _schema
from pipecat_rl.ledger.eligibility import Purpose, unfinished_simulation
from pipecat_rl.ledger.jobs import (
    JOB_COLUMNS,
    TERMINAL_STATES,
    JobEventRecord,
    JobRecord,
    job_from_row,
)
from pipecat_rl.ledger.records import (
    BASE_ADAPTER,
    AdapterRecord,
    LatencyRecord,
    LivePointer,
    ScoreRecord,
    SessionRecord,
    ToolCallRecord,
    TurnRecord,
)
from pipecat_rl.ledger.tables import (
    ADAPTERS,
    ELIGIBLE_SESSION,
    GATE_RECEIPT_COLUMNS,
    INSERT_ADAPTER,
    INSERT_GATE_RECEIPT,
    INSERT_HELDOUT_HASH,
    INSERT_LIVE,
    INSERT_SESSION,
    INSERT_TOOL_CALL,
    LATENCIES,
    LIVE,
    PUT_LATENCY,
    PUT_SCORE,
    SAMPLED_TURN,
    SCORES,
    SELECT_ADAPTER,
    SELECT_ADAPTERS,
    SELECT_GATE_RECEIPT,
    SELECT_HELDOUT_HASHES,
    SELECT_LATENCIES,
    SELECT_LATENCIES_FOR,
    SELECT_LIVE,
    SELECT_LIVE_HISTORY,
    SELECT_SCORES,
    SELECT_SESSION,
    SELECT_TOOL_CALL_BY_CALL_ID,
    SELECT_TOOL_CALLS,
    SELECT_TURN,
    SELECT_TURNS,
    SESSIONS,
    TOKEN_EXACT_TURN,
    TOOL_CALLS,
    TURNS,
    UPDATE_SESSION,
    UPDATE_TOOL_CALL,
    UPSERT_TURN,
    Table,
    dumps,
    eligible_turn,
)

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


def resolve_ledger_path(explicit: str | Path | None = None) -> Path:
    """--ledger PATH, else $PIPECAT_RL_LEDGER, else ./pipecat-rl.db in the current directory.

    One rule for every verb and library entry point, so they all find the same file.
    """
    if explicit is not None and str(explicit) != "":
        return Path(explicit).expanduser()
    from_env = os.environ.get(LEDGER_ENV)
    if from_env:
        return Path(from_env).expanduser()
    return Path.cwd() / DEFAULT_LEDGER_NAME


class Ledger:
    """The SQLite ledger: sessions, turns, tool calls, latencies, scores, adapters, live pointer.

    Safe to share between threads (one connection behind a lock) and between processes (WAL with
    a busy timeout). Opening a file from an older pipecat-rl migrates it; opening one from a newer
    pipecat-rl is refused rather than guessed at.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
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
        self.reconcile_open_sessions()

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
                raise LedgerError(
                    f"{self.path} is not a SQLite file, so it cannot be a pipecat-rl ledger; "
                    "pass --ledger (or set PIPECAT_RL_LEDGER) to a ledger file or a new path"
                ) from e
            raise LedgerError(f"cannot open the ledger {self.path}: {e}") from e

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
        with self._lock:
            conn = self._conn
            if conn is None:
                raise LedgerError(f"the ledger {self.path} is closed; open it again to use it")
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

    # -- sessions ------------------------------------------------------------------------------

    def add_session(self, s: SessionRecord) -> None:
        """Insert a new session; a duplicate id is refused, since ids identify episodes."""
        with self._write() as conn:
            self._insert_session(conn, s)

    def _insert_session(self, conn: sqlite3.Connection, s: SessionRecord) -> None:
        try:
            conn.execute(INSERT_SESSION, SESSIONS.params(s))
        except sqlite3.IntegrityError as e:
            raise LedgerError(
                f"session {s.id!r} is already in the ledger {self.path}; session ids must be "
                "unique, so give this session a new id"
            ) from e

    def _get_session(self, conn: sqlite3.Connection, session_id: str) -> SessionRecord:
        row = conn.execute(SELECT_SESSION, (session_id,)).fetchone()
        if row is None:
            raise NotInLedgerError(
                f"no session {session_id!r} in the ledger {self.path}; "
                "`pipecat-rl ledger sessions` lists ids"
            )
        return SESSIONS.record(row)

    def _replace_session(
        self, conn: sqlite3.Connection, current: SessionRecord, changes: dict[str, Any]
    ) -> None:
        try:
            updated = SessionRecord.model_validate({**current.model_dump(), **changes})
        except ValidationError as e:
            raise LedgerError(f"invalid update to session {current.id!r}: {e}") from e
        conn.execute(UPDATE_SESSION, SESSIONS.params(updated))

    def end_session(
        self,
        session_id: str,
        *,
        ended_at: float,
        outcome: str | None = None,
        reward: float | None = None,
        reward_parts: dict[str, float] | None = None,
        failure_labels: list[str] | None = None,
        metadata_update: dict[str, Any] | None = None,
    ) -> None:
        """Record how a session ended; arguments left None keep their stored values.

        `metadata_update` is merged into the stored metadata rather than replacing it.
        """
        changes: dict[str, Any] = {"ended_at": ended_at}
        for name, value in (
            ("outcome", outcome),
            ("reward", reward),
            ("reward_parts", reward_parts),
            ("failure_labels", failure_labels),
        ):
            if value is not None:
                changes[name] = value
        with self._write() as conn:
            current = self._get_session(conn, session_id)
            if metadata_update:
                changes["metadata"] = {**current.metadata, **metadata_update}
            self._replace_session(conn, current, changes)

    def update_session(self, session_id: str, **fields: Any) -> None:
        """Change named fields of a session (consent, excluded_from_training, labels, ...)."""
        allowed = set(SessionRecord.model_fields) - {"id"}
        unknown = sorted(set(fields) - allowed)
        if unknown:
            raise LedgerError(
                f"cannot update session field(s) {', '.join(unknown)}; "
                f"updatable fields: {', '.join(sorted(allowed))}"
            )
        with self._write() as conn:
            self._replace_session(conn, self._get_session(conn, session_id), fields)

    def session(self, id: str) -> SessionRecord:
        """One session by id; NotInLedgerError (a LedgerError) if it is not there."""
        with self._read() as conn:
            return self._get_session(conn, id)

    def sessions(
        self,
        *,
        source: str | None = None,
        split: str | None = None,
        policy: str | None = None,
        scenario_id: str | None = None,
        since: float | None = None,
        limit: int | None = None,
    ) -> list[SessionRecord]:
        """Sessions matching every filter given, newest first."""
        where, params = [], []
        for column, value in (
            ("source", source),
            ("split", split),
            ("policy", policy),
            ("scenario_id", scenario_id),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if since is not None:
            where.append("started_at >= ?")
            params.append(since)
        sql = f"SELECT {SESSIONS.select()} FROM sessions"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY started_at DESC, rowid DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        with self._read() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [SESSIONS.record(r) for r in rows]

    # -- turns, tool calls, latencies, scores --------------------------------------------------

    def _child_error(self, e: sqlite3.IntegrityError, what: str, session_id: str) -> LedgerError:
        if "FOREIGN KEY" in str(e):
            return LedgerError(
                f"cannot add {what}: no session {session_id!r} in the ledger {self.path}; "
                "add the session (add_session) before its turns, calls, latencies and scores"
            )
        return LedgerError(f"cannot add {what} of session {session_id!r}: {e}")

    def add_turn(self, t: TurnRecord) -> None:
        """Insert a turn, or replace the turn with the same (session_id, index).

        Replacing lets the recorder complete a turn later (spoken text after TTS, an interruption).
        """
        with self._write() as conn:
            self._put_turn(conn, t)

    def _put_turn(self, conn: sqlite3.Connection, t: TurnRecord) -> None:
        try:
            conn.execute(UPSERT_TURN, TURNS.params(t))
        except sqlite3.IntegrityError as e:
            raise self._child_error(e, f"turn {t.index}", t.session_id) from e

    def update_turn(self, session_id: str, index: int, **fields: Any) -> None:
        """Change named fields of a stored turn (spoken_text, interrupted, timestamps, ...)."""
        allowed = set(TurnRecord.model_fields) - {"session_id", "index"}
        unknown = sorted(set(fields) - allowed)
        if unknown:
            raise LedgerError(
                f"cannot update turn field(s) {', '.join(unknown)}; "
                f"updatable fields: {', '.join(sorted(allowed))}"
            )
        with self._write() as conn:
            row = conn.execute(SELECT_TURN, (session_id, index)).fetchone()
            if row is None:
                raise NotInLedgerError(
                    f"no turn {index} of session {session_id!r} in the ledger {self.path}; "
                    "add it with add_turn first"
                )
            current: TurnRecord = TURNS.record(row)
            try:
                updated = TurnRecord.model_validate({**current.model_dump(), **fields})
            except ValidationError as e:
                raise LedgerError(f"invalid update to turn {index} of {session_id!r}: {e}") from e
            conn.execute(UPSERT_TURN, TURNS.params(updated))

    def add_tool_call(self, c: ToolCallRecord) -> int:
        """Add a tool call, or merge it into the row with the same call id; returns the row id.

        The recorder sees a call in the pipeline's frames and the simulator sees it executed
        against the world: both write it, and what one leaves empty the other fills.
        """
        with self._write() as conn:
            return self._insert_tool_call(conn, c)

    def _insert_tool_call(self, conn: sqlite3.Connection, c: ToolCallRecord) -> int:
        if c.call_id is not None:
            row = conn.execute(SELECT_TOOL_CALL_BY_CALL_ID, (c.session_id, c.call_id)).fetchone()
            if row is not None:
                stored = TOOL_CALLS.record(row[1:]).model_dump()
                given = c.model_dump(exclude_none=True)
                merged = ToolCallRecord.model_validate(
                    {**stored, **{k: v for k, v in given.items() if v != {}}}
                )
                conn.execute(UPDATE_TOOL_CALL, (*TOOL_CALLS.params(merged), row[0]))
                return int(row[0])
        try:
            cursor = conn.execute(INSERT_TOOL_CALL, TOOL_CALLS.params(c))
        except sqlite3.IntegrityError as e:
            raise self._child_error(e, f"tool call {c.name!r}", c.session_id) from e
        return int(cursor.lastrowid or 0)

    def put_latency(self, l: LatencyRecord) -> None:  # noqa: E741
        """Insert or merge the latency row of one user turn.

        Merging: a field the new record leaves None keeps its stored value, so the agent-side
        recorder and the caller-side simulator can each fill in what they measure.
        """
        with self._write() as conn:
            self._put_latency(conn, l)

    def _put_latency(self, conn: sqlite3.Connection, l: LatencyRecord) -> None:  # noqa: E741
        try:
            conn.execute(PUT_LATENCY, LATENCIES.params(l))
        except sqlite3.IntegrityError as e:
            raise self._child_error(e, f"latency of user turn {l.user_turn}", l.session_id) from e

    def add_score(self, s: ScoreRecord) -> None:
        """Record a named score of a session, replacing an earlier score of the same name."""
        with self._write() as conn:
            self._put_score(conn, s)

    def _put_score(self, conn: sqlite3.Connection, s: ScoreRecord) -> None:
        try:
            conn.execute(PUT_SCORE, SCORES.params(s))
        except sqlite3.IntegrityError as e:
            raise self._child_error(e, f"score {s.name!r}", s.session_id) from e

    def write_session(
        self,
        session: SessionRecord,
        turns: Iterable[TurnRecord] = (),
        tool_calls: Iterable[ToolCallRecord] = (),
        latencies: Iterable[LatencyRecord] = (),
        scores: Iterable[ScoreRecord] = (),
    ) -> None:
        """Write a whole session and everything in it in one transaction: all of it or none."""
        turns, tool_calls = list(turns), list(tool_calls)
        latencies, scores = list(latencies), list(scores)
        for record in (*turns, *tool_calls, *latencies, *scores):
            if record.session_id != session.id:
                raise LedgerError(
                    f"write_session({session.id!r}) was given a {type(record).__name__} of "
                    f"session {record.session_id!r}; every record must belong to the session"
                )
        with self._write() as conn:
            self._insert_session(conn, session)
            for t in turns:
                self._put_turn(conn, t)
            for c in tool_calls:
                self._insert_tool_call(conn, c)
            for lat in latencies:
                self._put_latency(conn, lat)
            for s in scores:
                self._put_score(conn, s)

    def _children(self, sql: str, table: Table, session_id: str) -> list[Any]:
        with self._read() as conn:
            rows = conn.execute(sql, (session_id,)).fetchall()
        return [table.record(r) for r in rows]

    def turns(self, session_id: str) -> list[TurnRecord]:
        """The turns of a session in index order (empty if none)."""
        return self._children(SELECT_TURNS, TURNS, session_id)

    def tool_calls(self, session_id: str) -> list[ToolCallRecord]:
        """The tool calls of a session in the order they were recorded."""
        return self._children(SELECT_TOOL_CALLS, TOOL_CALLS, session_id)

    def latencies(self, session_id: str) -> list[LatencyRecord]:
        """The latency rows of a session in user-turn order."""
        return self._children(SELECT_LATENCIES, LATENCIES, session_id)

    def scores(self, session_id: str) -> list[ScoreRecord]:
        """The scores of a session in the order they were first recorded."""
        return self._children(SELECT_SCORES, SCORES, session_id)

    def latencies_for(self, session_ids: Sequence[str]) -> dict[str, list[LatencyRecord]]:
        """Latency rows of many sessions in one query (the gate reads hundreds at once).

        Every id asked for is a key; a session without latency rows maps to an empty list.
        """
        ids = list(dict.fromkeys(session_ids))
        out: dict[str, list[LatencyRecord]] = {sid: [] for sid in ids}
        if not ids:
            return out
        with self._read() as conn:
            rows = conn.execute(SELECT_LATENCIES_FOR, (dumps(ids),)).fetchall()
        for row in rows:
            record: LatencyRecord = LATENCIES.record(row)
            out[record.session_id].append(record)
        return out

    def training_turns(
        self,
        *,
        policy: str | None = None,
        source: str | None = None,
        require_token_exact: bool = True,
        purpose: Purpose = "rl",
        session_ids: Sequence[str] | None = None,
    ) -> list[TurnRecord]:
        """Turns that may become training rows, oldest session first.

        Enforced in the query itself, by the one definition in `ledger.eligibility`: never a
        held-out session (by split, held-out set or any held-out scenario hash ever seen), a gate
        session, an excluded, non-consented, unfinished or harness-failed session; with
        `require_token_exact`, only turns sampled token-exactly without truncation (RL), or also
        demonstrations (`purpose="sft"`).
        """
        where = [ELIGIBLE_SESSION]
        params: list[Any] = []
        if require_token_exact:
            where.append(eligible_turn(purpose))
        if policy is not None:
            where.append("s.policy = ?")
            params.append(policy)
        if source is not None:
            where.append("s.source = ?")
            params.append(source)
        if session_ids is not None:
            where.append("s.id IN (SELECT value FROM json_each(?))")
            params.append(dumps(list(session_ids)))
        sql = (
            f"SELECT {TURNS.select('t')} FROM turns t JOIN sessions s ON s.id = t.session_id "
            f"WHERE {' AND '.join(where)} ORDER BY s.started_at, t.session_id, t.turn_index"
        )
        with self._read() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [TURNS.record(r) for r in rows]

    # -- adapters and the live pointer ---------------------------------------------------------

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

    def rollback_live(self, *, receipt: str | None = None) -> LivePointer:
        """Point live back at the adapter that served before the current one (a new history row)."""
        with self._write() as conn:
            row = conn.execute(SELECT_LIVE).fetchone()
            current: LivePointer | None = None if row is None else LIVE.record(row)
            if current is None or current.previous is None:
                raise LedgerError(
                    f"nothing to roll back to in {self.path}: "
                    + (
                        "nothing was ever promoted"
                        if current is None
                        else f"{current.adapter!r} has no adapter recorded before it"
                    )
                )
            return self._move(conn, current.previous, receipt, current.adapter)

    def live_history(self) -> list[LivePointer]:
        """Every move of the live pointer, oldest first."""
        with self._read() as conn:
            rows = conn.execute(SELECT_LIVE_HISTORY).fetchall()
        return [LIVE.record(r) for r in rows]

    # -- summaries and export ------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counts that show at a glance what the ledger holds and how much of it can train."""
        tables = (
            "sessions",
            "turns",
            "tool_calls",
            "latencies",
            "scores",
            "adapters",
            "live_pointer",
        )
        with self._read() as conn:
            counts = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}
            by_source = dict(
                conn.execute("SELECT source, count(*) FROM sessions GROUP BY source").fetchall()
            )
            by_split = {
                (split or "none"): n
                for split, n in conn.execute(
                    "SELECT split, count(*) FROM sessions GROUP BY split"
                ).fetchall()
            }
            (token_exact,) = conn.execute(
                f"SELECT count(*) FROM turns t WHERE {TOKEN_EXACT_TURN}"
            ).fetchone()
            (eligible,) = conn.execute(
                "SELECT count(*) FROM turns t JOIN sessions s ON s.id = t.session_id "
                f"WHERE {ELIGIBLE_SESSION} AND {SAMPLED_TURN}"
            ).fetchone()
            live_row = conn.execute(SELECT_LIVE).fetchone()
        return {
            "path": str(self.path),
            "schema_version": _schema.current_version(),
            "counts": counts,
            "sessions_by_source": by_source,
            "sessions_by_split": by_split,
            "token_exact_turns": token_exact,
            "training_eligible_turns": eligible,
            "live": None if live_row is None else LIVE.record(live_row).adapter,
        }

    def session_bundle(self, session_id: str) -> dict[str, Any]:
        """A session with its turns, tool calls, latencies and scores nested, as plain JSON data."""
        with self._read() as conn:
            session = self._get_session(conn, session_id)
            turns = [TURNS.record(r) for r in conn.execute(SELECT_TURNS, (session_id,))]
            calls = [TOOL_CALLS.record(r) for r in conn.execute(SELECT_TOOL_CALLS, (session_id,))]
            lats = [LATENCIES.record(r) for r in conn.execute(SELECT_LATENCIES, (session_id,))]
            scores = [SCORES.record(r) for r in conn.execute(SELECT_SCORES, (session_id,))]
        return {
            **session.model_dump(mode="json"),
            "turns": [t.model_dump(mode="json") for t in turns],
            "tool_calls": [c.model_dump(mode="json") for c in calls],
            "latencies": [x.model_dump(mode="json") for x in lats],
            "scores": [s.model_dump(mode="json") for s in scores],
        }

    def export_jsonl(self, out: TextIO, *, session_ids: Sequence[str] | None = None) -> int:
        """Write one JSON object per session (children nested), oldest first; returns the count.

        Each session is read in its own short transaction, so a long export never stalls the
        recorder's writes.
        """
        if session_ids is None:
            with self._read() as conn:
                ids = [
                    r[0] for r in conn.execute("SELECT id FROM sessions ORDER BY started_at, rowid")
                ]
        else:
            ids = list(session_ids)
            with self._read() as conn:
                found = {
                    r[0]
                    for r in conn.execute(
                        "SELECT id FROM sessions WHERE id IN (SELECT value FROM json_each(?))",
                        (dumps(ids),),
                    )
                }
            missing = [sid for sid in ids if sid not in found]
            if missing:
                raise NotInLedgerError(
                    f"no session(s) {', '.join(map(repr, missing))} in the ledger {self.path}; "
                    "`pipecat-rl ledger sessions` lists ids"
                )
        for sid in ids:
            out.write(dumps(self.session_bundle(sid)) + "\n")
        return len(ids)

    # -- the gate: held-out hashes and gate receipts (issue 8) ---------------------------------

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

    # -- the side service's job queue (issue 13: pipecat_rl.service) ---------------------------

    def add_job(self, kind: str, params: dict[str, Any], *, job_id: str) -> JobRecord:
        """Queue a job; it runs after every job queued before it."""
        now = time.time()
        with self._write() as conn:
            try:
                conn.execute(
                    "INSERT INTO jobs (id, kind, state, params, submitted_at) "
                    "VALUES (?, ?, 'queued', ?, ?)",
                    (job_id, kind, dumps(params), now),
                )
            except sqlite3.IntegrityError as e:
                raise LedgerError(f"a job {job_id!r} is already in {self.path}") from e
            return self._get_job(conn, job_id)

    def _get_job(self, conn: sqlite3.Connection, job_id: str) -> JobRecord:
        row = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise NotInLedgerError(f"no job {job_id!r} in the ledger {self.path}")
        return job_from_row(row)

    def job(self, job_id: str) -> JobRecord:
        """One job by id; NotInLedgerError if there is none."""
        with self._read() as conn:
            return self._get_job(conn, job_id)

    def jobs(self, *, state: str | None = None, limit: int = 100) -> list[JobRecord]:
        """Jobs in submission order (optionally of one state)."""
        sql, params = f"SELECT {JOB_COLUMNS} FROM jobs", []
        if state is not None:
            sql += " WHERE state = ?"
            params.append(state)
        sql += " ORDER BY submitted_at, rowid LIMIT ?"
        params.append(int(limit))
        with self._read() as conn:
            return [job_from_row(r) for r in conn.execute(sql, params).fetchall()]

    def claim_next_job(self) -> JobRecord | None:
        """Mark the oldest queued job running and return it (None when the queue is empty).

        One transaction, so two workers on one ledger can never claim the same job.
        """
        with self._write() as conn:
            row = conn.execute(
                "SELECT id FROM jobs WHERE state = 'queued' ORDER BY submitted_at, rowid LIMIT 1"
            ).fetchone()
            if row is None:
                return None
            conn.execute(
                "UPDATE jobs SET state = 'running', started_at = ?, attempts = attempts + 1 "
                "WHERE id = ?",
                (time.time(), row[0]),
            )
            return self._get_job(conn, row[0])

    def finish_job(
        self,
        job_id: str,
        state: str,
        *,
        result: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> JobRecord:
        """Record how a job ended (`done`, `failed`, `cancelled`), or requeue it (`queued`)."""
        if state not in (*TERMINAL_STATES, "queued"):
            raise LedgerError(f"a job cannot end in state {state!r}")
        ended = None if state == "queued" else time.time()
        with self._write() as conn:
            self._get_job(conn, job_id)
            conn.execute(
                "UPDATE jobs SET state = ?, result = ?, error = ?, ended_at = ? WHERE id = ?",
                (state, None if result is None else dumps(result), error, ended, job_id),
            )
            return self._get_job(conn, job_id)

    def add_job_event(self, job_id: str, event: str, data: dict[str, Any]) -> JobEventRecord:
        """Append one event to a job's stream."""
        with self._write() as conn:
            (last,) = conn.execute(
                "SELECT coalesce(max(seq), 0) FROM job_events WHERE job_id = ?", (job_id,)
            ).fetchone()
            record = JobEventRecord(
                job_id=job_id, seq=last + 1, at=time.time(), event=event, data=data
            )
            try:
                conn.execute(
                    "INSERT INTO job_events (job_id, seq, at, event, data) VALUES (?, ?, ?, ?, ?)",
                    (job_id, record.seq, record.at, event, dumps(data)),
                )
            except sqlite3.IntegrityError as e:
                raise NotInLedgerError(f"no job {job_id!r} in the ledger {self.path}") from e
            return record

    def job_events(self, job_id: str, *, after: int = 0) -> list[JobEventRecord]:
        """A job's events with a sequence number above `after`, in order."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT seq, at, event, data FROM job_events WHERE job_id = ? AND seq > ? "
                "ORDER BY seq",
                (job_id, after),
            ).fetchall()
        return [
            JobEventRecord(job_id=job_id, seq=s, at=a, event=e, data=json.loads(d))
            for s, a, e, d in rows
        ]

    def close_open_sessions(
        self, *, since: float, reason: str, sources: Sequence[str] = ("simulate", "gate")
    ) -> list[str]:
        """End every session of `sources` started since `since` that never ended, `interrupted`.

        A simulated session the recorder ended but the simulator never finished (the crash fell
        between the two writes) counts as never ended (`eligibility.unfinished_simulation`).

        A crash mid-simulation leaves such sessions (opening a ledger reconciles those whose
        writer is gone the same way); `interrupted` keeps them out of training and out of the
        gate, and the metadata says why. Live calls are never touched.
        """
        with self._write() as conn:
            ids = [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM sessions s WHERE started_at >= ? "
                    "AND source IN (SELECT value FROM json_each(?)) "
                    f"AND (ended_at IS NULL OR {unfinished_simulation('s')})",
                    (since, dumps(list(sources))),
                )
            ]
            now = time.time()
            for sid in ids:
                current = self._get_session(conn, sid)
                self._replace_session(
                    conn,
                    current,
                    {
                        "ended_at": now,
                        "outcome": "interrupted",
                        "metadata": {**current.metadata, "error": reason},
                    },
                )
        return ids

    # -- crash safety: write retries and reconciling sessions left open (issue 9) -------------

    @property
    def closed(self) -> bool:
        """Whether `close()` was called (a writer must not keep using a closed ledger)."""
        return self._conn is None

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

    def reconcile_open_sessions(self) -> list[str]:
        """Mark sessions left open by a process that is gone as `interrupted`; returns their ids.

        Open means never ended, or a simulated session whose result was never written
        (`eligibility.unfinished_simulation`).

        A session names its writer (pid, host, process start) in its metadata; one whose writer
        is on this host and no longer runs will never be ended by it. Sessions of live
        processes, of other hosts, or without a writer are left as they are. Best effort: a
        ledger that cannot be written now is reconciled by a later open.
        """
        host, now, closed = socket.gethostname(), time.time(), []
        try:
            with self._read() as conn:
                rows = conn.execute(
                    "SELECT id, metadata FROM sessions s WHERE (ended_at IS NULL AND "
                    f"outcome IS NULL) OR {unfinished_simulation('s')}"
                ).fetchall()
            for session_id, metadata in rows:
                writer = (json.loads(metadata) if metadata else {}).get("writer") or {}
                if writer.get("host") != host or not isinstance(writer.get("pid"), int):
                    continue
                started = process_started(writer["pid"])
                if started is not None and started == writer.get("started"):
                    continue  # its writer still runs
                self.end_session(
                    session_id,
                    ended_at=now,
                    outcome="interrupted",
                    metadata_update={"reconciled_at": now, "reconciled_by": os.getpid()},
                )
                closed.append(session_id)
        except (LedgerError, ValueError) as e:
            logger.warning(f"pipecat-rl: could not reconcile open sessions in {self.path}: {e}")
        if closed:
            logger.warning(
                f"pipecat-rl: {len(closed)} session(s) in {self.path} were left open by a process "
                "that is gone; marked interrupted (never trained on or paired)"
            )
        return closed


def process_started(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, Linux), or None if it is not running.

    With the pid, this names a process uniquely: a pid reused by another process differs here.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return 0
        return 0  # alive, start unknown (no /proc)
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])
