"""`/receipts`: gate receipts under the data directory, as JSON or as their HTML page."""

import re
from pathlib import Path as FilePath
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Request, status
from fastapi.responses import HTMLResponse, Response

from pipecat_rl.errors import GateError
from pipecat_rl.gate import GateReceipt, load_receipt
from pipecat_rl.service.bodies import ReceiptSummary, errors
from pipecat_rl.service.security import StrictJSONRoute, confine, settings_of

router = APIRouter(prefix="/receipts", tags=["receipts"], route_class=StrictJSONRoute)

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


def _receipts(data_dir: FilePath) -> dict[str, FilePath]:
    """Receipt id (its folder's name) → receipt.json, for every receipt in the data directory."""
    found: dict[str, FilePath] = {}
    for path in sorted(data_dir.rglob("receipt.json")):
        try:
            found.setdefault(path.parent.name, confine(data_dir, str(path)))
        except HTTPException:
            continue  # a link out of the data directory is not ours to serve
    return found


@router.get("", response_model=list[ReceiptSummary])
def list_receipts(request: Request) -> list[ReceiptSummary]:
    """Every receipt in the data directory this version can read, by id."""
    out = []
    for rid, path in _receipts(settings_of(request).data_dir).items():
        try:
            r = load_receipt(path)
        except GateError:
            continue
        out.append(
            ReceiptSummary(
                id=rid, verdict=r.verdict, candidate=r.candidate.name,
                incumbent=r.incumbent.name, created_at=r.created_at,
            )
        )  # fmt: skip
    return out


@router.get(
    "/{receipt_id}", response_model=GateReceipt, responses={
        200: {"content": {"text/html": {}},
              "description": "The receipt (JSON), or its self-contained HTML page."},
        **errors(400, 404),
    },
)  # fmt: skip
def get_receipt(
    request: Request,
    receipt_id: Annotated[
        str, Path(description="The receipt's id: the name of the folder holding its receipt.json.")
    ],
    format: Annotated[
        Literal["json", "html"] | None,
        Query(description="`html` for the page (default: JSON, or HTML for a browser)."),
    ] = None,
) -> GateReceipt | Response:
    """One receipt: JSON by default, its self-contained HTML page with `?format=html`.

    A browser (`Accept: text/html`) gets the page too.
    """
    if not _ID.match(receipt_id):
        raise HTTPException(status.HTTP_400_BAD_REQUEST, detail="not a receipt id")
    path = _receipts(settings_of(request).data_dir).get(receipt_id)
    if path is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no receipt {receipt_id!r}")
    wants_html = format == "html" or (
        format is None and "text/html" in request.headers.get("accept", "")
    )
    if wants_html:
        page = path.with_name("receipt.html")
        if not page.is_file():
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail="this receipt has no HTML page")
        return HTMLResponse(page.read_text())
    try:
        return load_receipt(path)
    except GateError as e:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(e)) from e
