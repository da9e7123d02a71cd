"""A real simulation prints no traceback and no shutdown warning: every HTTP client it opened
(the agent's redirected OpenAI client, the persona's, the judge's) is closed in the event loop
that opened it. A client left open is collected later, under the next loop a process runs (the
gate's arms, the cycle's stages, the service's jobs), and logs "Task exception was never
retrieved ... Event loop is closed"; the child here runs a loop after the simulation and
collects garbage in it, as such a process would."""

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx

from pipecat_rl.ledger import Ledger
from pipecat_rl.serving.server import free_port

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import asyncio, gc, sys
from pathlib import Path
from pipecat_rl.ledger import Ledger
from pipecat_rl.scenarios import load_scenarios
from pipecat_rl.simulator import Server, load_bot, run
from pipecat_rl.simulator.options import SimulationOptions

async def next_loop():
    gc.collect()
    for _ in range(20):
        await asyncio.sleep(0)  # let whatever the collection scheduled run

url, db = sys.argv[1], Path(sys.argv[2])
scenarios = load_scenarios([Path("examples/clinic/handwritten/pool/routine_booking.yaml")])
with Ledger(db) as ledger:
    report = run(scenarios, load_bot("examples/clinic/bot.py"),
                 SimulationOptions(repeats=2, concurrency=2), ledger, server=Server(url=url))
asyncio.run(next_loop())
print(sorted({str(e.outcome) for e in report.episodes}), [e.error for e in report.episodes])
"""


def _wait_until_up(url: str, process: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            httpx.get(f"{url}/models", timeout=1.0).raise_for_status()
            return
        except httpx.HTTPError:
            time.sleep(0.1)  # polling for readiness: the fake has no event to wait on
    raise AssertionError("the fake OpenAI server did not start")


def test_a_simulation_closes_its_clients_in_its_own_loop(tmp_path):
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.fake_openai", "--port", str(port), "--vllm",
         "--pieces", "5"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/v1"
        _wait_until_up(url, server)
        child = subprocess.run(
            [sys.executable, "-c", CHILD, url, str(tmp_path / "l.db")],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert child.returncode == 0, child.stderr[-3000:]
    assert "[None, None]" in child.stdout, child.stdout  # both episodes ran to their end
    for sign in ("Traceback", "Task exception was never retrieved", "Event loop is closed"):
        assert sign not in child.stderr, child.stderr[-3000:]


def _finished(db: Path) -> int:
    """Sessions the child has ended so far (read beside its writes: SQLite's WAL allows it)."""
    if not db.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as conn:
        try:
            return conn.execute(
                "SELECT count(*) FROM sessions WHERE ended_at IS NOT NULL"
            ).fetchone()[0]
        except sqlite3.OperationalError:  # the schema is not written yet
            return 0


def test_one_ctrl_c_stops_a_simulation_at_once_and_leaves_no_call_open(tmp_path):
    """Ctrl-C while calls are in flight: the calls end (`interrupted`, what they recorded kept),
    nothing more starts, and the command exits 130 — it used to hang in asyncio's shutdown,
    waiting on the runners of calls that gather had left running."""
    db = tmp_path / "l.db"
    child = subprocess.Popen(
        [sys.executable, "-c", "from pipecat_rl.cli import main; main()", "simulate",
         "examples/clinic/handwritten/pool",
         "--bot", "examples/clinic/expert.py", "--persona", "scripted", "--no-server",
         "--repeats", "50", "--concurrency", "4", "--ledger", str(db)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # SIGABRT prints every thread's stack
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while _finished(db) < 8:
            assert child.poll() is None and time.monotonic() < deadline, "no call finished"
            time.sleep(0.2)  # polling the ledger: the child has no event to wait on
        child.send_signal(signal.SIGINT)
        try:
            _, stderr = child.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # say where it is (a child left ignoring SIGINT: runs on)
            child.send_signal(signal.SIGABRT)
            _, stderr = child.communicate(timeout=30)
            stacks = stderr[-6000:]
            raise AssertionError(f"no exit 60 s after Ctrl-C; its threads: {stacks}") from None
    finally:
        child.kill()
    assert child.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    with Ledger(db) as ledger:
        sessions = ledger.sessions(limit=10_000)
    assert len(sessions) < 21 * 50  # it stopped
    assert all(s.ended_at is not None for s in sessions)  # none left open
    interrupted = [s for s in sessions if s.outcome == "interrupted"]
    assert interrupted, "the calls in flight were not ended as interrupted"
    assert all("stopped before this call ended" in s.metadata["error"] for s in interrupted)
    assert {s.outcome for s in sessions} <= {"pass", "fail", "interrupted"}


async def test_a_bot_that_never_stops_is_cancelled_after_its_grace_and_said_so(monkeypatch):
    """The WebRTC episode test reads this message to tell a bot that ended on its own."""
    import asyncio

    from loguru import logger

    from pipecat_rl.simulator import runner

    monkeypatch.setattr(runner, "SHUTDOWN_GRACE_S", 0.01)
    said: list[str] = []
    sink = logger.add(lambda m: said.append(m.record["message"]), level="DEBUG")
    try:
        stuck = asyncio.create_task(asyncio.Event().wait(), name="the bot")
        await runner._stop(stuck, [])
        assert stuck.cancelled()
        assert said == ["the bot did not stop within 0.01 s: cancelling it"], said
        said.clear()
        ended = asyncio.create_task(asyncio.sleep(0), name="the bot")
        await runner._stop(ended, [])
        assert ended.done() and not ended.cancelled() and said == []
    finally:
        logger.remove(sink)
