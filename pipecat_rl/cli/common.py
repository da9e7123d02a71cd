"""Helpers every CLI verb shares: JSON output, error reporting with exit codes."""

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console

from pipecat_rl.errors import ConfigError, PipecatRLError, ScenarioError

console = Console(stderr=True)
"""Human-facing messages go to stderr so stdout stays clean for `--json`."""

# One table of exit codes for every verb. 0/1/2 are the gate's verdicts (PROMOTE / REJECT /
# INCONCLUSIVE) and nothing else uses 1 or 2; the rest follow BSD sysexits so they never collide.
EXIT_OK = 0
"""Success (and the gate's PROMOTE)."""
EXIT_NO = 1
"""The gate said REJECT, or a check the user asked for said no."""
EXIT_INCONCLUSIVE = 2
"""The gate could not decide (INCONCLUSIVE)."""
EXIT_USAGE = 64
"""A flag, argument or environment variable is wrong (Click's own usage errors included)."""
EXIT_DATA = 65
"""An input file is wrong: a scenario, config, score file or receipt."""
EXIT_UNAVAILABLE = 69
"""A service the verb needs is down or refused: the LLM server, the ledger file is locked."""
EXIT_FAILURE = 70
"""The harness itself failed (a bug, or episodes that could not run)."""
EXIT_IO = 74
"""A file could not be read or written (ledger, --out)."""
EXIT_INTERRUPTED = 130
"""Stopped by Ctrl-C / SIGINT."""


def print_json(payload: Any) -> None:
    """Write one JSON document to stdout."""
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    sys.stdout.flush()


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn pipecat-rl errors into a one-line message and a meaningful exit code."""
    try:
        yield
    except ConfigError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(EXIT_USAGE) from e
    except ScenarioError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(EXIT_DATA) from e
    except PipecatRLError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(EXIT_FAILURE) from e
