"""The ledger on PostgreSQL: the SQLite suite's key cases on a throwaway PostgreSQL 15 cluster,
many writer processes at once, and `ledger migrate` from a SQLite file.

The cluster runs on a loopback port as an unprivileged user (initdb refuses root); each test gets
a schema of its own. Skipped, saying why, where the server binaries or psycopg are missing.
The SQLite suite's backend-agnostic cases are imported here, so they run on this module's
`ledger` fixture (a Postgres ledger) as well as on their own module's SQLite one.
"""

import itertools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.errors import LedgerError
from pipecat_rl.ledger import Ledger, ScoreRecord, resolve_ledger_path, schema
from pipecat_rl.ledger.dialect import postgres_sql
from tests.postgres_helpers import server_binaries, throwaway_cluster
from tests.test_ledger import (  # noqa: F401
    make_session,
    make_turn,
    test_adapter_names_are_never_reused,
    test_children_need_their_session,
    test_duplicate_session_refused,
    test_end_and_update_session,
    test_export_jsonl,
    test_finish_episode_completes_what_the_recorder_wrote,
    test_finish_episode_writes_the_session_no_recorder_wrote,
    test_heldout_excluded_and_unconsented_sessions_never_train,
    test_latency_upsert_merges_fields,
    test_live_pointer_move_rollback_history,
    test_round_trip_every_table,
    test_score_with_same_name_is_replaced,
    test_sessions_filters_newest_first,
    test_stats,
    test_the_closer_closes_only_open_sessions_whose_writer_is_gone,
    test_tool_calls_with_the_same_call_id_merge_into_one_row,
    test_turn_upsert_completes_a_turn,
    test_write_session_round_trip_and_atomicity,
    test_writes_from_many_threads,
)
from tests.test_ledger_scores import (  # noqa: F401
    test_a_long_explanation_is_cut_and_the_result_says_so,
    test_a_score_posted_twice_is_one_row_and_the_retry_replaces_it,
    test_gate_heldout_and_open_sessions_refuse_scores,
    test_only_consented_redacted_trusted_settled_live_calls_train,
    test_stats_count_live_calls_by_score_state_as_the_eligibility_query_does,
    test_the_deciding_source_sets_a_live_calls_verdict,
    test_the_judge_takes_only_unscored_ended_live_calls_that_could_train,
)
from tests.test_live_redaction import (  # noqa: F401
    test_a_live_call_trains_exactly_when_no_reason_keeps_it_out,
    test_each_planted_reason_is_named,
    test_the_refusal_names_each_reason_under_the_runs_trust,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on a loopback port; yields its URL."""
    pytest.importorskip("psycopg", reason="psycopg is the extra pipecat-rl[postgres]")
    pytest.importorskip("psycopg_pool", reason="psycopg-pool is the extra pipecat-rl[postgres]")
    binaries = server_binaries()
    if binaries is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    with throwaway_cluster(*binaries) as url:
        yield url


_schemas = itertools.count()


@pytest.fixture
def pg_url(postgres_server: str) -> str:
    """A URL whose search path is a new, empty schema: one empty ledger per test."""
    import psycopg

    schema = f"t{os.getpid()}_{next(_schemas)}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{postgres_server}?options=-csearch_path%3D{schema}"


@pytest.fixture
def ledger(pg_url: str) -> Iterator[Ledger]:
    with Ledger(pg_url) as store:
        yield store


# -- opening, and the one place a --ledger value becomes a ledger ---------------------------------


def test_a_postgres_ledger_hides_its_password_and_reopens_at_its_schema_version(pg_url):
    url = pg_url.replace("postgres@", "postgres:secret@")
    with Ledger(url) as store:
        assert "secret" not in repr(store) and "***" in str(store.path)
        store.add_session(make_session("kept"))
    with Ledger(url) as again:  # migrated once; the second open finds the current version
        assert [s.id for s in again.sessions()] == ["kept"]
        assert again.stats()["schema_version"] == schema.current_version()


def test_a_url_never_becomes_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LedgerError, match="postgresql://"):
        resolve_ledger_path("mysql://u@h/db")
    with pytest.raises(LedgerError, match="postgresql://"):
        Ledger(Path("postgresql://u@h/db"))  # a Path collapses '//': refused, not a file
    assert resolve_ledger_path("postgresql://u@h/db") == "postgresql://u@h/db"
    assert resolve_ledger_path("C:/ledgers/calls.db") == Path("C:/ledgers/calls.db")
    assert not list(tmp_path.iterdir())


def test_the_cli_takes_a_postgres_url_and_refuses_another_scheme(pg_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with Ledger(pg_url) as store:
        store.add_session(make_session("s1"))
    ok = CliRunner().invoke(app, ["ledger", "stats", "--ledger", pg_url, "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["counts"]["sessions"] == 1
    bad = CliRunner().invoke(app, ["ledger", "stats", "--ledger", "mysql://u@h/db"])
    assert bad.exit_code != 0 and "postgresql://" in bad.output
    assert not list(tmp_path.iterdir())  # no ./mysql:/ folder, no ledger file


def test_a_postgres_url_without_the_driver_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "psycopg" else real(name, *a)
    )
    with pytest.raises(LedgerError, match=r"pipecat-rl\[postgres\]"):
        Ledger("postgresql://u@h/db")


def test_a_database_holding_other_tables_is_refused(pg_url):
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE invoices (id int)")
    with pytest.raises(LedgerError, match="not a pipecat-rl ledger"):
        Ledger(pg_url)


def test_an_undeclared_json_path_says_where_to_declare_it():
    with pytest.raises(LedgerError, match="JSON_PATHS"):
        postgres_sql("SELECT json_extract(s.metadata, '$.nowhere') FROM sessions s")


def test_the_eligibility_query_runs_in_postgres(ledger):
    """The held-out exclusion and the turn rules are the statement Postgres runs, not Python
    after the fact: the query text carries them, and a held-out hash keeps its session out."""
    ledger.add_session(make_session("pool", scenario_hash="h1", ended_at=1001.0, outcome="pass"))
    ledger.add_turn(make_turn("pool"))
    assert [t.session_id for t in ledger.training_turns()] == ["pool"]
    ledger.record_heldout_hashes([("h1", "clinic-1", "set-a")])  # now seen held out
    assert ledger.training_turns() == []
    assert ledger.stats()["eligible_turns"] == {"sft": 0, "rl": 0}


def test_a_write_held_off_by_a_stuck_writer_fails_locked_and_the_recorder_counts_it_dropped(
    ledger, pg_url, monkeypatch
):
    import psycopg

    from pipecat_rl.errors import LedgerLockedError
    from pipecat_rl.ledger import dialect
    from pipecat_rl.recording.writer import acquire_writer

    monkeypatch.setattr(dialect, "LOCK_TIMEOUT_S", 1)
    with psycopg.connect(pg_url) as stuck:  # a writer stopped inside its transaction
        stuck.execute("SELECT pg_advisory_xact_lock(%s)", (dialect.WRITE_LOCK,))
        with pytest.raises(LedgerLockedError, match="stayed locked"):
            ledger.add_session(make_session("held"))
        assert ledger.sessions() == []  # reads go on beside the writer
        writer = acquire_writer(ledger)
        writer.submit(
            lambda store: store.add_session(make_session("s1")), "session", session_id="s1"
        )
        assert writer.flush_sync()
        assert writer.dropped("s1") == 1
        writer.release()
    ledger.add_session(make_session("after"))  # the lock is free again
    assert [s.id for s in ledger.sessions()] == ["after"]


# -- many writers ---------------------------------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, {repo!r})
    from pipecat_rl.recording import RLRecorder
    from tests.fake_openai import serve_fake_openai
    from tests.recording_helpers import Call, vllm_llm

    async def main():
        async with serve_fake_openai(["Hello", " there"], vllm=True) as url:
            async def one(k):
                recorder = RLRecorder({url!r}, call_id=f"w{{sys.argv[1]}}-{{k}}")
                async with Call([recorder], llm=vllm_llm(url)) as call:
                    await call.say("Hi")
            for batch in range({calls} // 5):  # five calls at once
                await asyncio.gather(*(one(batch * 5 + k) for k in range(5)))

    asyncio.run(main())
    """
)


@pytest.mark.slow  # about a minute on two cores: 200 calls through real pipelines
def test_four_bot_processes_recording_at_once_lose_nothing(pg_url, tmp_path):
    writers, calls = 4, 50
    script = tmp_path / "bot.py"
    script.write_text(_WRITER.format(repo=str(REPO), url=pg_url, calls=calls))
    bots = [
        subprocess.Popen([sys.executable, str(script), str(w)], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for w in range(writers)
    ]  # fmt: skip
    for bot in bots:
        out, _ = bot.communicate(timeout=600)
        assert bot.returncode == 0, out.decode()[-3000:]
    with Ledger(pg_url) as ledger:
        sessions = ledger.sessions()
        ids = [s.id for s in sessions]
        expected = {f"w{w}-{k}" for w in range(writers) for k in range(calls)}
        assert len(ids) == len(set(ids)) == writers * calls and set(ids) == expected
        assert {s.outcome for s in sessions} == {"completed"}
        assert all(s.metadata["recorder"] == {"errors": 0, "dropped_writes": 0} for s in sessions)
        assert len({s.metadata["writer"]["pid"] for s in sessions}) == writers
        turns = [t for s in sessions for t in ledger.turns(s.id)]
        assert len(turns) == writers * calls and all(t.trainable for t in turns)
        assert ledger.stats()["counts"]["turns"] == writers * calls


# -- ledger migrate -------------------------------------------------------------------------------


def _fill(store: Ledger) -> None:
    from tests.test_ledger import make_adapter

    for k in range(3):
        sid = f"s{k}"
        store.add_session(make_session(sid, started_at=1000.0 + k, ended_at=1001.0 + k))
        store.add_turn(make_turn(sid, 0))
        store.add_turn(make_turn(sid, 1))
        store.add_score(ScoreRecord(session_id=sid, name="task", value=0.5))
    store.register_adapter(make_adapter("clinic-v1"))
    store.move_live("clinic-v1")
    store.record_heldout_hashes([("h9", "clinic-9", "set-a")])
    store.add_job("simulate", {"n": 1}, job_id="job-1")
    store.add_job_event("job-1", "started", {})


def test_ledger_migrate_copies_sqlite_over_idempotently_verifying_counts(tmp_path, pg_url):
    source = tmp_path / "calls.db"
    with Ledger(source) as store:
        _fill(store)
        before = store.stats()["counts"]
    runner = CliRunner()
    first = runner.invoke(app, ["ledger", "migrate", "--from", str(source), "--to", pg_url,
                                "--json"])  # fmt: skip
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout)
    assert report["tables"]["sessions"] == {"source": 3, "copied": 3, "present": 0}
    assert report["tables"]["turns"]["copied"] == 6
    again = runner.invoke(app, ["ledger", "migrate", "--from", str(source), "--to", pg_url,
                                "--json"])  # fmt: skip
    assert again.exit_code == 0, again.output
    rerun = json.loads(again.stdout)
    assert all(t["copied"] == 0 and t["present"] == t["source"] for t in rerun["tables"].values())
    with Ledger(pg_url) as copy:
        assert copy.stats()["counts"] == before
        assert copy.session_bundle("s1") == Ledger(source).session_bundle("s1")
        assert copy.live().adapter == "clinic-v1"
        assert [e.event for e in copy.job_events("job-1")] == ["started"]
        copy.add_session(make_session("new"))  # its own writes continue after the copy
        copy.add_score(ScoreRecord(session_id="new", name="task", value=1.0))
