"""The recorder's writer opens its ledger on its own thread: a call never waits for a connect.

A Postgres server that accepts the connection and never answers stands for a slow one (a real
socket, no sleeps): the call runs to its end while the connect is still pending, and once the
server hangs up, every write of the call is counted dropped. A ledger that cannot be opened at
all (a folder) is counted the same way, and the next session tries again.
"""

import socket
import threading
import time

import pytest

from pipecat_rl.errors import LedgerError
from pipecat_rl.ledger import dialect
from pipecat_rl.recording import RLRecorder
from pipecat_rl.recording.writer import acquire_writer
from tests.fake_openai import serve_fake_openai
from tests.recording_helpers import Call, vllm_llm


async def test_a_call_never_waits_for_the_ledger_server_to_answer(monkeypatch):
    pytest.importorskip("psycopg", reason="psycopg is the extra pipecat-rl[postgres]")
    pytest.importorskip("psycopg_pool", reason="psycopg-pool is the extra pipecat-rl[postgres]")
    monkeypatch.setattr(dialect, "CONNECT_TIMEOUT_S", 300)  # only the hang-up below ends it
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), says nothing
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        url = f"postgresql://bot@127.0.0.1:{port}/calls?sslmode=disable&gssencmode=disable"
        async with serve_fake_openai(["Hello", " there"], vllm=True) as llm_url:
            recorder = RLRecorder(url, call_id="call-1")
            async with Call([recorder], llm=vllm_llm(llm_url)) as call:
                assert await call.say("Hi") == "Hello there"
            writer = recorder.recorder._writer
            # The call has ended, and the ledger is still being opened.
            assert writer.ledger is None and writer.unopened is None and writer.alive
    # The server hung up (its socket closed): the writer could not open the ledger.
    assert await writer.flush()
    assert isinstance(writer.unopened, LedgerError)
    assert recorder.recorder.dropped >= 3  # the session, its turn, its end: none was written
    assert writer.failed == recorder.recorder.dropped


def test_a_ledger_that_cannot_be_opened_drops_each_write_and_the_next_session_retries(tmp_path):
    folder = tmp_path / "not-a-file"
    folder.mkdir()
    writer = acquire_writer(folder)  # returns at once: the thread opens it
    written: list[str] = []
    for k in range(2):
        writer.submit(lambda ledger, k=k: written.append(k), f"write {k}", session_id="s1")
    assert writer.flush_sync()
    assert written == [] and writer.dropped("s1") == 2 and writer.failed == 2
    assert "is a directory" in str(writer.unopened)
    retry = acquire_writer(folder)  # a new session: a new writer, which tries again
    assert retry is not writer
    for w in (writer, retry):
        w.release()


async def test_flush_returns_once_the_calls_end_is_in_a_slow_ledger(tmp_path, monkeypatch):
    """A bot that reads its ledger right after a call (to post a score) awaits `flush()` first:
    with every end-of-session write held up on the writer's thread, the call is over and its
    end not yet written; after `flush()` it is."""
    from pipecat_rl.ledger import Ledger

    end_session, disk = Ledger.end_session, threading.Event()

    def slow_end_session(self, *args, **kwargs):
        disk.wait(60)  # a slow disk: the end is written once the test lets it through,
        time.sleep(0.3)  # and slowly (a planted delay, not a synchronisation)
        return end_session(self, *args, **kwargs)

    monkeypatch.setattr(Ledger, "end_session", slow_end_session)
    path = tmp_path / "calls.db"
    async with serve_fake_openai(["Hello"], vllm=True) as llm_url:
        recorder = RLRecorder(path, call_id="call-1")
        async with Call([recorder], llm=vllm_llm(llm_url)) as call:
            assert await call.say("Hi") == "Hello"
    with Ledger(path) as ledger:
        assert ledger.session("call-1").outcome is None  # still on its way
    disk.set()
    await recorder.flush()
    with Ledger(path) as ledger:
        assert ledger.session("call-1").outcome in ("completed", "cancelled")
