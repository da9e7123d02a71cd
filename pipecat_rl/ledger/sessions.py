"""The ledger's sessions part: sessions and what they hold (turns, tool calls, latencies, scores).

A session is written by one process, its writer: the recorder starts it and adds its turns as the
call runs and ends it when the pipeline stops; for a simulated episode the simulator then writes
the result in one transaction (`finish_episode`). What a crash leaves is closed by the one closer
(`close_dead_sessions`) once its writer is gone. Training reads turns through the one eligibility
definition (`eligibility`); export and stats read everything.
"""

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from loguru import logger
from pydantic import ValidationError

from pipecat_rl.errors import LedgerError, NotInLedgerError
from pipecat_rl.ledger import schema as _schema
from pipecat_rl.ledger.core import LedgerCore
from pipecat_rl.ledger.eligibility import (
    DEFAULT_LIVE_TRUST,
    HELDOUT_SESSION,
    RECORDED_FROM,
    SAMPLED_RULES,
    TOKEN_EXACT_TURN,
    LiveTrust,
    Purpose,
    TrainingSelection,
    dropped_by,
    eligible_session,
    eligible_turn,
    open_session,
)
from pipecat_rl.ledger.liveness import writer_gone
from pipecat_rl.ledger.records import (
    LatencyRecord,
    ScoreRecord,
    SessionRecord,
    ToolCallRecord,
    TurnRecord,
)
from pipecat_rl.ledger.scores import live_score_states
from pipecat_rl.ledger.tables import (
    INSERT_SESSION,
    INSERT_TOOL_CALL,
    LATENCIES,
    LIVE,
    PUT_LATENCY,
    PUT_SCORE,
    SCORES,
    SELECT_LATENCIES,
    SELECT_LATENCIES_FOR,
    SELECT_LIVE,
    SELECT_SCORES,
    SELECT_SESSION,
    SELECT_TOOL_CALL_BY_CALL_ID,
    SELECT_TOOL_CALLS,
    SELECT_TURN,
    SELECT_TURNS,
    SESSIONS,
    TOOL_CALLS,
    TURNS,
    UPDATE_SESSION,
    UPDATE_TOOL_CALL,
    UPSERT_TURN,
    Table,
    dumps,
)
from pipecat_rl.ledger.transcript import conversation
from pipecat_rl.scoring.outcome import SessionOutcome

if TYPE_CHECKING:
    from pipecat_rl.scenarios.decontaminate import CallText, Overlap

Record = TurnRecord | ToolCallRecord | LatencyRecord | ScoreRecord


def _ending(
    ended_at: float,
    outcome: SessionOutcome | None,
    reward: float | None,
    reward_parts: Mapping[str, float] | None,
    failure_labels: Sequence[str] | None,
) -> dict[str, Any]:
    """The fields an end of a session sets: `ended_at`, and each other one given."""
    changes: dict[str, Any] = {"ended_at": ended_at}
    for name, value in (
        ("outcome", outcome),
        ("reward", reward),
        ("reward_parts", None if reward_parts is None else dict(reward_parts)),
        ("failure_labels", None if failure_labels is None else list(failure_labels)),
    ):
        if value is not None:
            changes[name] = value
    return changes


def _json_value(value: Any) -> Any:
    """A JSON column's value (text in SQLite, maybe decoded already elsewhere)."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def _call_text(
    session_id: str, turns: Sequence[TurnRecord], metadata: Any, scenario_hash: str | None = None
) -> "CallText":
    """What a call's caller said (its turns' user messages; else its transcript) and its goal."""
    from pipecat_rl.scenarios.decontaminate import CallText

    meta = _json_value(metadata) or {}
    meta = meta if isinstance(meta, dict) else {}
    lines = [m["content"] for m in conversation(turns) if m.get("role") == "user"]
    if not lines:  # no LLM turns recorded: the simulator's transcript says what the caller said
        lines = [
            str(line.get("heard") or line.get("text") or "")
            for line in meta.get("transcript") or []
            if isinstance(line, dict) and line.get("speaker") == "caller"
        ]
    goal = meta.get("goal")
    return CallText(
        id=session_id, caller_lines=tuple(lines), goal=goal if isinstance(goal, str) else None,
        scenario=scenario_hash,
    )  # fmt: skip


class Sessions(LedgerCore):
    """Sessions, turns, tool calls, latencies and scores; the closer; export and stats."""

    # -- sessions ------------------------------------------------------------------------------

    def add_session(self, s: SessionRecord) -> None:
        """Insert a new session; a duplicate id is refused, since ids identify episodes."""
        with self._write() as conn:
            self._insert_session(conn, s)

    def _insert_session(self, conn: sqlite3.Connection, s: SessionRecord) -> None:
        try:
            conn.execute(INSERT_SESSION, SESSIONS.params(s))
        except sqlite3.IntegrityError as e:
            raise LedgerError(
                f"session {s.id!r} is already in the ledger {self.path}; session ids must be "
                "unique, so give this session a new id"
            ) from e

    def _find_session(self, conn: sqlite3.Connection, session_id: str) -> SessionRecord | None:
        row = conn.execute(SELECT_SESSION, (session_id,)).fetchone()
        return None if row is None else SESSIONS.record(row)

    def _get_session(self, conn: sqlite3.Connection, session_id: str) -> SessionRecord:
        found = self._find_session(conn, session_id)
        if found is None:
            raise NotInLedgerError(
                f"no session {session_id!r} in the ledger {self.path}; "
                "`pipecat-rl ledger sessions` lists ids"
            )
        return found

    def _replace_session(
        self, conn: sqlite3.Connection, current: SessionRecord, changes: dict[str, Any]
    ) -> None:
        try:
            updated = SessionRecord.model_validate({**current.model_dump(), **changes})
        except ValidationError as e:
            raise LedgerError(f"invalid update to session {current.id!r}: {e}") from e
        conn.execute(UPDATE_SESSION, SESSIONS.params(updated))

    def _end(
        self,
        conn: sqlite3.Connection,
        current: SessionRecord,
        changes: dict[str, Any],
        metadata_update: Mapping[str, Any] | None,
    ) -> None:
        if metadata_update:
            changes = {**changes, "metadata": {**current.metadata, **metadata_update}}
        self._replace_session(conn, current, changes)

    def end_session(
        self,
        session_id: str,
        *,
        ended_at: float,
        outcome: SessionOutcome | None = None,
        reward: float | None = None,
        reward_parts: Mapping[str, float] | None = None,
        failure_labels: Sequence[str] | None = None,
        metadata_update: Mapping[str, Any] | None = None,
        policy: str | None = None,
    ) -> None:
        """Record how a session ended; arguments left None keep their stored values.

        `metadata_update` is merged into the stored metadata rather than replacing it. `policy`
        (the recorder learns it from the first LLM request) is set in the same write, so no
        reader sees an ended session without it.
        """
        changes = _ending(ended_at, outcome, reward, reward_parts, failure_labels)
        if policy is not None:
            changes["policy"] = policy
        with self._write() as conn:
            self._end(conn, self._get_session(conn, session_id), changes, metadata_update)

    def update_session(self, session_id: str, **fields: Any) -> None:
        """Change named fields of a session (consent, excluded_from_training, labels, ...)."""
        allowed = set(SessionRecord.model_fields) - {"id"}
        unknown = sorted(set(fields) - allowed)
        if unknown:
            raise LedgerError(
                f"cannot update session field(s) {', '.join(unknown)}; "
                f"updatable fields: {', '.join(sorted(allowed))}"
            )
        with self._write() as conn:
            self._replace_session(conn, self._get_session(conn, session_id), fields)

    def session(self, id: str) -> SessionRecord:
        """One session by id; NotInLedgerError (a LedgerError) if it is not there."""
        with self._read() as conn:
            return self._get_session(conn, id)

    def sessions(
        self,
        *,
        source: str | None = None,
        split: str | None = None,
        policy: str | None = None,
        scenario_id: str | None = None,
        since: float | None = None,
        limit: int | None = None,
    ) -> list[SessionRecord]:
        """Sessions matching every filter given, newest first."""
        where, params = [], []
        for column, value in (
            ("source", source),
            ("split", split),
            ("policy", policy),
            ("scenario_id", scenario_id),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if since is not None:
            where.append("started_at >= ?")
            params.append(since)
        sql = f"SELECT {SESSIONS.select()} FROM sessions"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY started_at DESC, rowid DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        with self._read() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [SESSIONS.record(r) for r in rows]

    # -- writing a whole session or episode at once --------------------------------------------

    def write_session(
        self,
        session: SessionRecord,
        turns: Iterable[TurnRecord] = (),
        tool_calls: Iterable[ToolCallRecord] = (),
        latencies: Iterable[LatencyRecord] = (),
        scores: Iterable[ScoreRecord] = (),
    ) -> None:
        """Write a whole session and everything in it in one transaction: all of it or none."""
        with self._write() as conn:
            self._insert_session(conn, session)
            self._put_children(conn, session.id, turns, tool_calls, latencies, scores)

    def finish_episode(
        self,
        session: SessionRecord,
        *,
        ended_at: float,
        outcome: SessionOutcome,
        reward: float | None,
        reward_parts: Mapping[str, float],
        failure_labels: Sequence[str],
        metadata_update: Mapping[str, Any] | None = None,
        latencies: Iterable[LatencyRecord] = (),
        scores: Iterable[ScoreRecord] = (),
        tool_calls: Iterable[ToolCallRecord] = (),
    ) -> None:
        """Write a simulated episode's result in one transaction: all of it or none.

        `session` is inserted when the recorder never wrote it (the bot started no pipeline);
        then the session is ended with the result and its latencies, scores and tool calls are
        put, merging into what the recorder wrote (`put_latency`, `add_tool_call`). A crash
        leaves the episode either whole or open (the recorder's, then `interrupted` by the
        closer): never ended with a verdict and half its scores.
        """
        changes = _ending(ended_at, outcome, reward, reward_parts, failure_labels)
        with self._write() as conn:
            current = self._find_session(conn, session.id)
            if current is None:
                self._insert_session(conn, session)
                current = session
            self._end(conn, current, changes, metadata_update)
            self._put_children(conn, session.id, (), tool_calls, latencies, scores)

    def _put_children(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        turns: Iterable[TurnRecord],
        tool_calls: Iterable[ToolCallRecord],
        latencies: Iterable[LatencyRecord],
        scores: Iterable[ScoreRecord],
    ) -> None:
        """Put a session's records inside the caller's transaction; a stray record aborts it."""
        turns, tool_calls = list(turns), list(tool_calls)
        latencies, scores = list(latencies), list(scores)
        records: list[Record] = [*turns, *tool_calls, *latencies, *scores]
        for record in records:
            if record.session_id != session_id:
                raise LedgerError(
                    f"writing session {session_id!r}, got a {type(record).__name__} of session "
                    f"{record.session_id!r}; every record must belong to the session"
                )
        for t in turns:
            self._put_turn(conn, t)
        for c in tool_calls:
            self._insert_tool_call(conn, c)
        for lat in latencies:
            self._put_latency(conn, lat)
        for s in scores:
            self._put_score(conn, s)

    # -- closing what a crash left open --------------------------------------------------------

    def close_dead_sessions(
        self,
        *,
        reason: str,
        since: float | None = None,
        sources: Iterable[str] | None = None,
    ) -> list[str]:
        """End `interrupted` every open session whose writer is gone; returns their ids.

        Open: never ended, or a simulated session the recorder ended and the simulator never
        finished (`eligibility.open_session`). Gone: the session names its writer (pid, host,
        process start: `liveness`), that host is this one, and no process with that pid and
        start time runs (`liveness.writer_gone`). `since` (started at or after) and `sources`
        narrow the search, never widen it: a session whose writer still runs is never closed,
        whatever the filters say; only its writer ends it. A session with no writer recorded
        (imported, or written by `write_session`) or written on another host is left as it
        is, since no process here can tell whether its writer lives; while open it never
        trains. `interrupted` keeps a session out of training and the gate; `reason` goes into
        its metadata as its `error`.
        """
        where, params = [open_session("s")], []
        if since is not None:
            where.append("s.started_at >= ?")
            params.append(since)
        if sources is not None:
            where.append("s.source IN (SELECT value FROM json_each(?))")
            params.append(dumps(list(sources)))
        writer = "json_extract(s.metadata, '$.writer.{}')"
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT s.id, {writer.format('pid')}, {writer.format('host')}, "
                f"{writer.format('started')} FROM sessions s WHERE {' AND '.join(where)}",
                params,
            ).fetchall()
        dead = [
            sid
            for sid, pid, host, started in rows
            if writer_gone({"pid": pid, "host": host, "started": started})
        ]
        closed = self._close_open(dead, reason)
        if closed:
            logger.warning(
                f"pipecat-rl: {len(closed)} session(s) in {self.path} were left open by a "
                f"process that is gone; marked interrupted (never trained on or paired): {reason}"
            )
        return closed

    def close_sessions(self, session_ids: Sequence[str], *, reason: str) -> list[str]:
        """End `interrupted` those of `session_ids` still open; returns the ids it closed.

        For a writer that is alive and knows it abandoned these sessions (the service's worker,
        after a job it ran was cancelled), where `close_dead_sessions` would wait for it to die.
        Sessions already finished are left as they are. One transaction, the closer's own.
        """
        return self._close_open(list(session_ids), reason)

    def _close_open(self, session_ids: list[str], reason: str) -> list[str]:
        """Mark `interrupted`, in one transaction, those of `session_ids` that are still open."""
        if not session_ids:
            return []
        closed: list[str] = []
        interrupted = _ending(time.time(), SessionOutcome.INTERRUPTED, None, None, None)
        metadata = {"error": reason, "closed_by": os.getpid()}
        with self._write() as conn:
            for row in conn.execute(  # still open: another closer may have come first
                f"SELECT {SESSIONS.select('s')} FROM sessions s "
                f"WHERE s.id IN (SELECT value FROM json_each(?)) AND {open_session('s')} "
                "ORDER BY s.started_at, s.rowid",
                (dumps(session_ids),),
            ).fetchall():
                current: SessionRecord = SESSIONS.record(row)
                self._end(conn, current, interrupted, metadata)
                closed.append(current.id)
        return closed

    # -- turns, tool calls, latencies, scores --------------------------------------------------

    def _child_error(self, e: sqlite3.IntegrityError, what: str, session_id: str) -> LedgerError:
        if "FOREIGN KEY" in str(e):
            return LedgerError(
                f"cannot add {what}: no session {session_id!r} in the ledger {self.path}; "
                "add the session (add_session) before its turns, calls, latencies and scores"
            )
        return LedgerError(f"cannot add {what} of session {session_id!r}: {e}")

    def add_turn(self, t: TurnRecord) -> None:
        """Insert a turn, or replace the turn with the same (session_id, index).

        Replacing lets the recorder complete a turn later (spoken text after TTS, an interruption).
        """
        with self._write() as conn:
            self._put_turn(conn, t)

    def _put_turn(self, conn: sqlite3.Connection, t: TurnRecord) -> None:
        try:
            conn.execute(UPSERT_TURN, TURNS.params(t))
        except sqlite3.IntegrityError as e:
            raise self._child_error(e, f"turn {t.index}", t.session_id) from e

    def update_turn(self, session_id: str, index: int, **fields: Any) -> None:
        """Change named fields of a stored turn (spoken_text, interrupted, timestamps, ...)."""
        allowed = set(TurnRecord.model_fields) - {"session_id", "index"}
        unknown = sorted(set(fields) - allowed)
        if unknown:
            raise LedgerError(
                f"cannot update turn field(s) {', '.join(unknown)}; "
                f"updatable fields: {', '.join(sorted(allowed))}"
            )
        with self._write() as conn:
            row = conn.execute(SELECT_TURN, (session_id, index)).fetchone()
            if row is None:
                raise NotInLedgerError(
                    f"no turn {index} of session {session_id!r} in the ledger {self.path}; "
                    "add it with add_turn first"
                )
            current: TurnRecord = TURNS.record(row)
            try:
                updated = TurnRecord.model_validate({**current.model_dump(), **fields})
            except ValidationError as e:
                raise LedgerError(f"invalid update to turn {index} of {session_id!r}: {e}") from e
            conn.execute(UPSERT_TURN, TURNS.params(updated))

    def add_tool_call(self, c: ToolCallRecord) -> int:
        """Add a tool call, or merge it into the row with the same call id; returns the row id.

        The recorder sees a call in the pipeline's frames and the simulator sees it executed
        against the world: both write it, and what one leaves empty the other fills.
        """
        with self._write() as conn:
            return self._insert_tool_call(conn, c)

    def _insert_tool_call(self, conn: sqlite3.Connection, c: ToolCallRecord) -> int:
        if c.call_id is not None:
            row = conn.execute(SELECT_TOOL_CALL_BY_CALL_ID, (c.session_id, c.call_id)).fetchone()
            if row is not None:
                stored = TOOL_CALLS.record(row[1:]).model_dump()
                given = c.model_dump(exclude_none=True)
                merged = ToolCallRecord.model_validate(
                    {**stored, **{k: v for k, v in given.items() if v != {}}}
                )
                conn.execute(UPDATE_TOOL_CALL, (*TOOL_CALLS.params(merged), row[0]))
                return int(row[0])
        try:
            cursor = conn.execute(INSERT_TOOL_CALL, TOOL_CALLS.params(c))
        except sqlite3.IntegrityError as e:
            raise self._child_error(e, f"tool call {c.name!r}", c.session_id) from e
        return int(cursor.lastrowid or 0)

    def put_latency(self, l: LatencyRecord) -> None:  # noqa: E741
        """Insert or merge the latency row of one user turn.

        Merging: a field the new record leaves None keeps its stored value, so the agent-side
        recorder and the caller-side simulator can each fill in what they measure.
        """
        with self._write() as conn:
            self._put_latency(conn, l)

    def _put_latency(self, conn: sqlite3.Connection, l: LatencyRecord) -> None:  # noqa: E741
        try:
            conn.execute(PUT_LATENCY, LATENCIES.params(l))
        except sqlite3.IntegrityError as e:
            raise self._child_error(e, f"latency of user turn {l.user_turn}", l.session_id) from e

    def add_score(self, s: ScoreRecord) -> None:
        """Record a named score of a session, replacing an earlier score of the same name."""
        with self._write() as conn:
            self._put_score(conn, s)

    def _put_score(self, conn: sqlite3.Connection, s: ScoreRecord) -> None:
        try:
            conn.execute(PUT_SCORE, SCORES.params(s))
        except sqlite3.IntegrityError as e:
            raise self._child_error(e, f"score {s.name!r}", s.session_id) from e

    # -- reading a session's records -----------------------------------------------------------

    def _children(self, sql: str, table: Table, session_id: str) -> list[Any]:
        with self._read() as conn:
            rows = conn.execute(sql, (session_id,)).fetchall()
        return [table.record(r) for r in rows]

    def turns(self, session_id: str) -> list[TurnRecord]:
        """The turns of a session in index order (empty if none)."""
        return self._children(SELECT_TURNS, TURNS, session_id)

    def tool_calls(self, session_id: str) -> list[ToolCallRecord]:
        """The tool calls of a session in the order they were recorded."""
        return self._children(SELECT_TOOL_CALLS, TOOL_CALLS, session_id)

    def latencies(self, session_id: str) -> list[LatencyRecord]:
        """The latency rows of a session in user-turn order."""
        return self._children(SELECT_LATENCIES, LATENCIES, session_id)

    def scores(self, session_id: str) -> list[ScoreRecord]:
        """The scores of a session in the order they were first recorded."""
        return self._children(SELECT_SCORES, SCORES, session_id)

    def latencies_for(self, session_ids: Sequence[str]) -> dict[str, list[LatencyRecord]]:
        """Latency rows of many sessions in one query (the gate reads hundreds at once).

        Every id asked for is a key; a session without latency rows maps to an empty list.
        """
        ids = list(dict.fromkeys(session_ids))
        out: dict[str, list[LatencyRecord]] = {sid: [] for sid in ids}
        if not ids:
            return out
        with self._read() as conn:
            rows = conn.execute(SELECT_LATENCIES_FOR, (dumps(ids),)).fetchall()
        for row in rows:
            record: LatencyRecord = LATENCIES.record(row)
            out[record.session_id].append(record)
        return out

    def training_turns(
        self,
        *,
        policy: str | None = None,
        source: str | None = None,
        require_token_exact: bool = True,
        purpose: Purpose = "rl",
        session_ids: Sequence[str] | None = None,
        live: LiveTrust = DEFAULT_LIVE_TRUST,
    ) -> list[TurnRecord]:
        """Turns that may become training rows, oldest session first (`training_selection`)."""
        return self.training_selection(
            policy=policy, source=source, require_token_exact=require_token_exact,
            purpose=purpose, session_ids=session_ids, live=live,
        ).turns  # fmt: skip

    def training_selection(
        self,
        *,
        policy: str | None = None,
        source: str | None = None,
        require_token_exact: bool = True,
        purpose: Purpose = "rl",
        session_ids: Sequence[str] | None = None,
        live: LiveTrust = DEFAULT_LIVE_TRUST,
    ) -> TrainingSelection:
        """Turns that may become training rows, and the sessions removed for held-out overlap.

        Enforced in the query itself, by the one definition in `ledger.eligibility`: never a
        held-out session (by split, held-out set or any held-out scenario hash ever seen), a gate
        session, an excluded, non-consented, unfinished or harness-failed session, nor a live
        call that `live` does not trust (unredacted, unscored, decided by an untrusted source, or
        too recent for its late scores); with `require_token_exact`, only turns sampled
        token-exactly without truncation (RL), or also demonstrations (`purpose="sft"`). Then
        decontamination (`scenarios.decontaminate`): a session whose caller lines replay those
        of a held-out session in the ledger is removed whatever scenario it names, and
        counted (`TrainingSelection.heldout_overlap`).
        """
        where = [eligible_session(live)]
        params: list[Any] = []
        if require_token_exact:
            where.append(eligible_turn(purpose))
        if policy is not None:
            where.append("s.policy = ?")
            params.append(policy)
        if source is not None:
            where.append("s.source = ?")
            params.append(source)
        if session_ids is not None:
            where.append("s.id IN (SELECT value FROM json_each(?))")
            params.append(dumps(list(session_ids)))
        sql = (
            f"SELECT {TURNS.select('t')} FROM turns t JOIN sessions s ON s.id = t.session_id "
            f"WHERE {' AND '.join(where)} ORDER BY s.started_at, t.session_id, t.turn_index"
        )
        with self._read() as conn:
            rows = conn.execute(sql, params).fetchall()
        turns = [TURNS.record(r) for r in rows]
        overlap = self._heldout_overlap(turns)
        if overlap:
            logger.warning(
                f"rows removed for held-out overlap: {len(overlap)} session(s) whose caller "
                "lines replay a held-out call ("
                + ", ".join(f"{sid} ~ {o.heldout_id} {o.share:.0%}" for sid, o in overlap.items())
                + ")"
            )
        return TrainingSelection(
            turns=[t for t in turns if t.session_id not in overlap], heldout_overlap=overlap
        )

    def _heldout_overlap(self, turns: list[TurnRecord]) -> "dict[str, Overlap]":
        """The sessions of `turns` whose calls replay a held-out session's call."""
        if not turns:
            return {}
        from pipecat_rl.scenarios.decontaminate import contaminated

        by_session: dict[str, list[TurnRecord]] = {}
        for t in turns:
            by_session.setdefault(t.session_id, []).append(t)
        with self._read() as conn:
            held = {
                sid: (meta, scenario_hash)
                for sid, meta, scenario_hash in conn.execute(
                    "SELECT s.id, s.metadata, s.scenario_hash FROM sessions s "
                    f"WHERE {HELDOUT_SESSION}"
                )
            }
            if not held:
                return {}
            held_turns: dict[str, list[TurnRecord]] = {}
            for sid, index, request in conn.execute(
                "SELECT t.session_id, t.turn_index, t.request FROM turns t JOIN sessions s "
                f"ON s.id = t.session_id WHERE {HELDOUT_SESSION} ORDER BY t.turn_index"
            ):
                request = _json_value(request) or {}
                turn = TurnRecord(
                    session_id=sid, index=index, adapter=None, created_at=0.0, request=request
                )
                held_turns.setdefault(sid, []).append(turn)
            metadata = dict(
                conn.execute(
                    "SELECT id, metadata FROM sessions "
                    "WHERE id IN (SELECT value FROM json_each(?))",
                    (dumps(list(by_session)),),
                )
            )
        candidates = [_call_text(sid, ts, metadata.get(sid)) for sid, ts in by_session.items()]
        reference = [
            _call_text(sid, held_turns.get(sid, []), meta, scenario_hash)
            for sid, (meta, scenario_hash) in held.items()
        ]
        return contaminated(candidates, reference)

    # -- summaries and export ------------------------------------------------------------------

    def stats(self, live: LiveTrust = DEFAULT_LIVE_TRUST) -> dict[str, Any]:
        """Counts that show at a glance what the ledger holds and how much of it can train.

        `counts` holds each table's rows, people's duels and their votes among them.
        Live calls by score state (`live_sessions`) and the turns each purpose may train on
        (`eligible_turns`: `sft` counts demonstrations too, `rl` only the policy's sampled
        turns) count by the same eligibility query `training_turns` runs, with the same `live`
        trust; `dropped_turns` counts, per rule of `SAMPLED_RULES`, the policy-sampled turns of
        trainable sessions it keeps out (a turn failing several rules counts under each);
        `recorded_from_caller` the sessions of bots called where they run (`--bot-url`), which
        never train.
        """
        tables = (
            "sessions",
            "turns",
            "tool_calls",
            "latencies",
            "scores",
            "adapters",
            "live_pointer",
            "duels",
            "duel_votes",
        )
        with self._read() as conn:
            counts = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}
            by_source = dict(
                conn.execute("SELECT source, count(*) FROM sessions GROUP BY source").fetchall()
            )
            by_split = {
                (split or "none"): n
                for split, n in conn.execute(
                    "SELECT split, count(*) FROM sessions GROUP BY split"
                ).fetchall()
            }
            (token_exact,) = conn.execute(
                f"SELECT count(*) FROM turns t WHERE {TOKEN_EXACT_TURN}"
            ).fetchone()
            eligible = {
                purpose: conn.execute(
                    "SELECT count(*) FROM turns t JOIN sessions s ON s.id = t.session_id "
                    f"WHERE {eligible_session(live)} AND {eligible_turn(purpose)}"
                ).fetchone()[0]
                for purpose in ("sft", "rl")
            }
            counts_by_rule = ", ".join(f"SUM({dropped_by(r)})" for r in SAMPLED_RULES)
            dropped = conn.execute(
                f"SELECT {counts_by_rule} FROM turns t JOIN sessions s ON s.id = t.session_id "
                f"WHERE {eligible_session(live)}"
            ).fetchone()
            (from_caller,) = conn.execute(
                f"SELECT count(*) FROM sessions s WHERE {RECORDED_FROM} = 'caller'"
            ).fetchone()
            live_row = conn.execute(SELECT_LIVE).fetchone()
            live_sessions = live_score_states(conn, live)
        return {
            "path": str(self.path),
            "schema_version": _schema.current_version(),
            "counts": counts,
            "sessions_by_source": by_source,
            "sessions_by_split": by_split,
            "token_exact_turns": token_exact,
            "eligible_turns": eligible,
            "dropped_turns": {
                r.reason: n or 0 for r, n in zip(SAMPLED_RULES, dropped, strict=True)
            },
            "recorded_from_caller": from_caller,
            "live_sessions": live_sessions,
            "live": None if live_row is None else LIVE.record(live_row).adapter,
        }

    def session_bundle(self, session_id: str) -> dict[str, Any]:
        """A session with its turns, tool calls, latencies and scores nested, as plain JSON data."""
        with self._read() as conn:
            session = self._get_session(conn, session_id)
            turns = [TURNS.record(r) for r in conn.execute(SELECT_TURNS, (session_id,))]
            calls = [TOOL_CALLS.record(r) for r in conn.execute(SELECT_TOOL_CALLS, (session_id,))]
            lats = [LATENCIES.record(r) for r in conn.execute(SELECT_LATENCIES, (session_id,))]
            scores = [SCORES.record(r) for r in conn.execute(SELECT_SCORES, (session_id,))]
        return {
            **session.model_dump(mode="json"),
            "turns": [t.model_dump(mode="json") for t in turns],
            "tool_calls": [c.model_dump(mode="json") for c in calls],
            "latencies": [x.model_dump(mode="json") for x in lats],
            "scores": [s.model_dump(mode="json") for s in scores],
        }

    def export_jsonl(self, out: TextIO, *, session_ids: Sequence[str] | None = None) -> int:
        """Write one JSON object per session (children nested), oldest first; returns the count.

        Each session is read in its own short transaction, so a long export never stalls the
        recorder's writes.
        """
        if session_ids is None:
            with self._read() as conn:
                ids = [
                    r[0] for r in conn.execute("SELECT id FROM sessions ORDER BY started_at, rowid")
                ]
        else:
            ids = list(session_ids)
            with self._read() as conn:
                found = {
                    r[0]
                    for r in conn.execute(
                        "SELECT id FROM sessions WHERE id IN (SELECT value FROM json_each(?))",
                        (dumps(ids),),
                    )
                }
            missing = [sid for sid in ids if sid not in found]
            if missing:
                raise NotInLedgerError(
                    f"no session(s) {', '.join(map(repr, missing))} in the ledger {self.path}; "
                    "`pipecat-rl ledger sessions` lists ids"
                )
        for sid in ids:
            out.write(dumps(self.session_bundle(sid)) + "\n")
        return len(ids)
