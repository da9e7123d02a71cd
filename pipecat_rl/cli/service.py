"""`pipecat-rl service`: the side service (FastAPI + uvicorn) that runs jobs beside the bot."""

from pathlib import Path
from typing import Annotated

import typer

from pipecat_rl import defaults
from pipecat_rl.cli.common import cli_errors, console
from pipecat_rl.cli.ledger import LedgerOpt
from pipecat_rl.cli.llm import LLM_URL_ENV
from pipecat_rl.ledger import resolve_ledger_path
from pipecat_rl.ledger.dialect import redact
from pipecat_rl.service.settings import TOKEN_ENV, ServiceSettings, resolve_token


def service_command(
    host: Annotated[str, typer.Option(help="Interface to bind (loopback by default).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8765,
    token: Annotated[
        str | None,
        typer.Option(
            help=f"Bearer token clients must send (default: ${TOKEN_ENV}); required off loopback.",
            show_default=False,
        ),
    ] = None,
    data_dir: Annotated[
        Path,
        typer.Option(help="Project data folder: every path in a request must lie inside it."),
    ] = Path("."),
    ledger: LedgerOpt = None,
    llm_url: Annotated[
        str | None,
        typer.Option(
            "--llm-url",
            envvar=LLM_URL_ENV,
            help="The bot's vLLM: promotions load adapters there (else jobs start their own).",
        ),
    ] = None,
    model: Annotated[str, typer.Option(help="Model an embedded vLLM serves.")] = defaults.MODEL,
    max_body_kb: Annotated[int, typer.Option(min=1, help="Largest request body accepted.")] = 64,
) -> None:
    """Serve the job API (simulate, train, gate, promote, rollback, cycle) with OpenAPI at /docs."""
    with cli_errors():
        from pipecat_rl.service.app import serve
        from pipecat_rl.service.security import check_bind

        secret = resolve_token(token)
        check_bind(host, secret)
        target = resolve_ledger_path(ledger)
        settings = ServiceSettings(
            data_dir=data_dir.resolve(),
            ledger=target.resolve() if isinstance(target, Path) else target,
            token=secret, host=host, port=port, llm_url=llm_url, model=model,
            max_body_bytes=max_body_kb * 1024,
        )  # fmt: skip
        console.print(
            f"[green]pipecat-rl service[/green] on http://{host}:{port} (API docs at /docs), "
            f"data {settings.data_dir}, ledger {redact(str(settings.ledger))}"
            + ("" if secret else " [yellow](no token: loopback only)[/yellow]")
        )
        serve(settings)


def register(app: typer.Typer) -> None:
    """Add the top-level `service` command."""
    app.command("service")(service_command)
