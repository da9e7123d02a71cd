"""The service as a process: SIGKILL mid-job then restart; a promotion reaching a running bot.

The killed job is a simulation with the scripted expert (cheap, no model): what matters is that
the ledger stays consistent and the job ends failed (or, for a cycle, resumed), never half-done.
"""

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from pipecat_rl.ledger import AdapterRecord, Ledger
from pipecat_rl.service.app import create_app
from pipecat_rl.service.settings import ServiceSettings
from pipecat_rl.serving.server import free_port
from tests.service_helpers import clinic_copy
from tests.test_gate_promote import FakeVLLM, _call, receipt_file

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class ServiceProcess:
    """`pipecat-rl service` in a child process on a free loopback port."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> "ServiceProcess":
        code = "from pipecat_rl.cli import main; main()"
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, "service", "--port", str(self.port), "--token", TOKEN,
             "--data-dir", str(self.data_dir), "--ledger", str(self.data_dir / "ledger.db")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            assert self.process.poll() is None, "the service exited"
            try:
                if httpx.get(f"{self.url}/jobs", headers=AUTH, timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the service did not answer"
            time.sleep(0.1)

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: no cleanup of any kind runs
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


def wait_for_event(url: str, job_id: str, name: str) -> None:
    with httpx.stream("GET", f"{url}/jobs/{job_id}/events", headers=AUTH, timeout=60) as r:
        for line in r.iter_lines():
            if line == f"event: {name}":
                return
    raise AssertionError(f"job {job_id} ended without a {name!r} event")


@pytest.mark.slow
def test_sigkill_mid_job_then_restart_leaves_a_consistent_ledger(tmp_path):
    clinic_copy(tmp_path, pool=["routine_booking", "booking_error_then_retry"], heldout=[])
    service = ServiceProcess(tmp_path).start()
    try:
        job = {"kind": "simulate", "scenarios": ["clinic/handwritten/pool"], "persona": "scripted",
               "bot": "clinic/expert.py", "no_server": True, "repeats": 60}  # fmt: skip
        job_id = httpx.post(f"{service.url}/jobs", json=job, headers=AUTH).json()["id"]
        wait_for_event(service.url, job_id, "episode")
        service.kill()
        with Ledger(tmp_path / "ledger.db") as ledger:
            assert ledger.job(job_id).state == "running"  # what the crash left
        with sqlite3.connect(tmp_path / "ledger.db") as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)

        service.start()
        after = httpx.get(f"{service.url}/jobs/{job_id}", headers=AUTH).json()
        assert after["state"] == "failed" and "interrupted" in after["error"]
        with Ledger(tmp_path / "ledger.db") as ledger:
            sessions = ledger.sessions(source="simulate")
            assert 0 < len(sessions) < 120  # it got some way, not all the way
            assert all(s.ended_at is not None for s in sessions)  # none left open
            closed = [e for e in ledger.job_events(job_id) if e.event == "interrupted"]
            ids = set(closed[0].data["closed"])
            # cut by the kill: closed by the restarted service, or already by the ledger's own
            # reconcile on open (their writer is gone); either way `interrupted`, never trained
            assert all(s.outcome == "interrupted" for s in sessions if s.id in ids)
            # including one the recorder had ended when the kill fell before the simulator's
            # result (`completed`, no reward): half-written, so `interrupted` too
            assert all(s.outcome in ("pass", "interrupted") for s in sessions), [
                (s.id, s.outcome) for s in sessions if s.outcome not in ("pass", "interrupted")
            ]
        # The queue works after the restart.
        next_id = httpx.post(
            f"{service.url}/jobs", json={**job, "repeats": 1}, headers=AUTH
        ).json()["id"]
        wait_for_event(service.url, next_id, "end")
        assert httpx.get(f"{service.url}/jobs/{next_id}", headers=AUTH).json()["state"] == "done"
    finally:
        service.stop()


@pytest.mark.integration
async def test_a_promotion_through_the_service_reaches_a_running_bot_at_its_next_call(tmp_path):
    for name in ("v1", "v2"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "adapter_config.json").write_text("{}")
    with Ledger(tmp_path / "ledger.db") as ledger:
        for name in ("v1", "v2"):
            ledger.register_adapter(AdapterRecord(
                name=name, path=str(tmp_path / name), base_model="smollm2", created_at=1.0,
                training_run={"id": name, "guard": {"passed": True}},
            ))  # fmt: skip
        ledger.move_live("v1")
        receipt = receipt_file(tmp_path, ledger, "PROMOTE", "v2")
    with FakeVLLM() as vllm:
        vllm.adapters["v1"] = str(tmp_path / "v1")
        settings = ServiceSettings(data_dir=tmp_path, ledger=tmp_path / "ledger.db",
                                   token=TOKEN, llm_url=vllm.url, poll_s=0.05)  # fmt: skip
        with TestClient(create_app(settings)) as client:

            def promote_now():
                r = client.post("/live", json={"action": "promote", "receipt": str(receipt)},
                                headers=AUTH)  # fmt: skip
                with client.stream("GET", f"/jobs/{r.json()['id']}/events", headers=AUTH) as s:
                    last = [json.loads(x[6:]) for x in s.iter_lines() if x.startswith("data: ")]
                assert last[-1] == {"state": "done"}

            first = await _call(vllm, tmp_path / "ledger.db", 3, between=promote_now)
            assert client.get("/live", headers=AUTH).json()["adapter"] == "v2"
            assert "v2" in vllm.adapters  # loaded into the bot's vLLM, then the pointer moved
            assert first.adapter == "v1" and vllm.requests == ["v1", "v1", "v1"]  # never mid-call
            second = await _call(vllm, tmp_path / "ledger.db", 1)
            assert second.adapter == "v2" and vllm.requests[-1] == "v2"
