"""`pipecat-rl scenarios list`: what scenario files and folders hold, templates expanded.

Loads PATHs as `simulate`, `gate`, `train` and `cycle` do (`load_scenarios`), so what it lists is
what they run: each scenario's id, the template and axis values it was expanded from
(`scenarios.matrix`), its level, whether it is guarded (`Scenario.guarded`) and its split,
then the counts. Exit 65 for a bad file, 64 for a path that does not exist.
"""

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from pipecat_rl.cli.common import (
    HELP_MARKUP,
    cli_errors,
    existing,
    print_json,
    print_table,
    results,
)
from pipecat_rl.cli.sampling import SampleByOpt, SampleOpt, sampled
from pipecat_rl.scenarios import HELDOUT, Scenario, load_scenarios
from pipecat_rl.scenarios.matrix import scenario_level, split_id

scenarios_app = typer.Typer(
    help="Inspect scenario files: what they hold, templates expanded.",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
)


def row(scenario: Scenario) -> dict[str, Any]:
    """One scenario as `scenarios list --json` prints it."""
    parsed = split_id(scenario.id)
    return {
        "id": scenario.id,
        "template": parsed[0] if parsed else None,
        "axes": parsed[1] if parsed else None,
        "level": scenario_level(scenario),
        "guarded": scenario.guarded,
        "split": scenario.split,
        "hash": scenario.content_hash(),
        "file": str(scenario.source_path) if scenario.source_path else None,
    }


def counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """The summary: scenarios in all, guarded ones, held-out ones."""
    return {
        "total": len(rows),
        "guarded": sum(r["guarded"] for r in rows),
        "heldout": sum(r["split"] == HELDOUT for r in rows),
    }


@scenarios_app.command("list")
def list_scenarios(
    paths: Annotated[
        list[Path],
        typer.Argument(metavar="PATH", help="Scenario files or folders (searched recursively)."),
    ],
    sample: SampleOpt = None,
    sample_by: SampleByOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the scenarios in PATHs, templates expanded.

    Each with its id, template, axes, level, whether it is guarded, and its split; then the
    counts (total, guarded, held out). With --sample N, the scenarios a loop's `heldout_sample`
    (or `simulate --sample N`) runs.
    """
    with cli_errors(json_out):
        loaded = sampled(
            load_scenarios([existing(path, "PATH") for path in paths]), sample, sample_by
        )
        rows = [row(s) for s in loaded]
    summary = counts(rows)
    if json_out:
        print_json({"scenarios": rows, "counts": summary})
        return
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for name in ("id", "template", "axes", "level", "guarded", "split"):
        # ids are copied whole: never wrapped, never cut (`print_table`)
        table.add_column(name, no_wrap=True, justify="right" if name == "level" else "left")
    for r in rows:
        axes = ",".join(f"{a}={v}" for a, v in r["axes"].items()) if r["axes"] else "-"
        table.add_row(
            escape(r["id"]),
            escape(r["template"] or "-"),
            escape(axes),
            "-" if r["level"] is None else str(r["level"]),
            "yes" if r["guarded"] else "no",
            r["split"],
        )
    out = results()
    print_table(out, table)
    out.print(
        f"{summary['total']} scenarios: {summary['guarded']} guarded, "
        f"{summary['heldout']} held out",
        markup=False,
    )


def register(app: typer.Typer) -> None:
    """Add the `scenarios` group."""
    app.add_typer(scenarios_app, name="scenarios")
