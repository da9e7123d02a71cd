"""`pipecat-rl setup-file`: the path for zero-line recording via PIPECAT_SETUP_FILES."""

from typing import Annotated

import typer

from pipecat_rl.cli.common import print_json


def setup_file(json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False):
    """Print the file that records any bot: PIPECAT_SETUP_FILES=$(pipecat-rl setup-file)."""
    from pipecat_rl.recording.setup_file import setup_file_path  # imports Pipecat: only here

    if json_out:
        print_json({"setup_file": str(setup_file_path())})
    else:
        typer.echo(str(setup_file_path()))


def register(app: typer.Typer) -> None:
    """Add the `setup-file` command."""
    app.command("setup-file")(setup_file)
