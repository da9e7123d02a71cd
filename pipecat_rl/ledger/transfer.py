"""Copying one ledger into another: `ledger migrate`, and the cycle's snapshot into a SQLite file.

`pipecat-rl ledger migrate` copies a SQLite file into Postgres; `snapshot_ledger` copies any
ledger, as it stands, into a SQLite file. The copy (`copy_ledger`) is idempotent, so an
interrupted copy is run again: a session is copied with all its records in one transaction and
skipped whole when the destination holds it with the same content. One the destination holds
with other content (the same id, other turns or scores) is a conflict: by default the copy stops
before copying anything and names it; `on_conflict="skip"` keeps the destination's and says so.
A ledger is never copied into itself, under any spelling of its path (`is_ledger_file`).
Adapters, held-out hashes, receipts, jobs and job events are keyed and skipped when present; a
live-pointer move by its adapter and time; duels by id and their votes by (duel, rater), except
those of a session skipped as a conflict (the destination's call is another call). Rows take
the destination's own ids, so a destination other processes already write to keeps its rows.
Then every table is counted by its rows' keys: each source row must be in the destination, or
the copy is an error that names the table.
"""

import os
import sqlite3
from collections import Counter
from contextlib import closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipecat_rl.errors import ConfigError, LedgerError
from pipecat_rl.ledger.duels import DUEL_COLUMNS, VOTE_COLUMNS
from pipecat_rl.ledger.jobs import JOB_COLUMNS
from pipecat_rl.ledger.store import Ledger
from pipecat_rl.ledger.tables import (
    ADAPTERS,
    GATE_RECEIPT_COLUMNS,
    INSERT_HELDOUT_HASH,
    INSERT_LIVE,
    INSERT_TOOL_CALL,
    LIVE,
    TOOL_CALLS,
)

KEYS: dict[str, str] = {
    "sessions": "id",
    "turns": "session_id, turn_index",
    "tool_calls": "session_id, name, started_at",
    "latencies": "session_id, user_turn",
    "scores": "session_id, name, source",
    "adapters": "name",
    "live_pointer": "adapter, moved_at",
    "heldout_hashes": "scenario_hash",
    "gate_receipts": "receipt_sha256",
    "jobs": "id",
    "job_events": "job_id, seq",
    "duels": "id",
    "duel_votes": "duel_id, rater",
}
"""What identifies a row of each table when two ledgers are compared (ids differ between them)."""

_EVENT_COLUMNS = "job_id, seq, at, event, data"

SIDE_FILES = ("-wal", "-shm", "-journal")
"""What SQLite keeps beside a ledger file: writing over one of them corrupts the ledger."""

OnConflict = Literal["skip", "fail"]
"""What `copy_ledger` does with a session the destination holds with other content."""

_NAMED = 10
"""How many conflicting ids a message names before it says how many more."""


@dataclass
class TableCopy:
    """One table's rows: in the source, copied now, and already in the destination."""

    source: int = 0
    copied: int = 0
    present: int = 0


@dataclass
class LedgerCopy:
    """What `copy_ledger` did: per table, its rows; and the sessions it skipped as conflicts."""

    tables: dict[str, dict[str, int]]
    """Per table: `source`, `copied`, `present` (a skipped conflict counts as present)."""
    conflicts: list[str] = field(default_factory=list)
    """Ids the destination holds with other content, skipped (`on_conflict="skip"`)."""


def ledger_files(ledger: Path) -> tuple[Path, ...]:
    """The files of the SQLite ledger `ledger`: itself, then its side files (`SIDE_FILES`)."""
    return (ledger, *(ledger.with_name(ledger.name + end) for end in SIDE_FILES))


def is_ledger_file(path: Path | str, ledger: Path | str) -> bool:
    """Whether `path` is the ledger `ledger` or one of its side files, however it is spelled.

    Paths are compared as files, not strings: the same inode (`os.path.samefile`: a hard link,
    a symlink, `./x.db`, another case on a case-insensitive disk) or the same real path (a side
    file SQLite has not made yet). Postgres URLs (str) are compared as written.
    """
    if not isinstance(path, Path) or not isinstance(ledger, Path):
        return str(path) == str(ledger)
    real = os.path.realpath(path)
    for file in ledger_files(ledger):
        if real == os.path.realpath(file):
            return True
        try:
            if os.path.samefile(path, file):
                return True
        except OSError:  # one of them is not there (yet)
            continue
    return False


def conflicting_sessions(source: Ledger, dest: Ledger) -> list[str]:
    """Ids of `source`'s sessions that `dest` holds with other content, oldest first.

    Content is the session with its turns, tool calls, latencies and scores
    (`session_bundle`), so a session copied before and unchanged since is no conflict.
    """
    held = {r[0] for r in dest.rows("SELECT id FROM sessions")}
    ids = [r[0] for r in source.rows("SELECT id FROM sessions ORDER BY started_at, rowid")]
    return [
        sid for sid in ids if sid in held and source.session_bundle(sid) != dest.session_bundle(sid)
    ]


def _conflict_message(source: Ledger, dest: Ledger, ids: list[str]) -> str:
    named = ", ".join(ids[:_NAMED]) + (
        f" and {len(ids) - _NAMED} more" if len(ids) > _NAMED else ""
    )
    return (
        f"{len(ids)} session(s) of {source.path} are in {dest.path} with other content: {named}; "
        "nothing was copied. Pass --on-conflict skip to keep the destination's and copy the "
        "rest, or compare them first (`pipecat-rl ledger show ID --ledger ...` on each side)"
    )


def _insert_new(dest: Ledger, table: str, columns: str, rows: list[Any], key: str) -> TableCopy:
    """Insert `rows`, skipping those whose `key` the destination holds (one transaction)."""
    marks = ", ".join("?" for _ in columns.split(","))
    sql = f"INSERT INTO {table} ({columns}) VALUES ({marks}) ON CONFLICT ({key}) DO NOTHING"
    out = TableCopy(source=len(rows))
    with dest._write() as conn:
        for row in rows:
            out.copied += conn.execute(sql, tuple(row)).rowcount
    out.present = out.source - out.copied
    return out


def _copy_sessions(source: Ledger, dest: Ledger, report: dict[str, TableCopy]) -> None:
    ids = [r[0] for r in source.rows("SELECT id FROM sessions ORDER BY started_at, rowid")]
    for sid in ids:
        records = {
            "turns": source.turns(sid),
            "tool_calls": source.tool_calls(sid),
            "latencies": source.latencies(sid),
            "scores": source.scores(sid),
        }
        session = source.session(sid)
        with dest._write() as conn:
            there = conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone()
            if there is None:
                dest._insert_session(conn, session)
                for call in records["tool_calls"]:  # as stored: no merging by call id
                    conn.execute(INSERT_TOOL_CALL, TOOL_CALLS.params(call))
                dest._put_children(
                    conn, sid, records["turns"], (), records["latencies"], records["scores"]
                )
        field = "present" if there is not None else "copied"
        for table, n in (("sessions", 1), *((t, len(r)) for t, r in records.items())):
            report[table].source += n
            setattr(report[table], field, getattr(report[table], field) + n)


def _copy_live_pointer(source: Ledger, dest: Ledger) -> TableCopy:
    moves = source.live_history()
    out = TableCopy(source=len(moves))
    with dest._write() as conn:
        for move in moves:
            there = conn.execute(
                "SELECT 1 FROM live_pointer WHERE adapter = ? AND moved_at = ?",
                (move.adapter, move.moved_at),
            ).fetchone()
            if there is None:
                conn.execute(INSERT_LIVE, LIVE.params(move))
                out.copied += 1
    out.present = out.source - out.copied
    return out


def _duels_of(source: Ledger, sessions: set[str]) -> set[str]:
    """The ids of `source`'s duels at moments of `sessions`."""
    return {r[0] for r in source.rows("SELECT id, session_id FROM duels") if r[1] in sessions}


def _copy_duels(source: Ledger, dest: Ledger, left_out: set[str]) -> tuple[TableCopy, TableCopy]:
    """Duels and their votes, but none of the duels `left_out` (a conflicting call's)."""
    duels = source.rows(f"SELECT {DUEL_COLUMNS} FROM duels ORDER BY created_at, id")
    votes = source.rows(f"SELECT {VOTE_COLUMNS} FROM duel_votes ORDER BY voted_at, duel_id, rater")
    return (  # a duel's id, and a vote's duel id, come first
        _insert_new(dest, "duels", DUEL_COLUMNS, [r for r in duels if r[0] not in left_out], "id"),
        _insert_new(
            dest, "duel_votes", VOTE_COLUMNS, [r for r in votes if r[0] not in left_out],
            "duel_id, rater",
        ),
    )  # fmt: skip


def _verify(source: Ledger, dest: Ledger, skipped: set[str], left_out: set[str]) -> None:
    for table, key in KEYS.items():
        of_session = table == "sessions" or key.startswith("session_id")
        of_duel = table in ("duels", "duel_votes")
        wanted = Counter(
            tuple(r)
            for r in source.rows(f"SELECT {key} FROM {table}")
            if not (of_session and r[0] in skipped)  # a conflict kept the destination's rows
            and not (of_duel and r[0] in left_out)  # and the duels of its own call
        )
        held = Counter(tuple(r) for r in dest.rows(f"SELECT {key} FROM {table}"))
        missing = wanted - held
        if missing:
            raise LedgerError(
                f"copying {source.path} into {dest.path}: {sum(missing.values())} of "
                f"{sum(wanted.values())} rows of {table} are not in the destination (e.g. "
                f"{next(iter(missing))}); nothing was removed, so run the copy again, and "
                "report it if they stay missing"
            )


def copy_ledger(source: Ledger, dest: Ledger, on_conflict: OnConflict = "fail") -> LedgerCopy:
    """Copy every row of `source` that `dest` lacks; per table: source, copied, present.

    A session `dest` holds with other content (`conflicting_sessions`) stops the copy before
    anything is copied (`on_conflict="fail"`), or is left as `dest` has it and named in the
    result (`"skip"`): never overwritten, never skipped silently.

    Raises:
        LedgerError: `source` and `dest` are one ledger, or after the copy a source row is not in
            the destination.
        ConfigError: a conflict, with `on_conflict="fail"` (the message names the ids).
    """
    if is_ledger_file(dest.path, source.path) or is_ledger_file(source.path, dest.path):
        raise LedgerError(
            f"the source {source.path} and the destination {dest.path} are the same ledger; "
            "name another destination"
        )
    if on_conflict not in ("skip", "fail"):
        raise ConfigError(f"on_conflict must be skip or fail, not {on_conflict!r}")
    conflicts = conflicting_sessions(source, dest)
    if conflicts and on_conflict == "fail":
        raise ConfigError(_conflict_message(source, dest, conflicts))
    report = {table: TableCopy() for table in KEYS}
    _copy_sessions(source, dest, report)
    adapters = source.rows(f"SELECT {ADAPTERS.select()} FROM adapters ORDER BY created_at, name")
    report["adapters"] = _insert_new(dest, "adapters", ADAPTERS.select(), adapters, "name")
    report["live_pointer"] = _copy_live_pointer(source, dest)
    hashes = [
        (h, v["scenario_id"], v["heldout_set_id"], v["first_seen_at"])
        for h, v in source.heldout_hashes().items()
    ]
    with dest._write() as conn:
        copied = sum(conn.execute(INSERT_HELDOUT_HASH, row).rowcount for row in hashes)
    report["heldout_hashes"] = TableCopy(len(hashes), copied, len(hashes) - copied)
    receipts = ", ".join(GATE_RECEIPT_COLUMNS)
    report["gate_receipts"] = _insert_new(
        dest, "gate_receipts", receipts,
        source.rows(f"SELECT {receipts} FROM gate_receipts ORDER BY created_at"),
        "receipt_sha256",
    )  # fmt: skip
    jobs = source.rows(f"SELECT {JOB_COLUMNS} FROM jobs ORDER BY submitted_at, rowid")
    report["jobs"] = _insert_new(dest, "jobs", JOB_COLUMNS, jobs, "id")
    events = source.rows(f"SELECT {_EVENT_COLUMNS} FROM job_events ORDER BY job_id, seq")
    report["job_events"] = _insert_new(dest, "job_events", _EVENT_COLUMNS, events, "job_id, seq")
    left_out = _duels_of(source, set(conflicts))
    report["duels"], report["duel_votes"] = _copy_duels(source, dest, left_out)
    _verify(source, dest, set(conflicts), left_out)
    return LedgerCopy({table: asdict(counts) for table, counts in report.items()}, conflicts)


def snapshot_ledger(ledger: Ledger, dest: Path) -> dict[str, int]:
    """`ledger` as it stands, copied into the SQLite file `dest` (replaced); its rows per table.

    A SQLite ledger is copied page by page (sqlite3's backup API: one consistent state, with
    writers going on). A Postgres ledger, which bots on other machines keep writing, is read in
    one transaction (`consistent_reads`) and copied with `copy_ledger`, so the file and the
    counts are the same point in time; the copy is an ordinary SQLite ledger any verb reads.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in (dest, *(dest.with_name(dest.name + end) for end in ("-wal", "-shm"))):
        stale.unlink(missing_ok=True)  # a copy left by an interrupted snapshot
    postgres = ledger._postgres
    if postgres is None:
        with closing(sqlite3.connect(ledger.path)) as src, closing(sqlite3.connect(dest)) as dst:
            src.backup(dst)
        return ledger.stats()["counts"]
    with postgres.consistent_reads(), Ledger(dest) as copy:
        copy_ledger(ledger, copy)
        return ledger.stats()["counts"]
