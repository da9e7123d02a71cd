"""The `pipecat-rl` command: one Typer app, each verb group registered from its own module.

Exit codes: one table for every verb, `pipecat_rl.cli.common.EXIT_TABLE` (the README renders
it). No verb shows a traceback unless run with -vv (`CLIGroup`). Verbs import Pipecat only when
they build a pipeline, so `ledger`, `llm` and `models` start fast.

Each module here is named after the verb group it registers, so some share a name with the
module that does the work (`cli/models.py` calls `serving/weights.py`, `cli/cycle.py` runs
`service/cycle.py`): the verb module parses flags, calls that one, and prints.
"""

import sys
from importlib.metadata import version as _installed_version
from typing import Annotated

import typer
from loguru import logger

from pipecat_rl.cli import common
from pipecat_rl.cli import cycle as cycle_cli
from pipecat_rl.cli import duels as duels_cli
from pipecat_rl.cli import gate as gate_cli
from pipecat_rl.cli import judge as judge_cli
from pipecat_rl.cli import ledger as ledger_cli
from pipecat_rl.cli import llm as llm_cli
from pipecat_rl.cli import models as models_cli
from pipecat_rl.cli import record as record_cli
from pipecat_rl.cli import scenarios as scenarios_cli
from pipecat_rl.cli import service as service_cli
from pipecat_rl.cli import simulate as simulate_cli
from pipecat_rl.cli import train as train_cli

app = typer.Typer(
    name="pipecat-rl",
    help="Record, simulate, train and gate Pipecat voice agents.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode=common.HELP_MARKUP,
    cls=common.CLIGroup,
)


def _version(shown: bool) -> None:
    if shown:
        typer.echo(f"pipecat-rl {_installed_version('pipecat-rl')}")
        raise typer.Exit()


@app.callback()
def _options(
    verbose: int = typer.Option(
        0, "--verbose", "-v", count=True, help="Log more: -v for info, -vv for debug (also "
        "after the verb)."
    ),
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Record, simulate, train and gate Pipecat voice agents."""
    # Pipecat logs every frame-level step at DEBUG; a CLI user wants warnings unless asked,
    # and logged exceptions carry their traceback only under -vv.
    common.verbosity = verbose
    logger.remove()
    level = ("WARNING", "INFO", "DEBUG")[min(verbose, 2)]
    logger.add(_Stderr(), level=level, format=_log_format, colorize=sys.stderr.isatty())


class _Stderr:
    """Whatever `sys.stderr` is at each write, not the one of the moment the app started.

    The app run in-process (a test's runner, a notebook) swaps stderr and closes its copy
    afterwards; a sink holding that copy would raise on every later log line.
    """

    def write(self, message: str) -> None:
        sys.stderr.write(message)

    def flush(self) -> None:
        sys.stderr.flush()


def _log_format(record: dict) -> str:
    line = "<level>{level: <8}</level> | {message}\n"
    return line + "{exception}" if common.verbosity >= 2 else line


for module in (simulate_cli, models_cli, llm_cli, record_cli, ledger_cli, gate_cli, train_cli):
    module.register(app)
for module in (service_cli, cycle_cli, judge_cli, scenarios_cli, duels_cli):
    module.register(app)


def main() -> None:
    """Console-script entry point: every outcome is an exit code from the one table."""
    app()
