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
    NoTrainingSignalError,
    PipecatRLError,
    ScenarioError,
    ServingError,
)

console = Console(stderr=True)
"""Human-facing messages go to stderr so stdout stays clean for `--json`."""

# 0/1/2 are the gate's verdicts (PROMOTE / REJECT / INCONCLUSIVE) and nothing else uses 1 or 2;
# the rest follow BSD sysexits (sysexits.h) so they never collide with a verdict.
EXIT_OK = 0
EXIT_NO = 1
EXIT_INCONCLUSIVE = 2
EXIT_USAGE = 64  # EX_USAGE
EXIT_DATA = 65  # EX_DATAERR
EXIT_NO_SIGNAL = 66  # EX_NOINPUT: the input is there, but holds nothing to learn from
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE
EXIT_FAILURE = 70  # EX_SOFTWARE
EXIT_IO = 74  # EX_IOERR
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it

EXIT_TABLE: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success; the gate's PROMOTE"),
    (EXIT_NO, "the gate's REJECT"),
    (EXIT_INCONCLUSIVE, "the gate's INCONCLUSIVE"),
    (EXIT_USAGE, "a flag or argument is wrong (Click's own usage errors included)"),
    (EXIT_DATA, "an input file is wrong: scenario, gate config, scores file, receipt, model"),
    (
        EXIT_NO_SIGNAL,
        "no training signal: nothing the algorithm can learn from (no passed session or "
        "demonstration for SFT, every GRPO group with equal rewards, no judged turn with a hint "
        "for OPSD); simulate more or warm-start",
    ),
    (
        EXIT_UNAVAILABLE,
        "a service is unavailable: the LLM server is gone or refused, the ledger stayed locked, "
        "an optional extra is missing",
    ),
    (
        EXIT_FAILURE,
        "the harness failed: episodes that could not run to their end, or an unexpected error",
    ),
    (EXIT_IO, "a file could not be read or written: the ledger, `--out`"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
)
"""The one exit-code table of every verb; the README's table is rendered from it."""

_EXIT_BY_ERROR: tuple[tuple[type[BaseException], int], ...] = (
    # most specific first: the first match wins
    (NotInLedgerError, EXIT_USAGE),
    (NoTrainingSignalError, EXIT_NO_SIGNAL),
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


def exit_code_markdown() -> str:
    """`EXIT_TABLE` as the Markdown table the README shows (a test keeps the two equal)."""
    rows = [f"| {code} | {meaning} |" for code, meaning in EXIT_TABLE]
    return "\n".join(["| exit | meaning (every verb) |", "|---|---|", *rows]) + "\n"


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


HELP_MARKUP = None
"""Every Typer app's `rich_markup_mode`: Click's plain help, which keeps flag names whole at 80
columns, prints `[webrtc]` as written (rich markup would eat the brackets) and shows no metavar
for a flag."""
