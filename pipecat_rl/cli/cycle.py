"""`pipecat-rl cycle --config loop.yaml`: one night-loop cycle, resumable, with its receipt.

Exit codes: the gate's (0 PROMOTE, 1 REJECT, 2 INCONCLUSIVE) when the cycle reached its verdict;
0 when it stopped resumably before one (budget, `--stop-after`); the usual codes for errors.
"""

import contextlib
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table

from pipecat_rl.cli.common import EXIT_OK, cli_errors, config_file, console, print_json, results
from pipecat_rl.cli.ledger import LedgerOpt
from pipecat_rl.cli.progress import ProgressMode, chosen
from pipecat_rl.loop.config import STAGES, load_loop_config

_STYLE = {"PROMOTE": "green", "REJECT": "red", "INCONCLUSIVE": "yellow"}


class _Progress:
    """The cycle as it goes, from its events.

    A live table of the stages on a terminal (`bar`), or one line per stage, call and training
    step when stderr is a file or pipe (`lines`): `make cycle > log` is never silent.
    """

    def __init__(self, mode: ProgressMode):
        self.mode = chosen(mode)
        self.status: dict[str, str] = {s: "·" for s in STAGES}
        self.detail = ""
        self.calls = 0
        self.live = Live(self._render(), console=console) if self.mode == "bar" else (
            contextlib.nullcontext()
        )  # fmt: skip

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
            self.status[stage], self.detail, self.calls = "running", "", 0
        elif event == "stage_finished":
            self.status[stage] = f"[green]done[/green] {data['result']['wall_s']:.0f} s"
        elif event == "call_finished":
            self.calls += 1
            self.detail = f"{self.calls} call(s)"
        elif event in ("server_starting", "demonstrations", "train_progress"):
            self.detail = event.replace("_", " ")
        if self.mode == "bar":
            self.live.update(self._render())
        elif self.mode == "lines" and (line := _line(event, data, self.calls)):
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def _line(event: str, data: dict, calls: int) -> str | None:
    """One event as a line of `--progress lines`, or None for an event not worth one."""
    if event == "stage_started":
        return f"cycle: {data['stage']} started"
    if event == "stage_finished":
        return f"cycle: {data['stage']} done in {data['result']['wall_s']:.0f} s"
    if event == "call_finished":
        return (
            f"cycle: call {calls}: {data['scenario']}#{data['repeat']} {data['outcome']} "
            f"({data['duration_s']:.1f} s)"
        )
    if event == "train_progress" and "step" in data and "loss" in data:
        total = f"/{data['total_steps']}" if data.get("total_steps") else ""
        return f"cycle: train step {data['step']}{total}, loss {data['loss']:.4g}"
    if event in ("server_starting", "server_ready", "demonstrations", "budget_exhausted"):
        shown = {k: v for k, v in data.items() if k not in ("at", "stage")}
        return f"cycle: {event.replace('_', ' ')} {json.dumps(shown, default=str)}"
    return None


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
    progress_mode: Annotated[
        ProgressMode,
        typer.Option(
            "--progress",
            help="auto: a live table on a terminal, else one line per stage, call and training "
            "step (on stderr); bar, lines or none to choose.",
        ),
    ] = "auto",
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

        progress = _Progress("none" if json_out else progress_mode)
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
