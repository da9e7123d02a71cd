"""A recorded call as a conversation, rebuilt from its turns: what a judge reads and a draft keeps.

A live call has no transcript of its own in the ledger, only its LLM turns: each turn's request
holds the context the agent was given (the caller's lines so far) and the turn holds what the
agent said back (`spoken_text`, what the caller heard, else `generated_text`) and the tools it
called. `conversation` walks the turns in order and emits, per turn, the caller's lines that are
new in its request, then its tool calls, then its reply, in the shape of a Pipecat conversation
file (`{"role": "user" | "assistant", "content"}`, `{"role": "tool_call", "name", "arguments",
"cancelled"}`). When a bot rewrites its context (a Pipecat Flows node change), a caller line is
new only if it differs from the last one seen, so nothing is repeated. `caller_lines` says the
same per turn index, with the bot's own opening prompt told apart from the caller's lines.
"""

import json
from collections.abc import Callable, Sequence
from typing import Any

from pipecat_rl.ledger.records import LatencyRecord, SessionRecord, ToolCallRecord, TurnRecord


def message_text(content: Any) -> str:
    """The text of an OpenAI message's content: a string, or its text parts joined."""
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call as the model emitted it (flat, or OpenAI's `function` form) as a message."""
    function = call.get("function") if isinstance(call.get("function"), dict) else {}
    name = call.get("name") or function.get("name") or "?"
    arguments = call.get("arguments", function.get("arguments"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            arguments = {"raw": arguments}
    if not isinstance(arguments, dict):
        arguments = {} if arguments is None else {"value": arguments}
    return {"role": "tool_call", "name": str(name), "arguments": arguments, "cancelled": False}


def _caller_lines(turn: TurnRecord) -> list[str]:
    messages = turn.request.get("messages") or []
    return [
        message_text(m.get("content"))
        for m in messages
        if isinstance(m, dict) and m.get("role") == "user"
    ]


def conversation(turns: Sequence[TurnRecord]) -> list[dict[str, Any]]:
    """The call as a Pipecat conversation file holds it, from its turns (in index order)."""
    out: list[dict[str, Any]] = []
    seen: list[str] = []
    for turn in sorted(turns, key=lambda t: t.index):
        lines = _caller_lines(turn)
        if lines[: len(seen)] == seen:
            new = lines[len(seen) :]
        else:  # the bot rewrote its context: only a line unlike the last one is new
            new = lines[-1:] if lines and (not seen or lines[-1] != seen[-1]) else []
        seen = lines
        out.extend({"role": "user", "content": line} for line in new if line.strip())
        out.extend(tool_call(c) for c in turn.tool_calls)
        said = turn.spoken_text if turn.spoken_text is not None else turn.generated_text
        if said.strip():
            out.append({"role": "assistant", "content": said})
    return out


def _opens_with_prompt(
    session: SessionRecord, turns: Sequence[TurnRecord], latencies: dict[int, LatencyRecord]
) -> bool:
    """Whether the first turn's user messages are the bot's own prompt, not the caller's.

    A greeting cue said before the caller spoke is no caller line, so it takes no latency row.
    """
    transcript = session.metadata.get("transcript")
    if isinstance(transcript, list) and transcript and isinstance(transcript[0], dict):
        return transcript[0].get("speaker") == "agent"  # a simulation: the agent spoke first
    first = latencies.get(0)
    heard = None if first is None else first.user_stopped_at or first.stt_final_at
    return bool(turns) and heard is not None and turns[0].created_at < heard


def caller_lines(
    session: SessionRecord, turns: Sequence[TurnRecord], latencies: dict[int, LatencyRecord]
) -> dict[int, list[tuple[str, int | None]]]:
    """Per turn index, the user messages new in it, each with its caller line number.

    The number is None for the bot's own prompt; the numbering is the latency rows' user turns.
    `ledger show` prints them; a fork says them again (`scenarios.forking`).
    """
    prompt = _opens_with_prompt(session, turns, latencies)
    out: dict[int, list[tuple[str, int | None]]] = {}
    seen: list[str] = []
    number = 0
    for position, turn in enumerate(turns):
        users = _caller_lines(turn)
        if len(users) > len(seen):
            new = users[len(seen) :]
        elif users and (not seen or users[-1] != seen[-1]):
            new = users[-1:]  # the bot trimmed its context: only the last line can be new
        else:
            new = []
        lines: list[tuple[str, int | None]] = []
        for text in new:
            if position == 0 and prompt:
                lines.append((text, None))
            else:
                lines.append((text, number))
                number += 1
        out[turn.index] = lines
        seen = users
    return out


def after_tool_results(turn: TurnRecord) -> bool:
    """Whether the turn answers tool results (it continues the reply of the turn before it)."""
    messages = turn.request.get("messages") or []
    return bool(messages) and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool"


def _call_ids(turn: TurnRecord) -> set[str]:
    return {str(c["id"]) for c in turn.tool_calls if isinstance(c, dict) and c.get("id")}


def call_owner(turns: Sequence[TurnRecord]) -> Callable[[ToolCallRecord], int | None]:
    """Which turn (its index) made a tool call; None when no turn of `turns` did.

    The turn whose tool calls carry the call's id, else the call's own turn index (the
    simulator's world executions carry none).
    """
    owner = {call_id: t.index for t in turns for call_id in _call_ids(t)}
    indexes = {t.index for t in turns}

    def of(call: ToolCallRecord) -> int | None:
        index = owner.get(call.call_id or "", call.turn_index)
        return index if index in indexes else None

    return of


def calls_by_turn(
    turns: Sequence[TurnRecord], calls: Sequence[ToolCallRecord]
) -> tuple[dict[int, list[ToolCallRecord]], list[ToolCallRecord]]:
    """Each tool call under the turn that made it (`call_owner`), once per call id; the rest.

    The rest: the calls no turn made.
    """
    owner = call_owner(turns)
    placed: dict[int, list[ToolCallRecord]] = {}
    loose: list[ToolCallRecord] = []
    shown: set[str] = set()
    for call in calls:
        if call.call_id is not None:
            if call.call_id in shown:
                continue  # the recorder's and the world's record of one call
            shown.add(call.call_id)
        index = owner(call)
        if index is not None:
            placed.setdefault(index, []).append(call)
        else:
            loose.append(call)
    return placed, loose
