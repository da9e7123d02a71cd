"""Worlds: the executable state an agent's tools act on, one fresh SQLite database per episode.

A world pack is a Python file (or module) that defines `PACK = WorldPack(schema=..., tools=...)`:
the SQL schema and the tool implementations, each `fn(db, **arguments)` returning JSON-able data
or raising `ToolError`. Every episode builds a new in-memory database from the schema and the
scenario's `world.state`, so two episodes of one scenario start identical and share nothing.
Tool calls run for real against it, each recorded with its arguments, result, error and state
diff; faults (a timeout or an error on the n-th call, or with a seeded probability) are injected
before the tool runs. After the call, `verify` checks the final state. A fork of a live call
without a pack is served the call's recorded tool results instead (`fixtures_pack`).
"""

import importlib
import importlib.util
import json
import random
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from pipecat_rl.errors import ScenarioError, ToolError
from pipecat_rl.scenarios.fork import FIXTURE_LABEL
from pipecat_rl.scenarios.scenario import Fault, Scenario, VerifyCheck, Where

ToolFn = Callable[..., Any]


@dataclass(frozen=True)
class WorldPack:
    """A world's schema and the tools that act on it."""

    schema: str
    tools: dict[str, ToolFn]


@dataclass
class ToolExecution:
    """One tool call executed against the world."""

    name: str
    arguments: dict[str, Any]
    started_at: float
    call_id: str | None = None
    result: Any = None
    error: str | None = None
    duration_ms: float = 0.0
    state_diff: dict[str, Any] = field(default_factory=dict)
    fault: str | None = None
    """The injected fault's kind, when one fired."""

    @property
    def ok(self) -> bool:
        """Whether the tool executed without an error."""
        return self.error is None

    @property
    def wrote(self) -> bool:
        """Whether the call changed the world."""
        return bool(self.state_diff)


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one verify check, with what was found."""

    check: str
    passed: bool
    detail: str


_packs: dict[str, WorldPack] = {}


def load_pack(scenario: Scenario) -> WorldPack | None:
    """The scenario's world pack (cached per file), or None when it names none."""
    spec = scenario.world.pack
    if spec is None:
        return None
    key = str(scenario.pack_path or spec)
    if key in _packs:
        return _packs[key]
    where = f"{scenario.source_path}: world.pack"
    try:
        if scenario.pack_path is not None:
            path = scenario.pack_path
            if not path.is_file():
                raise ScenarioError(f"{where}: {path} does not exist")
            name = f"pipecat_rl_world_{abs(hash(key))}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
            sys.modules[name] = module
            module_spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            module = importlib.import_module(spec)
    except ScenarioError:
        raise
    except (Exception, SystemExit, KeyboardInterrupt) as e:  # a pack must not end the process
        raise ScenarioError(f"{where}: cannot import {spec}: {_raised(e)}") from e
    pack = getattr(module, "PACK", None)
    if not isinstance(pack, WorldPack):
        raise ScenarioError(f"{where}: {spec} defines no `PACK = WorldPack(...)`")
    _packs[key] = pack
    return pack


def fixtures_pack(scenario: Scenario) -> WorldPack | None:
    """A fork of a live call without a world pack: its recorded tool results, in order.

    Each tool the call offered answers with the next recorded result of its name (or raises
    its recorded error); once they run out it fails with an error saying it is a fixture, so a
    candidate never reaches the live backend and nobody mistakes the answer for a world's.
    None for any other scenario. A fresh pack per world: the results are used up per episode.
    """
    fixtures = scenario.fork.fixtures if scenario.fork is not None else None
    if fixtures is None:
        return None
    pending = list(fixtures.results)
    session = scenario.fork.session  # type: ignore[union-attr]

    def serving(name: str) -> ToolFn:
        def tool(db: sqlite3.Connection, **arguments: Any) -> Any:
            del db, arguments  # a fixture answers what the recording says, not the arguments
            found = next((f for f in pending if f.name == name), None)
            if found is None:
                raise ToolError(
                    f"{FIXTURE_LABEL}: no recorded result of {name} left: this fork of the live "
                    f"call {session} has no world pack, only the call's recorded tool results"
                )
            pending.remove(found)
            if found.error is not None:
                raise ToolError(found.error)
            return found.result

        return tool

    return WorldPack(schema="", tools={name: serving(name) for name in fixtures.tools})


def _raised(e: BaseException) -> str:
    """What pack code raised, in words: `sys.exit(0)` says nothing by itself."""
    if isinstance(e, SystemExit):
        return f"it called sys.exit({e.code!r})"
    if isinstance(e, KeyboardInterrupt):
        return "it raised KeyboardInterrupt"
    return f"{type(e).__name__}: {e}"


def _rows_key(rows: list[dict[str, Any]]) -> set[str]:
    return {json.dumps(r, sort_keys=True, default=str) for r in rows}


class World:
    """One episode's world: a fresh in-memory database, its tools, faults and history."""

    def __init__(self, scenario: Scenario, *, seed: int = 0):
        self.scenario = scenario
        self.pack = load_pack(scenario) or fixtures_pack(scenario) or WorldPack(schema="", tools={})
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._rng = random.Random(seed)
        self._calls: dict[str, int] = {}
        self.executions: list[ToolExecution] = []
        self.on_execution: Callable[[ToolExecution], None] | None = None
        """Called with each tool execution as it ends (`simulate -v` prints it)."""
        self.harness_errors: list[str] = []
        """Pack code that tried to end the process: the episode is the harness's failure."""
        where = f"{scenario.source_path}: world"
        try:
            self._db.executescript(self.pack.schema)
        except sqlite3.Error as e:
            raise ScenarioError(f"{where}.pack: the schema does not run: {e}") from e
        for table, rows in scenario.world.state.items():
            self._insert(table, rows, f"{where}.state.{table}")
        self._db.commit()
        self._check_spec(scenario)
        self.initial = self.snapshot()

    @property
    def tools(self) -> list[str]:
        """The tool names this world implements."""
        return list(self.pack.tools)

    def close(self) -> None:
        """Release the database."""
        self._db.close()

    # -- state ---------------------------------------------------------------------------------

    def tables(self) -> list[str]:
        """The world's table names."""
        rows = self._db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
        return [r[0] for r in rows if not r[0].startswith("sqlite_")]

    def _columns(self, table: str) -> list[str]:
        return [r[1] for r in self._db.execute(f"PRAGMA table_info({json.dumps(table)})")]

    def _insert(self, table: str, rows: list[dict[str, Any]], where: str) -> None:
        columns = self._columns(table)
        if not columns:
            raise ScenarioError(f"{where}: no table {table!r} (tables: {', '.join(self.tables())})")
        for i, row in enumerate(rows):
            unknown = sorted(set(row) - set(columns))
            if unknown:
                raise ScenarioError(f"{where}.{i}: unknown column(s) {', '.join(unknown)}")
            values = [json.dumps(v) if isinstance(v, (dict, list)) else v for v in row.values()]
            names = ", ".join(json.dumps(c) for c in row)
            marks = ", ".join("?" for _ in row)
            try:
                sql = f"INSERT INTO {json.dumps(table)} ({names}) VALUES ({marks})"
                self._db.execute(sql, values)
            except sqlite3.Error as e:
                raise ScenarioError(f"{where}.{i}: cannot insert: {e}") from e

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        """Every table's rows, in a stable order."""
        out = {}
        for table in self.tables():
            rows = [dict(r) for r in self._db.execute(f"SELECT * FROM {json.dumps(table)}")]
            out[table] = sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))
        return out

    @staticmethod
    def diff(before: dict, after: dict) -> dict[str, Any]:
        """Rows added and removed per table (a changed row is one of each); empty if no change."""
        out = {}
        for table in sorted(set(before) | set(after)):
            old, new = _rows_key(before.get(table, [])), _rows_key(after.get(table, []))
            if old != new:
                out[table] = {
                    "added": [json.loads(r) for r in sorted(new - old)],
                    "removed": [json.loads(r) for r in sorted(old - new)],
                }
        return out

    def count(self, selector: Where) -> int:
        """How many rows of `selector.table` match its `where`."""
        clauses = " AND ".join(f"{json.dumps(c)} IS ?" for c in selector.where) or "1"
        sql = f"SELECT COUNT(*) FROM {json.dumps(selector.table)} WHERE {clauses}"
        return self._db.execute(sql, list(selector.where.values())).fetchone()[0]

    # -- tools ---------------------------------------------------------------------------------

    def _fault_for(self, name: str, n: int) -> Fault | None:
        for fault in self.scenario.faults:
            if fault.tool != name:
                continue
            if fault.on_call == n:
                return fault
            if fault.probability is not None and self._rng.random() < fault.probability:
                return fault
        return None

    def execute(
        self, name: str, arguments: dict[str, Any], *, call_id: str | None = None
    ) -> ToolExecution:
        """Run tool `name` against the world (or inject its fault) and record the execution."""
        n = self._calls[name] = self._calls.get(name, 0) + 1
        execution = ToolExecution(
            name=name, arguments=dict(arguments), started_at=time.time(), call_id=call_id
        )
        start = time.perf_counter()
        fault = self._fault_for(name, n)
        before = self.snapshot()
        if fault is not None:
            execution.fault = fault.kind
            execution.error = fault.message or (
                f"{name} timed out: the backend did not answer in time"
                if fault.kind == "timeout"
                else f"{name} failed: internal error"
            )
        elif name not in self.pack.tools:
            execution.error = f"unknown tool {name!r}"
        else:
            try:
                execution.result = self.pack.tools[name](self._db, **arguments)
                self._db.commit()
            except ToolError as e:
                self._db.rollback()
                execution.error = str(e)
            except TypeError as e:
                self._db.rollback()
                execution.error = f"bad arguments for {name}: {e}"
            except Exception as e:  # a bug in the pack is still the agent's failed call
                self._db.rollback()
                execution.error = f"{name} raised {type(e).__name__}: {e}"
            except (SystemExit, KeyboardInterrupt) as e:  # not the agent's: the pack is broken
                self._db.rollback()
                execution.error = f"{name} failed: the world pack broke"
                self.harness_errors.append(
                    f"{self.scenario.source_path}: world pack tool {name!r}: {_raised(e)}"
                )
        execution.state_diff = self.diff(before, self.snapshot())
        execution.duration_ms = (time.perf_counter() - start) * 1000.0
        self.executions.append(execution)
        if self.on_execution is not None:
            try:
                self.on_execution(execution)
            except Exception:  # a listener's bug is not the agent's failed call
                logger.exception("a tool-execution listener failed")
        return execution

    # -- verify --------------------------------------------------------------------------------

    def _check_spec(self, scenario: Scenario) -> None:
        for i, fault in enumerate(scenario.faults):  # one on another tool would never fire
            if fault.tool not in self.pack.tools:
                have = ", ".join(sorted(self.pack.tools)) or "none: the scenario names no pack"
                raise ScenarioError(
                    f"{scenario.source_path}: faults.{i}: no tool {fault.tool!r} in the world "
                    f"(its tools: {have}); a fault fires only on a tool the world runs"
                )
        tables = set(self.tables())
        for i, check in enumerate(scenario.verify):
            where = f"{scenario.source_path}: verify.{i}"
            selector = check.exists or check.not_exists or check.count
            names = [selector.table] if selector else list(check.unchanged or [])
            for table in names:
                if table not in tables:
                    raise ScenarioError(f"{where}: no table {table!r} in the world")
            if selector is not None:
                unknown = sorted(set(selector.where) - set(self._columns(selector.table)))
                if unknown:
                    raise ScenarioError(f"{where}: unknown column(s) {', '.join(unknown)}")

    def verify(self, checks: list[VerifyCheck] | None = None) -> list[CheckResult]:
        """Run the scenario's checks (or `checks`) against the current state."""
        results = []
        final = self.snapshot()
        for check in self.scenario.verify if checks is None else checks:
            if check.exists is not None:
                n = self.count(check.exists)
                results.append(CheckResult(_describe("exists", check.exists), n >= 1, f"{n} rows"))
            elif check.not_exists is not None:
                n = self.count(check.not_exists)
                label = _describe("not_exists", check.not_exists)
                results.append(CheckResult(label, n == 0, f"{n} rows"))
            elif check.count is not None:
                c = check.count
                n = self.count(c)
                ok = (
                    (c.equals is None or n == c.equals)
                    and (c.min is None or n >= c.min)
                    and (c.max is None or n <= c.max)
                )
                results.append(CheckResult(_describe("count", c), ok, f"{n} rows"))
            else:
                for table in check.unchanged or []:
                    same = final.get(table) == self.initial.get(table)
                    detail = (
                        "unchanged"
                        if same
                        else json.dumps(
                            self.diff(
                                {table: self.initial.get(table, [])}, {table: final.get(table)}
                            ),
                            default=str,
                        )
                    )
                    results.append(CheckResult(f"unchanged {table}", same, detail))
        return results


def _describe(kind: str, selector: Where) -> str:
    where = ", ".join(f"{k}={v!r}" for k, v in selector.where.items())
    return f"{kind} {selector.table}" + (f" where {where}" if where else "")
