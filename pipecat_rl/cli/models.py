"""`pipecat-rl models`: prepare packaged or local weights for serving (`serving.weights`)."""

from typing import Annotated

import typer

from pipecat_rl import defaults
from pipecat_rl.cli.common import HELP_MARKUP, cli_errors, print_json, results
from pipecat_rl.serving.weights import PACKAGED_MODELS, prepare_model

models_app = typer.Typer(
    help="Prepare models for serving.", no_args_is_help=True, rich_markup_mode=HELP_MARKUP
)


@models_app.command("prepare")
def prepare(
    model: Annotated[
        str, typer.Argument(help="A packaged model name, an HF folder or a .gguf file.")
    ] = defaults.MODEL,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Convert a packaged GGUF to a cached HF folder (idempotent) and print its path."""
    with cli_errors(json_out):
        path = prepare_model(model)
    if json_out:
        print_json({"model": model, "path": str(path)})
    else:
        typer.echo(str(path))


@models_app.command("list")
def list_models(json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False):
    """List the models that ship inside Python packages."""
    rows = [
        {"name": key, "model": m.name, "package": m.package, "install": m.install}
        for key, m in PACKAGED_MODELS.items()
    ]
    if json_out:
        print_json(rows)
        return
    out = results()
    for row in rows:
        out.print(
            f"{row['name']}: {row['model']} (from {row['package']}; {row['install']})", markup=False
        )


def register(app: typer.Typer) -> None:
    """Add the `models` group."""
    app.add_typer(models_app, name="models")
