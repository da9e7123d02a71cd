"""`/sessions/{call_id}/scores`: scores in, by call id, from the platforms that score calls.

The call id is the session id the recorder wrote the call under (`RLRecorder(call_id=...)`,
Pipecat's `runner_args.session_id` or the platform's own conversation id). Status codes:

- 201 stored; 200 replaced this source's earlier score of the metric (a retried webhook);
- 404 no session has this id (nothing written);
- 409 the session is a gate run or held out (its scores could never train) or has not ended;
- 413 the body is over the service's limit (a long explanation in a small body is cut and
  stored, and the response says so: `explanation_truncated`);
- 422 the body is not a score (value outside [0, 1], an unknown field, a bad source name).
"""

from fastapi import APIRouter, HTTPException, Path, Request, Response, status

from pipecat_rl.errors import ScoreRefusedError
from pipecat_rl.ledger import NotInLedgerError
from pipecat_rl.service.scores import ScorePosted, ScoreRequest, ScoreView
from pipecat_rl.service.security import StrictJSONRoute

router = APIRouter(prefix="/sessions", tags=["sessions"], route_class=StrictJSONRoute)

CallId = Path(min_length=1, max_length=200, description="The call's id: its session id.")


def _detail(description: str) -> dict:
    return {"description": description, "content": {"application/json": {}}}


@router.post(
    "/{call_id}/scores",
    status_code=status.HTTP_201_CREATED,
    response_model=ScorePosted,
    responses={
        200: {"description": "Replaced this source's earlier score of the metric.",
              "model": ScorePosted},
        404: _detail("No session has this call id; nothing was written."),
        409: _detail("A gate run, a held-out session or a call still in progress."),
        413: _detail("The request body is over the service's size limit."),
    },
)  # fmt: skip
def post_score(
    request: Request, response: Response, body: ScoreRequest, call_id: str = CallId
) -> ScorePosted:
    """Store one score of a call, idempotently per (metric, source), and update its verdict."""
    try:
        posted = request.app.state.ledger.post_score(call_id, body)
    except NotInLedgerError as e:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(e)) from e
    except ScoreRefusedError as e:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(e)) from e
    if not posted.created:
        response.status_code = status.HTTP_200_OK
    return ScorePosted.of(call_id, posted)


@router.get(
    "/{call_id}/scores",
    response_model=list[ScoreView],
    responses={404: _detail("No session has this call id.")},
)
def get_scores(request: Request, call_id: str = CallId) -> list[ScoreView]:
    """Every score of a call, the simulator's own parts included, in the order first stored."""
    ledger = request.app.state.ledger
    try:
        ledger.session(call_id)
    except NotInLedgerError as e:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(e)) from e
    return [ScoreView.of(s) for s in ledger.scores(call_id)]
