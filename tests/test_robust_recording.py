"""Nothing lost in silence, nothing half-written in training: recorder and ledger under stress.

Against the vLLM-shaped fake server (`tests/fake_openai.py`), so no model is needed: one writer
thread per ledger file however many calls, `on_turn_recorded`, request parameters kept per call,
token-exactness checked against usage, sessions of a killed process reconciled, and a locked
ledger turning into a non-zero exit with the session marked as not fully written.
"""

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pipecat.processors.aggregators.llm_context import LLMContext
from typer.testing import CliRunner

from pipecat_rl import compat
from pipecat_rl.cli import app
from pipecat_rl.cli.common import EXIT_FAILURE
from pipecat_rl.ledger import Ledger, ScoreIn, SessionRecord, TurnRecord
from pipecat_rl.ledger import store as ledger_store
from pipecat_rl.ledger.liveness import process_started
from pipecat_rl.recording import RLRecorder
from pipecat_rl.recording.llm_tee import LLMCall, tee_llm_service
from pipecat_rl.scoring.outcome import UNTRAINABLE_OUTCOMES
from pipecat_rl.serving.server import free_port
from tests.fake_openai import serve_fake_openai
from tests.recording_helpers import Call, vllm_llm
from tests.robust_helpers import CLINIC, cli_env, long_scenario, recorded_turns, start_fake_vllm


def _writer_threads(path: Path | None = None) -> list[threading.Thread]:
    """Live ledger writer threads (of one file when `path` is given)."""
    name = "pipecat-rl-ledger" if path is None else f"pipecat-rl-ledger {path}"
    return [t for t in threading.enumerate() if t.name.startswith(name) and t.is_alive()]


async def test_fifty_calls_share_one_writer_thread(tmp_path):
    path = tmp_path / "ledger.db"
    seen: list[int] = []
    async with serve_fake_openai(["Hello", " there"], vllm=True) as url:

        async def one(k: int) -> None:
            recorder = RLRecorder(path, call_id=f"call-{k}")
            async with Call([recorder], llm=vllm_llm(url)) as call:
                await call.say("Hi")
                seen.append(len(_writer_threads(path)))

        for batch in range(10):  # 5 calls at once, 10 times: 50 calls
            await asyncio.gather(*(one(batch * 5 + k) for k in range(5)))
    assert max(seen) == 1  # one writer for the file, however many calls were in progress
    for thread in _writer_threads(path):  # the last session to end stops it
        await asyncio.to_thread(thread.join, 10)
    assert not _writer_threads(path)
    with Ledger(path) as ledger:
        sessions = ledger.sessions()
        assert len(sessions) == 50 and {s.outcome for s in sessions} == {"completed"}
        assert all(s.metadata["recorder"] == {"errors": 0, "dropped_writes": 0} for s in sessions)
        assert all(s.metadata["writer"]["pid"] == os.getpid() for s in sessions)
        turns = [t for s in sessions for t in ledger.turns(s.id)]
        assert len(turns) == 50 and all(t.trainable for t in turns)  # each one token-exact


async def test_on_turn_recorded_fires_for_every_turn(tmp_path):
    recorder = RLRecorder(tmp_path / "ledger.db", call_id="events")
    fired: list[TurnRecord] = []
    both = asyncio.Event()
    async with serve_fake_openai(["One", " two"], vllm=True) as url:
        async with Call([recorder], llm=vllm_llm(url)) as call:

            @recorder.recorder.event_handler("on_turn_recorded")
            async def on_turn(rec, turn):
                assert rec is recorder.recorder
                fired.append(turn)
                if len(fired) == 2:
                    both.set()

            await call.say("First")
            await call.say("Second")
    await asyncio.wait_for(both.wait(), 60)  # a hang guard only: the event is the sync
    assert [t.index for t in fired] == [0, 1]
    assert all(t.session_id == "events" and t.token_exact for t in fired)


async def test_request_parameters_are_kept_per_call_not_on_the_service(tmp_path):
    """Pipecat's own inference (context summaries) building its request mid-stream must not
    become the recorded request of the streaming call."""
    calls: list[LLMCall] = []
    async with serve_fake_openai(["Fine"], vllm=True) as url:
        llm = vllm_llm(url)
        tee_llm_service(llm, calls.append, token_ids=True)
        client = compat.llm_client(llm)
        create = client.chat.completions.create
        summary = LLMContext(messages=[{"role": "user", "content": "SUMMARISE EVERYTHING"}])

        async def create_while_summarising(**params):
            async def summarise():
                adapter = llm.get_llm_adapter()
                invocation = await adapter.get_llm_invocation_params(
                    summary, convert_developer_to_user=False
                )
                llm.build_chat_completion_params(invocation)  # another task, same service

            await asyncio.create_task(summarise())
            return await create(**params)

        client.chat.completions.create = create_while_summarising
        context = LLMContext(messages=[{"role": "user", "content": "the real question"}])
        stream = await llm.get_chat_completions(context)
        async for _ in stream:
            pass
    (call,) = calls
    assert call.request["messages"] == [{"role": "user", "content": "the real question"}]
    assert call.request["logprobs"] is True and call.token_exact


def test_a_sampled_id_count_that_disagrees_with_usage_is_not_token_exact():
    def call(completion_tokens: int | None) -> LLMCall:
        return LLMCall(
            request={},
            started_at=0.0,
            token_ids_requested=True,
            prompt_token_ids=[1, 2, 3],
            token_ids=[7, 8],
            logprobs=[-0.1, -0.2],
            usage={} if completion_tokens is None else {"completion_tokens": completion_tokens},
        )

    assert call(2).token_exact and call(None).token_exact
    assert not call(3).token_exact  # a chunk was lost or merged: the ids are not the sample


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_opening_a_ledger_closes_sessions_of_dead_processes(tmp_path):
    path = tmp_path / "ledger.db"
    host = socket.gethostname()
    me = {"pid": os.getpid(), "host": host, "started": process_started(os.getpid())}
    writers = {
        "dead": {"pid": _dead_pid(), "host": host, "started": 1},
        "alive": me,
        "elsewhere": {"pid": 1, "host": "another-host", "started": 1},
        "reused-pid": {**me, "started": (me["started"] or 0) + 1},
    }
    with Ledger(path) as ledger:
        for sid, writer in writers.items():
            ledger.add_session(
                SessionRecord(id=sid, source="live", started_at=1.0, metadata={"writer": writer})
            )
            ledger.add_turn(
                TurnRecord(
                    session_id=sid,
                    index=0,
                    adapter="base",
                    created_at=1.0,
                    request={},
                    prompt_token_ids=[1],
                    completion_token_ids=[2],
                    logprobs=[-0.1],
                    token_exact=True,
                    usage={"completion_tokens": 1},
                    redacted=True,
                )  # fmt: skip
            )
    with Ledger(path) as ledger:
        outcomes = {s.id: s.outcome for s in ledger.sessions()}
        assert outcomes == {
            "dead": "interrupted",
            "reused-pid": "interrupted",
            "alive": None,
            "elsewhere": None,
        }
        assert ledger.training_turns() == []  # a call still open (or cut) never trains
        for sid in ("alive", "elsewhere"):  # once their own writers end them, they may
            ledger.end_session(sid, ended_at=2.0)
            ledger.post_score(sid, ScoreIn(metric="success", value=1, source="human"))
        assert {t.session_id for t in ledger.training_turns()} == {"alive", "elsewhere"}
        assert ledger.stats()["eligible_turns"]["rl"] == 2
        for outcome in ("error", "not_run"):
            ledger.end_session("alive", ended_at=2.0, outcome=outcome)
            assert {t.session_id for t in ledger.training_turns()} == {"elsewhere"}


def test_a_simulated_session_the_recorder_ended_but_the_simulator_never_finished(tmp_path):
    """A crash between the recorder's end of the call and the simulator's result: half-written.

    The recorder wrote `completed` (a live call's outcome) and no reward; it must not train, and
    opening the ledger after its writer died closes it `interrupted`. A live call that ended the
    same way is finished, and may train once scored.
    """
    path = tmp_path / "ledger.db"
    dead = {"pid": _dead_pid(), "host": socket.gethostname(), "started": 1}
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "started": process_started(os.getpid())}  # fmt: skip
    with Ledger(path) as ledger:
        for sid, source, writer in (("cut", "simulate", dead), ("running", "simulate", me),
                                    ("live", "live", dead)):  # fmt: skip
            ledger.add_session(
                SessionRecord(id=sid, source=source, started_at=1.0, metadata={"writer": writer})
            )
            ledger.add_turn(
                TurnRecord(
                    session_id=sid, index=0, adapter="base", created_at=1.0, request={},
                    prompt_token_ids=[1], completion_token_ids=[2], logprobs=[-0.1],
                    token_exact=True, redacted=source == "live", usage={"completion_tokens": 1},
                )  # fmt: skip
            )
            ledger.end_session(sid, ended_at=2.0, outcome="completed")  # the recorder's write
        ledger.post_score("live", ScoreIn(metric="success", value=1, source="human"))
        assert {t.session_id for t in ledger.training_turns()} == {"live"}
    with Ledger(path) as ledger:
        outcomes = {s.id: s.outcome for s in ledger.sessions()}
        assert outcomes == {"cut": "interrupted", "running": "completed", "live": "pass"}
        ledger.end_session("running", ended_at=3.0, outcome="pass")  # the simulator's result
        assert {t.session_id for t in ledger.training_turns()} == {"live", "running"}


def test_sigkill_mid_simulation_leaves_sessions_that_reopen_interrupted(tmp_path):
    port = free_port()
    env = cli_env()
    fake = start_fake_vllm(port, env)
    ledger_path = tmp_path / "ledger.db"
    sim = None
    try:
        sim = subprocess.Popen(
            [sys.executable, "-c", "from pipecat_rl.cli import main; main()", "simulate",
             str(long_scenario(tmp_path)), "--bot", str(CLINIC / "bot.py"), "--persona", "scripted",
             "--llm-url", f"http://127.0.0.1:{port}/v1", "--repeats", "2", "--ledger",
             str(ledger_path)],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while recorded_turns(ledger_path) < 4:  # both calls are under way
            assert sim.poll() is None, "the simulation ended before it could be killed"
            assert time.monotonic() < deadline, "no turns were recorded"
            time.sleep(0.1)
        sim.send_signal(signal.SIGKILL)
        sim.wait(30)
    finally:
        if sim is not None and sim.poll() is None:
            sim.kill()
        fake.terminate()
        fake.wait(30)
    with sqlite3.connect(ledger_path) as raw:  # as the kill left it: open, and trainable turns
        (open_sessions,) = raw.execute("SELECT count(*) FROM sessions WHERE ended_at IS NULL")
        (exact,) = raw.execute("SELECT count(*) FROM turns WHERE token_exact = 1")
    assert open_sessions[0] >= 1 and exact[0] >= 4
    with Ledger(ledger_path) as ledger:
        sessions = ledger.sessions()
        assert {s.outcome for s in sessions if s.ended_at is None} == set()
        assert "interrupted" in {s.outcome for s in sessions}
        interrupted = {s.id for s in sessions if s.outcome == "interrupted"}
        assert not interrupted & {t.session_id for t in ledger.training_turns()}
    with sqlite3.connect(ledger_path) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_locked_ledger_fails_the_episode_and_the_run(tmp_path, monkeypatch):
    """Another process holds the ledger's write lock for the whole call: the recorder's writes
    fail after their retries, the episode says the session is not fully written, and the run
    exits non-zero."""
    monkeypatch.setattr(ledger_store, "BUSY_TIMEOUT_S", 0.05)
    monkeypatch.setattr(ledger_store, "WRITE_RETRIES", 1)
    monkeypatch.setattr(ledger_store, "RETRY_BACKOFF_S", 0.01)
    ledger_path = tmp_path / "ledger.db"
    Ledger(ledger_path).close()
    bot = tmp_path / "locking_bot.py"
    bot.write_text(
        "import importlib.util, sqlite3\n"
        "from pipecat_rl.recording.session import current_recording\n"
        f"spec = importlib.util.spec_from_file_location('expert', {str(CLINIC / 'expert.py')!r})\n"
        "expert = importlib.util.module_from_spec(spec)\n"
        "import sys; sys.path.insert(0, spec.origin.rsplit('/', 1)[0])\n"
        "spec.loader.exec_module(expert)\n\n"
        "async def run_bot(transport, runner_args):\n"
        f"    lock = sqlite3.connect({str(ledger_path)!r}, isolation_level=None)\n"
        "    lock.execute('BEGIN IMMEDIATE')  # another writer holds the file for the call\n"
        "    try:\n"
        "        await expert.run_bot(transport, runner_args)\n"
        "    finally:  # held until the recorder has tried (and failed) to write the call\n"
        "        await current_recording().flush()\n"
        "        lock.execute('ROLLBACK')\n"
        "        lock.close()\n"
    )
    args = ["simulate", str(CLINIC / "handwritten" / "pool" / "routine_booking.yaml"), "--bot",
            str(bot), "--persona", "scripted", "--no-server", "--ledger", str(ledger_path),
            "--json"]  # fmt: skip
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == EXIT_FAILURE, result.output
    assert "not fully written" in result.stderr.replace("\n", " ")
    with Ledger(ledger_path) as ledger:
        (session,) = ledger.sessions()
        assert session.outcome == "error"
        assert "not fully written" in session.metadata["error"]
        assert not ledger.training_turns()


@pytest.mark.parametrize("outcome", ["interrupted", "error", "not_run"])
def test_untrainable_outcomes_are_one_list(outcome):
    assert outcome in UNTRAINABLE_OUTCOMES


def test_a_call_that_ends_just_before_the_process_exits_is_still_written(tmp_path):
    """The writer released by the last session still drains its queue before the interpreter
    exits (its thread is a daemon: without the wait, the end of that call would be lost)."""
    import subprocess
    import sys
    import textwrap

    path = tmp_path / "ledger.db"
    script = textwrap.dedent(
        f"""
        import time
        from pipecat_rl.ledger import Ledger, SessionRecord
        from pipecat_rl.recording.writer import acquire_writer

        writer = acquire_writer({str(path)!r})

        def slow_end(ledger):
            time.sleep(0.5)  # a write still queued when the program returns
            ledger.add_session(SessionRecord(id="last", source="live", started_at=1.0))
            ledger.end_session("last", ended_at=2.0, outcome="completed")

        writer.submit(slow_end, "end of session last")
        writer.release()  # the last session is done: the writer stops after its queue
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    with Ledger(path) as ledger:
        assert ledger.session("last").outcome == "completed"


async def test_a_call_given_up_before_its_pipeline_started_still_ends_its_session(tmp_path):
    """A worker cancelled while a processor is still setting up (a caller gone while the bot
    connects; the simulator's pre-flight) never fires `on_pipeline_finished`: the session still
    ends, cancelled, and the file's writer thread stops."""
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.frame_processor import FrameProcessor
    from pipecat.workers.runner import WorkerRunner

    path = tmp_path / "ledger.db"
    connecting = asyncio.Event()

    class NeverConnects(FrameProcessor):
        async def setup(self, setup):
            await super().setup(setup)
            connecting.set()
            await asyncio.Event().wait()  # until the worker gives up on it

    async with serve_fake_openai(["Hello"], vllm=True) as url:
        recorder = RLRecorder(path, call_id="call-gone", token_ids=True)  # attached at once
        worker = PipelineWorker(Pipeline([recorder, NeverConnects(), vllm_llm(url)]))
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        run = asyncio.create_task(runner.run())
        try:
            await asyncio.wait_for(connecting.wait(), 30)
            assert recorder.recorder is not None and _writer_threads(path)
            await worker.cancel()
            await asyncio.wait_for(run, 30)
        finally:
            run.cancel()
    for thread in _writer_threads(path):
        await asyncio.to_thread(thread.join, 10)
    assert not _writer_threads(path)
    with Ledger(path) as ledger:
        (session,) = ledger.sessions()
        assert session.id == "call-gone" and session.outcome == "cancelled"
