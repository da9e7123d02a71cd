"""Every `pipecat-rl` command the README and the reference pages show parses with today's CLI.

Each fenced shell block is split into commands (`\\` continuations and quotes spanning lines
joined, comments dropped, `$(pipecat-rl ...)` substitutions included) and each `pipecat-rl`
invocation runs through the real command tree with every verb's body stubbed out: an option that
was renamed or removed, a value out of its range or a verb that no longer exists fails here,
naming the page, the line and the command, and the README needs no server or hours to check.
Placeholders (`$CALL_ID`, `<id>`) become a dummy word; paths need not exist (none of the verbs
checks a path while parsing).
"""

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.core import TyperGroup

from pipecat_rl.cli import app
from pipecat_rl.cli.common import EXIT_OK, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_FENCE = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.S | re.M)
SUBSTITUTION = re.compile(r"\$\(([^()]*)\)")
PLACEHOLDER = re.compile(r"\$\{?[A-Z_][A-Z0-9_]*\}?|<[a-z][\w-]*>")
DUMMY = "placeholder-1"
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")


@dataclass(frozen=True)
class Shown:
    """One `pipecat-rl` command as a page shows it."""

    page: str
    line: int
    text: str

    @property
    def args(self) -> list[str]:
        """Its arguments after `pipecat-rl`, placeholders filled in."""
        words = shlex.split(PLACEHOLDER.sub(DUMMY, self.text), comments=True)
        return words[words.index("pipecat-rl") + 1 :]


def _quotes_closed(command: str) -> bool:
    """Whether `command` leaves no quote open (a JSON body may span lines)."""
    try:
        shlex.split(command, comments=True)
    except ValueError:
        return False
    return True


def _commands(text: str, first_line: int) -> list[tuple[int, str]]:
    """A block's commands with the line each starts on: continuations joined, `$(...)` unnested."""
    found, pending, start = [], "", first_line
    for number, line in enumerate(text.splitlines(), first_line):
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        pending += line
        if not _quotes_closed(pending):
            pending += "\n"
            continue
        command, pending = pending.strip(), ""
        found += [(start, inner) for inner in SUBSTITUTION.findall(command)]
        found.append((start, SUBSTITUTION.sub(DUMMY, command)))
    return found


def shown_commands() -> list[Shown]:
    """Every `pipecat-rl` invocation in a shell block of the README or docs/, in page order."""
    shown = []
    for page in PAGES:
        text = page.read_text()
        for block in SHELL_FENCE.finditer(text):
            first = text[: block.start(1)].count("\n") + 1
            for line, command in _commands(block.group(1), first):
                words = shlex.split(PLACEHOLDER.sub(DUMMY, command), comments=True)
                while words and ASSIGNMENT.match(words[0]):
                    words.pop(0)  # `VAR=value pipecat-rl ...`
                if words[:1] == ["pipecat-rl"]:
                    shown.append(Shown(page.relative_to(ROOT).as_posix(), line, command.strip()))
    return shown


@pytest.fixture
def cli() -> Callable[[list[str]], tuple[int, list[str]]]:
    """`pipecat-rl` as users run it, every verb's body replaced by a note of its name.

    So a command is parsed by the real tree (the top-level group's `-v` handling, every type
    and callback of every option) and runs nothing: `(exit code, verbs reached)`.
    """
    reached: list[str] = []
    root = typer.main.get_command(app)  # a fresh tree: nothing else sees the stubs

    def stub(command: Any, path: str) -> None:
        if not isinstance(command, TyperGroup) or command.invoke_without_command:
            command.callback = lambda **_: reached.append(path)  # a verb (`judge` is one too)
        for name, sub in getattr(command, "commands", {}).items():
            stub(sub, f"{path} {name}")

    stub(root, "pipecat-rl")

    def run(args: list[str]) -> tuple[int, list[str]]:
        reached.clear()
        return root.main(list(args), prog_name="pipecat-rl", standalone_mode=False), reached

    return run


COMMANDS = shown_commands()


def test_the_pages_show_commands_to_check():
    pages = {c.page for c in COMMANDS}
    assert "README.md" in pages and len(COMMANDS) >= 40, [c.text for c in COMMANDS]
    joined = [c for c in COMMANDS if c.text.startswith("pipecat-rl simulate examples")]
    assert any("--persona scripted" in c.text for c in joined)  # a continuation was joined


def test_a_block_splits_into_the_commands_a_shell_would_run():
    block = (
        "export KEY=$(openssl rand -hex 16)\n"
        "A=1 pipecat-rl simulate s/ --bot b.py \\\n"
        "    --persona scripted   # a comment with a quote: don't\n"
        'curl -d \'{"a": 1,\n  "b": 2}\' localhost\n'
        "PIPECAT_SETUP_FILES=$(pipecat-rl setup-file) python bot.py\n"
    )
    commands = _commands(block, 10)
    assert [line for line, _ in commands] == [10, 10, 11, 13, 15, 15]  # `$(...)` first
    assert commands[2][1].split() == [
        "A=1", "pipecat-rl", "simulate", "s/", "--bot", "b.py", "--persona", "scripted", "#",
        "a", "comment", "with", "a", "quote:", "don't",
    ]  # fmt: skip
    assert commands[4][1] == "pipecat-rl setup-file"


@pytest.mark.parametrize("shown", COMMANDS, ids=[f"{c.page}:{c.line}" for c in COMMANDS])
def test_each_shown_command_parses(shown: Shown, cli, capsys):
    code, reached = cli(shown.args)
    error = capsys.readouterr().err.strip()
    where = f"{shown.page}:{shown.line}: `{shown.text}`"
    assert code == EXIT_OK, f"{where} no longer parses (exit {code}): {error}"
    assert reached or shown.args == ["--version"], f"{where} names no verb"


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "scenarios/", "--no-such-flag"],
        ["ledger", "shw", "call-1"],
        ["llm", "serve", "--port", "70000"],
        ["simulate", "scenarios/", "--progress", "sometimes"],
    ],
)
def test_a_command_that_no_longer_parses_is_caught(args: list[str], cli, capsys):
    code, reached = cli(args)
    assert code == EXIT_USAGE and reached == []
    assert capsys.readouterr().err.startswith("error: ")
