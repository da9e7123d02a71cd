"""A process killed while it writes episodes leaves each one whole or `interrupted`, never half.

The writer is a real process on its own: a launcher (one Python subprocess, imports paid once)
forks a child per trial that records episodes as the recorder and the simulator do, and prints a
line after each transaction commits; the test SIGKILLs the child after a random number of lines
plus a random sliver of time, then opens the ledger (which runs the closer) and reads every
episode. The closer never takes a session from a writer that still runs: a second process's
closer, the service's job recovery and a resumed cycle each leave a live writer's session open.
"""

import json
import os
import queue
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from pipecat_rl.ledger import Ledger, SessionRecord
from pipecat_rl.ledger.liveness import writer_identity
from pipecat_rl.loop.config import LoopConfig
from pipecat_rl.loop.cycle import Cycle
from pipecat_rl.scoring.outcome import VERDICTS
from pipecat_rl.service.jobs import recover_interrupted

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}

SCORES, LATENCIES, CALLS = 4, 3, 3
"""What `finish_episode` writes per episode: a whole episode has exactly these."""

LAUNCHER = textwrap.dedent(
    f"""
    import os, sys, time
    from pipecat_rl.ledger import (
        LatencyRecord, Ledger, ScoreRecord, SessionRecord, ToolCallRecord, TurnRecord,
    )
    from pipecat_rl.ledger.liveness import writer_identity

    def episodes(path):
        ledger = Ledger(path)
        for i in range(10_000):
            sid = f"ep-{{i}}"
            session = SessionRecord(id=sid, source="simulate", started_at=time.time(),
                                    metadata={{"writer": writer_identity()}})
            recorded = i % 3 != 2  # every third episode: the bot started no recorder
            if recorded:
                ledger.add_session(session)
                print("session", sid, flush=True)
                for k in range(2):
                    ledger.add_turn(TurnRecord(
                        session_id=sid, index=k, adapter="base", created_at=time.time(),
                        request={{"messages": [{{"role": "user", "content": "x" * 500}}]}},
                        prompt_token_ids=list(range(300)), completion_token_ids=[1, 2],
                        logprobs=[-0.1, -0.2], token_exact=True,
                        usage={{"completion_tokens": 2}},
                    ))
                    print("turn", sid, flush=True)
                ledger.end_session(sid, ended_at=time.time(), outcome="completed")
                print("recorder", sid, flush=True)
            ledger.finish_episode(
                session, ended_at=time.time(), outcome="pass" if i % 2 else "fail",
                reward=1.0, reward_parts={{"verifier": 1.0}}, failure_labels=[],
                metadata_update={{"transcript": ["x" * 2000] * 20}},
                scores=[ScoreRecord(session_id=sid, name=f"part-{{n}}", value=1.0,
                                    detail={{"why": "y" * 2000}}) for n in range({SCORES})],
                latencies=[LatencyRecord(session_id=sid, user_turn=n, response_gap_ms=5.0)
                           for n in range({LATENCIES})],
                tool_calls=[ToolCallRecord(session_id=sid, turn_index=None, call_id=f"c{{n}}",
                                           name="book", arguments={{"n": n}}, started_at=1.0,
                                           state_diff={{"world": {{"z": "z" * 2000}}}})
                            for n in range({CALLS})],
            )
            print("finished", sid, flush=True)

    for line in sys.stdin:
        child = os.fork()
        if child == 0:
            try:
                episodes(line.strip())
            finally:
                os._exit(0)
        print("pid", child, flush=True)
        os.waitpid(child, 0)
        print("reaped", child, flush=True)
    """
)


def _whole(ledger: Ledger, sid: str) -> bool:
    s = ledger.session(sid)
    return (
        s.ended_at is not None
        and s.outcome in VERDICTS
        and s.reward == 1.0
        and len(s.metadata.get("transcript", ())) == 20
        and len(ledger.scores(sid)) == SCORES
        and len(ledger.latencies(sid)) == LATENCIES
        and len(ledger.tool_calls(sid)) == CALLS
    )


def test_sigkill_at_random_points_of_episode_writes_leaves_each_whole_or_interrupted(tmp_path):
    rng = random.Random(17)
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env=ENV,
    )  # fmt: skip
    seen = {"whole": 0, "interrupted": 0}
    said: queue.Queue[str] = queue.Queue()  # the launcher's lines, read off the pipe by a thread
    threading.Thread(target=lambda: [said.put(x) for x in launcher.stdout], daemon=True).start()

    def next_line() -> str:
        try:
            return said.get(timeout=60)
        except queue.Empty:
            raise AssertionError("the launcher said nothing for 60 s") from None

    try:
        for trial in range(24):
            path = tmp_path / f"trial-{trial}.db"
            launcher.stdin.write(f"{path}\n")
            launcher.stdin.flush()
            lines, pid, wanted = [], None, rng.randint(1, 12)
            while pid is None or len(lines) < wanted:
                kind, value = next_line().split()
                assert kind != "reaped", "the writer died before it was killed"
                if kind == "pid":
                    pid = int(value)
                else:
                    lines.append((kind, value))
            time.sleep(rng.uniform(0, 0.004))  # a random point of the next transaction
            os.kill(pid, signal.SIGKILL)
            # Read on to the launcher's `reaped`; a line the kill cut short may run into it.
            while not (line := next_line().strip()).endswith(f"reaped {pid}"):
                lines.append(tuple(line.split()))  # committed before the kill, read after it
            finished = {sid for kind, sid in lines if kind == "finished"}
            with Ledger(path) as ledger:  # opening runs the closer: the child is gone
                for s in ledger.sessions():
                    if s.outcome == "interrupted":
                        assert s.id not in finished, s.id
                        assert s.metadata["error"].startswith("interrupted")
                        seen["interrupted"] += 1
                    else:
                        assert _whole(ledger, s.id), ledger.session_bundle(s.id)
                        seen["whole"] += 1
                assert finished <= {s.id for s in ledger.sessions()}
                interrupted = {s.id for s in ledger.sessions() if s.outcome == "interrupted"}
                assert not interrupted & {t.session_id for t in ledger.training_turns()}
    finally:
        launcher.kill()
        launcher.wait(10)
    assert seen["whole"] and seen["interrupted"], seen  # both ends of a kill were exercised


OPEN_SESSION = textwrap.dedent(
    """
    import sys, time
    from pipecat_rl.ledger import Ledger, SessionRecord
    from pipecat_rl.ledger.liveness import writer_identity

    with Ledger(sys.argv[1]) as ledger:
        ledger.add_session(SessionRecord(id=sys.argv[2], source="simulate",
                                         started_at=time.time(),
                                         metadata={"writer": writer_identity()}))
    print("written", flush=True)
    sys.stdin.read()  # runs until the test lets it go
    """
)


class Writer:
    """Another process that opened a session and is still running (until `stop`)."""

    def __init__(self, path: Path, session_id: str):
        self.process = subprocess.Popen(
            [sys.executable, "-c", OPEN_SESSION, str(path), session_id],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV,
        )  # fmt: skip
        assert self.process.stdout.readline().strip() == "written"

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.wait(10)
        self.process.stdout.close()


def _dead_session(ledger: Ledger, session_id: str) -> None:
    """A session whose writer (a process that ran here) is gone."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    writer = {**writer_identity(), "pid": child.pid}
    ledger.add_session(
        SessionRecord(
            id=session_id, source="simulate", started_at=time.time(), metadata={"writer": writer}
        )
    )


CLOSER = textwrap.dedent(
    """
    import json, sys
    from pipecat_rl.ledger import Ledger

    with Ledger(sys.argv[1]) as ledger:
        closed = ledger.close_dead_sessions(reason="another process", since=0.0)
        print(json.dumps({"closed": closed, "open": [s.id for s in ledger.sessions()
                                                      if s.ended_at is None]}))
    """
)


def test_a_live_writers_session_is_never_closed_by_another_processes_closer(tmp_path):
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        mine = {"writer": writer_identity()}
        ledger.add_session(
            SessionRecord(id="mine", source="simulate", started_at=time.time(), metadata=mine)
        )
        _dead_session(ledger, "dead")
    other = subprocess.run(
        [sys.executable, "-c", CLOSER, str(path)], capture_output=True, text=True, env=ENV,
        check=True,
    )  # fmt: skip
    # its own open ran the closer first (on "dead"); its explicit call finds nothing more
    assert json.loads(other.stdout) == {"closed": [], "open": ["mine"]}
    with Ledger(path) as ledger:
        assert ledger.session("dead").outcome == "interrupted"
        assert ledger.session("mine").ended_at is None  # this process still runs


def test_service_recovery_closes_the_dead_jobs_sessions_not_a_live_writers(tmp_path):
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        ledger.add_job("simulate", {}, job_id="j1")
        ledger.claim_next_job()
        live = Writer(path, "live")  # (its own open runs a closer too: before "cut" exists)
        _dead_session(ledger, "cut")
        try:
            (job,) = recover_interrupted(ledger)
            assert job.state == "failed"
            (event,) = ledger.job_events("j1")
            assert event.data["closed"] == ["cut"]
            assert ledger.session("cut").outcome == "interrupted"
            assert "job j1" in ledger.session("cut").metadata["error"]
            assert ledger.session("live").ended_at is None
        finally:
            live.stop()


def test_a_resumed_cycle_closes_its_dead_predecessors_sessions_not_a_live_writers(tmp_path):
    """The cycle resumed in a new process (this one): the killed stage's sessions, written by a
    process that is gone, close; a session another running process writes stays open until
    that process is gone."""
    path = tmp_path / "ledger.db"
    config = LoopConfig(
        bot="bot.py", pool=tmp_path / "pool", heldout=tmp_path / "heldout", out=tmp_path / "out",
        ledger=path,
    )  # fmt: skip
    cycle = Cycle(config)
    try:
        cycle.log.write("stage_started", stage="filter")
        live = Writer(path, "other-process")
        _dead_session(cycle.ledger, "killed-stage")
        try:
            cycle._close_interrupted(["filter"])
            assert cycle.ledger.session("killed-stage").outcome == "interrupted"
            assert cycle.ledger.session("other-process").ended_at is None
        finally:
            live.stop()
        cycle._close_interrupted(["filter"])  # now its writer is gone too
        assert cycle.ledger.session("other-process").outcome == "interrupted"
        events = [e for e in cycle.log.read() if e["event"] == "stage_interrupted"]
        assert [e["closed_sessions"] for e in events] == [1, 1]
    finally:
        cycle.ledger.close()
