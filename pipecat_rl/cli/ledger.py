"""`pipecat-rl ledger`: look inside the ledger (stats, sessions, one transcript), export it, score.

`score` is the CLI face of the service's `POST /sessions/{call_id}/scores` (`Ledger.post_score`).
"""

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pipecat_rl.cli.common import HELP_MARKUP, cli_errors, console, print_json
from pipecat_rl.errors import ConfigError, ScoreRefusedError
from pipecat_rl.ledger import (
    LEDGER_ENV,
    LatencyRecord,
    Ledger,
    NotInLedgerError,
    ScoreIn,
    ToolCallRecord,
    TurnRecord,
    resolve_ledger_path,
)
from pipecat_rl.ledger.scores import MAX_EXPLANATION_CHARS

ledger_app = typer.Typer(
    help="Inspect and export the ledger (sessions, turns, tool calls, latencies, adapters).",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
)

LedgerOpt = Annotated[
    Path | None,
    typer.Option(
        "--ledger",
        help=f"Ledger file (default: ${LEDGER_ENV}, else ./pipecat-rl.db).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")]

_SOURCES = ("live", "simulate", "gate")
_SPLITS = ("pool", "heldout")


@contextmanager
def open_ledger(path: Path | None) -> Iterator[Ledger]:
    """Open an existing ledger; a missing file is a usage error, never silently created here."""
    resolved = resolve_ledger_path(path)
    if not resolved.exists():
        raise ConfigError(
            f"no ledger at {resolved}; pass --ledger PATH or set {LEDGER_ENV} "
            "(a ledger is created when a bot or the simulator first records a session)"
        )
    ledger = Ledger(resolved)
    try:
        yield ledger
    except NotInLedgerError as e:
        raise ConfigError(str(e)) from e
    finally:
        ledger.close()


def _choice(name: str, value: str | None, allowed: tuple[str, ...]) -> str | None:
    if value is not None and value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    return value


def _when(ts: float | None, short: bool = False) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts).strftime("%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}".rstrip("0").rstrip(".")


def _stdout() -> Console:
    """Console for a verb's output: a wide page when piped, so rows are never folded."""
    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 240)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


@ledger_app.command("stats")
def stats(ledger: LedgerOpt = None, json_out: JsonOpt = False) -> None:
    """Counts per table, sessions by source and split, and how many turns can train."""
    with cli_errors(), open_ledger(ledger) as store:
        data = store.stats()
    if json_out:
        print_json(data)
        return
    out = _stdout()
    out.print(f"[bold]ledger[/bold] {escape(data['path'])} (schema v{data['schema_version']})")
    for table, n in data["counts"].items():
        out.print(f"  {table:<14} {n}")
    sources = ", ".join(f"{k} {v}" for k, v in sorted(data["sessions_by_source"].items()))
    splits = ", ".join(f"{k} {v}" for k, v in sorted(data["sessions_by_split"].items()))
    out.print(f"  sessions by source: {sources or '-'}")
    out.print(f"  sessions by split:  {splits or '-'}")
    out.print(f"  token-exact turns:  {data['token_exact_turns']}")
    out.print(f"  training-eligible turns: {data['training_eligible_turns']}")
    live = data["live_sessions"]
    out.print(
        f"  live sessions: {live['unscored']} unscored, {live['scored']} scored "
        f"({live['trainable']} trainable)"
    )
    out.print(f"  live: {escape(data['live'] or 'nothing promoted yet')}")


@ledger_app.command("sessions")
def sessions(
    source: Annotated[
        str | None, typer.Option(help="live, simulate or gate.", show_default=False)
    ] = None,
    split: Annotated[str | None, typer.Option(help="pool or heldout.", show_default=False)] = None,
    policy: Annotated[
        str | None, typer.Option(help="Adapter or base model served.", show_default=False)
    ] = None,
    scenario: Annotated[str | None, typer.Option(help="Scenario id.", show_default=False)] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many, newest first.")] = 50,
    ledger: LedgerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List sessions, newest first, with their scenario, policy, outcome and reward."""
    with cli_errors(), open_ledger(ledger) as store:
        rows = store.sessions(
            source=_choice("--source", source, _SOURCES),
            split=_choice("--split", split, _SPLITS),
            policy=policy,
            scenario_id=scenario,
            limit=limit,
        )
    if json_out:
        print_json([s.model_dump(mode="json") for s in rows])
        return
    if not rows:
        console.print("no sessions match")
        return
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("id", overflow="fold")
    table.add_column("started", no_wrap=True)
    table.add_column("source", no_wrap=True)
    table.add_column("scenario", overflow="fold")
    table.add_column("policy", overflow="fold")
    table.add_column("outcome", overflow="fold")
    table.add_column("reward", no_wrap=True, justify="right")
    table.add_column("labels", overflow="fold")
    for s in rows:
        scenario = (s.scenario_id or "-") + (f" ({s.split})" if s.split else "")
        table.add_row(
            escape(s.id),
            _when(s.started_at, short=True),
            s.source,
            escape(scenario),
            escape(s.policy or "-"),
            escape(s.outcome or "-"),
            _num(s.reward),
            escape(", ".join(s.failure_labels) or "-"),
        )
    _stdout().print(table)


def _text(content: Any) -> str:
    """The text of an OpenAI message content (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return "" if content is None else str(content)


def _user_messages(turn: TurnRecord) -> list[str]:
    messages = turn.request.get("messages") or []
    return [
        _text(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") == "user"
    ]


def _latency_line(lat: LatencyRecord) -> str:
    parts = [
        f"endpointing {_ms(lat.endpointing_ms)}",
        f"STT {_ms(lat.stt_ms)}",
        f"TTFT {_ms(lat.llm_ttft_ms)}",
        f"TTS TTFB {_ms(lat.tts_ttfb_ms)}",
        f"v2v {_ms(lat.v2v_ms)}",
    ]
    if lat.heard_gap_ms is not None:
        parts.append(f"heard {_ms(lat.heard_gap_ms)}")
    if lat.interrupted:
        parts.append("interrupted")
    return f"    [dim]latency (user turn {lat.user_turn}):[/dim] " + " · ".join(parts)


def _tool_line(call: ToolCallRecord) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items())
    head = f"    [cyan]tool[/cyan] {escape(call.name)}({escape(args)})"
    if call.error is not None:
        tail = f" [red]error:[/red] {escape(call.error)}"
    else:
        tail = f" → {escape(repr(call.result))}"
    took = "" if call.duration_ms is None else f" [dim]({call.duration_ms:.0f} ms)[/dim]"
    return head + tail + took


def _print_transcript(out: Console, store: Ledger, session_id: str) -> None:
    s = store.session(session_id)
    turns = store.turns(session_id)
    calls = store.tool_calls(session_id)
    lats = {lat.user_turn: lat for lat in store.latencies(session_id)}
    scores = store.scores(session_id)

    out.print(f"[bold]session {escape(s.id)}[/bold] ({s.source})")
    scenario = escape((s.scenario_id or "-") + (f" [{s.split}]" if s.split else ""))
    out.print(
        f"  scenario {scenario}   policy {escape(s.policy or '-')}"
        + (f"   seed {s.seed}" if s.seed is not None else "")
        + (f"   repeat {s.repeat}" if s.repeat is not None else "")
    )
    out.print(f"  started {_when(s.started_at)}   ended {_when(s.ended_at)}")
    parts = ", ".join(f"{k} {_num(v)}" for k, v in s.reward_parts.items())
    out.print(
        f"  outcome {escape(s.outcome or '-')}   reward {_num(s.reward)}"
        + (f" ({escape(parts)})" if parts else "")
    )
    out.print(f"  labels {escape(', '.join(s.failure_labels) or '-')}")
    if s.excluded_from_training or not s.consent:
        flags = [
            f
            for f, on in (
                ("excluded from training", s.excluded_from_training),
                ("no consent", not s.consent),
            )
            if on
        ]
        out.print(f"  [yellow]{', '.join(flags)}[/yellow]")
    if scores:
        out.print("  scores " + ", ".join(f"{escape(x.name)} {_num(x.value)}" for x in scores))

    shown_latency: set[int] = set()
    for turn in turns:
        user = _user_messages(turn)
        out.print()
        tokens = f"tokens {len(turn.prompt_token_ids or [])}→{len(turn.completion_token_ids or [])}"
        exact = "[green]token-exact[/green]" if turn.token_exact else "[dim]text only[/dim]"
        out.print(
            f"[bold]turn {turn.index}[/bold]  adapter {escape(turn.adapter or '-')}  "
            f"{tokens}  {exact}" + ("  [dim]redacted[/dim]" if turn.redacted else "")
        )
        if user:
            out.print(f"    [magenta]user:[/magenta] {escape(user[-1])}")
        said = turn.generated_text
        if not said and turn.tool_calls:
            names = ", ".join(
                str(c.get("name") or c.get("function", {}).get("name", "?"))
                for c in turn.tool_calls
            )
            said = f"(calls {names})"
        out.print(f"    [blue]bot:[/blue]  {escape(said)}")
        if turn.spoken_text is not None and (
            turn.spoken_text != turn.generated_text or turn.interrupted
        ):
            mark = " [yellow](interrupted)[/yellow]" if turn.interrupted else ""
            out.print(f"    [blue]spoken:[/blue] {escape(turn.spoken_text)}{mark}")
        elif turn.interrupted:
            out.print("    [yellow](interrupted)[/yellow]")
        for call in calls:
            if call.turn_index == turn.index:
                out.print(_tool_line(call))
        user_turn = len(user) - 1
        if user_turn in lats and user_turn not in shown_latency:
            shown_latency.add(user_turn)
            out.print(_latency_line(lats[user_turn]))

    loose = [
        c for c in calls if c.turn_index is None or c.turn_index not in {t.index for t in turns}
    ]
    unshown = [lat for k, lat in sorted(lats.items()) if k not in shown_latency]
    if loose or unshown:
        out.print()
        out.print("[bold]not attached to a turn[/bold]")
        for call in loose:
            out.print(_tool_line(call))
        for lat in unshown:
            out.print(_latency_line(lat))


@ledger_app.command("show")
def show(
    session_id: Annotated[str, typer.Argument(metavar="ID", help="A session id.")],
    ledger: LedgerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Print one session as a transcript: turns, tool calls, token counts and latencies."""
    with cli_errors(), open_ledger(ledger) as store:
        if json_out:
            print_json(store.session_bundle(session_id))
        else:
            _print_transcript(_stdout(), store, session_id)


@ledger_app.command("export")
def export(
    fmt: Annotated[str, typer.Option("--format", help="Output format (jsonl).")] = "jsonl",
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write to this file (default: stdout).", show_default=False),
    ] = None,
    session: Annotated[
        list[str] | None,
        typer.Option(
            "--session", help="Export only this session id (repeatable).", show_default=False
        ),
    ] = None,
    ledger: LedgerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Export sessions, each with its turns, tool calls, latencies and scores, one per line.

    With --json and --out, prints {"count", "out"} on stdout once the file is written.
    """
    with cli_errors(), open_ledger(ledger) as store:
        if fmt != "jsonl":
            raise ConfigError(f"--format must be jsonl, not {fmt!r}")
        if out is None:
            count = store.export_jsonl(sys.stdout, session_ids=session or None)
            sys.stdout.flush()
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("w", encoding="utf-8") as f:
                count = store.export_jsonl(f, session_ids=session or None)
    if out is not None and json_out:
        print_json({"count": count, "out": str(out)})
    else:
        console.print(f"exported {count} session(s)" + (f" to {out}" if out else ""))


@ledger_app.command("score")
def score(
    call_id: Annotated[str, typer.Argument(metavar="CALL_ID", help="The call's (session's) id.")],
    value: Annotated[str, typer.Option("--value", help="A score in [0, 1], or pass / fail.")],
    metric: Annotated[
        str, typer.Option("--metric", help="The metric; `success` decides whether a call passed.")
    ] = "success",
    source: Annotated[
        str, typer.Option("--source", help="Who scored it: human, coval, pipecat-evals, judge, ...")
    ] = "human",
    explanation: Annotated[
        str | None,
        typer.Option(
            "--explanation",
            help=f"Why (the first {MAX_EXPLANATION_CHARS} characters are kept).",
            show_default=False,
        ),
    ] = None,
    external_id: Annotated[
        str | None,
        typer.Option("--external-id", help="The scorer's own id for it.", show_default=False),
    ] = None,
    ledger: LedgerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Score a call by its id, as the service's POST /sessions/{call_id}/scores does.

    Posting the same (metric, source) again replaces the first score. A gate run, a held-out
    session or a call still in progress is refused (exit 64).
    """
    from pipecat_rl.service.scores import ScorePosted

    with cli_errors(), open_ledger(ledger) as store:
        try:
            given = ScoreIn(
                metric=metric, value=value, source=source, explanation=explanation,
                external_id=external_id,
            )  # fmt: skip
            posted = store.post_score(call_id, given)
        except ValidationError as e:
            raise ConfigError("; ".join(err["msg"] for err in e.errors())) from e
        except ScoreRefusedError as e:
            raise ConfigError(str(e)) from e
    if json_out:
        print_json(ScorePosted.of(call_id, posted).model_dump(mode="json"))
        return
    verdict = f"outcome {posted.outcome or '-'}" + (
        f", decided by {posted.decided_by}" if posted.decided_by else ""
    )
    action = "stored" if posted.created else "replaced"
    console.print(
        f"{action} {escape(metric)} = {_num(given.value)} ({escape(source)}) for "
        f"{escape(call_id)}: {escape(verdict)}"
    )
    if posted.truncated:
        console.print(
            f"[yellow]explanation cut to its first {MAX_EXPLANATION_CHARS} of "
            f"{posted.explanation_chars} characters[/yellow]"
        )


def register(app: typer.Typer) -> None:
    """Add the `ledger` group."""
    app.add_typer(ledger_app, name="ledger")
