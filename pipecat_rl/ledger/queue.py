"""The ledger's queue part: the side service's jobs and the events each emitted.

The records (`JobRecord`, `JobEventRecord`) and the states live in `ledger.jobs`; this part is the
queue's behaviour on them. Claiming a job is one transaction, so two workers on one ledger never
run the same job.
"""

import json
import sqlite3
import time
from typing import Any

from pipecat_rl.errors import LedgerError, NotInLedgerError
from pipecat_rl.ledger.core import LedgerCore
from pipecat_rl.ledger.jobs import (
    JOB_COLUMNS,
    TERMINAL_STATES,
    JobEventRecord,
    JobRecord,
    job_from_row,
)
from pipecat_rl.ledger.tables import dumps


class JobQueue(LedgerCore):
    """The service's job queue."""

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

    def cancel_queued_job(self, job_id: str) -> bool:
        """Cancel a job that is still queued; False when it is not queued (any more).

        One transaction with the state check, so a job a worker claims at the same moment is
        either cancelled before it runs or running, never both.
        """
        with self._write() as conn:
            self._get_job(conn, job_id)  # NotInLedgerError for an unknown id
            changed = conn.execute(
                "UPDATE jobs SET state = 'cancelled', ended_at = ? WHERE id = ? "
                "AND state = 'queued'",
                (time.time(), job_id),
            ).rowcount
        return changed == 1

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
