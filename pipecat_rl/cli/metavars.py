"""A metavar a person reads, for every option and argument that does not name its own.

Typer prints a parameter's Python type where no metavar is given (`--ledger <str>`,
`SCENARIO... <list[Path]>`), and after an argument even where one is. `name_parameters` gives
each option and argument of the command tree a metavar from one vocabulary (`N`, `MS`,
`SECONDS`, `FILE`, `DIR`, `URL`, `NAME`, `[a|b]` for a choice), so the same kind of value reads
the same in every verb, a verb defined elsewhere included. A metavar written beside the option
wins. `CLIGroup` applies it when Typer builds the command tree; `tests/test_cli_help.py` walks
every verb's help at 80 columns.

This leans on Typer's own parameter classes (`TyperArgument`, `type_descriptor`): an upgrade
that changes them breaks that test, not a user's help page.
"""

from pathlib import Path
from typing import Any

from typer.core import TyperArgument

_BY_NAME = {
    # names of things
    "candidate": "NAME", "incumbent": "NAME", "adapter": "NAME", "parent": "NAME",
    "policy": "NAME", "name": "NAME", "merged": "ADAPTER", "scenario": "ID", "session": "ID",
    "heldout_set": "ID", "external_id": "ID", "stop_after": "STAGE", "dest": "LEDGER",
    "since": "DURATION", "live_since": "DURATION", "live_settle": "DURATION",
    "message": "TEXT", "explanation": "TEXT", "value": "SCORE", "api_key": "KEY",
    "ray_address": "URL", "live_sources": "SOURCE", "fmt": "FORMAT",
    # numbers with a role
    "port": "PORT", "seed": "SEED",
}  # fmt: skip
"""Metavars by parameter name, where the last word of the name is not the reader's noun."""

_PATHS = {
    "out": "DIR", "data_dir": "DIR", "drafts": "DIR", "path": "DIR", "config": "FILE",
    "rubric": "FILE", "scores": "FILE", "gap_html": "FILE", "source": "FILE",
}  # fmt: skip
"""Path parameters by name: a file or a folder (DIR); any other path is a PATH (either)."""

_UNITS = {"ms": "MS", "s": "SECONDS", "kb": "KB", "gb": "GB"}


def readable_metavar(param: Any) -> str | None:
    """The metavar `param` should show, or None: it names its own, or is a flag (no value)."""
    if param.metavar is not None or getattr(param, "is_flag", False) or getattr(param, "count", 0):
        return None
    desc = param.type_descriptor
    name = param.name or ""
    if desc.is_choice and desc.choices is not None:
        return "[" + "|".join(str(getattr(c, "value", c)) for c in desc.choices) + "]"
    element = desc.annotation.__args__[0] if desc.is_list else desc.annotation
    if desc.is_path or element is Path:
        return _PATHS.get(name, "PATH")
    if name in _BY_NAME:
        return _BY_NAME[name]
    last = name.rsplit("_", 1)[-1]
    if element in (int, float):
        return _UNITS.get(last, "N" if element is int else "NUMBER")
    return last.upper() or None


class _NamedArgument(TyperArgument):
    """An argument whose help line shows its metavar alone, as Click's own do."""

    def display_type_rich(self, ctx: Any) -> str | None:  # noqa: D102 (see the class)
        return None

    def get_help_record(self, ctx: Any) -> tuple[str, str] | None:  # noqa: D102 (see the class)
        record = super().get_help_record(ctx)
        if record is None or self.nargs == 1 or record[0].endswith("..."):
            return record
        return f"{record[0]}...", record[1]  # as many as given: say so


def name_parameters(command: Any) -> None:
    """Give every option and argument of `command` and its subcommands a readable metavar."""
    for param in getattr(command, "params", ()):
        if isinstance(param, TyperArgument):
            param.metavar = param.metavar or (param.name or "value").upper()
            param.__class__ = _NamedArgument
        elif (metavar := readable_metavar(param)) is not None:
            param.metavar = metavar
    for sub in getattr(command, "commands", {}).values():
        name_parameters(sub)
