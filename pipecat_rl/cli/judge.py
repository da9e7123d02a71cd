"""`pipecat-rl judge`: the nightly LLM judge over live calls nobody has scored yet.

`pipecat-rl judge calibrate`: how far its verdicts agree with people's on the same calls.

Exit codes (`cli.common.EXIT_TABLE`): 0 when every call it took was judged (whatever the
verdicts); 64 for bad flags or a rubric that holds no valid criteria; 65 for a rubric file that
cannot be read or is not valid YAML; 69 for a judge endpoint that does not answer; 70 when some
calls could not be judged (they stay unscored).
`calibrate` exits 0 whatever κ is: it measures, and prints the rule the cycle would apply.
"""

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipecat_rl.cli.common import (
    EXIT_FAILURE,
    HELP_MARKUP,
    cli_errors,
    console,
    print_json,
    results,
)
from pipecat_rl.cli.ledger import LedgerOpt, open_ledger
from pipecat_rl.cli.llm import LLM_URL_ENV
from pipecat_rl.duels.calibration import JudgeCalibrationSettings
from pipecat_rl.errors import ConfigError
from pipecat_rl.loop.config import span_s

if TYPE_CHECKING:  # the judge imports Pipecat: only when a judge really runs
    from pipecat_rl.simulator.live_judge import JudgeReport


def parse_span(text: str, flag: str = "--since") -> float:
    """A span such as `24h`, `90m`, `7d` or `3600` (seconds) in seconds, given as `flag`.

    Raises:
        ConfigError: the text is not a span.
    """
    try:
        return float(span_s(text))
    except ValueError:
        raise ConfigError(
            f"{flag} {text!r}: give a span such as 24h, 90m, 7d or 3600 (seconds)"
        ) from None


def _summary(report: "JudgeReport", drafts: list[Path]) -> dict:
    return {
        "judged": len(report.calls), "passed": report.passed, "failed": report.failed,
        "unjudged": report.unjudged, "remaining": report.remaining,
        "calls": [
            {"session_id": c.session_id, "success": c.success, "metrics": c.metrics,
             "explanation": c.explanation, "error": c.error}
            for c in report.calls
        ],
        "drafts": [str(p) for p in drafts],
    }  # fmt: skip


judge_app = typer.Typer(
    help="Judge the live calls nobody scored (an LLM judge), or calibrate it against people.",
    invoke_without_command=True,
    rich_markup_mode=HELP_MARKUP,
)


@judge_app.callback()
def judge_command(
    ctx: typer.Context,
    rubric: Annotated[
        Path | None,
        typer.Option(
            "--rubric",
            help="The criteria: `success` and named `metrics` (Pipecat eval style).",
            show_default=False,
        ),
    ] = None,
    since: Annotated[
        str, typer.Option("--since", help="Calls started within this span: 24h, 90m, 7d, seconds.")
    ] = "24h",
    judge_llm_url: Annotated[
        str | None,
        typer.Option(
            "--judge-llm-url",
            envvar=LLM_URL_ENV,
            help=f"OpenAI-compatible server for the judge (default ${LLM_URL_ENV}).",
        ),
    ] = None,  # fmt: skip
    judge_model: Annotated[
        str | None, typer.Option("--judge-model", help="The judge's model (default base).")
    ] = None,
    max_calls: Annotated[
        int, typer.Option("--max-calls", min=1, help="Judge at most this many calls (a budget).")
    ] = 200,
    drafts: Annotated[
        Path | None,
        typer.Option(
            "--drafts",
            help="Write a scenario draft for review here from each failed, explained live call.",
            show_default=False,
        ),
    ] = None,
    ledger: LedgerOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")] = False,
) -> None:
    """Judge the live calls of the last --since that nobody scored, as scores from `judge`."""
    if ctx.invoked_subcommand is not None:
        return
    from pipecat_rl.loop.drafts import draft_from_live_failures
    from pipecat_rl.simulator.judge import check_reachable, resolve_endpoint
    from pipecat_rl.simulator.live_judge import judge_live, load_judge_rubric

    with cli_errors():
        if rubric is None:
            raise ConfigError("--rubric: name the judge's criteria file (or run `judge calibrate`)")
        span = parse_span(since)
        criteria = load_judge_rubric(rubric)
        endpoint = resolve_endpoint(
            None, flag_url=judge_llm_url, flag_model=judge_model, served_url=None,
            where="--rubric", flag="--judge-llm-url",
        )  # fmt: skip
        if endpoint is None:
            raise ConfigError(
                f"no judge: pass --judge-llm-url URL (any OpenAI-compatible server) or set "
                f"{LLM_URL_ENV}"
            )
        check_reachable([(endpoint, "--judge-llm-url")])
        started = time.time() - span
        with open_ledger(ledger) as store:
            todo = min(len(store.unscored_live_sessions(since=started)), max_calls)
            progress = Progress(
                TextColumn("judging"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=console, disable=json_out,
            )  # fmt: skip
            with progress:
                task = progress.add_task("calls", total=todo)
                report = asyncio.run(
                    judge_live(
                        store, criteria, endpoint, since=started, max_calls=max_calls,
                        on_call=lambda _: progress.advance(task),
                    )
                )  # fmt: skip
            written = []
            if drafts is not None:
                written = draft_from_live_failures(store, drafts, since=started)
    if json_out:
        print_json(_summary(report, written))
    else:
        console.print(
            f"judged {len(report.calls)} call(s): {report.passed} passed, {report.failed} failed, "
            f"{report.unjudged} without a verdict"
            + (f"; {report.remaining} more left for the next run (--max-calls)"
               if report.remaining else "")
        )  # fmt: skip
        for path in written:
            console.print(f"draft for review: {path}")
    if any(c.error for c in report.calls):
        raise typer.Exit(EXIT_FAILURE)


@judge_app.command("calibrate")
def calibrate_command(
    labels: Annotated[
        Literal["human"],
        typer.Option("--labels", help="Whose labels to compare with: human (scores, duels)."),
    ] = "human",
    min_labels: Annotated[
        int, typer.Option("--min-labels", min=2, help="The cycle's rule: labelled calls needed.")
    ] = JudgeCalibrationSettings().min_labels,
    min_kappa: Annotated[
        float,
        typer.Option("--min-kappa", min=-1.0, max=1.0, help="The rule: κ lower bound needed."),
    ] = JudgeCalibrationSettings().min_kappa,
    confidence: Annotated[
        float, typer.Option("--confidence", min=0.5, max=0.999, help="κ's interval level.")
    ] = JudgeCalibrationSettings().confidence,
    ledger: LedgerOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")] = False,
) -> None:
    """The judge against people's labels of the same calls: agreement, κ, the cycle's rule."""
    from pipecat_rl.duels.calibration import calibrate, kappa_text, refusal

    with cli_errors(json_out), open_ledger(ledger, read_only=True) as store:
        settings = JudgeCalibrationSettings(
            min_labels=min_labels, min_kappa=min_kappa, confidence=confidence
        )
        report = calibrate(store, confidence=confidence)
        why = refusal(report, settings)
    rule = why or (
        f"judge-scored calls may train: κ lower bound {report.kappa.low:.2f} >= {min_kappa:g} "
        f"on {report.kappa.n} calls"
    )
    if json_out:
        print_json({**report.model_dump(mode="json"), "labels": labels, "rule": rule,
                    "judge_may_train": why is None})  # fmt: skip
        return
    k = report.kappa
    out = results()
    out.print(
        f"{report.judged} call(s) judged, {report.human_labelled} labelled by people, {k.n} by both"
    )
    if k.n:
        out.print(f"agreement {k.agreement:.0%} ({k.n - len(report.disagreements)} of {k.n})")
        out.print(f"Cohen's κ {kappa_text(k)}")
        out.print("confusion (rows: judge, columns: people):")
        out.print("         " + "".join(f"{name:>8}" for name in k.labels))
        for name, row in zip(k.labels, k.confusion, strict=True):
            out.print(f"  {name:<7}" + "".join(f"{c:>8}" for c in row))
        for d in report.disagreements:
            why_human = d.human_explanation or ""
            out.print(
                f"  disagree {d.session_id}: judge {d.judge}, people {d.human} (by {d.human_via})"
                + (f": {why_human}" if why_human else "")
            )
    out.print(rule)


def register(app: typer.Typer) -> None:
    """Add the `judge` verb and its `calibrate`."""
    app.add_typer(judge_app, name="judge")
