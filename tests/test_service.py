"""The side service: auth, path confinement, body limits, the job queue, events, resources."""

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from pipecat_rl.cli import app as cli
from pipecat_rl.cli.common import EXIT_USAGE
from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import AdapterRecord, Ledger
from pipecat_rl.service.app import create_app
from pipecat_rl.service.jobs import recover_interrupted
from pipecat_rl.service.settings import ServiceSettings
from tests.service_helpers import GATE_HELDOUT, FakeVLLM, better_candidate_bot, clinic_copy

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def settings(tmp_path: Path, **kw) -> ServiceSettings:
    defaults = dict(data_dir=tmp_path, ledger=tmp_path / "ledger.db", token=TOKEN, poll_s=0.05)
    return ServiceSettings(**{**defaults, **kw})


@pytest.fixture
def client(tmp_path):
    clinic_copy(tmp_path, pool=["routine_booking", "handoff_request"], heldout=[])
    with TestClient(create_app(settings(tmp_path))) as c:
        yield c


def simulate_job(**kw) -> dict:
    """The scripted expert against the pool's scripted callers: no model anywhere."""
    return {"kind": "simulate", "scenarios": ["clinic/handwritten/pool"], "bot": "clinic/expert.py",
            "persona": "scripted", "no_server": True, **kw}  # fmt: skip


def events(client: TestClient, job_id: str) -> list[tuple[str, dict]]:
    """Read the job's whole SSE stream (it ends once the job has ended)."""
    out, name = [], None
    with client.stream("GET", f"/jobs/{job_id}/events", headers=AUTH) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:])))
    return out


# --- the door -------------------------------------------------------------------------------


def test_requests_without_the_right_token_are_refused(client):
    assert client.get("/jobs").status_code == 401
    assert client.get("/jobs", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/jobs", headers={"Authorization": TOKEN}).status_code == 401
    assert client.post("/jobs", json=simulate_job()).status_code == 401
    assert client.get("/jobs", headers=AUTH).status_code == 200
    # The OpenAPI page documents every resource.
    paths = client.get("/openapi.json", headers=AUTH).json()["paths"]
    assert {"/jobs", "/jobs/{job_id}", "/jobs/{job_id}/events", "/adapters",
            "/receipts/{receipt_id}", "/live"} <= set(paths)  # fmt: skip


def test_no_token_beyond_loopback_is_refused(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="without a token"):
        create_app(settings(tmp_path, token=None, host="0.0.0.0"))
    create_app(settings(tmp_path, token=None, host="127.0.0.1"))  # loopback may go without
    create_app(settings(tmp_path, host="0.0.0.0"))  # with a token it may listen anywhere
    monkeypatch.delenv("PIPECAT_RL_SERVICE_TOKEN", raising=False)
    result = CliRunner().invoke(cli, ["service", "--host", "0.0.0.0", "--data-dir", str(tmp_path)])
    assert result.exit_code == EXIT_USAGE
    assert "without a token" in result.stderr


def test_paths_outside_the_data_directory_are_refused(client, tmp_path):
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (tmp_path / "escape").symlink_to(outside)
    for job in (
        simulate_job(scenarios=["../x"]),
        simulate_job(scenarios=["clinic/handwritten/../../../etc"]),
        simulate_job(scenarios=["/etc"]),
        simulate_job(bot="/etc/passwd:run_bot"),
        simulate_job(scenarios=["escape/pool"]),
        {"kind": "promote", "receipt": "escape/receipt.json"},
        {"kind": "cycle", "config": "../loop.yaml"},
    ):
        r = client.post("/jobs", json=job, headers=AUTH)
        assert r.status_code == 403, (job, r.text)
        assert "outside the service's data directory" in r.json()["detail"]
    r = client.post("/live", json={"action": "promote", "receipt": "/tmp/r.json"}, headers=AUTH)
    assert r.status_code == 403
    assert client.get("/jobs", headers=AUTH).json() == []  # nothing was queued


def test_bad_and_oversized_bodies_are_refused(client):
    r = client.post("/jobs", json={"kind": "format-disk"}, headers=AUTH)
    assert r.status_code == 422
    r = client.post("/jobs", json={**simulate_job(), "shell": "rm -rf /"}, headers=AUTH)
    assert r.status_code == 422  # unknown fields are refused, not ignored
    big = simulate_job(scenarios=["clinic/handwritten/pool"] * 20, bot="x" * 70_000)
    r = client.post("/jobs", json=big, headers=AUTH)
    assert r.status_code == 413
    r = client.post(
        "/jobs", content=iter([b'{"kind": "simulate", "bot": "', b"y" * 70_000, b'"}']),
        headers={**AUTH, "Content-Type": "application/json"},
    )  # fmt: skip
    assert r.status_code == 413  # streamed without a length: counted as it arrives


# --- the queue --------------------------------------------------------------------------------


def test_two_jobs_run_in_order_and_stream_their_events(client, tmp_path):
    first = client.post("/jobs", json=simulate_job(repeats=2), headers=AUTH)
    second = client.post("/jobs", json=simulate_job(repeats=1, seed=7), headers=AUTH)
    assert first.status_code == second.status_code == 202
    a, b = first.json()["id"], second.json()["id"]
    stream = events(client, b)  # ends when the second job has ended
    names = [n for n, _ in stream]
    assert names[0] == "started" and names[-2:] == ["done", "end"]
    assert names.count("episode") == 2
    assert stream[-1][1] == {"state": "done"}
    ja, jb = (client.get(f"/jobs/{j}", headers=AUTH).json() for j in (a, b))
    assert ja["state"] == jb["state"] == "done"
    assert ja["ended_at"] <= jb["started_at"]  # one at a time, in submission order
    assert ja["result"]["episodes"] == 4 and ja["result"]["passed"] == 4
    assert [j["id"] for j in client.get("/jobs", headers=AUTH).json()] == [a, b]
    # Resuming a stream after an event id sends only what came after it.
    with client.stream("GET", f"/jobs/{b}/events", headers={**AUTH, "Last-Event-ID": "2"}) as r:
        ids = [int(line[4:]) for line in r.iter_lines() if line.startswith("id: ")]
    assert ids and ids[0] == 3
    assert client.get("/jobs/job-nope", headers=AUTH).status_code == 404


def test_a_failing_job_is_recorded_and_the_next_one_still_runs(client):
    bad = client.post("/jobs", json={"kind": "rollback"}, headers=AUTH).json()["id"]
    good = client.post("/jobs", json=simulate_job(), headers=AUTH).json()["id"]
    events(client, good)
    failed = client.get(f"/jobs/{bad}", headers=AUTH).json()
    assert failed["state"] == "failed" and "nothing was ever promoted" in failed["error"]
    assert client.get(f"/jobs/{good}", headers=AUTH).json()["state"] == "done"


def _register_v1(tmp_path: Path) -> Path:
    """Adapter `v1` in the data dir, registered with a passed training guard."""
    folder = tmp_path / "adapters" / "v1"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.register_adapter(AdapterRecord(
            name="v1", path=str(folder), base_model="smollm2", created_at=1.0,
            training_run={"id": "run-1", "guard": {"passed": True, "max_abs": 0.001}},
        ))  # fmt: skip
    return folder


def test_adapters_receipts_and_the_live_pointer(tmp_path):
    from tests.test_gate_promote import receipt_file

    folder = _register_v1(tmp_path)
    with Ledger(tmp_path / "ledger.db") as ledger:
        receipt = receipt_file(tmp_path, ledger, "PROMOTE", "v1", incumbent="base")
    with FakeVLLM() as vllm, TestClient(create_app(settings(tmp_path, llm_url=vllm.url))) as c:
        adapters = {a["name"]: a for a in c.get("/adapters", headers=AUTH).json()}
        assert adapters["base"]["children"] == ["v1"] and adapters["base"]["live"]
        assert adapters["v1"]["parent"] == "base" and adapters["v1"]["guard"] == "passed"

        rid = receipt.parent.name
        assert c.get("/receipts", headers=AUTH).json()[0]["id"] == rid
        body = c.get(f"/receipts/{rid}", headers=AUTH).json()
        assert body["verdict"] == "PROMOTE" and body["candidate"]["name"] == "v1"
        page = c.get(f"/receipts/{rid}?format=html", headers=AUTH)
        assert page.headers["content-type"].startswith("text/html") and "<svg" in page.text
        assert c.get("/receipts/..%2F..%2Fetc", headers=AUTH).status_code in (400, 404)
        assert c.get("/receipts/nope", headers=AUTH).status_code == 404

        assert c.get("/live", headers=AUTH).json()["adapter"] == "base"
        job = c.post("/live", json={"action": "promote", "receipt": str(receipt)}, headers=AUTH)
        assert job.status_code == 202
        assert events(c, job.json()["id"])[-1][1] == {"state": "done"}
        live = c.get("/live", headers=AUTH).json()
        assert live["adapter"] == "v1" and live["pointer"]["previous"] == "base"
        assert vllm.adapters == {"v1": str(folder.resolve())}  # loaded before the pointer moved
        back = c.post("/live", json={"action": "rollback"}, headers=AUTH).json()["id"]
        events(c, back)
        assert c.get("/live", headers=AUTH).json()["adapter"] == "base"


def test_recovery_fails_plain_jobs_and_requeues_cycles(tmp_path):
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.add_job("simulate", {}, job_id="j1")
        ledger.add_job("cycle", {"config": "loop.yaml"}, job_id="j2")
        for _ in range(2):
            ledger.claim_next_job()
        recovered = {j.id: j for j in recover_interrupted(ledger)}
        assert recovered["j1"].state == "failed" and "interrupted" in recovered["j1"].error
        assert recovered["j2"].state == "queued"
        assert ledger.claim_next_job().attempts == 2  # the cycle runs again, as attempt 2
        assert [e.event for e in ledger.job_events("j1")] == ["interrupted"]


def test_service_help_names_the_token_variable():
    result = CliRunner().invoke(cli, ["service", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "PIPECAT_RL_SERVICE_TOKEN" in result.output


def test_a_gate_job_records_its_receipt_and_promote_accepts_it(tmp_path):
    """The service's gate goes through `gate.run_gate`: its receipt is one `promote` accepts."""
    clinic = clinic_copy(tmp_path, pool=[], heldout=GATE_HELDOUT)
    better_candidate_bot(clinic)
    _register_v1(tmp_path)
    # The candidate is the scripted expert, the base an agent that never calls a tool: a real,
    # recorded improvement (text mode has no voice, so no latency budget to hold).
    (tmp_path / "gate.yaml").write_text("require_latency: false\n")
    job = {
        "kind": "gate", "candidate": "v1", "incumbent": "base",
        "bot": "clinic/better_candidate.py", "scenarios": "clinic/handwritten/heldout",
        "repeats": 1, "config": "gate.yaml", "persona": "scripted",
    }  # fmt: skip
    with FakeVLLM() as vllm, TestClient(create_app(settings(tmp_path, llm_url=vllm.url))) as c:
        submitted = c.post("/jobs", json=job, headers=AUTH)
        assert submitted.status_code == 202, submitted.text
        assert events(c, submitted.json()["id"])[-1][1] == {"state": "done"}
        result = c.get(f"/jobs/{submitted.json()['id']}", headers=AUTH).json()["result"]
        assert result["verdict"] == "PROMOTE", result
        with Ledger(tmp_path / "ledger.db") as ledger:
            gate_sessions = ledger.sessions(source="gate")
            assert {s.policy for s in gate_sessions} == {"v1", "base"}
            assert len(gate_sessions) == 12  # 6 held-out scenarios x 1 run x 2 arms
        move = c.post("/live", json={"action": "promote", "receipt": result["receipt"]},
                      headers=AUTH)  # fmt: skip
        assert move.status_code == 202
        assert events(c, move.json()["id"])[-1][1] == {"state": "done"}
        assert c.get("/live", headers=AUTH).json()["adapter"] == "v1"
