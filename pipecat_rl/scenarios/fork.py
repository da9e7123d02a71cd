"""A fork: a recorded call's first K agent turns, carried by a scenario so it can be replayed.

A fork scenario is its source scenario (persona, goal, facts, world, verify...) plus a `fork:`
block holding what the replay needs, so a fork file runs without the ledger it came from:

```yaml
fork:
  session: call-20250101-120000-ab12cd34   # the recorded call
  at: 2                                     # its first 2 agent turns are forced
  source: simulate                          # live, simulate or gate
  turns:                                    # agent turns 1..at, as the server sampled them
    - prompt_token_ids: [1, 9690, ...]      # the context the turn was sampled from
      completion_token_ids: [...]
      text: ""                              # what the server returned (content)
      tool_calls: [{id: chatcmpl-tool-1, name: note, arguments: '{"text": "hi"}'}]
      finish_reason: tool_calls
  next_prompt_token_ids: [...]              # turn at+1's context: what the candidate must see
  caller:                                   # the caller's recorded lines, said verbatim
    - {before_turn: 3, text: "Please note that I called."}
  world_changes: {notes: {added: [{id: 1, text: hi}], removed: []}}  # by turn `at`
  fixtures:                                 # a live call without a world pack only:
    tools: [lookup_patient, book]           #   every tool its requests offered
    results: [{name: lookup_patient, arguments: {name: Maria}, result: {id: 1}}]
```

`before_turn` is 1-based: the line is said before agent turn `before_turn` (1: the caller spoke
first). Turns are numbered from 1 here, as `--at` counts them; the ledger's turn index is one
less. The simulator replays it (`simulator.fork`): turns 1..at are answered from `turns` after
the served template re-renders their request to exactly `prompt_token_ids`, the caller says
`caller` verbatim, and turn at+1 goes to the served model once its context renders to
`next_prompt_token_ids`. Making a fork from the ledger is `forking`'s.
"""

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

FIXTURE_LABEL = "fixture"
"""How a tool result served from a live call's recording (no world pack) is labelled."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ForkToolCall(_Model):
    """A tool call as the server streamed it: its id, name and raw JSON arguments."""

    id: str | None = None
    name: str
    arguments: str = ""


class ForcedTurn(_Model):
    """One recorded agent turn, answered from the recording during the replay."""

    prompt_token_ids: list[int] = Field(min_length=1)
    completion_token_ids: list[int] = Field(min_length=1)
    text: str = ""
    tool_calls: list[ForkToolCall] = Field(default_factory=list)
    finish_reason: str | None = None


class ForkLine(_Model):
    """A caller line of the recording, said verbatim before agent turn `before_turn` (1-based)."""

    before_turn: int = Field(ge=1)
    text: str = Field(min_length=1)


class Fixture(_Model):
    """A tool result of a live call, served in order when the fork has no world pack."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: Any = None
    error: str | None = None


class Fixtures(_Model):
    """A live call forked without a world pack: its recorded tool results, served in order."""

    tools: list[str] = Field(default_factory=list)
    """Every tool the call's requests offered: each answers from `results` (never the bot's own
    handler, which would reach the live backend), and with a labelled error once they run out."""
    results: list[Fixture] = Field(default_factory=list)


class TableChanges(_Model):
    """Rows a table gained and lost (a changed row is one of each), as the world diffs them."""

    added: list[dict[str, Any]] = Field(default_factory=list)
    removed: list[dict[str, Any]] = Field(default_factory=list)


class ForkSpec(_Model):
    """What a fork replays: the forced turns, the caller's lines and the world they left."""

    session: str = Field(min_length=1)
    at: int = Field(ge=1)
    source: Literal["live", "simulate", "gate"]
    turns: list[ForcedTurn]
    next_prompt_token_ids: list[int] | None = None
    """Turn at+1's recorded context, checked before the candidate answers (None: the call ended
    at turn `at`, or that turn was not recorded token-exactly)."""
    caller: list[ForkLine] = Field(default_factory=list)
    world_changes: dict[str, TableChanges] | None = None
    """What the recorded tool calls of turns 1..at changed, checked once they are replayed;
    None for a fork served from `fixtures` (no world to compare)."""
    fixtures: Fixtures | None = None
    """A live call without a world pack: its recorded tool results, served as fixtures."""

    @model_validator(mode="after")
    def _consistent(self) -> "ForkSpec":
        if len(self.turns) != self.at:
            raise ValueError(f"turns: {len(self.turns)} recorded turn(s), but at is {self.at}")
        late = [line.before_turn for line in self.caller if line.before_turn > self.at + 1]
        if late:
            raise ValueError(
                f"caller: a line before turn {late[0]}, after the hand-off at turn {self.at + 1}"
            )
        return self

    def lines_before(self, turn: int) -> str:
        """What the caller says before agent turn `turn` (1-based; "" for nothing)."""
        return " ".join(line.text for line in self.caller if line.before_turn == turn)


def fork_id(session_id: str, at: int) -> str:
    """A fork's scenario id, from its call and turn: the same fork always has the same id."""
    return f"fork-{session_id}@{at}"


def fork_file_name(scenario_id: str) -> str:
    """The file a fork is written to by default: its id, safe as a file name, `.yaml`."""
    return re.sub(r"[^A-Za-z0-9._@-]+", "_", scenario_id) + ".yaml"


def _row_key(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, default=str)


def compose_changes(diffs: list[dict[str, Any]]) -> dict[str, TableChanges]:
    """The net change of the world over consecutive diffs (`World.diff`'s shape, per table).

    A row added then removed is no change; the result is sorted as `World.diff` sorts it, so it
    compares equal to the diff of the first state against the last.
    """
    added: dict[str, dict[str, dict]] = {}
    removed: dict[str, dict[str, dict]] = {}
    for diff in diffs:
        for table, change in diff.items():
            plus, minus = added.setdefault(table, {}), removed.setdefault(table, {})
            for row in change.get("removed", []):
                key = _row_key(row)
                if plus.pop(key, None) is None:
                    minus[key] = row
            for row in change.get("added", []):
                key = _row_key(row)
                if minus.pop(key, None) is None:
                    plus[key] = row
    out = {}
    for table in sorted(set(added) | set(removed)):
        plus, minus = added.get(table, {}), removed.get(table, {})
        if plus or minus:
            out[table] = TableChanges(
                added=[json.loads(k) for k in sorted(plus)],
                removed=[json.loads(k) for k in sorted(minus)],
            )
    return out
