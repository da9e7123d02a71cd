"""`/duels`: people pick between two replies at one moment of a call, in a browser.

Behind the service's token like every route: a browser sends it as HTTP Basic (the rater's id
as the user name, the token as the password; it asks once), a script as a bearer token with
`?rater=`. `GET /duels` shows the rater's next duel (their own queue: the duels they have not
voted on); `POST /duels/{id}/vote` stores the pick (a form: `pick` = left / right / tie /
both_bad, optional `note`) and goes on to the next one. The page is plain HTML; JavaScript only
adds the keys. `Ledger.vote` does the work; these routes only carry it over HTTP.
"""

from pathlib import Path as FilePath
from typing import Literal
from urllib.parse import parse_qsl, quote

from fastapi import APIRouter, HTTPException, Path, Query, Request, status
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipecat_rl.duels.page import done_page, duel_page, rater_page
from pipecat_rl.ledger import NotInLedgerError
from pipecat_rl.ledger.duels import MAX_NOTE_CHARS, DuelRecord, rater_name
from pipecat_rl.service.security import (
    StrictJSONRoute,
    basic_credentials,
    confine,
    settings_of,
    text_problem,
)

router = APIRouter(prefix="/duels", tags=["duels"], route_class=StrictJSONRoute)

DuelId = Path(min_length=1, max_length=64, description="The duel's id (`duel-...`).")
RaterQuery = Query(default=None, max_length=32, description="The rater (else Basic's user).")


class VoteForm(BaseModel):
    """A pick as the duel page's form posts it (urlencoded)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pick: Literal["left", "right", "tie", "both_bad"]
    note: str | None = Field(default=None, max_length=MAX_NOTE_CHARS)
    rater: str | None = Field(default=None, max_length=32)


def _html(text: str, code: int = status.HTTP_200_OK) -> HTMLResponse:
    return HTMLResponse(text, status_code=code)


def _rater(request: Request, given: str | None) -> str | None:
    """The rater: the Basic user name (a browser's), else `given` (a query or form field).

    Raises:
        HTTPException: 422 when it is no rater id.
    """
    rater = basic_credentials(request)[0] or given
    if rater is None:
        return None
    try:
        return rater_name(rater)
    except ValueError as e:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(e)) from None


def _audio_url(request: Request, duel: DuelRecord) -> str | None:
    """The call's recording up to the moment (a media fragment ends it there), if recorded."""
    ledger = request.app.state.ledger
    session = ledger.session(duel.session_id)
    if not session.metadata.get("audio_wav"):
        return None
    turn = next((t for t in ledger.turns(duel.session_id) if t.index == duel.turn_index), None)
    until = "" if turn is None else f"#t=0,{max(turn.created_at - session.started_at, 0):.1f}"
    return f"/duels/{duel.id}/audio{until}"


@router.get("", response_class=HTMLResponse, summary="The rater's next duel (HTML)")
def next_duel(request: Request, rater: str | None = RaterQuery) -> HTMLResponse:
    """The next duel in the rater's queue, or a page saying it is empty."""
    who = _rater(request, rater)
    if who is None:
        return _html(rater_page())
    ledger = request.app.state.ledger
    queue = ledger.duel_queue(who)
    if not queue:
        voted = sum(v.rater == who for v in ledger.votes())
        return _html(done_page(who, voted))
    return _html(duel_page(queue[0], who, len(queue), _audio_url(request, queue[0])))


@router.get("/{duel_id}", response_class=HTMLResponse, summary="One duel (HTML)")
def show_duel(request: Request, duel_id: str = DuelId, rater: str | None = RaterQuery):
    """One duel by id, for the rater (whether or not they voted on it already)."""
    who = _rater(request, rater)
    if who is None:
        return _html(rater_page())
    ledger = request.app.state.ledger
    try:
        duel = ledger.duel(duel_id)
    except NotInLedgerError as e:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(e)) from e
    left = len(ledger.duel_queue(who))
    return _html(duel_page(duel, who, left, _audio_url(request, duel)))


@router.post(
    "/{duel_id}/vote",
    status_code=status.HTTP_303_SEE_OTHER,
    summary="Store a pick (form post), then show the next duel",
    openapi_extra={"requestBody": {"content": {"application/x-www-form-urlencoded": {
        "schema": VoteForm.model_json_schema()}}}},
)  # fmt: skip
async def vote(request: Request, duel_id: str = DuelId) -> RedirectResponse:
    """Store the rater's pick of the duel (replacing theirs), then redirect to `GET /duels`."""
    raw = (await request.body()).decode("utf-8", errors="replace")
    fields = dict(parse_qsl(raw, keep_blank_values=False))
    problem = next((p for p in map(text_problem, fields.values()) if p), None)
    if problem:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=f"a field {problem}")
    try:
        form = VoteForm.model_validate(fields)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, detail=f"{where}: {first['msg']}"
        ) from None
    who = _rater(request, form.rater)
    if who is None:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            detail="rater: name who is rating (Basic user name, or a `rater` field)",
        )
    ledger = request.app.state.ledger
    try:
        duel = ledger.duel(duel_id)
        left = duel.left_for(who)
        right = "b" if left == "a" else "a"
        choice = {"left": left, "right": right}.get(form.pick, form.pick)
        ledger.vote(duel_id, who, choice, form.note)
    except NotInLedgerError as e:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(e)) from e
    return RedirectResponse(f"/duels?rater={quote(who)}", status_code=status.HTTP_303_SEE_OTHER)


@router.get("/{duel_id}/audio", response_class=FileResponse, summary="The call's recording")
def audio(request: Request, duel_id: str = DuelId) -> FileResponse:
    """The recording of the duel's call (a WAV inside the data directory)."""
    ledger = request.app.state.ledger
    try:
        session = ledger.session(ledger.duel(duel_id).session_id)
    except NotInLedgerError as e:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(e)) from e
    wav = session.metadata.get("audio_wav")
    if not wav:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail="this call has no recording")
    path: FilePath = confine(settings_of(request).data_dir, str(wav), "audio_wav")
    if not path.is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail="the recording is gone")
    return FileResponse(path, media_type="audio/wav")
