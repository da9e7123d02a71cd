"""`pipecat-rl ledger show`: one session as a transcript a person can follow.

The ledger stores LLM calls, not caller lines: each turn's request holds the whole context, so
the caller line a turn answers is the user message that is new in it, and an LLM call after a
tool result (no new user message) is the same caller line continued. Tool calls sit under the
turn whose tool calls carry their id (the simulator's world executions carry no turn index);
latencies under the turn that first answered their caller line, with the stages that mode
measured (the response gap in text mode, the heard gap and v2v in audio). The score shown is the
gate's: the authoritative part (`ledger.outcome`), not the training reward with tool credit.
"""

from datetime import datetime

from rich.console import Console
from rich.markup import escape

from pipecat_rl.ledger import LatencyRecord, Ledger, SessionRecord, ToolCallRecord, TurnRecord
from pipecat_rl.ledger.transcript import after_tool_results, caller_lines, calls_by_turn
from pipecat_rl.scoring import authoritative_part, gate_score, turntaking

_STAGES = (
    ("endpointing", "endpointing_ms"),
    ("STT", "stt_ms"),
    ("TTFT", "llm_ttft_ms"),
    ("TTS TTFB", "tts_ttfb_ms"),
    ("v2v", "v2v_ms"),
    ("heard", "heard_gap_ms"),
    ("response gap", "response_gap_ms"),
)
"""A latency row's stages as shown, each only where the mode measured it."""


def when(ts: float | None, short: bool = False) -> str:
    """A timestamp as local time, or `-`."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts).strftime("%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S")


def num(value: float | None) -> str:
    """A number without trailing zeros, or `-`."""
    return "-" if value is None else f"{value:.3f}".rstrip("0").rstrip(".")


def shown_score(parts: dict[str, float]) -> float | None:
    """The session's score on the gate's scale (`scoring.gate_score`), None when unverified."""
    try:
        return gate_score(parts, {})
    except ValueError:  # a part out of range is the ledger's problem, not a display's
        return None


def latency_line(lat: LatencyRecord) -> str | None:
    """The stages this row measured, or None when it measured none."""
    parts = [f"{name} {value:.0f} ms" for name, field in _STAGES
             if (value := getattr(lat, field)) is not None]  # fmt: skip
    if lat.interrupted:
        parts.append("interrupted")
    if not parts:
        return None
    return f"    [dim]latency (user turn {lat.user_turn}):[/dim] " + " · ".join(parts)


def tool_line(call: ToolCallRecord) -> str:
    """One tool execution: its call, result or error, and duration."""
    args = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items())
    head = f"    [cyan]tool[/cyan] {escape(call.name)}({escape(args)})"
    if call.error is not None:
        tail = f" [red]error:[/red] {escape(call.error)}"
    else:
        tail = f" → {escape(repr(call.result))}"
    took = "" if call.duration_ms is None else f" [dim]({call.duration_ms:.0f} ms)[/dim]"
    return head + tail + took


def _header(out: Console, s: SessionRecord, store: Ledger) -> None:
    out.print(f"[bold]session {escape(s.id)}[/bold] ({s.source})")
    scenario = escape((s.scenario_id or "-") + (f" [{s.split}]" if s.split else ""))
    out.print(
        f"  scenario {scenario}   policy {escape(s.policy or '-')}"
        + (f"   seed {s.seed}" if s.seed is not None else "")
        + (f"   repeat {s.repeat}" if s.repeat is not None else "")
    )
    out.print(f"  started {when(s.started_at)}   ended {when(s.ended_at)}")
    decided_by = authoritative_part(s.reward_parts)
    score = num(shown_score(s.reward_parts)) + (f" ({decided_by})" if decided_by else "")
    parts = ", ".join(f"{k} {num(v)}" for k, v in s.reward_parts.items())
    out.print(
        f"  outcome {escape(s.outcome or '-')}   score {escape(score)}"
        + (f"   parts {escape(parts)} (training reward {num(s.reward)})" if parts else "")
    )
    out.print(f"  labels {escape(', '.join(s.failure_labels) or '-')}")
    if wav := s.metadata.get("audio_wav"):  # --record-audio: the call, caller left, agent right
        out.print(f"  audio {escape(str(wav))}")
    if (taking := turntaking.read(s.metadata)) is not None:  # audio: measured; text: why not
        shown = turntaking.brief(taking) if taking.measured else f"— ({taking.unavailable})"
        out.print(f"  turn-taking {escape(shown)}")
    flags = [f for f, on in (("excluded from training", s.excluded_from_training),
                             ("no consent", not s.consent)) if on]  # fmt: skip
    if flags:
        out.print(f"  [yellow]{', '.join(flags)}[/yellow]")
    unscored = s.metadata.get("unscored")
    if isinstance(unscored, dict):
        for name, why in unscored.items():
            out.print(f"  [yellow]unscored[/yellow] {escape(str(name))}: {escape(str(why))}")
    scores = store.scores(s.id)
    if scores:
        out.print("  scores " + ", ".join(f"{escape(x.name)} {num(x.value)}" for x in scores))


def _said(turn: TurnRecord) -> str:
    if turn.generated_text or not turn.tool_calls:
        return turn.generated_text
    names = ", ".join(
        str(c.get("name") or c.get("function", {}).get("name", "?")) for c in turn.tool_calls
    )
    return f"(calls {names})"


def print_transcript(out: Console, store: Ledger, session_id: str) -> None:
    """Print one session: its header, then its turns, then whatever no turn claims.

    Each turn shows its new caller line, the reply, its tool calls and its latency.
    """
    s = store.session(session_id)
    turns = store.turns(session_id)
    lats = {lat.user_turn: lat for lat in store.latencies(session_id)}
    _header(out, s, store)
    lines = caller_lines(s, turns, lats)
    placed, loose = calls_by_turn(turns, store.tool_calls(session_id))
    shown: set[int] = set()
    for turn in turns:
        out.print()
        tokens = f"tokens {len(turn.prompt_token_ids or [])}→{len(turn.completion_token_ids or [])}"
        kind = (
            "[green]token-exact[/green]" if turn.token_exact
            else "[dim]demonstration[/dim]" if turn.demonstration else "[dim]text only[/dim]"
        )  # fmt: skip
        cont = "  [dim](after tool results)[/dim]" if after_tool_results(turn) else ""
        out.print(
            f"[bold]turn {turn.index}[/bold]  adapter {escape(turn.adapter or '-')}  "
            f"{tokens}  {kind}" + ("  [dim]redacted[/dim]" if turn.redacted else "") + cont
        )
        for text, number in lines[turn.index]:
            who = "[magenta]user:[/magenta]" if number is not None else "[dim]prompt:[/dim]"
            out.print(f"    {who} {escape(text)}")
        out.print(f"    [blue]bot:[/blue]  {escape(_said(turn))}")
        if turn.spoken_text is not None and (
            turn.spoken_text != turn.generated_text or turn.interrupted
        ):
            mark = " [yellow](interrupted)[/yellow]" if turn.interrupted else ""
            out.print(f"    [blue]spoken:[/blue] {escape(turn.spoken_text)}{mark}")
        elif turn.interrupted:
            out.print("    [yellow](interrupted)[/yellow]")
        for call in placed.get(turn.index, []):
            out.print(tool_line(call))
        for _, number in lines[turn.index]:
            if number in lats and number not in shown:
                shown.add(number)
                line = latency_line(lats[number])
                if line:
                    out.print(line)
    unshown = [line for k, lat in sorted(lats.items())
               if k not in shown and (line := latency_line(lat))]  # fmt: skip
    if loose or unshown:
        out.print()
        out.print("[bold]not attached to a turn[/bold]")
        for call in loose:
            out.print(tool_line(call))
        for line in unshown:
            out.print(line)
