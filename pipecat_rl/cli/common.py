"""Helpers every CLI verb shares: JSON output, one-line errors, and one exit-code table.

`CLIGroup` is the top-level command class: it runs every verb with Click's standalone mode off,
so usage errors exit 64 (Click's own 2 would read as INCONCLUSIVE), pipecat-rl errors exit with
the code of their branch of the error tree, and anything unexpected is one line and 70, with the
traceback only under `-vv`. A reader that closes stdout early (`| head`) ends the verb quietly
with the SIGPIPE convention, and `-v` may follow the verb (`ledger stats -v`).

Results (tables, verdicts, paths) go to stdout through `results()`; progress, logs and errors go
to stderr through `console`, so `verb > file` keeps the result and the terminal keeps the rest.
"""

import json
import os
import re
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
import yaml
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
    first_error,
)

if TYPE_CHECKING:
    from pipecat_rl.ledger import Ledger

console = Console(stderr=True)
"""Progress, notes and errors: stderr, so stdout holds only results (and `--json`)."""


class _Results(Console):
    """A console on stdout whose closed pipe ends the verb through `CLIGroup`.

    Rich's own handling exits 1, which would read as the gate's REJECT.
    """

    def on_broken_pipe(self) -> None:  # noqa: D102 (see the class)
        raise BrokenPipeError


def print_table(out: Console, table: Any) -> None:
    """Print `table` at its natural width: no id or number is ever cut or folded.

    A terminal narrower than the table wraps its lines, which keeps each id copyable whole.
    """
    natural = out.measure(table, options=out.options.update_width(10_000)).maximum
    out.width = max(out.width, natural)
    out.print(table)


def results(json_out: bool = False) -> Console:
    """Where a verb's result goes: stdout, never folded (a wide page when piped).

    With `json_out` stdout carries the JSON, so the human result goes to stderr.
    """
    if json_out:
        return console
    return _Results(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 240)


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
EXIT_PIPE = 141  # 128 + SIGPIPE: what `yes | head -1` reports for `yes`

EXIT_TABLE: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success; the gate's PROMOTE"),
    (EXIT_NO, "the gate's REJECT; `simulate --fail-under RATE`: the pass rate fell below RATE"),
    (EXIT_INCONCLUSIVE, "the gate's INCONCLUSIVE"),
    (
        EXIT_USAGE,
        "a flag or argument is wrong, or the verb cannot apply: a bad value, a file or folder "
        "that does not exist, an id the ledger does not hold, nothing to roll back to (Click's "
        "own usage errors included)",
    ),
    (
        EXIT_DATA,
        "an input file is wrong: scenario, gate or loop config (its content, or a format its "
        "suffix does not name), scores file, receipt, model",
    ),
    (
        EXIT_NO_SIGNAL,
        "no training signal: nothing the algorithm can learn from (no passed session or "
        "demonstration for SFT, every GRPO group with equal rewards, no judged turn with a hint "
        "for OPSD); simulate more or warm-start",
    ),
    (
        EXIT_UNAVAILABLE,
        "a service is unavailable: the LLM server, a persona or a judge endpoint is gone or "
        "refused, the ledger stayed locked, an optional extra is missing",
    ),
    (
        EXIT_FAILURE,
        "the harness failed: episodes that could not run to their end, or an unexpected error",
    ),
    (
        EXIT_IO,
        "a file that exists could not be read or written: the ledger, `--out` (permissions, a "
        "full disk); a failed command creates no file or folder",
    ),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
    (
        EXIT_PIPE,
        "stdout was closed before the result was written (`head` or a pager quit early): "
        "128 + SIGPIPE, said quietly",
    ),
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

HELP_MARKUP = None
"""Every Typer app's `rich_markup_mode`: Click's plain help, which keeps flag names whole at 80
columns, prints `[webrtc]` as written (rich markup would eat the brackets) and shows no metavar
for a flag."""


def exit_code_for(error: BaseException) -> int:
    """The documented exit code of an error: its branch of the tree, else 70.

    An exception group (a task group's) has the code of the error it stands for (`first_error`).
    """
    error = first_error(error)
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
def cli_errors(json_out: bool = False) -> Iterator[None]:
    """Turn pipecat-rl (and file) errors into a one-line message and their exit code.

    With `json_out` the refusal is also a JSON document on stdout (`{"error", "exit_code"}`),
    so a script reading `--json` always gets one. An error a task group wrapped (a simulation's
    episodes run in one) is reported as itself (`first_error`): the group's own message names
    no cause and no fix.
    """
    try:
        yield
    except BrokenPipeError:
        raise  # the reader went away: `CLIGroup` ends quietly
    except (PipecatRLError, OSError) as e:
        fail(exit_code_for(e), _describe(e), json_out, e)
    except BaseExceptionGroup as group:
        error = first_error(group)
        if not isinstance(error, PipecatRLError | OSError) or isinstance(error, BrokenPipeError):
            raise  # a bug (one line and 70, in `CLIGroup`), a closed pipe or an interrupt
        fail(exit_code_for(error), _describe(error), json_out, error)


def fail(
    code: int, message: str, json_out: bool = False, cause: BaseException | None = None
) -> NoReturn:
    """Print `message` as the error line (and as JSON with `json_out`), then exit with `code`."""
    error_line(message)
    if json_out:
        print_json({"error": message, "exit_code": code})
    raise typer.Exit(code) from cause


def existing(path: Path, flag: str) -> Path:
    """`path` as given to `flag`; one that does not exist is a usage error naming both."""
    if not path.exists():
        raise ConfigError(f"{flag} {path}: no such file or directory")
    return path


def writable_folder(path: Path, flag: str) -> Path:
    """`path` as given to `flag`, somewhere to write; folders missing above it are fine.

    The writer makes them (as `mkdir -p`), so `--out receipts/v2` works on a fresh clone; only
    a file standing where a folder must be is refused, before the verb does any work.
    """
    for above in path.parents:  # nearest first; the first that exists decides
        if above.exists():
            if not above.is_dir():
                raise ConfigError(
                    f"{flag} {path}: {above} is not a folder; name a path under a folder"
                )
            break
    return path


@contextmanager
def new_ledger_kept_if_used(path: Path | str) -> Iterator["Ledger"]:
    """Open the ledger at `path`, created if need be; a failed command leaves no new file.

    When the block fails and the file is one this opened new and no session was recorded in
    it, the file goes again (with SQLite's -wal and -shm beside it).
    """
    from pipecat_rl.ledger import Ledger, ledger_file_missing

    new = ledger_file_missing(path)  # a server's database is never removed
    store = Ledger(path)
    try:
        with store:
            yield store
    except BaseException:
        if new and not _holds_sessions(path):
            for leftover in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm"))):
                leftover.unlink(missing_ok=True)
        raise


def _holds_sessions(path: Path) -> bool:
    from pipecat_rl.ledger import Ledger

    with Ledger(path) as store:
        return bool(store.sessions(limit=1))


_PARSERS = {".json": ("JSON", json.loads), ".yaml": ("YAML", yaml.safe_load),
            ".yml": ("YAML", yaml.safe_load)}  # fmt: skip


def config_file(path: Path, flag: str) -> Path:
    """A config file given to `flag`: it must exist and hold the format its suffix names.

    JSON is YAML, so a YAML reader takes a `.json` file holding YAML: the suffix decides. A file
    whose content is not its suffix's format is a wrong input file (exit 65), named.
    """
    existing(path, flag)
    kind, parse = _PARSERS.get(path.suffix.lower(), (None, None))
    if parse is None:
        raise ConfigError(f"{flag} {path}: name a .json, .yaml or .yml file")
    try:
        parse(path.read_text(encoding="utf-8"))
    except (ValueError, yaml.YAMLError) as e:  # JSONDecodeError, UnicodeDecodeError: ValueError
        fail(EXIT_DATA, f"{flag} {path}: not valid {kind} ({e}); fix it or rename it", cause=e)
    return path


_VERBOSE = re.compile(r"^(-v+|--verbose)$")


def verbose_first(args: list[str]) -> list[str]:
    """`args` with every `-v`/`--verbose` moved before the verb, so it may follow it."""
    end = args.index("--") if "--" in args else len(args)
    flags = [a for a in args[:end] if _VERBOSE.match(a)]
    return [*flags, *(a for a in args[:end] if not _VERBOSE.match(a)), *args[end:]]


class CLIGroup(TyperGroup):
    """The top-level group: one exit-code table and one error line for every verb."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """The group Typer built, every verb's parameters given a readable metavar."""
        super().__init__(*args, **kwargs)
        from pipecat_rl.cli.metavars import name_parameters

        name_parameters(self)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # noqa: D102 (see the class)
        return super().parse_args(ctx, verbose_first(list(args)))

    # Typer turns a closed pipe into exit 1 (the gate's REJECT): catch it before Typer does,
    # in parsing (eager options such as --version) and in the verb
    def make_context(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D102 (see the class)
        with _quiet_on_closed_pipe():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:  # noqa: D102 (see the class)
        with _quiet_on_closed_pipe():
            return super().invoke(ctx)

    def main(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D102 (see the class)
        standalone = kwargs.pop("standalone_mode", True)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
            sys.stdout.flush()  # a closed pipe shows here, not as a warning at exit
        except BrokenPipeError:
            code = _closed_pipe()
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


EXTRAS = {
    "torch": "cpu", "transformers": "cpu", "peft": "cpu", "gguf": "cpu", "vllm": "cpu",
    "faster_whisper": "cpu", "piper": "cpu", "matplotlib": "report", "fastapi": "service",
    "uvicorn": "service", "psycopg": "postgres", "psycopg_pool": "postgres", "ray": "ray",
    "aiortc": "webrtc",
}  # fmt: skip
"""The extra of pyproject.toml that installs each optional top-level package."""


def missing_extra(error: ImportError) -> str:
    """An import error in words, naming the extra and the pip command where one installs it."""
    text = str(error)
    top = (error.name or "").split(".")[0]
    if top not in EXTRAS or "pip install" in text:
        return text
    extra = EXTRAS[top]
    return f"{text}: it comes with pipecat-rl's `{extra}` extra: pip install 'pipecat-rl[{extra}]'"


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError) and not isinstance(error, PipecatRLError):
        where = f" {error.filename}" if error.filename else ""
        return f"cannot use{where}: {error.strerror or error}"
    if isinstance(error, ImportError):
        return missing_extra(error)
    return str(error)


@contextmanager
def _quiet_on_closed_pipe() -> Iterator[None]:
    try:
        yield
    except BrokenPipeError as e:
        raise typer.Exit(_closed_pipe()) from e


def _closed_pipe() -> int:
    """The reader closed stdout: say nothing, and let the exit not flush into it again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (a test runner's capture)
        pass
    return EXIT_PIPE


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


def _unexpected(raised: Exception) -> int:
    if verbosity >= 2:
        traceback.print_exception(raised, file=sys.stderr)
    error = first_error(raised)  # a task group's error is reported as itself
    if isinstance(error, PipecatRLError | OSError | ImportError):
        error_line(_describe(error))
    elif isinstance(error, UnicodeDecodeError):
        error_line(f"an input file is not UTF-8 text ({error}); save it as UTF-8")
    else:
        hint = "" if verbosity >= 2 else "; run with -vv for the traceback"
        error_line(f"unexpected {type(error).__name__}: {error}{hint} (please report it)")
    return exit_code_for(error)
