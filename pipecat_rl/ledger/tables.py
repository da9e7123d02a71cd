"""How each record maps onto its table, and every SQL statement the store runs on the hot path.

Statements are module constants so sqlite3's statement cache prepares each once per connection, and
reads name their columns so a file migrated by a newer pipecat-rl never feeds unknown columns into
a record.
"""

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from pipecat_rl.ledger.records import (
    AdapterRecord,
    LatencyRecord,
    LivePointer,
    ScoreRecord,
    SessionRecord,
    ToolCallRecord,
    TurnRecord,
)


def dumps(value: Any) -> str:
    """JSON text for a JSON column; objects JSON cannot hold are stored as their str()."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


@dataclass(frozen=True)
class Table:
    """How one record type maps onto one table: column order, JSON columns, renamed fields."""

    name: str
    model: type[BaseModel]
    fields: tuple[str, ...]
    json_fields: frozenset[str]
    nullable_json: frozenset[str] = frozenset()
    renames: tuple[tuple[str, str], ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        """Column names in field order."""
        renames = dict(self.renames)
        return tuple(renames.get(f, f) for f in self.fields)

    def select(self, alias: str = "") -> str:
        """The column list for a SELECT, optionally qualified by a table alias."""
        prefix = f"{alias}." if alias else ""
        return ", ".join(prefix + c for c in self.columns)

    def insert(self, conflict: str = "") -> str:
        """An INSERT of every column, with an optional ON CONFLICT clause."""
        cols = ", ".join(self.columns)
        marks = ", ".join("?" for _ in self.columns)
        return f"INSERT INTO {self.name} ({cols}) VALUES ({marks}) {conflict}".strip()

    def params(self, record: BaseModel) -> tuple[Any, ...]:
        """A record as statement parameters, JSON fields as text."""
        out = []
        for f in self.fields:
            value = getattr(record, f)
            if f in self.json_fields and not (value is None and f in self.nullable_json):
                value = dumps(value)
            out.append(value)
        return tuple(out)

    def record(self, row: Sequence[Any]) -> Any:
        """A row (selected with `select`) as a validated record."""
        data = {}
        for f, value in zip(self.fields, row, strict=True):
            if f in self.json_fields and value is not None:
                value = json.loads(value)
            data[f] = value
        return self.model.model_validate(data)


def _table(
    name: str,
    model: type[BaseModel],
    json_fields: Iterable[str],
    nullable_json: Iterable[str] = (),
    renames: dict[str, str] | None = None,
) -> Table:
    return Table(
        name=name,
        model=model,
        fields=tuple(model.model_fields),
        json_fields=frozenset(json_fields),
        nullable_json=frozenset(nullable_json),
        renames=tuple((renames or {}).items()),
    )


SESSIONS = _table("sessions", SessionRecord, ("reward_parts", "failure_labels", "metadata"))
TURNS = _table(
    "turns",
    TurnRecord,
    (
        "request",
        "prompt_token_ids",
        "completion_token_ids",
        "logprobs",
        "usage",
        "tool_calls",
        "timestamps",
    ),
    nullable_json=("prompt_token_ids", "completion_token_ids", "logprobs"),
    renames={"index": "turn_index"},
)
TOOL_CALLS = _table(
    "tool_calls",
    ToolCallRecord,
    ("arguments", "result", "state_diff"),
    nullable_json=("result", "state_diff"),
)
LATENCIES = _table("latencies", LatencyRecord, ())
SCORES = _table("scores", ScoreRecord, ("detail",))
ADAPTERS = _table(
    "adapters",
    AdapterRecord,
    ("training_run", "training_data", "config", "metrics"),
    nullable_json=("training_run",),
)
LIVE = _table("live_pointer", LivePointer, ())


def _upsert_all(table: Table, key: tuple[str, ...]) -> str:
    """An insert that replaces every non-key column when the key already exists."""
    sets = ", ".join(f"{c} = excluded.{c}" for c in table.columns if c not in key)
    return table.insert(f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {sets}")


def _latency_merge() -> str:
    """An upsert where a field the new record leaves None keeps its stored value."""
    key = ("session_id", "user_turn")
    sets = []
    for c in LATENCIES.columns:
        if c in key:
            continue
        if c == "interrupted":
            sets.append("interrupted = MAX(excluded.interrupted, latencies.interrupted)")
        else:
            sets.append(f"{c} = COALESCE(excluded.{c}, latencies.{c})")
    return LATENCIES.insert(f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {', '.join(sets)}")


INSERT_SESSION = SESSIONS.insert()
UPDATE_SESSION = _upsert_all(SESSIONS, ("id",))
UPSERT_TURN = _upsert_all(TURNS, ("session_id", "turn_index"))
INSERT_TOOL_CALL = TOOL_CALLS.insert()
SELECT_TOOL_CALL_BY_CALL_ID = (
    f"SELECT id, {TOOL_CALLS.select()} FROM tool_calls WHERE session_id = ? AND call_id = ?"
)
UPDATE_TOOL_CALL = (
    f"UPDATE tool_calls SET {', '.join(f'{c} = ?' for c in TOOL_CALLS.columns)} WHERE id = ?"
)
PUT_LATENCY = _latency_merge()
PUT_SCORE = _upsert_all(SCORES, ("session_id", "name", "source"))
INSERT_ADAPTER = ADAPTERS.insert()
INSERT_LIVE = LIVE.insert()

SELECT_SESSION = f"SELECT {SESSIONS.select()} FROM sessions WHERE id = ?"
SELECT_TURNS = f"SELECT {TURNS.select()} FROM turns WHERE session_id = ? ORDER BY turn_index"
SELECT_TURN = f"SELECT {TURNS.select()} FROM turns WHERE session_id = ? AND turn_index = ?"
SELECT_TOOL_CALLS = f"SELECT {TOOL_CALLS.select()} FROM tool_calls WHERE session_id = ? ORDER BY id"
SELECT_LATENCIES = (
    f"SELECT {LATENCIES.select()} FROM latencies WHERE session_id = ? ORDER BY user_turn"
)
SELECT_LATENCIES_FOR = (
    f"SELECT {LATENCIES.select()} FROM latencies "
    "WHERE session_id IN (SELECT value FROM json_each(?)) ORDER BY session_id, user_turn"
)
SELECT_SCORES = f"SELECT {SCORES.select()} FROM scores WHERE session_id = ? ORDER BY id"
SELECT_ADAPTER = f"SELECT {ADAPTERS.select()} FROM adapters WHERE name = ?"
SELECT_ADAPTERS = f"SELECT {ADAPTERS.select()} FROM adapters ORDER BY created_at, name"
SELECT_LIVE = f"SELECT {LIVE.select()} FROM live_pointer ORDER BY id DESC LIMIT 1"
SELECT_LIVE_HISTORY = f"SELECT {LIVE.select()} FROM live_pointer ORDER BY id"

# Every held-out scenario hash ever seen, and the receipts the gate wrote.
INSERT_HELDOUT_HASH = (
    "INSERT INTO heldout_hashes (scenario_hash, scenario_id, heldout_set_id, first_seen_at) "
    "VALUES (?, ?, ?, ?) ON CONFLICT (scenario_hash) DO NOTHING"
)
SELECT_HELDOUT_HASHES = (
    "SELECT scenario_hash, scenario_id, heldout_set_id, first_seen_at FROM heldout_hashes "
    "ORDER BY first_seen_at, scenario_hash"
)
GATE_RECEIPT_COLUMNS = (
    "receipt_sha256", "receipt_id", "verdict", "candidate", "incumbent", "heldout_set_id", "path",
    "created_at",
)  # fmt: skip
INSERT_GATE_RECEIPT = (
    f"INSERT INTO gate_receipts ({', '.join(GATE_RECEIPT_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in GATE_RECEIPT_COLUMNS)})"
)
SELECT_GATE_RECEIPT = (
    f"SELECT {', '.join(GATE_RECEIPT_COLUMNS)} FROM gate_receipts WHERE receipt_sha256 = ?"
)
