"""DELETE /jobs/{id}: a queued job never runs; a running one stops at its next checkpoint with
the sessions it left open closed `interrupted`; a cycle stops between stages and resumes."""

import time
from pathlib import Path

from pipecat_rl.ledger import Ledger, SessionRecord
from pipecat_rl.ledger.liveness import writer_identity
from pipecat_rl.service.jobs import JobContext, close_job_sessions, run_job
from pipecat_rl.service.settings import ServiceSettings
from tests.service_helpers import FakeVLLM, ServiceThread, clinic_copy

TOKEN = "cancel-token"


def settings(tmp_path: Path, **kw) -> ServiceSettings:
    return ServiceSettings(data_dir=tmp_path, ledger=tmp_path / "ledger.db", token=TOKEN,
                           poll_s=0.05, **kw)  # fmt: skip


def long_simulation(repeats: int) -> dict:
    return {"kind": "simulate", "scenarios": ["clinic/handwritten/pool"], "bot": "clinic/expert.py",
            "persona": "scripted", "no_server": True, "repeats": repeats,
            "concurrency": 2}  # fmt: skip


def test_cancelling_a_queued_and_a_running_job(tmp_path):
    clinic_copy(tmp_path, pool=["routine_booking", "handoff_request"], heldout=[])
    with ServiceThread(settings(tmp_path)) as service:
        api = service.client
        running = api.post("/jobs", json=long_simulation(30)).json()["id"]
        queued = api.post("/jobs", json=long_simulation(1)).json()["id"]
        stream = service.events(running)
        for name, _ in stream:
            if name == "episode":  # the job runs and has recorded a call
                break

        # The queued job is cancelled at once and never runs.
        r = api.delete(f"/jobs/{queued}")
        assert r.status_code == 200 and r.json()["state"] == "cancelled"
        # The running one is asked to stop, and stops at its next episode's end.
        r = api.delete(f"/jobs/{running}")
        assert r.status_code == 202 and r.json()["state"] == "running"
        rest = list(stream)
        assert rest[-1] == ("end", {"state": "cancelled"})
        names = [n for n, _ in rest]
        assert "cancel_requested" in names and "cancelled" in names and "done" not in names
        closed = next(d for n, d in rest if n == "cancelled")["data"]["closed"]

        job = api.get(f"/jobs/{running}").json()
        assert job["state"] == "cancelled" and "cancelled while running" in job["error"]
        never = api.get(f"/jobs/{queued}").json()
        assert never["attempts"] == 0 and never["started_at"] is None
        assert [e for e, _ in service.events(queued)] == ["cancelled", "end"]

        # Ended jobs cannot be cancelled; unknown ones are not found.
        assert api.delete(f"/jobs/{running}").status_code == 409
        assert api.delete(f"/jobs/{queued}").status_code == 409
        assert api.delete("/jobs/job-nope").status_code == 404

        with Ledger(tmp_path / "ledger.db") as ledger:
            sessions = ledger.sessions(source="simulate")
            assert 0 < len(sessions) < 30  # it stopped early
            assert all(s.ended_at is not None for s in sessions)  # none left open
            assert all(ledger.session(i).outcome == "interrupted" for i in closed)
            assert {s.outcome for s in sessions} <= {"pass", "interrupted"}
            assert len([s for s in sessions if s.outcome == "interrupted"]) == len(closed)

        # The worker goes on with the next job.
        after = api.post("/jobs", json=long_simulation(1)).json()["id"]
        assert list(service.events(after))[-1] == ("end", {"state": "done"})


class CancelAfter(JobContext):
    """A job context asked to stop as soon as the cycle's `stage` has finished."""

    stage: str = "snapshot"

    def record(self, event, **data):
        super().record(event, **data)
        if event == "stage_finished" and data["stage"] == self.stage:
            self.cancel.set()


def test_a_cancelled_cycle_stops_between_stages_and_a_new_job_resumes_it(tmp_path):
    clinic_copy(tmp_path, pool=["routine_booking"], heldout=["heldout_terse_booking"])
    (tmp_path / "loop.yaml").write_text(
        "bot: clinic/expert.py\nexpert_bot: clinic/expert.py\npool: clinic/handwritten/pool\n"
        "heldout: clinic/handwritten/heldout\nout: cycle\npersona: scripted\nstop_after: filter\n"
    )
    with FakeVLLM() as vllm, Ledger(tmp_path / "ledger.db") as ledger:
        params = {"config": str(tmp_path / "loop.yaml")}
        job = ledger.add_job("cycle", params, job_id="job-cycle-1")
        ledger.claim_next_job()
        service = settings(tmp_path, llm_url=vllm.url)
        ended = run_job(CancelAfter(ledger.job(job.id), ledger, service))
        assert ended.state == "cancelled"
        names = [e.event for e in ledger.job_events(job.id)]
        assert names[-1] == "cancelled" and "stage_started" in names
        finished = [e.data["stage"] for e in ledger.job_events(job.id)
                    if e.event == "stage_finished"]  # fmt: skip
        assert finished == ["snapshot"]  # it stopped at the boundary after the snapshot

        again = ledger.add_job("cycle", params, job_id="job-cycle-2")
        ledger.claim_next_job()
        done = run_job(JobContext(ledger.job(again.id), ledger, service))
        assert done.state == "done", done.error
        assert done.result["resumed_from"] == "preflight"  # the snapshot was not taken again
        assert list(done.result["stages"]) == ["snapshot", "preflight", "filter"]


def test_a_job_that_did_not_finish_closes_exactly_its_own_open_sessions(tmp_path):
    """The service's process is alive, so the ledger's closer of dead writers' sessions would
    leave them open for ever: the worker closes the job's own, and nothing else."""
    me, other = writer_identity(), {**writer_identity(), "pid": 1}
    with Ledger(tmp_path / "ledger.db") as ledger:
        job = ledger.add_job("simulate", {}, job_id="job-1")
        ledger.claim_next_job()
        job = ledger.job(job.id)
        later = job.started_at + 1

        def add(sid, *, started, writer=me, source="simulate", ended=None, outcome=None):
            ledger.add_session(SessionRecord(
                id=sid, source=source, started_at=started, ended_at=ended, outcome=outcome,
                metadata={"writer": writer},
            ))  # fmt: skip

        add("mine-open", started=later)
        add("mine-ended-by-recorder", started=later, ended=later + 1, outcome="cancelled")
        add("mine-finished", started=later, ended=later + 1, outcome="pass")
        add("before-the-job", started=job.started_at - 10)
        add("another-process", started=later, writer=other)
        add("a-live-call", started=later, source="live")
        closed = close_job_sessions(JobContext(job, ledger, settings(tmp_path)), "why")
        assert sorted(closed) == ["mine-ended-by-recorder", "mine-open"]
        for sid in closed:
            session = ledger.session(sid)
            assert session.outcome == "interrupted" and session.metadata["error"] == "why"
        assert ledger.session("mine-finished").outcome == "pass"
        for sid in ("before-the-job", "another-process", "a-live-call"):
            assert ledger.session(sid).ended_at is None
        # Closing again closes nothing: only what is still open is ever closed.
        assert ledger.close_sessions(["mine-open", "mine-finished", "no-such"], reason="x") == []


def test_a_failing_job_closes_its_open_sessions_too(tmp_path, monkeypatch):
    from pipecat_rl.service import jobs

    def broken(ctx, params):  # opened a call, then crashed before finishing it
        ctx.ledger.add_session(SessionRecord(
            id="half", source="simulate", started_at=time.time(),
            metadata={"writer": writer_identity()},
        ))  # fmt: skip
        raise RuntimeError("boom")

    monkeypatch.setitem(jobs.HANDLERS, "rollback", broken)
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.add_job("rollback", {}, job_id="job-2")
        ended = run_job(JobContext(ledger.claim_next_job(), ledger, settings(tmp_path)))
        assert ended.state == "failed" and ended.error == "RuntimeError: boom"
        assert ledger.session("half").outcome == "interrupted"
        assert ledger.job_events("job-2")[-1].data["closed"] == ["half"]
