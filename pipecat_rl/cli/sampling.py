"""`--sample N [--sample-by AXIS]`: a fixed, stratified sample of the scenarios.

Shared by `scenarios list` (to see it), `simulate` and `gate` (to run it), as a loop's
`heldout_sample` is.
"""

from typing import Annotated

import typer

from pipecat_rl.errors import ScenarioError
from pipecat_rl.scenarios import ScenarioSet
from pipecat_rl.scenarios.sampling import stratified_sample

SampleOpt = Annotated[
    int | None,
    typer.Option(
        "--sample",
        metavar="N",
        min=1,
        help="Run (or list) a fixed sample of N scenarios, spread evenly over their axes; the "
        "same files and N give the same scenarios everywhere (default: all of them).",
    ),
]
SampleByOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--sample-by",
        metavar="AXIS",
        help="With --sample: draw each combination of these axes once before any twice "
        "(repeat it: --sample-by style --sample-by task).",
    ),
]


def sampled(loaded: ScenarioSet, size: int | None, by: list[str] | None) -> ScenarioSet:
    """`loaded`, or its `--sample` (a usage error naming the flag for an axis they lack)."""
    if size is None:
        if by:
            raise typer.BadParameter("--sample-by needs --sample N", param_hint="--sample-by")
        return loaded
    try:
        return stratified_sample(loaded, size, by=by or (), what="--sample-by")
    except ScenarioError as e:
        why = str(e).removeprefix("--sample-by: ")
        raise typer.BadParameter(why, param_hint="--sample-by") from None
