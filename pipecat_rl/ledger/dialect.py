"""How a PostgreSQL ledger differs from the SQLite one, all in this module.

The parts write every statement once, in SQLite's dialect, and the migrations are the same list
for both. On PostgreSQL (`Ledger("postgresql://...")`, for many bot processes on many machines)
each statement is translated once (`postgres_sql`, cached), and the few SQLite built-ins the
queries call are defined in the database under their SQLite names (`COMPAT_FUNCTIONS`), so the
eligibility query and the held-out exclusion run inside Postgres exactly as they read. What
differs:

- placeholders: `?` becomes `%s` (a literal `%` is doubled);
- JSON: `json_each`, `json_array_length` and `julianday('now')` are SQL functions of the same
  name; `json_extract`, whose SQLite result takes the type of the value stored, becomes a typed
  extraction by the type declared for its path (`JSON_PATHS`; an undeclared path is an error
  that says where to declare it);
- the scalar `MAX(excluded.x, t.x)` of an upsert is `GREATEST`, and the empty list `IN ()`
  (no trusted sources) an empty subquery;
- types: SQLite's INTEGER is 64-bit (BIGINT), REAL is DOUBLE PRECISION, an AUTOINCREMENT key is
  an identity column, and every other table gets an identity `rowid` column standing in for
  SQLite's implicit rowid (the queries order by it); flags stay integer columns, so a bool
  parameter is sent as 0/1;
- the schema version: `PRAGMA user_version` is the one row of `pipecat_rl_schema`;
- locking: a SQLite file has one writer at a time (BEGIN IMMEDIATE), and the parts' read-modify-
  write transactions rely on it; on Postgres every write transaction takes one advisory lock
  first, so writes serialise in the same way across every process and machine, while reads run
  beside them on a snapshot (REPEATABLE READ); a write waits for the lock `LOCK_TIMEOUT_S` at
  most, then fails as a SQLite write does after its retries (`LedgerLockedError`);
- errors: a constraint violation is raised as `sqlite3.IntegrityError` (what the parts catch,
  with SQLite's wording), any other driver error as `LedgerError`.

psycopg 3 and its pool are the optional extra `pipecat-rl[postgres]`; nothing here imports them
until a Postgres URL is opened.
"""

import functools
import importlib.util
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pipecat_rl.errors import LedgerError, LedgerLockedError
from pipecat_rl.ledger.schema import Migration

POSTGRES_SCHEMES = ("postgresql", "postgres")
"""URL schemes that name a PostgreSQL ledger."""

POSTGRES_EXTRA = "pip install 'pipecat-rl[postgres]'"
"""What installs the driver a Postgres ledger needs."""

WRITE_LOCK = 0x7069_7065_6361_74  # "pipecat"
"""The advisory lock every write transaction holds: one writer at a time, as in a SQLite file."""

LOCK_TIMEOUT_S = 20
"""How long a write waits for the write lock before failing, as long as a SQLite write retries."""

CONNECT_TIMEOUT_S = 10
"""How long opening a Postgres ledger waits for the server."""

POOL_SIZE = 4
"""Connections one process keeps to a Postgres ledger (reads run beside the one writer)."""

JSON_PATHS: dict[str, str] = {
    "$.verdict.source": "text",
    "$.recorded_from": "text",
    "$.writer.host": "text",
    "$.writer.pid": "integer",
    "$.writer.started": "integer",
    "$.completion_tokens": "number",
    "$.top_p": "number",
    "$.extra_body.top_p": "number",
    "$.top_k": "number",
    "$.extra_body.top_k": "number",
}
"""The type of each JSON path the ledger's SQL extracts: Postgres needs one type per expression.

A value of another type reads as NULL (SQLite would return it as it is stored)."""

COMPAT_FUNCTIONS = (
    # SQLite's json_each(array) as the queries use it: one row per element, in `value`.
    """
    CREATE OR REPLACE FUNCTION json_each(doc text) RETURNS TABLE (value text)
    LANGUAGE sql IMMUTABLE AS $$ SELECT jsonb_array_elements_text(doc::jsonb) $$
    """,
    """
    CREATE OR REPLACE FUNCTION json_array_length(doc text) RETURNS bigint
    LANGUAGE sql IMMUTABLE AS $$ SELECT jsonb_array_length(doc::jsonb)::bigint $$
    """,
    # julianday('now'): the statement's time as a Julian day, as SQLite reads it.
    """
    CREATE OR REPLACE FUNCTION julianday(what text) RETURNS double precision
    LANGUAGE sql STABLE AS $$
        SELECT CASE WHEN what = 'now' THEN
            extract(epoch FROM statement_timestamp())::double precision / 86400.0 + 2440587.5
        END
    $$
    """,
    """
    CREATE OR REPLACE FUNCTION pipecat_rl_json_number(doc text, path text[])
    RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
        SELECT CASE WHEN jsonb_typeof(doc::jsonb #> path) = 'number'
            THEN (doc::jsonb #>> path)::double precision END
    $$
    """,
    """
    CREATE OR REPLACE FUNCTION pipecat_rl_json_integer(doc text, path text[])
    RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
        SELECT CASE WHEN jsonb_typeof(doc::jsonb #> path) = 'number'
            THEN (doc::jsonb #>> path)::numeric::bigint END
    $$
    """,
)
"""SQLite built-ins the ledger's SQL calls, defined in a Postgres ledger when it is migrated."""

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")  # two letters at least: not C:/
_JSON_EXTRACT = re.compile(r"json_extract\(\s*([\w.]+)\s*,\s*'(\$[\w.]*)'\s*\)")
_AUTOINCREMENT = re.compile(r"\bINTEGER PRIMARY KEY AUTOINCREMENT\b", re.IGNORECASE)
_CREATE_TABLE = re.compile(r"^\s*CREATE TABLE (\w+) \(", re.IGNORECASE)


def is_url(value: str | Path) -> bool:
    """Whether a --ledger value names a server (`scheme://...`) rather than a file."""
    return _URL.match(str(value)) is not None


def ledger_target(value: str | Path) -> Path | str:
    """A --ledger value as a SQLite file path, or a Postgres URL the driver can open.

    A URL of another scheme, or a Postgres URL without the driver installed, is a LedgerError
    that says what to pass or install, rather than a file under ./postgresql:/.
    """
    text = str(value)
    match = _URL.match(text)
    if match is None:
        return Path(text).expanduser()
    scheme = match.group(1).lower()
    if scheme not in POSTGRES_SCHEMES or not text.startswith(f"{match.group(1)}://"):
        raise LedgerError(
            f"the ledger {redact(text)!r} is not a file path or a postgresql:// URL; pass a "
            "SQLite file (e.g. ./pipecat-rl.db) or postgresql://user@host:5432/dbname"
        )
    missing = [m for m in ("psycopg", "psycopg_pool") if importlib.util.find_spec(m) is None]
    if missing:
        raise LedgerError(
            f"the ledger {redact(text)} is a PostgreSQL URL, and {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {POSTGRES_EXTRA}"
        )
    return text


def redact(url: str) -> str:
    """A URL fit for logs and messages: its password replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _json_extract(match: re.Match[str]) -> str:
    column, path = match.group(1), match.group(2)
    kind = JSON_PATHS.get(path)
    if kind is None:
        raise LedgerError(
            f"the ledger's SQL extracts the JSON path {path!r}, whose type Postgres needs: "
            "declare it in pipecat_rl.ledger.dialect.JSON_PATHS"
        )
    keys = "{" + ",".join(path[2:].split(".")) + "}" if path != "$" else "{}"
    if kind == "text":
        return f"({column}::jsonb #>> '{keys}')"
    return f"pipecat_rl_json_{kind}({column}, '{keys}')"


def _ddl(sql: str) -> str:
    if _AUTOINCREMENT.search(sql):
        sql = _AUTOINCREMENT.sub("BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY", sql)
    elif _CREATE_TABLE.match(sql):
        sql = _CREATE_TABLE.sub(
            lambda m: f"{m.group(0)}\n rowid BIGINT GENERATED ALWAYS AS IDENTITY,", sql, count=1
        )
    sql = re.sub(r"\bINTEGER\b", "BIGINT", sql)
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)


@functools.lru_cache(maxsize=1024)
def postgres_sql(sql: str) -> str:
    """One statement of the ledger's SQLite SQL as Postgres runs it (see the module docstring)."""
    if re.match(r"^\s*(CREATE|ALTER) TABLE\b", sql, re.IGNORECASE):
        sql = _ddl(sql)
    sql = _JSON_EXTRACT.sub(_json_extract, sql)
    sql = re.sub(r"\bMAX\(excluded\.", "GREATEST(excluded.", sql, flags=re.IGNORECASE)
    sql = sql.replace(" IN ()", " IN (SELECT NULL::text WHERE FALSE)")
    return sql.replace("%", "%%").replace("?", "%s")


def _param(value: Any) -> Any:
    return int(value) if isinstance(value, bool) else value


class PostgresCursor:
    """The part of sqlite3's cursor the parts use, over a psycopg cursor."""

    def __init__(self, cursor: Any, lastrowid: int | None):
        self._cursor = cursor
        self.lastrowid = lastrowid
        self.rowcount: int = cursor.rowcount

    def fetchone(self) -> Any:
        """The next row, or None."""
        return self._cursor.fetchone() if self._cursor.description else None

    def fetchall(self) -> list[Any]:
        """Every remaining row."""
        return self._cursor.fetchall() if self._cursor.description else []

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())


class PostgresConnection:
    """One Postgres transaction, speaking the part of sqlite3's connection the parts use."""

    def __init__(self, raw: Any, identity_tables: frozenset[str]):
        self._raw = raw
        self._identity = identity_tables
        self.total_changes = 0
        """Rows inserted, updated or deleted so far (sqlite3's `total_changes`)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> PostgresCursor:
        """Run one statement of the ledger's SQL, translated; see the module docstring."""
        import psycopg

        statement = postgres_sql(sql)
        table = re.match(r"^\s*INSERT INTO (\w+)", sql, re.IGNORECASE)
        returning = table is not None and table.group(1) in self._identity
        if returning:
            statement += " RETURNING id"
        cursor = self._raw.cursor()
        try:
            cursor.execute(statement, tuple(_param(p) for p in params))
        except psycopg.errors.IntegrityError as e:
            kind = (
                "FOREIGN KEY"
                if isinstance(e, psycopg.errors.ForeignKeyViolation)
                else ("UNIQUE" if isinstance(e, psycopg.errors.UniqueViolation) else "CHECK")
            )
            raise sqlite3.IntegrityError(
                f"{kind} constraint failed: {e.diag.message_primary}"
            ) from e
        lastrowid = None
        if returning:
            row = cursor.fetchone()
            lastrowid = None if row is None else int(row[0])
        if cursor.rowcount > 0 and not re.match(r"^\s*SELECT\b", sql, re.IGNORECASE):
            self.total_changes += cursor.rowcount
        return PostgresCursor(cursor, lastrowid)


class PostgresStore:
    """A Postgres ledger's connections: a pool, its transactions and the schema's migrations."""

    def __init__(self, url: str, migrations: Sequence[Migration], newer: Callable[..., Exception]):
        import psycopg
        from psycopg_pool import ConnectionPool

        self.name = redact(url)
        try:
            with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S) as conn:
                self._migrate(conn, migrations, newer)
                self._identity = frozenset(
                    r[0]
                    for r in conn.execute(
                        "SELECT table_name FROM information_schema.columns WHERE "
                        "table_schema = current_schema() AND column_name = 'id' "
                        "AND is_identity = 'YES'"
                    )
                )
        except psycopg.Error as e:
            raise LedgerError(
                f"cannot open the Postgres ledger {self.name}: {e}; check the URL, that the "
                "server runs and that the user may create tables in the database"
            ) from e
        self._pinned = threading.local()
        self._pool: Any = ConnectionPool(
            url, min_size=1, max_size=POOL_SIZE, open=False,
            kwargs={"connect_timeout": CONNECT_TIMEOUT_S}, name=f"pipecat-rl {self.name}",
        )  # fmt: skip
        try:
            self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
        except psycopg.Error as e:
            raise LedgerError(f"cannot connect to the Postgres ledger {self.name}: {e}") from e

    def close(self) -> None:
        """Close every connection of the pool."""
        self._pool.close()

    def _migrate(self, conn: Any, migrations: Sequence[Migration], newer: Callable) -> None:
        target = len(migrations)
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
            conn.execute("CREATE TABLE IF NOT EXISTS pipecat_rl_schema (version BIGINT NOT NULL)")
            row = conn.execute("SELECT version FROM pipecat_rl_schema").fetchone()
            version = 0 if row is None else int(row[0])
            if version > target:
                raise newer(version, target)
            if version == target:
                return
            for statement in COMPAT_FUNCTIONS:  # by the role that owns the schema
                conn.execute(statement)
            if version == 0:
                (tables,) = conn.execute(
                    "SELECT count(*) FROM information_schema.tables WHERE "
                    "table_schema = current_schema() AND table_name != 'pipecat_rl_schema'"
                ).fetchone()
                if tables:
                    raise LedgerError(
                        f"the database {self.name} has tables and no pipecat-rl schema version, "
                        "so it is not a pipecat-rl ledger; name an empty database (or schema)"
                    )
            wrapped = PostgresConnection(conn, frozenset())
            for number in range(version + 1, target + 1):
                migration = migrations[number - 1]
                try:
                    migration.apply(wrapped)
                except Exception as e:
                    raise LedgerError(
                        f"migrating the ledger {self.name} to schema version {number} "
                        f"({migration.description}) failed: {e}; the database was left unchanged "
                        f"at version {version}. Report this with its schema version"
                    ) from e
            conn.execute("DELETE FROM pipecat_rl_schema")
            conn.execute("INSERT INTO pipecat_rl_schema (version) VALUES (%s)", (target,))

    @contextmanager
    def consistent_reads(self) -> Iterator[None]:
        """Inside the block, every read of this thread sees the database at one point in time.

        The reads share one REPEATABLE READ, READ ONLY transaction, so a copy made of many reads
        (a cycle's snapshot) is one consistent state while other processes go on writing; writes
        inside the block run in their own transactions, which these reads do not see.
        """
        import psycopg

        try:
            with self._pool.connection(timeout=CONNECT_TIMEOUT_S) as raw, raw.transaction():
                raw.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                self._pinned.conn = PostgresConnection(raw, self._identity)
                try:
                    yield
                finally:
                    self._pinned.conn = None
        except psycopg.Error as e:
            raise LedgerError(f"ledger {self.name}: {e}") from e

    @contextmanager
    def transaction(self, *, write: bool) -> Iterator[PostgresConnection]:
        """One transaction on a pooled connection; a write first takes the ledger's write lock.

        A read inside `consistent_reads` runs in that block's transaction instead.
        """
        import psycopg

        pinned = None if write else getattr(self._pinned, "conn", None)
        if pinned is not None:
            yield pinned
            return
        try:
            with self._pool.connection(timeout=CONNECT_TIMEOUT_S) as raw, raw.transaction():
                if write:
                    raw.execute(  # one round trip: this transaction's lock wait, then the lock
                        "SELECT set_config('lock_timeout', %s, true), pg_advisory_xact_lock(%s)",
                        (f"{LOCK_TIMEOUT_S}s", WRITE_LOCK),
                    )
                else:
                    raw.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                yield PostgresConnection(raw, self._identity)
        except psycopg.errors.LockNotAvailable as e:
            raise LedgerLockedError(
                f"the ledger {self.name} stayed locked by another writer for {LOCK_TIMEOUT_S} s; "
                "find the process holding it (pg_stat_activity: a stuck writer) and retry"
            ) from e
        except psycopg.Error as e:
            raise LedgerError(f"ledger {self.name}: {e}") from e
