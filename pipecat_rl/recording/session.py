"""Who a recorded call is: the session labels, and the context that hands them to recorders.

A live bot gets a generated call id; the simulator and the gate wrap each episode in
`record_session(...)`, and every PipelineWorker set up inside that context (the same asyncio task
tree) records into the given ledger under the given labels.
"""

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipecat_rl.ledger import Ledger, SessionRecord
from pipecat_rl.ledger.liveness import writer_identity

if TYPE_CHECKING:
    from pipecat_rl.recording.recorder import RecorderObserver


class SessionInfo(BaseModel):
    """Labels a recorder writes on its session row."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    call_id: str | None = None
    """The session id; a fresh one is generated when absent."""
    source: Literal["live", "simulate", "gate"] = "live"
    scenario_id: str | None = None
    scenario_hash: str | None = None
    split: Literal["pool", "heldout"] | None = None
    heldout_set_id: str | None = None
    policy: str | None = None
    """The adapter (or base model) served; filled from the first LLM request when absent."""
    seed: int | None = None
    repeat: int | None = None
    consent: bool = True
    """Whether the caller consented to training on this call; training respects it."""
    metadata: dict[str, Any] = Field(default_factory=dict)

    def record(self, session_id: str) -> SessionRecord:
        """The session row this info starts, naming the process that writes it.

        The writer (pid, host, process start) is how the ledger's closer tells a session whose
        process died from one still in progress (`Ledger.close_dead_sessions`).
        """
        fields = self.model_dump(exclude={"call_id"})
        fields["metadata"] = {**fields["metadata"], "writer": writer_identity()}
        return SessionRecord(id=session_id, started_at=time.time(), **fields)


def new_call_id() -> str:
    """A fresh, sortable-enough session id."""
    return f"call-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"


@dataclass
class RecordingHandle:
    """What `record_session()` yields: the session id and the recorders installed under it."""

    ledger: Ledger
    session: SessionInfo
    session_id: str
    recorders: list["RecorderObserver"] = field(default_factory=list)

    async def flush(self) -> None:
        """Wait until everything recorded in this context is in the ledger."""
        for recorder in self.recorders:
            await recorder.flush()

    @property
    def dropped(self) -> int:
        """Recorder writes of this session that failed even after the ledger's retries."""
        return sum(recorder.dropped for recorder in self.recorders)


_current: ContextVar[RecordingHandle | None] = ContextVar("pipecat_rl_recording", default=None)


@contextmanager
def record_session(ledger: Ledger, session: SessionInfo) -> Iterator[RecordingHandle]:
    """Record every pipeline set up inside this block into `ledger` as `session`."""
    handle = RecordingHandle(ledger, session, session.call_id or new_call_id())
    token = _current.set(handle)
    try:
        yield handle
    finally:
        _current.reset(token)


def current_recording() -> RecordingHandle | None:
    """The innermost `record_session()` context, if any."""
    return _current.get()
