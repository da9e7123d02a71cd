"""Running the whole `pipecat-rl` app in-process, as a user's shell would, without leaking its
log setup into later tests (the app points loguru at the runner's stderr, closed afterwards)."""

import sys

from loguru import logger
from typer.testing import CliRunner, Result

from pipecat_rl.cli import app


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    """`pipecat-rl ARGS`, in-process; stdout and stderr apart."""
    try:
        return CliRunner().invoke(app, list(args), env=env)
    finally:
        logger.remove()
        logger.add(sys.stderr)
