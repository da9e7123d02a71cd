"""`/receipts`: gate receipts under the data directory, as JSON or as their HTML page."""

import json
import re
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import HTMLResponse, JSONResponse, Response

from pipecat_rl.service.models import ReceiptSummary
from pipecat_rl.service.security import confine, settings_of

router = APIRouter(prefix="/receipts", tags=["receipts"])

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


def _receipts(data_dir: Path) -> dict[str, Path]:
    """Receipt id (its folder's name) → receipt.json, for every receipt in the data directory."""
    found: dict[str, Path] = {}
    for path in sorted(data_dir.rglob("receipt.json")):
        try:
            found.setdefault(path.parent.name, confine(data_dir, str(path)))
        except HTTPException:
            continue  # a link out of the data directory is not ours to serve
    return found


@router.get("", response_model=list[ReceiptSummary])
def list_receipts(request: Request) -> list[ReceiptSummary]:
    """Every receipt in the data directory, by id."""
    out = []
    for rid, path in _receipts(settings_of(request).data_dir).items():
        try:
            body = json.loads(path.read_text())
            out.append(
                ReceiptSummary(
                    id=rid, verdict=body["verdict"], candidate=body["candidate"]["name"],
                    incumbent=body["incumbent"]["name"], created_at=body["created_at"],
                )
            )  # fmt: skip
        except (OSError, ValueError, KeyError):
            continue
    return out


@router.get("/{receipt_id}", response_model=None)
def get_receipt(request: Request, receipt_id: str, format: str | None = None) -> Response:
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
    return JSONResponse(json.loads(path.read_text()))
