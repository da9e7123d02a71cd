"""`pipecat-rl cycle --config loop.yaml`: one night-loop cycle, resumable, with its receipt.

Exit codes: the gate's (0 PROMOTE, 1 REJECT, 2 INCONCLUSIVE) when the cycle reached its verdict;
0 when it stopped resumably before one (budget, `--stop-after`); the usual codes for errors.
"""

import contextlib
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table

from pipecat_rl.cli.common import EXIT_OK, cli_errors, config_file, console, print_json, results
from pipecat_rl.cli.ledger import LedgerOpt
from pipecat_rl.loop.config import STAGES, load_loop_config

_STYLE = {"PROMOTE": "green", "REJECT": "red", "INCONCLUSIVE": "yellow"}


class _Progress:
    """A live table of the stages: done (with wall time), running, to do."""

    def __init__(self, enabled: bool):
        self.status: dict[str, str] = {s: "·" for s in STAGES}
        self.detail = ""
        self.enabled = enabled
        self.live = Live(self._render(), console=console) if enabled else contextlib.nullcontext()

    def _render(self):
        table = Table(title="cycle", title_justify="left", show_header=False, box=None)
        for stage in STAGES:
            mark = self.status[stage]
            cell = Spinner("dots", text=self.detail) if mark == "running" else mark
            table.add_row(stage, cell)
        return table

    def __call__(self, event: str, data: dict) -> None:
        stage = data.get("stage")
        if event == "stage_started":
            self.status[stage], self.detail = "running", ""
        elif event == "stage_finished":
            self.status[stage] = f"[green]done[/green] {data['result']['wall_s']:.0f} s"
        elif event in ("server_starting", "demonstrations", "train_progress"):
            self.detail = event.replace("_", " ")
        if self.enabled:
            self.live.update(self._render())


def cycle_command(
    config: Annotated[Path, typer.Option("--config", help="The loop file (loop.yaml).")],
    budget_s: Annotated[
        float | None, typer.Option("--budget-s", help="Wall-time budget of this run (seconds).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="The cycle's folder (default: the loop file's `out`).")
    ] = None,
    llm_url: Annotated[
        str | None, typer.Option("--llm-url", help="A running vLLM (default: start one).")
    ] = None,
    model: Annotated[str | None, typer.Option(help="The base model (default: the file's).")] = None,
    ledger: LedgerOpt = None,
    incumbent: Annotated[
        str | None,
        typer.Option(help="Start from and gate against this registered adapter (default: live)."),
    ] = None,
    stop_after: Annotated[
        str | None, typer.Option(help=f"Stop, resumably, after this stage ({', '.join(STAGES)}).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Run (or resume) one cycle: snapshot, preflight, filter, train, evaluate + gate, promote."""
    with cli_errors(json_out):
        overrides = {
            k: v
            for k, v in dict(
                budget_s=budget_s,
                out=out,
                llm_url=llm_url,
                model=model,
                stop_after=stop_after,
                ledger=ledger,
                incumbent=incumbent,
            ).items()
            if v is not None
        }
        loop = load_loop_config(config_file(config, "--config"), **overrides)
        from pipecat_rl.loop.cycle import run_cycle

        progress = _Progress(enabled=not json_out)
        with progress.live:
            summary = run_cycle(loop, emit=progress)
    if json_out:
        print_json(summary.model_dump(mode="json"))
    out = results(json_out)
    out.print(f"cycle {summary.state}: {summary.reason}", markup=False)
    if summary.verdict is None:
        out.print(f"events: {Path(summary.out) / 'events.jsonl'}", markup=False)
        raise typer.Exit(EXIT_OK)
    evaluated = summary.stages["evaluate"]
    style = _STYLE.get(summary.verdict, "white")
    out.print(
        f"[bold {style}]{summary.verdict}[/bold {style}] {evaluated['candidate']} vs "
        f"{evaluated['incumbent']}: mean delta {evaluated['mean_delta']:+.3f}, 95% CI "
        f"[{evaluated['ci95'][0]:+.3f}, {evaluated['ci95'][1]:+.3f}]"
    )
    out.print(f"receipt: {summary.receipt_html}", markup=False)
    raise typer.Exit(evaluated["exit_code"])


def register(app: typer.Typer) -> None:
    """Add the top-level `cycle` command."""
    app.command("cycle")(cycle_command)
