"""The service's FastAPI app: routers, the token dependency, the body limit and the worker."""

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from pipecat_rl.ledger import Ledger
from pipecat_rl.service.bodies import errors
from pipecat_rl.service.docs import add_docs
from pipecat_rl.service.jobs import JobWorker
from pipecat_rl.service.routers import adapters, duels, jobs, live, receipts, sessions
from pipecat_rl.service.security import BodyLimit, check_bind, require_token
from pipecat_rl.service.settings import ServiceSettings

DESCRIPTION = """The pipecat-rl side service: it runs beside the bot, never inside it.

Jobs (simulate, train, gate, promote, rollback, cycle) run one at a time from a durable queue in
the ledger; `DELETE /jobs/{id}` cancels one. A promotion loads the adapter into the bot's vLLM
and only then moves the live pointer; the bot's `LiveAdapterSelector` picks it up at its next
call. Every path in a request must exist inside the service's data directory, and every path
in the files it names (a loop file's `out:`, a scenario's `!include` or world pack) must lie
inside it too, or nothing is queued (403). Bodies are strict JSON: a key given twice, NaN or
Infinity, a NUL byte are a 422. Send `Authorization: Bearer <token>` and, with a body,
`Content-Type: application/json`. `/duels` is a page for people: a browser sends the token as
HTTP Basic, the rater's id as the user name.
"""


def _sendable(error: dict[str, Any]) -> dict[str, Any]:
    """A validation error as JSON can carry it.

    An `input` or `ctx` JSON cannot carry (the raw bytes of a body that is not UTF-8, a NaN) is
    left out, where FastAPI's own handler would fail with a 500.
    """
    out = {}
    for key, value in error.items():
        try:
            encoded = jsonable_encoder(value)
            json.dumps(encoded, allow_nan=False).encode("utf-8")
        except (ValueError, TypeError):  # UnicodeError is a ValueError
            continue
        out[key] = encoded
    return out


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """The 422 FastAPI answers, with every error in a form JSON can carry (`_sendable`)."""
    detail = [_sendable(e) for e in exc.errors()]
    return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


def create_app(settings: ServiceSettings) -> FastAPI:
    """The app for one data directory and ledger (the worker starts with the app)."""
    check_bind(settings.host, settings.token)
    worker = JobWorker(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.ledger = Ledger(settings.ledger)
        worker.start()
        try:
            yield
        finally:
            worker.stop()
            app.state.ledger.close()

    app = FastAPI(
        title="pipecat-rl service", description=DESCRIPTION, lifespan=lifespan,
        dependencies=[Depends(require_token)], responses=errors(401),
        docs_url=None, redoc_url=None,  # served from local files: `docs`
    )  # fmt: skip
    app.state.settings = settings
    app.add_exception_handler(RequestValidationError, validation_error)
    app.state.worker = worker
    for module in (jobs, adapters, receipts, live, sessions, duels):
        app.include_router(module.router)
    add_docs(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    return app


def serve(settings: ServiceSettings) -> None:
    """Run the service with uvicorn until stopped."""
    import uvicorn

    app = create_app(settings)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
