"""`/jobs`: submit a job, list jobs, read one, stream its events (Server-Sent Events).

The HTTP face of the queue only: `service/jobs.py` runs the jobs, `ledger/jobs.py` holds them.
"""

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Header, HTTPException, Request, status
from fastapi.responses import StreamingResponse

from pipecat_rl.ledger import NotInLedgerError
from pipecat_rl.ledger.jobs import TERMINAL_STATES
from pipecat_rl.service.models import EventView, JobRequest, JobState, JobView
from pipecat_rl.service.security import settings_of

router = APIRouter(prefix="/jobs", tags=["jobs"])


def submit(request: Request, job: JobRequest) -> JobView:
    """Queue a validated job whose paths were confined, and wake the worker."""
    from pipecat_rl.service.jobs import confine_params, new_job_id

    job = confine_params(settings_of(request).data_dir, job)
    params = job.model_dump(mode="json", exclude={"kind"})
    record = request.app.state.ledger.add_job(job.kind, params, job_id=new_job_id(job.kind))
    request.app.state.worker.notify()
    return JobView.of(record)


def _job(request: Request, job_id: str) -> JobView:
    ledger = request.app.state.ledger
    try:
        record = ledger.job(job_id)
    except NotInLedgerError as e:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(e)) from e
    return JobView.of(record, events=len(ledger.job_events(job_id)))


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=JobView)
def post_job(request: Request, job: JobRequest) -> JobView:
    """Queue a job; it runs after every job queued before it, one at a time."""
    return submit(request, job)


@router.get("", response_model=list[JobView])
def list_jobs(request: Request, state: JobState | None = None, limit: int = 100) -> list[JobView]:
    """Jobs in submission order (optionally only those in one state)."""
    return [JobView.of(j) for j in request.app.state.ledger.jobs(state=state, limit=limit)]


@router.get("/{job_id}", response_model=JobView)
def get_job(request: Request, job_id: str) -> JobView:
    """One job: its state, parameters, result or error, and how many events it emitted."""
    return _job(request, job_id)


@router.get("/{job_id}/events", response_class=StreamingResponse)
async def job_events(
    request: Request,
    job_id: str,
    after: int = 0,
    last_event_id: str | None = Header(default=None),
) -> StreamingResponse:
    """The job's events as Server-Sent Events, from the start (or after `Last-Event-ID`).

    The stream ends after the job has ended and its last event was sent.
    """
    _job(request, job_id)
    start = int(last_event_id) if last_event_id and last_event_id.isdigit() else after
    ledger, poll = request.app.state.ledger, settings_of(request).poll_s

    async def stream() -> AsyncIterator[str]:
        seen = start
        while True:
            state = (await asyncio.to_thread(ledger.job, job_id)).state
            for e in await asyncio.to_thread(ledger.job_events, job_id, after=seen):
                seen = e.seq
                body = EventView.of(e).model_dump_json()
                yield f"id: {e.seq}\nevent: {e.event}\ndata: {body}\n\n"
            if state in TERMINAL_STATES:
                yield f"event: end\ndata: {json.dumps({'state': state})}\n\n"
                return
            if await request.is_disconnected():
                return
            await asyncio.sleep(poll)

    return StreamingResponse(stream(), media_type="text/event-stream")
