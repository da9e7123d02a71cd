"""`/jobs`: submit a job, list jobs, read one, stream its events (Server-Sent Events), cancel it.

The HTTP face of the queue only: `service/jobs.py` runs the jobs, `ledger/jobs.py` holds them.
Before a job is queued, every path in it and in the files it names (a loop file, scenario
folders) is checked to lie inside the data directory (`security`): nothing outside is queued.
"""

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path as FilePath
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Path, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse

from pipecat_rl.ledger import NotInLedgerError
from pipecat_rl.ledger.jobs import TERMINAL_STATES
from pipecat_rl.service.bodies import (
    CycleJob,
    EventView,
    JobRequest,
    JobState,
    JobView,
    PromoteJob,
    errors,
)
from pipecat_rl.service.security import (
    StrictJSONRoute,
    confine,
    confine_loop_file,
    confine_scenario_files,
    settings_of,
)
from pipecat_rl.service.settings import ServiceSettings

router = APIRouter(prefix="/jobs", tags=["jobs"], route_class=StrictJSONRoute)

JobId = Annotated[str, Path(description="The job's id, as `POST /jobs` answered it.")]


def submit(request: Request, job: JobRequest) -> JobView:
    """Queue a validated job whose paths were confined, resolved and found; wake the worker."""
    from pipecat_rl.service.jobs import new_job_id, resolve_paths

    settings = settings_of(request)
    _confine_fields(settings.data_dir, job)
    job = resolve_paths(settings.data_dir, job)
    _confine_named_files(settings, job)
    params = job.model_dump(mode="json", exclude={"kind"})
    record = request.app.state.ledger.add_job(job.kind, params, job_id=new_job_id(job.kind))
    request.app.state.worker.notify()
    return JobView.of(record)


def _confine_fields(data_dir: FilePath, job: Any) -> None:
    """403 (or 422) naming the first path field of `job` that is outside the data directory."""
    from pipecat_rl.service.jobs import path_part

    for name in job.PATH_FIELDS:
        value = getattr(job, name)
        items = value if isinstance(value, list) else [] if value is None else [value]
        for index, item in enumerate(items):
            path = path_part(name, item)
            if path is None:  # a URL, not a file
                continue
            label = f"{name}.{index}" if isinstance(value, list) else name
            confine(data_dir, path, label, item)


def _confine_named_files(settings: ServiceSettings, job: Any) -> None:
    """403 (or 422) for a path outside the data directory in a file `job` names.

    The scenario files and folders (their `!include`s, world packs and recordings), a cycle's
    loop file, read as its job will read it, and a promoted receipt folder's `receipt.json`.
    """
    scenarios = getattr(job, "scenarios", None)
    targets = [scenarios] if isinstance(scenarios, str) else scenarios or []
    for index, target in enumerate(dict.fromkeys(targets)):
        label = "scenarios" if isinstance(scenarios, str) else f"scenarios.{index}"
        confine_scenario_files(settings.data_dir, target, label)
    if isinstance(job, CycleJob):
        overrides = job.model_dump(include={"budget_s", "stop_after"}, exclude_none=True)
        confine_loop_file(
            settings.data_dir, FilePath(job.config), ledger=settings.ledger, **overrides
        )
    if isinstance(job, PromoteJob) and FilePath(job.receipt).is_dir():
        confine(settings.data_dir, FilePath(job.receipt) / "receipt.json", "receipt", job.receipt)


def refuse(field: str, message: str) -> RequestValidationError:
    """A 422 naming one body field, shaped like FastAPI's own validation errors."""
    return RequestValidationError([{"type": "value_error", "loc": ("body", field), "msg": message}])


def _job(request: Request, job_id: str) -> JobView:
    ledger = request.app.state.ledger
    try:
        record = ledger.job(job_id)
    except NotInLedgerError as e:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(e)) from e
    return JobView.of(record, events=len(ledger.job_events(job_id)))


@router.post(
    "", status_code=status.HTTP_202_ACCEPTED, response_model=JobView,
    responses=errors(403, 413),
)  # fmt: skip
def post_job(request: Request, job: JobRequest) -> JobView:
    """Queue a job; it runs after every job queued before it, one at a time.

    Every path in the body must exist inside the service's data directory: a path outside it
    is a 403, a missing one a 422 naming the field.
    """
    return submit(request, job)


@router.get("", response_model=list[JobView])
def list_jobs(
    request: Request,
    state: Annotated[JobState | None, Query(description="Only jobs in this state.")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000, description="At most this many jobs.")] = 100,
) -> list[JobView]:
    """Jobs in submission order (optionally only those in one state)."""
    return [JobView.of(j) for j in request.app.state.ledger.jobs(state=state, limit=limit)]


@router.get("/{job_id}", response_model=JobView, responses=errors(404))
def get_job(request: Request, job_id: JobId) -> JobView:
    """One job: its state, parameters, result or error, and how many events it emitted."""
    return _job(request, job_id)


@router.delete(
    "/{job_id}", response_model=JobView, responses={
        202: {"model": JobView, "description": "Running: asked to stop at its next checkpoint."},
        **errors(404, 409),
    },
)  # fmt: skip
def cancel_job(request: Request, response: Response, job_id: JobId) -> JobView:
    """Cancel a job: a queued one at once, a running one at its next checkpoint.

    A queued job ends `cancelled` now (200) and never runs. A running one is asked to stop
    (202) and ends `cancelled` at its next checkpoint (a simulation starts no more episodes
    and lets those in flight finish; a training step; a cycle's stage boundary), with the
    simulated sessions it left open closed `interrupted`. A gate's paired runs and a promotion
    have no checkpoint: they finish.
    """
    try:
        done = request.app.state.worker.cancel(request.app.state.ledger, job_id)
    except NotInLedgerError as e:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(e)) from e
    if done.outcome == "ended":
        raise HTTPException(
            status.HTTP_409_CONFLICT, detail=f"job {job_id} has already ended ({done.job.state})"
        )
    if done.outcome == "elsewhere":
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            detail=f"job {job_id} is running in another service process on this ledger; "
            "cancel it through that service",
        )
    if done.outcome == "requested":
        response.status_code = status.HTTP_202_ACCEPTED
    return JobView.of(done.job, events=len(request.app.state.ledger.job_events(job_id)))


@router.get(
    "/{job_id}/events", response_class=StreamingResponse, responses={
        200: {"content": {"text/event-stream": {}},
              "description": "`id:`, `event:` and `data:` (an EventView) per event; then `end`."},
        **errors(404),
    },
)  # fmt: skip
async def job_events(
    request: Request,
    job_id: JobId,
    after: Annotated[int, Query(ge=0, description="Send only events after this number.")] = 0,
    last_event_id: Annotated[
        str | None, Header(description="An SSE client's resume point (wins over `after`).")
    ] = None,
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
