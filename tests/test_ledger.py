import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from pipecat_rl.errors import LedgerError
from pipecat_rl.ledger import (
    DEFAULT_LEDGER_NAME,
    AdapterRecord,
    LatencyRecord,
    Ledger,
    LivePointer,
    NotInLedgerError,
    ScoreIn,
    ScoreRecord,
    SessionRecord,
    ToolCallRecord,
    TurnRecord,
    resolve_ledger_path,
    schema,
)
from pipecat_rl.ledger.eligibility import TOKEN_EXACT
from pipecat_rl.ledger.liveness import writer_identity

REPO = Path(__file__).resolve().parents[1]


def make_session(id: str = "s1", **kw) -> SessionRecord:
    fields = {"source": "simulate", "started_at": 1000.0}
    fields.update(kw)
    return SessionRecord(id=id, **fields)


def make_turn(session_id: str = "s1", index: int = 0, exact: bool = True, **kw) -> TurnRecord:
    fields = dict(
        adapter="clinic-v1",
        created_at=1000.5 + index,
        request={
            "model": "clinic-v1",
            "messages": [{"role": "user", "content": f"hi {index}"}],
            "temperature": 0.7,
        },
        generated_text=f"hello {index}",
    )
    if exact:
        fields.update(
            prompt_token_ids=[1, 2, 3, 4],
            completion_token_ids=[5, 6, 7],
            logprobs=[-0.1, -0.25, -1.5],
            token_exact=True,
            usage={"prompt_tokens": 4, "completion_tokens": 3},
        )
    fields.update(kw)
    return TurnRecord(session_id=session_id, index=index, **fields)


def make_adapter(name: str, created_at: float = 2000.0, **kw) -> AdapterRecord:
    fields = {"path": f"/adapters/{name}", "base_model": "smollm2-135m", "created_at": created_at}
    fields.update(kw)
    return AdapterRecord(name=name, **fields)


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.db") as store:
        yield store


# -- opening --------------------------------------------------------------------------------------


def test_open_creates_directory_and_uses_wal(tmp_path):
    path = tmp_path / "deep" / "er" / "ledger.db"
    with Ledger(path) as store:
        assert store.path == path
        store.add_session(make_session())
    assert path.exists()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.current_version()
    conn.close()


def test_not_a_sqlite_file_is_refused_naming_the_path(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 20)
    with pytest.raises(LedgerError, match="not a SQLite file") as info:
        Ledger(path)
    assert str(path) in str(info.value)


def test_foreign_sqlite_file_is_refused(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE sessions (x)")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="not a pipecat-rl ledger"):
        Ledger(path)


def test_directory_path_is_refused(tmp_path):
    with pytest.raises(LedgerError, match="is a directory"):
        Ledger(tmp_path)


def test_closed_ledger_refuses_calls(tmp_path):
    store = Ledger(tmp_path / "l.db")
    store.close()
    store.close()  # twice is harmless
    with pytest.raises(LedgerError, match="closed"):
        store.sessions()


def test_resolve_ledger_path_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    assert resolve_ledger_path() == tmp_path / DEFAULT_LEDGER_NAME
    monkeypatch.setenv("PIPECAT_RL_LEDGER", str(tmp_path / "env.db"))
    assert resolve_ledger_path() == tmp_path / "env.db"
    assert resolve_ledger_path(tmp_path / "flag.db") == tmp_path / "flag.db"
    with Ledger.open() as store:
        assert store.path == tmp_path / "env.db"


# -- records --------------------------------------------------------------------------------------


def test_records_are_frozen_and_strict():
    s = make_session()
    with pytest.raises(ValidationError):
        s.outcome = "pass"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        SessionRecord(id="x", source="simulate", started_at=1.0, surprise=1)
    with pytest.raises(ValidationError):
        SessionRecord(id="x", source="phone", started_at=1.0)
    with pytest.raises(ValidationError):
        SessionRecord(id="x", source="simulate", started_at=1.0, split="held-out")


def test_trainable_needs_server_ids_and_matching_logprobs():
    assert make_turn().trainable
    assert not make_turn(exact=False).trainable
    assert not make_turn(token_exact=False).trainable
    assert not make_turn(logprobs=[-0.1]).trainable
    assert not make_turn(completion_token_ids=[], logprobs=[]).trainable
    assert not make_turn(prompt_token_ids=None).trainable


# -- round trips ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "violation",
    [
        {"token_exact": False},
        {"prompt_token_ids": []},
        {"prompt_token_ids": None},
        {"completion_token_ids": [], "logprobs": []},
        {"completion_token_ids": None, "logprobs": []},
        {"logprobs": [-0.1]},
        {"logprobs": None},
    ],
)
def test_token_exact_is_one_rule_in_sql_and_in_python(ledger, violation):
    """Each clause of `TOKEN_EXACT` says the same on a record and on its row; one planted
    violation fails exactly one clause, on both sides, and the whole rule with it."""
    good, bad = make_turn("s", 0), make_turn("s", 1, **violation)
    ledger.write_session(make_session("s"), [good, bad])
    conn = sqlite3.connect(ledger.path)
    for turn in (good, bad):
        sql = [
            conn.execute(
                f"SELECT count(*) FROM turns t WHERE t.turn_index = ? AND ({c.sql})", (turn.index,)
            ).fetchone()[0]
            == 1
            for c in TOKEN_EXACT
        ]
        assert sql == [c.check(turn) for c in TOKEN_EXACT]
        assert sql.count(False) == (turn is bad)
    conn.close()
    assert good.trainable and not bad.trainable
    assert ledger.stats()["token_exact_turns"] == 1


def test_round_trip_every_table(ledger):
    session = SessionRecord(
        id="sess-α",
        source="simulate",
        started_at=1700000000.125,
        ended_at=1700000042.5,
        scenario_id="book-cleaning",
        scenario_hash="sha256:abc",
        split="pool",
        heldout_set_id=None,
        policy="clinic-v1",
        seed=7,
        repeat=2,
        outcome="pass",
        reward=1.1,
        reward_parts={"verifier": 1.0, "tool_credit": 0.1},
        failure_labels=["misheard_slot"],
        excluded_from_training=False,
        consent=True,
        metadata={"persona": "terse", "nested": {"a": [1, 2]}},
    )
    turn = make_turn(
        "sess-α",
        0,
        spoken_text="hello",
        interrupted=True,
        finish_reason="stop",
        usage={"prompt_tokens": 4, "completion_tokens": 3},
        tool_calls=[{"id": "c1", "name": "book", "arguments": '{"day": "mon"}'}],
        timestamps={"llm_request": 1.0, "llm_first_token": 1.2, "llm_done": 1.5},
        redacted=False,
    )
    bare_turn = make_turn("sess-α", 1, exact=False, adapter=None)
    call = ToolCallRecord(
        session_id="sess-α",
        turn_index=0,
        call_id="c1",
        name="book",
        arguments={"day": "mon", "slot": 3},
        result={"ok": True, "id": 12},
        started_at=1700000001.0,
        duration_ms=12.5,
        state_diff={"bookings": {"added": [12]}},
    )
    failed_call = ToolCallRecord(
        session_id="sess-α",
        turn_index=None,
        call_id=None,
        name="cancel",
        arguments={},
        error="timeout",
        started_at=1700000002.0,
    )
    latency = LatencyRecord.from_timestamps(
        "sess-α",
        0,
        user_stopped_at=10.0,
        stt_final_at=10.3,
        llm_request_at=10.31,
        llm_first_token_at=10.5,
        tts_first_audio_at=10.6,
        bot_started_at=10.65,
        bot_stopped_at=12.0,
        heard_gap_ms=700.0,
        stt_ms=120.0,
        interrupted=True,
    )
    score = ScoreRecord(session_id="sess-α", name="judge", value=0.75, detail={"why": "polite"})
    adapter = make_adapter(
        "clinic-v1",
        parent="clinic-v0",
        training_run={"id": "run-1", "guard": None},
        training_data=["a", "b"],
        config={"rank": 8},
        metrics={"loss": 0.5},
    )

    ledger.add_session(session)
    ledger.add_turn(turn)
    ledger.add_turn(bare_turn)
    first_id = ledger.add_tool_call(call)
    second_id = ledger.add_tool_call(failed_call)
    assert second_id > first_id
    ledger.put_latency(latency)
    ledger.add_score(score)
    ledger.register_adapter(adapter)

    assert ledger.session("sess-α") == session
    assert ledger.turns("sess-α") == [turn, bare_turn]
    assert ledger.tool_calls("sess-α") == [call, failed_call]
    assert ledger.latencies("sess-α") == [latency]
    assert ledger.scores("sess-α") == [score]
    assert ledger.adapter("clinic-v1") == adapter
    assert ledger.adapters() == [adapter]


def test_write_session_round_trip_and_atomicity(ledger):
    turns = [make_turn("w", i) for i in range(3)]
    calls = [
        ToolCallRecord(
            session_id="w", turn_index=1, call_id="c", name="t", arguments={}, started_at=1.0
        )
    ]
    lats = [LatencyRecord(session_id="w", user_turn=0, v2v_ms=800.0)]
    scores = [ScoreRecord(session_id="w", name="reward", value=1.0)]
    ledger.write_session(make_session("w"), turns, calls, lats, scores)
    assert ledger.turns("w") == turns
    assert ledger.tool_calls("w") == calls
    assert ledger.latencies("w") == lats
    assert ledger.scores("w") == scores

    # the same session again fails as a whole: nothing of the second write lands
    with pytest.raises(LedgerError, match="already in the ledger"):
        ledger.write_session(make_session("w"), [make_turn("w", 9)])
    assert [t.index for t in ledger.turns("w")] == [0, 1, 2]

    # records of another session are refused before anything is written
    with pytest.raises(LedgerError, match="belong"):
        ledger.write_session(make_session("v"), [make_turn("other", 0)])
    with pytest.raises(NotInLedgerError):
        ledger.session("v")


def test_write_session_rolls_back_on_a_database_error(ledger, monkeypatch):
    from pipecat_rl.ledger import sessions

    monkeypatch.setattr(sessions, "PUT_SCORE", "INSERT INTO no_such_table VALUES (?)")
    with pytest.raises(LedgerError):
        ledger.write_session(
            make_session("r"),
            [make_turn("r", 0)],
            scores=[ScoreRecord(session_id="r", name="x", value=1.0)],
        )
    with pytest.raises(NotInLedgerError):
        ledger.session("r")
    assert ledger.turns("r") == []


def _result(sid: str, **kw):
    """What the simulator hands `finish_episode` for one episode."""
    fields = dict(
        ended_at=1100.0,
        outcome="pass",
        reward=1.1,
        reward_parts={"verifier": 1.0, "tool_credit": 0.1},
        failure_labels=[],
        metadata_update={"end_reason": "caller_hung_up"},
        latencies=[LatencyRecord(session_id=sid, user_turn=0, response_gap_ms=120.0)],
        scores=[
            ScoreRecord(session_id=sid, name="verifier", value=1.0),
            ScoreRecord(session_id=sid, name="tool_credit", value=0.1),
        ],
        tool_calls=[
            ToolCallRecord(
                session_id=sid,
                turn_index=None,
                call_id="c1",
                name="book",
                arguments={},
                result={"ok": True},
                started_at=1000.2,
                state_diff={"world": {"added": 1}},
            )  # fmt: skip
        ],
    )
    fields.update(kw)
    return fields


def test_finish_episode_completes_what_the_recorder_wrote(ledger):
    ledger.add_session(make_session("e", metadata={"writer": {"pid": 1}}))
    ledger.add_turn(make_turn("e", 0))
    ledger.add_tool_call(
        ToolCallRecord(
            session_id="e",
            turn_index=0,
            call_id="c1",
            name="book",
            arguments={"slot": 3},
            started_at=1000.1,
            duration_ms=40.0,
        )  # fmt: skip
    )
    ledger.put_latency(LatencyRecord(session_id="e", user_turn=0, v2v_ms=800.0))
    ledger.end_session("e", ended_at=1050.0, outcome="completed")  # the recorder's end

    ledger.finish_episode(make_session("e", metadata={"ignored": True}), **_result("e"))
    s = ledger.session("e")
    assert (s.ended_at, s.outcome, s.reward) == (1100.0, "pass", 1.1)
    assert s.reward_parts == {"verifier": 1.0, "tool_credit": 0.1}
    assert s.metadata == {"writer": {"pid": 1}, "end_reason": "caller_hung_up"}
    assert [(x.name, x.value) for x in ledger.scores("e")] == [
        ("verifier", 1.0),
        ("tool_credit", 0.1),
    ]
    (call,) = ledger.tool_calls("e")  # merged into the recorder's row by call id
    assert call.turn_index == 0 and call.arguments == {"slot": 3} and call.result == {"ok": True}
    (lat,) = ledger.latencies("e")  # merged: the recorder's v2v and the caller's gap
    assert (lat.v2v_ms, lat.response_gap_ms) == (800.0, 120.0)
    assert [t.index for t in ledger.turns("e")] == [0]


def test_finish_episode_writes_the_session_no_recorder_wrote(ledger):
    ledger.finish_episode(make_session("n", metadata={"bot": "b"}), **_result("n", outcome="error"))
    s = ledger.session("n")
    assert s.outcome == "error" and s.metadata == {"bot": "b", "end_reason": "caller_hung_up"}
    assert len(ledger.scores("n")) == 2 and len(ledger.tool_calls("n")) == 1


def test_finish_episode_is_one_transaction(ledger, monkeypatch):
    from pipecat_rl.ledger import sessions

    ledger.add_session(make_session("e"))
    ledger.end_session("e", ended_at=1050.0, outcome="completed")
    before = ledger.session_bundle("e")
    monkeypatch.setattr(sessions, "PUT_SCORE", "INSERT INTO no_such_table VALUES (?)")
    with pytest.raises(LedgerError):
        ledger.finish_episode(make_session("e"), **_result("e"))
    assert ledger.session_bundle("e") == before  # the recorder's end, nothing of the result
    with pytest.raises(LedgerError):
        ledger.finish_episode(make_session("fresh"), **_result("fresh"))
    with pytest.raises(NotInLedgerError):
        ledger.session("fresh")
    monkeypatch.undo()
    with pytest.raises(LedgerError, match="belong"):  # a stray record aborts the whole write
        ledger.finish_episode(make_session("e"), **_result("e", scores=[ScoreRecord(
            session_id="other", name="x", value=1.0)]))  # fmt: skip
    assert ledger.session_bundle("e") == before


def test_duplicate_session_refused(ledger):
    ledger.add_session(make_session("dup"))
    with pytest.raises(LedgerError, match="'dup' is already in the ledger"):
        ledger.add_session(make_session("dup"))


def test_children_need_their_session(ledger):
    with pytest.raises(LedgerError, match="add the session"):
        ledger.add_turn(make_turn("ghost", 0))
    with pytest.raises(LedgerError, match="add the session"):
        ledger.put_latency(LatencyRecord(session_id="ghost", user_turn=0))
    with pytest.raises(LedgerError, match="add the session"):
        ledger.add_score(ScoreRecord(session_id="ghost", name="x", value=1))
    with pytest.raises(LedgerError, match="add the session"):
        ledger.add_tool_call(
            ToolCallRecord(
                session_id="ghost",
                turn_index=None,
                call_id=None,
                name="t",
                arguments={},
                started_at=1.0,
            )
        )


def test_missing_session_message_names_id_and_the_listing_verb(ledger):
    with pytest.raises(NotInLedgerError) as info:
        ledger.session("nope-123")
    assert "nope-123" in str(info.value)
    assert "pipecat-rl ledger sessions" in str(info.value)
    assert isinstance(info.value, LedgerError)


# -- updates and upserts --------------------------------------------------------------------------


def test_turn_upsert_completes_a_turn(ledger):
    ledger.add_session(make_session())
    ledger.add_turn(make_turn(index=0))
    completed = make_turn(index=0, spoken_text="hel", interrupted=True)
    ledger.add_turn(completed)
    assert ledger.turns("s1") == [completed]

    ledger.update_turn("s1", 0, spoken_text="he", timestamps={"tts_done": 3.0})
    (turn,) = ledger.turns("s1")
    assert turn.spoken_text == "he" and turn.interrupted and turn.timestamps == {"tts_done": 3.0}
    assert turn.completion_token_ids == [5, 6, 7]

    with pytest.raises(LedgerError, match="bogus"):
        ledger.update_turn("s1", 0, bogus=1)
    with pytest.raises(LedgerError, match="invalid update"):
        ledger.update_turn("s1", 0, logprobs="not a list")
    with pytest.raises(NotInLedgerError):
        ledger.update_turn("s1", 5, spoken_text="x")


def test_latency_upsert_merges_fields(ledger):
    ledger.add_session(make_session())
    agent_side = LatencyRecord.from_timestamps(
        "s1", 0, user_stopped_at=1.0, stt_final_at=1.2, bot_started_at=1.9
    )
    ledger.put_latency(agent_side)
    caller_side = LatencyRecord(session_id="s1", user_turn=0, heard_gap_ms=950.0, interrupted=True)
    ledger.put_latency(caller_side)
    ledger.put_latency(LatencyRecord(session_id="s1", user_turn=1, v2v_ms=500.0))
    first, second = ledger.latencies("s1")
    assert first.heard_gap_ms == 950.0
    assert first.interrupted
    assert first.endpointing_ms == pytest.approx(200.0)
    assert first.v2v_ms == pytest.approx(900.0)
    assert first.user_stopped_at == 1.0
    # a later value replaces an earlier one
    ledger.put_latency(LatencyRecord(session_id="s1", user_turn=0, v2v_ms=850.0))
    assert ledger.latencies("s1")[0].v2v_ms == 850.0
    assert second.v2v_ms == 500.0
    assert len(ledger.latencies("s1")) == 2


def test_score_with_same_name_is_replaced(ledger):
    ledger.add_session(make_session())
    ledger.add_score(ScoreRecord(session_id="s1", name="judge", value=0.2))
    ledger.add_score(ScoreRecord(session_id="s1", name="other", value=1.0))
    ledger.add_score(ScoreRecord(session_id="s1", name="judge", value=0.9, detail={"v": 2}))
    assert [(s.name, s.value) for s in ledger.scores("s1")] == [("judge", 0.9), ("other", 1.0)]


def test_end_and_update_session(ledger):
    ledger.add_session(make_session(metadata={"a": 1}))
    ledger.end_session(
        "s1",
        ended_at=1100.0,
        outcome="pass",
        reward=1.1,
        reward_parts={"verifier": 1.0},
        failure_labels=["timeout"],
        metadata_update={"b": 2},
        policy="clinic-sft-v1",  # in the same write: no reader sees the end without it
    )
    s = ledger.session("s1")
    assert (s.ended_at, s.outcome, s.reward, s.policy) == (1100.0, "pass", 1.1, "clinic-sft-v1")
    assert s.reward_parts == {"verifier": 1.0}
    assert s.failure_labels == ["timeout"]
    assert s.metadata == {"a": 1, "b": 2}

    ledger.end_session("s1", ended_at=1200.0)  # None arguments keep stored values
    assert (ledger.session("s1").outcome, ledger.session("s1").policy) == ("pass", "clinic-sft-v1")

    ledger.update_session("s1", consent=False, excluded_from_training=True)
    s = ledger.session("s1")
    assert not s.consent and s.excluded_from_training
    with pytest.raises(LedgerError, match="nonsense"):
        ledger.update_session("s1", nonsense=True)
    with pytest.raises(LedgerError, match="id"):
        ledger.update_session("s1", id="other")
    with pytest.raises(LedgerError, match="invalid update"):
        ledger.update_session("s1", split="held-out")
    with pytest.raises(LedgerError, match="invalid update"):  # an outcome is a SessionOutcome
        ledger.update_session("s1", outcome="running")
    with pytest.raises(NotInLedgerError):
        ledger.end_session("missing", ended_at=1.0)


def test_sessions_filters_newest_first(ledger):
    ledger.add_session(make_session("old", started_at=1.0, source="live", policy="base"))
    ledger.add_session(
        make_session("mid", started_at=2.0, split="pool", scenario_id="a", policy="v1")
    )
    ledger.add_session(
        make_session("new", started_at=3.0, split="heldout", scenario_id="a", policy="v1")
    )
    assert [s.id for s in ledger.sessions()] == ["new", "mid", "old"]
    assert [s.id for s in ledger.sessions(source="live")] == ["old"]
    assert [s.id for s in ledger.sessions(split="pool")] == ["mid"]
    assert [s.id for s in ledger.sessions(policy="v1")] == ["new", "mid"]
    assert [s.id for s in ledger.sessions(scenario_id="a", since=2.5)] == ["new"]
    assert [s.id for s in ledger.sessions(limit=2)] == ["new", "mid"]


def test_latencies_for_reads_many_sessions_in_one_query(ledger):
    ids = [f"s{i}" for i in range(400)]
    for sid in ids:
        ledger.write_session(
            make_session(sid),
            latencies=[
                LatencyRecord(session_id=sid, user_turn=k, v2v_ms=100.0 * k) for k in range(2)
            ],
        )
    statements: list[str] = []
    ledger._conn.set_trace_callback(statements.append)
    result = ledger.latencies_for([*ids, "no-such"])
    ledger._conn.set_trace_callback(None)
    assert len([s for s in statements if s.lstrip().upper().startswith("SELECT")]) == 1
    assert result["no-such"] == []
    assert all([lat.user_turn for lat in result[sid]] == [0, 1] for sid in ids)
    assert ledger.latencies_for([]) == {}


# -- training eligibility -------------------------------------------------------------------------


def test_heldout_excluded_and_unconsented_sessions_never_train(ledger):
    cases = {
        "pool": {"split": "pool", "policy": "v1"},
        "live": {"source": "live", "policy": "v1"},
        "heldout": {"split": "heldout", "policy": "v1"},
        "heldout-set": {"split": "pool", "heldout_set_id": "hs-1", "policy": "v1"},
        "excluded": {"split": "pool", "excluded_from_training": True, "policy": "v1"},
        "no-consent": {"source": "live", "consent": False, "policy": "v1"},
        "gate": {"source": "gate", "policy": "v1"},
        "other-policy": {"split": "pool", "policy": "v2"},
        "live-unscored": {"source": "live", "policy": "v1"},
    }
    for i, (sid, kw) in enumerate(cases.items()):
        live = kw.get("source") == "live"  # a live call trains only redacted (and scored)
        ledger.write_session(
            make_session(sid, started_at=float(i), ended_at=float(i) + 0.5, **kw),
            [
                make_turn(sid, 0, redacted=live),
                make_turn(sid, 1, exact=False, redacted=live),
                make_turn(sid, 2, logprobs=[-1.0], redacted=live),
                make_turn(sid, 3, redacted=True),
            ],
        )
    ledger.post_score("live", ScoreIn(metric="success", value="pass", source="human"))

    eligible = ledger.training_turns()
    # a redacted turn of a consented session keeps its ids and trains
    assert [(t.session_id, t.index) for t in eligible] == [
        ("pool", 0),
        ("pool", 3),
        ("live", 0),
        ("live", 3),
        ("other-policy", 0),
        ("other-policy", 3),
    ]
    assert all(t.trainable for t in eligible)
    assert [t.session_id for t in ledger.training_turns(policy="v1")] == ["pool"] * 2 + ["live"] * 2
    assert {t.session_id for t in ledger.training_turns(source="live")} == {"live"}

    loose = ledger.training_turns(require_token_exact=False)
    assert {t.session_id for t in loose} == {"pool", "live", "other-policy"}
    assert {(t.session_id, t.index) for t in loose if t.session_id == "pool"} == {
        ("pool", 0),
        ("pool", 1),
        ("pool", 2),
        ("pool", 3),
    }

    # flipping consent off later removes a session at once
    ledger.update_session("pool", consent=False)
    assert "pool" not in {t.session_id for t in ledger.training_turns()}
    assert ledger.stats()["eligible_turns"]["rl"] == len(ledger.training_turns())


# -- closing what a crash left open ---------------------------------------------------------------


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_closer_closes_only_open_sessions_whose_writer_is_gone(ledger):
    me = writer_identity()
    dead = {**me, "pid": _dead_pid()}
    cases = {  # id: (source, writer, started_at, how the session stands)
        "dead-open": ("simulate", dead, 10.0, "open"),
        "dead-unfinished": ("simulate", dead, 10.0, "recorder"),  # no simulator result
        "dead-finished": ("simulate", dead, 10.0, "finished"),
        "dead-live-call": ("live", dead, 10.0, "recorder"),  # a live call ends there
        "reused-pid": ("simulate", {**me, "started": (me["started"] or 0) + 1}, 10.0, "open"),
        "dead-before": ("simulate", dead, 1.0, "open"),
        "dead-live-open": ("live", dead, 10.0, "open"),
        "alive": ("simulate", me, 10.0, "open"),
        "alive-unfinished": ("simulate", me, 10.0, "recorder"),
        "elsewhere": ("simulate", {**dead, "host": "another-host"}, 10.0, "open"),
        "no-writer": ("simulate", None, 10.0, "open"),
    }
    for sid, (source, writer, started, state) in cases.items():
        metadata = {"writer": writer} if writer else {}
        ledger.add_session(make_session(sid, source=source, started_at=started, metadata=metadata))
        ledger.add_turn(make_turn(sid, 0, redacted=source == "live"))
        if state != "open":
            ledger.end_session(sid, ended_at=started + 1, outcome="completed")
        if state == "finished":
            ledger.finish_episode(make_session(sid), **_result(sid))

    closed = ledger.close_dead_sessions(reason="why", since=5.0, sources=("simulate", "gate"))
    assert sorted(closed) == ["dead-open", "dead-unfinished", "reused-pid"]
    for sid in closed:
        s = ledger.session(sid)
        assert s.outcome == "interrupted" and s.ended_at is not None
        assert s.metadata["error"] == "why"
    assert ledger.close_dead_sessions(reason="again", since=5.0) == ["dead-live-open"]
    assert ledger.close_dead_sessions(reason="all") == ["dead-before"]
    outcomes = {s.id: s.outcome for s in ledger.sessions()}
    assert outcomes["dead-finished"] == "pass" and outcomes["dead-live-call"] == "completed"
    # a writer that runs, or one this host cannot see, is never closed by another hand
    for sid in ("alive", "elsewhere", "no-writer"):
        assert outcomes[sid] is None and ledger.session(sid).ended_at is None
    assert outcomes["alive-unfinished"] == "completed"
    ledger.post_score("dead-live-call", ScoreIn(metric="success", value=1, source="human"))
    trained = {t.session_id for t in ledger.training_turns()}
    assert trained == {"dead-finished", "dead-live-call"}  # nothing open or cut trains


# -- latency derivations --------------------------------------------------------------------------


def test_from_timestamps_derives_each_stage():
    lat = LatencyRecord.from_timestamps(
        "s",
        3,
        user_stopped_at=100.0,
        stt_final_at=100.25,
        llm_request_at=100.3,
        llm_first_token_at=100.5,
        tts_first_audio_at=100.62,
        bot_started_at=100.7,
        stt_ms=90.0,
    )
    assert lat.endpointing_ms == pytest.approx(250.0)
    assert lat.llm_ttft_ms == pytest.approx(200.0)
    assert lat.tts_ttfb_ms == pytest.approx(120.0)
    assert lat.v2v_ms == pytest.approx(700.0)
    assert lat.stt_ms == 90.0
    assert lat.heard_gap_ms is None


def test_from_timestamps_leaves_a_stage_with_endpoints_out_of_order_unknown():
    # an STT final of an earlier segment lands before the user stopped: no endpointing measured
    lat = LatencyRecord.from_timestamps(
        "s", 0, user_stopped_at=10.0, stt_final_at=9.7, bot_started_at=10.8
    )
    assert lat.endpointing_ms is None
    assert lat.v2v_ms == pytest.approx(800.0)


def test_from_timestamps_missing_endpoints_give_none_and_explicit_wins():
    lat = LatencyRecord.from_timestamps("s", 0, user_stopped_at=1.0, llm_first_token_at=2.0)
    assert lat.endpointing_ms is None
    assert lat.llm_ttft_ms is None
    assert lat.tts_ttfb_ms is None
    assert lat.v2v_ms is None
    assert lat.stt_ms is None  # never derived

    lat = LatencyRecord.from_timestamps(
        "s",
        0,
        llm_request_at=1.0,
        llm_first_token_at=1.5,
        llm_ttft_ms=480.0,
        v2v_ms=900.0,
        heard_gap_ms=950.0,
        interrupted=True,
    )
    assert lat.llm_ttft_ms == 480.0
    assert lat.v2v_ms == 900.0
    assert lat.heard_gap_ms == 950.0
    assert lat.interrupted

    empty = LatencyRecord.from_timestamps("s", 0)
    assert empty == LatencyRecord(session_id="s", user_turn=0)


# -- adapters and the live pointer ----------------------------------------------------------------


def test_adapter_names_are_never_reused(ledger):
    ledger.register_adapter(make_adapter("clinic-v1"))
    with pytest.raises(LedgerError, match="never reused"):
        ledger.register_adapter(make_adapter("clinic-v1", path="/elsewhere"))
    assert ledger.adapter("clinic-v1").path == "/adapters/clinic-v1"
    with pytest.raises(LedgerError, match="reserved"):
        ledger.register_adapter(make_adapter("base"))
    with pytest.raises(NotInLedgerError, match="clinic-v1"):
        ledger.adapter("clinic-v9")


def test_live_pointer_move_rollback_history(ledger):
    assert ledger.live() is None
    assert ledger.live_history() == []
    with pytest.raises(LedgerError, match="nothing was ever promoted"):
        ledger.rollback_live()
    with pytest.raises(NotInLedgerError):
        ledger.move_live("unregistered")

    ledger.register_adapter(make_adapter("v1", created_at=1.0))
    ledger.register_adapter(make_adapter("v2", created_at=2.0))

    p1 = ledger.move_live("v1", receipt="receipts/v1.json")
    # before anything went live the base model served: the first move can be rolled back to it
    assert (p1.adapter, p1.previous, p1.receipt) == ("v1", "base", "receipts/v1.json")
    to_base = ledger.rollback_live()
    assert (to_base.adapter, to_base.previous) == ("base", "v1")
    p1 = ledger.move_live("v1")

    p2 = ledger.move_live("v2", receipt="receipts/v2.json")
    assert (p2.adapter, p2.previous) == ("v2", "v1")
    assert ledger.move_live("v2") == p2  # already live: no new row
    assert ledger.live() == p2

    back = ledger.rollback_live()
    assert (back.adapter, back.previous, back.receipt) == ("v1", "v2", None)
    assert ledger.live() == back

    base = ledger.move_live("base")
    assert (base.adapter, base.previous) == ("base", "v1")

    history = ledger.live_history()
    assert [h.adapter for h in history] == ["v1", "base", "v1", "v2", "v1", "base"]
    assert all(isinstance(h, LivePointer) for h in history)
    assert history[0].moved_at <= history[-1].moved_at


# -- stats and export -----------------------------------------------------------------------------


def test_stats(ledger):
    ledger.write_session(
        make_session("a", split="pool", ended_at=1001.0),
        [make_turn("a", 0), make_turn("a", 1, exact=False)],
    )
    ledger.write_session(make_session("b", split="heldout"), [make_turn("b", 0)])
    ledger.write_session(make_session("c", source="live"))
    ledger.register_adapter(make_adapter("v1"))
    ledger.move_live("v1")
    stats = ledger.stats()
    assert stats["path"] == str(ledger.path)
    assert stats["schema_version"] == schema.current_version()
    assert stats["counts"]["sessions"] == 3
    assert stats["counts"]["turns"] == 3
    assert stats["counts"]["adapters"] == 1
    assert stats["counts"]["live_pointer"] == 1
    assert stats["sessions_by_source"] == {"simulate": 2, "live": 1}
    assert stats["sessions_by_split"] == {"pool": 1, "heldout": 1, "none": 1}
    assert stats["token_exact_turns"] == 2
    assert stats["eligible_turns"]["rl"] == 1
    assert stats["live"] == "v1"
    json.dumps(stats)


def test_export_jsonl(ledger):
    ledger.write_session(
        make_session("a", started_at=1.0),
        [make_turn("a", 0)],
        [
            ToolCallRecord(
                session_id="a",
                turn_index=0,
                call_id="c",
                name="t",
                arguments={"x": 1},
                result=[1, 2],
                started_at=1.0,
            )
        ],
        [LatencyRecord(session_id="a", user_turn=0, v2v_ms=1.0)],
        [ScoreRecord(session_id="a", name="r", value=1.0)],
    )
    ledger.write_session(make_session("b", started_at=2.0))
    buf = io.StringIO()
    assert ledger.export_jsonl(buf) == 2
    rows = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert [r["id"] for r in rows] == ["a", "b"]
    assert rows[0]["turns"][0]["completion_token_ids"] == [5, 6, 7]
    assert rows[0]["tool_calls"][0]["result"] == [1, 2]
    assert rows[0]["latencies"][0]["v2v_ms"] == 1.0
    assert rows[0]["scores"][0]["name"] == "r"
    assert rows[1]["turns"] == []
    assert TurnRecord.model_validate(rows[0]["turns"][0]) == ledger.turns("a")[0]

    buf = io.StringIO()
    assert ledger.export_jsonl(buf, session_ids=["b"]) == 1
    with pytest.raises(NotInLedgerError, match="zzz"):
        ledger.export_jsonl(io.StringIO(), session_ids=["b", "zzz"])


# -- concurrency and migrations -------------------------------------------------------------------


def test_writes_from_many_threads(ledger):
    ledger.add_session(make_session())

    def write(start: int) -> None:
        for i in range(start, start + 25):
            ledger.add_turn(make_turn(index=i))
            ledger.put_latency(LatencyRecord(session_id="s1", user_turn=i, v2v_ms=float(i)))

    threads = [threading.Thread(target=write, args=(k * 25,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [t.index for t in ledger.turns("s1")] == list(range(100))
    assert len(ledger.latencies("s1")) == 100


def test_two_connections_share_a_file(tmp_path):
    path = tmp_path / "shared.db"
    with Ledger(path) as a, Ledger(path) as b:
        a.add_session(make_session("from-a"))
        assert b.session("from-a").id == "from-a"


def test_migration_applied_once_and_data_survives(tmp_path, monkeypatch):
    path = tmp_path / "old.db"
    with Ledger(path) as store:
        store.write_session(make_session("keep"), [make_turn("keep", 0)])
    now = schema.current_version()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == now

    calls = []

    def add_note_column(conn: sqlite3.Connection) -> None:
        calls.append(1)
        conn.execute("ALTER TABLE sessions ADD COLUMN note TEXT")
        conn.execute("UPDATE sessions SET note = 'migrated'")

    monkeypatch.setattr(
        schema, "MIGRATIONS", [*schema.MIGRATIONS, schema.Migration("add note", add_note_column)]
    )
    with Ledger(path) as store:
        assert store.session("keep").id == "keep"
        assert store.turns("keep") == [make_turn("keep", 0)]
        assert store.stats()["schema_version"] == now + 1
    with Ledger(path) as store:
        store.add_session(make_session("after"))
    assert calls == [1]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == now + 1
    assert conn.execute("SELECT note FROM sessions WHERE id = 'keep'").fetchone()[0] == "migrated"
    conn.close()


def test_failed_migration_leaves_file_unchanged(tmp_path, monkeypatch):
    path = tmp_path / "old.db"
    with Ledger(path) as store:
        store.add_session(make_session("keep"))
    now = schema.current_version()

    def half_then_fail(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE sessions ADD COLUMN half TEXT")
        conn.execute("SELECT * FROM no_such_table")

    monkeypatch.setattr(
        schema, "MIGRATIONS", [*schema.MIGRATIONS, schema.Migration("broken", half_then_fail)]
    )
    with pytest.raises(LedgerError, match=f"version {now + 1} \\(broken\\)"):
        Ledger(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == now
    columns = [r[1] for r in conn.execute("PRAGMA table_info(sessions)")]
    assert "half" not in columns
    conn.close()


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "future.db"
    with Ledger(path) as store:
        store.add_session(make_session())
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError) as info:
        Ledger(path)
    message = str(info.value)
    assert "newer pipecat-rl" in message and "upgrade pipecat-rl" in message
    assert "99" in message and str(path) in message


# -- crash safety ---------------------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys, time
    from pipecat_rl.ledger import Ledger, SessionRecord, TurnRecord, LatencyRecord

    ledger = Ledger(sys.argv[1])
    i = 0
    while True:
        sid = f"crash-{i}"
        turns = [
            TurnRecord(
                session_id=sid, index=k, adapter=None, created_at=time.time(),
                request={"messages": [{"role": "user", "content": "x" * 2000}]},
                prompt_token_ids=list(range(500)), completion_token_ids=list(range(50)),
                logprobs=[-0.5] * 50, token_exact=True, generated_text="y" * 500,
            )
            for k in range(TURNS)
        ]
        ledger.write_session(
            SessionRecord(id=sid, source="simulate", started_at=time.time()),
            turns,
            latencies=[LatencyRecord(session_id=sid, user_turn=0, v2v_ms=1.0)],
        )
        print(sid, flush=True)
        i += 1
    """
)


def test_sigkill_mid_write_loses_nothing_committed(tmp_path):
    path = tmp_path / "crash" / "ledger.db"
    turns_per_session = 6
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-c", f"TURNS = {turns_per_session}\n" + WRITER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    printed: list[str] = []
    try:
        while len(printed) < 8:
            line = proc.stdout.readline()
            if not line:
                pytest.fail(f"writer exited early: {proc.stderr.read()}")
            printed.append(line.strip())
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
    # ids the writer committed after our last read may also have been printed
    printed += [line.strip() for line in proc.stdout.read().splitlines() if line.strip()]
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    with Ledger(path) as store:
        assert store._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        for sid in printed:
            assert store.session(sid).id == sid
            turns = store.turns(sid)
            assert [t.index for t in turns] == list(range(turns_per_session))
            assert all(t.trainable for t in turns)
            assert len(store.latencies(sid)) == 1
        # whatever was in flight is either wholly there or wholly absent
        for s in store.sessions():
            assert len(store.turns(s.id)) == turns_per_session


def test_tool_calls_with_the_same_call_id_merge_into_one_row(ledger):
    ledger.add_session(make_session("s"))
    seen = ToolCallRecord(session_id="s", turn_index=2, call_id="call-1", name="book",
                          arguments={"slot": 3}, result={"ok": True}, started_at=10.0,
                          duration_ms=40.0)  # fmt: skip
    executed = ToolCallRecord(session_id="s", turn_index=None, call_id="call-1", name="book",
                              arguments={}, result={"ok": True, "id": "A1"}, started_at=10.01,
                              state_diff={"appointments": {"added": 1}})  # fmt: skip
    first = ledger.add_tool_call(seen)
    assert ledger.add_tool_call(executed) == first
    (row,) = ledger.tool_calls("s")
    assert row.turn_index == 2 and row.arguments == {"slot": 3} and row.duration_ms == 40.0
    assert row.result == {"ok": True, "id": "A1"} and row.state_diff == {
        "appointments": {"added": 1}
    }
    # without a call id, every call is its own row
    ledger.add_tool_call(seen.model_copy(update={"call_id": None}))
    ledger.add_tool_call(seen.model_copy(update={"call_id": None}))
    assert len(ledger.tool_calls("s")) == 3


def test_a_version_1_file_gains_the_call_id_index(tmp_path, monkeypatch):
    path = tmp_path / "v1.db"
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:1])
    with Ledger(path) as store:
        store.add_session(make_session("old"))
    monkeypatch.undo()
    with Ledger(path) as store:
        assert store.stats()["schema_version"] == schema.current_version()
        assert store.session("old").id == "old"
    indexes = [r[1] for r in sqlite3.connect(path).execute("PRAGMA index_list(tool_calls)")]
    assert "tool_calls_by_call_id" in indexes
