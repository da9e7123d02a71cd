"""Making forks from the ledger: a recorded call's first K agent turns as a scenario file.

`fork_call` reads one session (live or simulated) and builds its fork (`fork.ForkSpec` on the
source scenario): the forced turns (token-exact, or it refuses), the caller's lines up to the
candidate's first turn (`ledger.transcript.caller_lines`), what the recorded tool calls of
those turns changed in the world, and, for a live call with no world pack, its recorded tool
results as fixtures. Who the caller is after the hand-off comes from the call's scenario (found
in `--scenarios` by id and checked by content hash, so the world is the one the call ran
against) or, for a live call without one, from a short scenario file the user writes
(`persona`). A fork is held out when its call is (by the ledger's own rule,
`eligibility.HELDOUT_SESSION`), and the ledger is told its hash at once, so it stays held out
wherever its file goes. Every refusal is a `ScenarioError` naming the session, the turn or the
file, raised before anything is written.
"""

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipecat_rl.errors import ScenarioError
from pipecat_rl.ledger import Ledger, SessionRecord, ToolCallRecord, TurnRecord
from pipecat_rl.ledger.eligibility import HELDOUT_SESSION
from pipecat_rl.ledger.transcript import caller_lines
from pipecat_rl.scenarios.fork import (
    Fixture,
    Fixtures,
    ForcedTurn,
    ForkLine,
    ForkSpec,
    ForkToolCall,
    compose_changes,
    fork_id,
)
from pipecat_rl.scenarios.loading import load_scenario_file, load_scenarios
from pipecat_rl.scenarios.scenario import HELDOUT, POOL, Scenario
from pipecat_rl.scenarios.yaml_safe import MAX_FILE_BYTES


@dataclass(frozen=True)
class Fork:
    """A fork made from the ledger, and where its parts came from (what the CLI says)."""

    scenario: Scenario
    persona_from: str
    """Where the caller after the hand-off comes from: the call's scenario, or the user's file."""
    world: str
    """How the world is restored: replayed on the pack, served as fixtures, or none."""


def _forced(session_id: str, turns: Sequence[TurnRecord], at: int) -> list[ForcedTurn]:
    """Turns 1..at as the server sampled them; a turn recorded as text only is refused."""
    forced = []
    for n, turn in enumerate(turns[:at], 1):
        if not (turn.token_exact and turn.prompt_token_ids and turn.completion_token_ids):
            earlier = f"fork at an earlier turn (--at {n - 1})" if n > 1 else "no turn before it"
            raise ScenarioError(
                f"session {session_id}: turn {n} was recorded as text only (not token-exact), so "
                f"it cannot be forced to the ids the model sampled; {earlier} can be forked"
            )
        forced.append(
            ForcedTurn(
                prompt_token_ids=turn.prompt_token_ids,
                completion_token_ids=turn.completion_token_ids,
                text=turn.generated_text,
                tool_calls=[ForkToolCall.model_validate(c) for c in turn.tool_calls],
                finish_reason=turn.finish_reason,
            )
        )
    return forced


def _source_scenario(
    session: SessionRecord, scenarios: Sequence[Path], persona: Path | None
) -> tuple[Scenario, str]:
    """The scenario the fork continues as, and where it was found (see the module docstring)."""
    if session.scenario_id is None:
        if persona is None:
            raise ScenarioError(
                f"session {session.id} is a {session.source} call with no scenario: write a short "
                "scenario file for the caller after the fork (name, persona, goal, success; "
                "facts, world and verify if it has them) and pass --persona FILE"
            )
        found = load_scenario_file(persona)
        if len(found) != 1:
            raise ScenarioError(f"{persona}: holds {len(found)} scenarios; give the fork one")
        return found[0], f"the file {persona}"
    if persona is not None:
        raise ScenarioError(
            f"session {session.id} ran scenario {session.scenario_id!r}: its fork takes the "
            "persona and verifier from it; drop --persona"
        )
    if not scenarios:
        raise ScenarioError(
            f"session {session.id} ran scenario {session.scenario_id!r}: pass --scenarios with "
            "the file or folder that holds it"
        )
    match = [s for s in load_scenarios(list(scenarios)) if s.id == session.scenario_id]
    if not match:
        raise ScenarioError(
            f"session {session.id} ran scenario {session.scenario_id!r}, which is not in "
            f"{', '.join(map(str, scenarios))}; pass --scenarios with the folder that holds it"
        )
    (scenario,) = match
    if scenario.world.pack and scenario.pack_code() is None:
        raise ScenarioError(
            f"{scenario.source_path}: world.pack: {scenario.world.pack} is gone, so the world "
            f"session {session.id} ran against cannot be rebuilt; restore the pack to fork it"
        )
    if session.scenario_hash and scenario.content_hash() != session.scenario_hash:
        raise ScenarioError(
            f"{scenario.source_path}: scenario {scenario.id!r} changed since session "
            f"{session.id} ran it (hash {session.scenario_hash}, now {scenario.content_hash()}): "
            "the fork could not restore the world the call ran against; fork it from the "
            "scenario as it was"
        )
    return scenario, f"the call's scenario {scenario.id!r} ({scenario.source_path})"


def _prefix_calls(
    turns: Sequence[TurnRecord], calls: Sequence[ToolCallRecord], at: int
) -> tuple[list[dict[str, Any]], list[ToolCallRecord]]:
    """What the tool calls of turns 1..at changed in the world, in order; and the calls, once each.

    A call belongs to a turn by its id (the turn's tool calls carry it), else by the recorder's
    turn index. The ledger may hold a call twice (the recorder's row and the simulator's world
    execution, which carries the state diff): each is taken once, with its diff where it has one.
    """
    ids = {c.get("id") for t in turns[:at] for c in t.tool_calls if c.get("id")}
    ours = [
        c for c in calls
        if c.call_id in ids or (c.call_id is None and c.turn_index is not None
                                and c.turn_index < at)
    ]  # fmt: skip
    diffs = {
        c.call_id: c.state_diff["world"]
        for c in reversed(ours)
        if isinstance(c.state_diff, dict) and c.state_diff.get("world") is not None
    }
    once: dict[Any, ToolCallRecord] = {}
    for i, c in enumerate(ours):
        once.setdefault(c.call_id if c.call_id is not None else f"#{i}", c)
    world = [diffs[key] for key in once if key in diffs]
    return world, list(once.values())


def is_heldout(ledger: Ledger, session_id: str) -> bool:
    """Whether the ledger holds this session held out (the training query's own rule)."""
    return bool(ledger.rows(f"SELECT 1 FROM sessions s WHERE s.id = ? AND {HELDOUT_SESSION}",
                            (session_id,)))  # fmt: skip


def fork_call(
    ledger: Ledger,
    session_id: str,
    at: int,
    *,
    scenarios: Sequence[Path] = (),
    persona: Path | None = None,
) -> Fork:
    """The fork of `session_id` at turn `at`: its first `at` agent turns, then the persona.

    Raises:
        NotInLedgerError: no such session.
        ScenarioError: `at` is out of range, a turn before it is text only, the call's scenario
            or its pack is missing or changed, or a live call has no scenario and no `persona`.
    """
    session = ledger.session(session_id)
    turns = ledger.turns(session_id)
    if at < 1 or at > len(turns):
        raise ScenarioError(
            f"--at {at}: session {session_id} has {len(turns)} agent turn(s); fork at 1 to "
            f"{len(turns)}"
            if turns
            else f"session {session_id} recorded no agent turn to fork"
        )
    forced = _forced(session_id, turns, at)
    base, persona_from = _source_scenario(session, scenarios, persona)
    latencies = {lat.user_turn: lat for lat in ledger.latencies(session_id)}
    lines = caller_lines(session, turns, latencies)
    caller = [
        ForkLine(before_turn=turn.index + 1, text=text)
        for turn in turns[: at + 1]
        for text, number in lines.get(turn.index, [])
        if number is not None and text.strip()
    ]
    world, calls = _prefix_calls(turns, ledger.tool_calls(session_id), at)
    fixtures = None
    if base.world.pack is None and session.source == "live":
        offered = [
            str(tool.get("function", tool).get("name"))
            for turn in turns
            for tool in turn.request.get("tools") or []
            if isinstance(tool, dict)
        ]
        fixtures = Fixtures(
            tools=list(dict.fromkeys(offered + [c.name for c in calls])),
            results=[
                Fixture(name=c.name, arguments=c.arguments, result=c.result, error=c.error)
                for c in calls
            ],
        )
        how = (
            f"{len(fixtures.results)} recorded tool result(s) served as fixtures, labelled "
            "so (the call has no world pack)"
        )
    elif base.world.pack is None:
        how = "none (the scenario names no world pack)"
    else:
        how = f"{len(calls)} tool call(s) of turns 1..{at} replayed on a fresh {base.world.pack}"
    spec = ForkSpec(
        session=session_id,
        at=at,
        source=session.source,
        turns=forced,
        next_prompt_token_ids=turns[at].prompt_token_ids if at < len(turns) else None,
        caller=caller,
        world_changes=None if fixtures is not None else compose_changes(world),
        fixtures=fixtures,
    )  # fmt: skip
    split = HELDOUT if is_heldout(ledger, session_id) else POOL
    scenario = base.model_copy(update={"name": fork_id(session_id, at), "split": split,
                                       "fork": spec})  # fmt: skip
    return Fork(scenario=scenario, persona_from=persona_from, world=how)


def _relative(value: str | None, base: Path | None, folder: Path) -> str | None:
    """A path the scenario gives relative to its own file, made relative to `folder`."""
    if value is None or base is None or not value.endswith((".py", ".wav")):
        return value
    return os.path.relpath((base.parent / value).resolve(), folder.resolve())


def fork_yaml(scenario: Scenario, folder: Path) -> str:
    """The fork as a scenario file written in `folder` (its relative paths rebased there).

    Raises:
        ScenarioError: the file would be over the scenario loader's size limit.
    """
    data: dict[str, Any] = scenario.model_dump(
        mode="json", exclude={"source_path", "parsed_turns"}, exclude_none=True
    )
    base = scenario.source_path
    pack = _relative(scenario.world.pack, base, folder)
    if pack is not None:
        data["world"]["pack"] = pack
    noise = _relative(scenario.channel.background_noise, base, folder)
    if noise is not None:
        data["channel"]["background_noise"] = noise
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100,
                          allow_unicode=True)  # fmt: skip
    if len(text.encode()) > MAX_FILE_BYTES:
        raise ScenarioError(
            f"the fork of {scenario.id} is {len(text.encode()):,} bytes, over the "
            f"{MAX_FILE_BYTES:,}-byte limit of a scenario file: fork at an earlier turn"
        )
    return text
