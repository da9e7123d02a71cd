"""Every verb's help reads at 80 columns: no Python type where a metavar belongs.

Typer prints `<str>`, `<int range>` or `<list[Path]>` for a parameter that names no metavar
(issue 38); `cli.metavars` names every one. This walks the whole command tree, so a verb added
later is held to it without being listed here.
"""

import re

import pytest
import typer
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.cli.metavars import readable_metavar

WIDTH = 80
TYPE_SHAPED = re.compile(r"<[^>]*>|list\[|\bPath\b|\b(?:str|int|float|bool)\b range")
"""What Typer prints for a parameter's Python type: `<str>`, `<int range>`, `list[Path]`."""


def _commands() -> list[tuple[str, ...]]:
    """The path of every command and group, the top-level one first."""
    found: list[tuple[str, ...]] = []

    def walk(command, path: tuple[str, ...]) -> None:
        found.append(path)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            if not sub.hidden:
                walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return found


COMMANDS = _commands()


def test_the_walk_finds_every_verb_and_subcommand():
    assert {("gate",), ("simulate",), ("ledger", "export"), ("llm", "serve")} <= set(COMMANDS)
    assert len(COMMANDS) > 25


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "pipecat-rl")
def test_help_names_values_and_fits_80_columns(path):
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    typed = [line for line in lines if TYPE_SHAPED.search(line)]
    assert not typed, "a Python type where a metavar belongs:\n" + "\n".join(typed)
    # Click wraps help text; only a word longer than the space left (none today) may overflow.
    wide = [line for line in lines if len(line) > WIDTH]
    assert not wide, f"wider than {WIDTH} columns:\n" + "\n".join(wide)


def test_every_value_taking_parameter_has_a_metavar():
    root = typer.main.get_command(app)
    unnamed = []

    def walk(command, path: str) -> None:
        for param in getattr(command, "params", ()):
            takes_value = not (getattr(param, "is_flag", False) or getattr(param, "count", 0))
            if takes_value and not param.metavar:
                unnamed.append(f"{path} {param.name}")
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(root, "pipecat-rl")
    assert not unnamed


def test_a_metavar_written_beside_its_option_wins():
    root = typer.main.get_command(app)
    simulate = root.commands["simulate"]
    by_name = {p.name: p.metavar for p in simulate.params}
    assert by_name["junit"] == "FILE" and by_name["pattern"] == "GLOB"  # written there
    assert (by_name["llm_url"], by_name["concurrency"]) == ("URL", "N")  # derived
    assert by_name["transport"] == "[local|webrtc]"
    assert readable_metavar(simulate.params[0]) is None  # named already: left alone
