"""The side service's job queue as ledger records: a job, and the events it emitted.

A job is queued, then `running` while the service's one worker runs it, then `done`, `failed`
or `cancelled`. Its events (progress, stage boundaries, the result) are appended in order and
never change, so a reader can stream them from any sequence number. Records only: the queue that
stores them is `ledger.queue`, the handlers that run them `service.jobs`.
"""

import json
import sqlite3
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

JobState = Literal["queued", "running", "done", "failed", "cancelled"]
TERMINAL_STATES: frozenset[str] = frozenset({"done", "failed", "cancelled"})


class JobRecord(BaseModel):
    """One submitted job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    kind: str
    state: JobState
    params: dict[str, Any] = Field(default_factory=dict)
    result: dict[str, Any] | None = None
    error: str | None = None
    submitted_at: float
    started_at: float | None = None
    ended_at: float | None = None
    attempts: int = 0


class JobEventRecord(BaseModel):
    """One event of a job, numbered from 1 in the order it was emitted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    seq: int
    at: float
    event: str
    data: dict[str, Any] = Field(default_factory=dict)


JOB_COLUMNS = "id, kind, state, params, result, error, submitted_at, started_at, ended_at, attempts"


def job_from_row(row: sqlite3.Row | tuple) -> JobRecord:
    """A `JobRecord` from a row selected with `JOB_COLUMNS`."""
    id_, kind, state, params, result, error, submitted, started, ended, attempts = row
    return JobRecord(
        id=id_,
        kind=kind,
        state=state,
        params=json.loads(params),
        result=None if result is None else json.loads(result),
        error=error,
        submitted_at=submitted,
        started_at=started,
        ended_at=ended,
        attempts=attempts,
    )
