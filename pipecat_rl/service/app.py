"""The service's FastAPI app: routers, the token dependency, the body limit and the worker."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from pipecat_rl.ledger import Ledger
from pipecat_rl.service.bodies import errors
from pipecat_rl.service.docs import add_docs
from pipecat_rl.service.jobs import JobWorker
from pipecat_rl.service.routers import adapters, jobs, live, receipts, sessions
from pipecat_rl.service.security import BodyLimit, check_bind, require_token
from pipecat_rl.service.settings import ServiceSettings

DESCRIPTION = """The pipecat-rl side service: it runs beside the bot, never inside it.

Jobs (simulate, train, gate, promote, rollback, cycle) run one at a time from a durable queue in
the ledger; `DELETE /jobs/{id}` cancels one. A promotion loads the adapter into the bot's vLLM
and only then moves the live pointer; the bot's `LiveAdapterSelector` picks it up at its next
call. Every path in a request must exist inside the service's data directory. Send
`Authorization: Bearer <token>` and, with a body, `Content-Type: application/json`.
"""


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
    app.state.worker = worker
    for module in (jobs, adapters, receipts, live, sessions):
        app.include_router(module.router)
    add_docs(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    return app


def serve(settings: ServiceSettings) -> None:
    """Run the service with uvicorn until stopped."""
    import uvicorn

    app = create_app(settings)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
