"""The cycle on a Postgres ledger: loop.yaml's `ledger:` URL, a snapshot that is one point in
time while bots keep writing, and a whole cycle (stopped, then resumed) with its stand-ins.

The cycle's fixtures (the clinic, a stand-in vLLM and trainer) are test_cycle.py's, and the
throwaway PostgreSQL cluster test_ledger_postgres.py's: skipped, saying why, where the server
binaries or psycopg are missing. The loop-file cases need neither.
"""

import importlib.util
from pathlib import Path

import pytest

from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import Ledger, transfer
from pipecat_rl.loop.config import load_loop_config
from pipecat_rl.loop.cycle import run_cycle
from tests.test_cycle import loop, read_events, world  # noqa: F401
from tests.test_ledger import make_session, make_turn
from tests.test_ledger_postgres import pg_url, postgres_server  # noqa: F401

URL = "postgresql://bot:s3cret@db.internal:5432/calls?sslmode=require"


def _loop_file(tmp_path: Path, ledger: str) -> Path:
    path = tmp_path / "loop.yaml"
    path.write_text(f"bot: bot.py\npool: pool\nheldout: heldout\nout: cycle\nledger: {ledger}\n")
    return path


def test_a_loop_file_takes_a_ledger_url_as_written_and_a_path_from_its_folder(tmp_path):
    pytest.importorskip("psycopg", reason="psycopg is the extra pipecat-rl[postgres]")
    pytest.importorskip("psycopg_pool", reason="psycopg-pool is the extra pipecat-rl[postgres]")
    assert load_loop_config(_loop_file(tmp_path, URL)).ledger == URL
    assert load_loop_config(_loop_file(tmp_path, "calls.db")).ledger == (
        tmp_path.resolve() / "calls.db"
    )
    # A flag wins over the file, and stays a URL too.
    config = load_loop_config(_loop_file(tmp_path, "calls.db"), ledger=URL)
    assert config.ledger == URL


def test_a_loop_file_ledger_of_another_scheme_or_without_the_driver_is_refused(
    tmp_path, monkeypatch
):
    with pytest.raises(ConfigError, match=r"loop\.yaml: ledger: .*postgresql://") as refused:
        load_loop_config(_loop_file(tmp_path, "mysql://bot:s3cret@db.internal/calls"))
    assert "s3cret" not in str(refused.value)  # the password never reaches a message
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "psycopg" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"loop\.yaml: ledger: .*pipecat-rl\[postgres\]"):
        load_loop_config(_loop_file(tmp_path, URL))
    assert not (tmp_path / "postgresql:").exists()


def test_a_postgres_snapshot_is_one_point_in_time_while_a_bot_records(
    pg_url,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """A call a bot records while the snapshot is being copied is neither in the copy nor in its
    counts, and the copy's check against the ledger still holds (it reads the same point)."""
    with Ledger(pg_url) as ledger, Ledger(pg_url) as bot:
        for k in range(3):
            ledger.add_session(make_session(f"s{k}"))
            ledger.add_turn(make_turn(f"s{k}"))
        copy_sessions = transfer._copy_sessions

        def sessions_then_a_bot_records(source, dest, report) -> None:
            copy_sessions(source, dest, report)
            bot.add_session(make_session("late"))  # committed in the middle of the copy
            bot.add_turn(make_turn("late"))

        monkeypatch.setattr(transfer, "_copy_sessions", sessions_then_a_bot_records)
        counts = transfer.snapshot_ledger(ledger, tmp_path / "snapshot" / "ledger.db")
        assert counts["sessions"] == 3 and counts["turns"] == 3
        assert len(ledger.sessions()) == 4  # the bot's call is in the ledger, after the point
    with Ledger(tmp_path / "snapshot" / "ledger.db") as copy:
        assert sorted(s.id for s in copy.sessions()) == ["s0", "s1", "s2"]
        assert copy.stats()["counts"] == counts


def test_a_cycle_runs_on_a_postgres_ledger_and_resumes_on_it(tmp_path, world, pg_url):  # noqa: F811
    clinic, training, vllm = world
    with Ledger(pg_url) as ledger:  # a call the bots recorded before the cycle
        ledger.add_session(make_session("live-1", source="live", ended_at=1001.0))
        ledger.add_turn(make_turn("live-1"))
    first = run_cycle(loop(tmp_path, clinic, vllm, ledger=pg_url, stop_after="train"))
    assert first.state == "stopped" and list(first.stages)[-1] == "train"
    snap = first.stages["snapshot"]
    assert snap["ledger"] == pg_url and snap["ledger_counts"]["sessions"] == 1
    with Ledger(Path(snap["ledger_snapshot"])) as copy:  # a SQLite file of the ledger's start
        assert [s.id for s in copy.sessions()] == ["live-1"]
        assert copy.stats()["counts"] == snap["ledger_counts"]
    assert first.stages["filter"]["contested"] == ["routine_booking"]
    again = run_cycle(loop(tmp_path, clinic, vllm, ledger=pg_url))
    assert again.resumed_from == "evaluate" and again.state == "finished"
    assert len(training.calls) == 1  # train finished before: not rerun
    evaluated = again.stages["evaluate"]
    assert evaluated["candidate"] == first.stages["train"]["candidate"] == "cand-grpo-1"
    assert Path(evaluated["receipt"]["json"]).is_file()
    with Ledger(pg_url) as ledger:
        assert {s.source for s in ledger.sessions()} == {"live", "simulate", "gate"}
        assert "cand-grpo-1" in [a.name for a in ledger.adapters()]
        # both arms, one run each, of every held-out scenario
        assert len(ledger.sessions(source="gate")) == 2 * evaluated["n_scenarios"] == 4
        assert ledger.heldout_hashes()  # the gate froze the held-out set in Postgres
    assert not (tmp_path / "ledger.db").exists()  # no SQLite ledger beside it
    starts = [e["stage"] for e in read_events(loop(tmp_path, clinic, vllm)) if e["event"] ==
              "stage_started"]  # fmt: skip
    assert starts.count("snapshot") == 1 and starts[-2:] == ["evaluate", "promote"]
