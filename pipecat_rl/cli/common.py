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

EXIT_OK = 0
EXIT_NO = 1
EXIT_USAGE = 2
EXIT_FAILURE = 3


def print_json(payload: Any) -> None:
    """Write one JSON document to stdout."""
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    sys.stdout.flush()


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn pipecat-rl errors into a one-line message and a meaningful exit code."""
    try:
        yield
    except (ConfigError, ScenarioError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(EXIT_USAGE) from e
    except PipecatRLError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(EXIT_FAILURE) from e
