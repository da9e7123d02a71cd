"""`/live`: read the live pointer, or move it (a promote or rollback job, run in queue order)."""

from fastapi import APIRouter, Request, status

from pipecat_rl.ledger import BASE_ADAPTER
from pipecat_rl.service.bodies import (
    JobView,
    LiveMoveRequest,
    LiveView,
    PointerView,
    PromoteJob,
    RollbackJob,
    errors,
)
from pipecat_rl.service.routers.jobs import refuse, submit
from pipecat_rl.service.security import StrictJSONRoute

router = APIRouter(prefix="/live", tags=["live"], route_class=StrictJSONRoute)


@router.get("", response_model=LiveView)
def get_live(request: Request) -> LiveView:
    """The adapter that serves now, and every move of the pointer before."""
    ledger = request.app.state.ledger
    pointer = ledger.live()
    history = [PointerView(**p.model_dump()) for p in ledger.live_history()]
    return LiveView(
        adapter=BASE_ADAPTER if pointer is None else pointer.adapter,
        pointer=None if pointer is None else PointerView(**pointer.model_dump()),
        history=history,
    )


@router.post(
    "", status_code=status.HTTP_202_ACCEPTED, response_model=JobView,
    responses=errors(403, 413),
)  # fmt: skip
def move_live(request: Request, move: LiveMoveRequest) -> JobView:
    """Queue a promotion of a PROMOTE receipt (or a rollback).

    The job loads the adapter into the bot's vLLM and only then moves the pointer; a running
    bot picks the new adapter up at its next call.
    """
    if move.action == "promote":
        if move.receipt is None:
            raise refuse("receipt", "promote needs a receipt")
        return submit(request, PromoteJob(receipt=move.receipt))
    return submit(request, RollbackJob())
