"""Helpers every CLI verb shares: JSON output, one-line errors, and one exit-code table.

`CLIGroup` is the top-level command class: it runs every verb with Click's standalone mode off,
so usage errors exit 64 (Click's own 2 would read as INCONCLUSIVE), pipecat-rl errors exit with
the code of their branch of the error tree, and anything unexpected is one line and 70, with the
traceback only under `-vv`.
"""

import json
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console
from typer.core import TyperGroup
from typer.exceptions import Abort, TyperException

from pipecat_rl.errors import (
    ConfigError,
    GateError,
    LedgerError,
    LedgerLockedError,
    ModelError,
    NotInLedgerError,
    PipecatRLError,
    ScenarioError,
    ServingError,
)

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

_EXIT_BY_ERROR: tuple[tuple[type[BaseException], int], ...] = (
    # most specific first: the first match wins
    (NotInLedgerError, EXIT_USAGE),
    (LedgerLockedError, EXIT_UNAVAILABLE),
    (ConfigError, EXIT_USAGE),
    (ScenarioError, EXIT_DATA),
    (GateError, EXIT_DATA),
    (ModelError, EXIT_DATA),
    (ServingError, EXIT_UNAVAILABLE),
    (LedgerError, EXIT_IO),
    (PipecatRLError, EXIT_FAILURE),
    (OSError, EXIT_IO),
    (UnicodeDecodeError, EXIT_DATA),  # an input file that is not UTF-8 text
    (ImportError, EXIT_UNAVAILABLE),  # an optional extra is not installed
)

verbosity = 0
"""How many -v the user gave (set by the top-level callback); -vv shows tracebacks."""


def exit_code_for(error: BaseException) -> int:
    """The documented exit code of an error: its branch of the tree, else 70."""
    for kind, code in _EXIT_BY_ERROR:
        if isinstance(error, kind):
            return code
    return EXIT_FAILURE


def error_line(message: str) -> None:
    """Print `error: message` on stderr as typed (no markup, never folded)."""
    console.print(f"[red]error:[/red] {_escape(message)}", soft_wrap=True, highlight=False)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def print_json(payload: Any) -> None:
    """Write one JSON document to stdout."""
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    sys.stdout.flush()


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn pipecat-rl (and file) errors into a one-line message and their exit code."""
    try:
        yield
    except (PipecatRLError, OSError) as e:
        error_line(_describe(e))
        raise typer.Exit(exit_code_for(e)) from e


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError) and not isinstance(error, PipecatRLError):
        where = f" {error.filename}" if error.filename else ""
        return f"cannot use{where}: {error.strerror or error}"
    return str(error)


class CLIGroup(TyperGroup):
    """The top-level group: one exit-code table and one error line for every verb."""

    def main(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D102 (see the class)
        standalone = kwargs.pop("standalone_mode", True)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except TyperException as e:  # Typer's (vendored) Click errors
            code = _click_error(e)
        except Abort:
            error_line("aborted")
            code = EXIT_INTERRUPTED
        except Exception as e:  # the guard: no traceback reaches a user unless asked for
            code = _unexpected(e)
        if not isinstance(code, int):
            code = EXIT_OK
        if standalone:
            sys.exit(code)
        return code


def _kind(error: BaseException, name: str) -> bool:
    # Typer vendors Click under a private module, so its classes are matched by name
    return any(c.__name__ == name for c in type(error).__mro__)


def _click_error(error: TyperException) -> int:
    if _kind(error, "NoArgsIsHelpError"):
        typer.echo(error.format_message(), err=True)
        return EXIT_USAGE
    if _kind(error, "UsageError"):
        ctx = getattr(error, "ctx", None)
        hint = f" (see `{ctx.command_path} -h`)" if ctx is not None else ""
        error_line(error.format_message() + hint)
        return EXIT_USAGE
    error_line(error.format_message())
    return EXIT_IO if _kind(error, "FileError") else EXIT_USAGE


def _unexpected(error: Exception) -> int:
    if verbosity >= 2:
        traceback.print_exception(error, file=sys.stderr)
    if isinstance(error, PipecatRLError | OSError | ImportError):
        error_line(_describe(error))
    elif isinstance(error, UnicodeDecodeError):
        error_line(f"an input file is not UTF-8 text ({error}); save it as UTF-8")
    else:
        hint = "" if verbosity >= 2 else "; run with -vv for the traceback"
        error_line(f"unexpected {type(error).__name__}: {error}{hint} (please report it)")
    return exit_code_for(error)
