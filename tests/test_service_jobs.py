"""Every job kind through the API, on what CI runs: the train job on a tiny model, the cycle job
(stopped after the filter, and whole with a stand-in trainer), paths checked at submission, and
defaults shared with the CLI. (simulate, gate → promote and rollback: tests/test_service.py.)"""

import inspect
import json
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from pipecat_rl.ledger import Ledger, SessionRecord
from pipecat_rl.service.app import create_app
from pipecat_rl.service.bodies import GateJob, SimulateJob, TrainJob
from pipecat_rl.service.settings import ServiceSettings
from pipecat_rl.simulator.options import GATE_REPEATS, SimulationOptions
from pipecat_rl.training.config import TrainConfig
from tests.service_helpers import GATE_HELDOUT, FakeVLLM, better_candidate_bot, clinic_copy

TOKEN = "jobs-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def settings(tmp_path: Path, **kw) -> ServiceSettings:
    return ServiceSettings(data_dir=tmp_path, ledger=tmp_path / "ledger.db", token=TOKEN,
                           poll_s=0.05, **kw)  # fmt: skip


def run_to_end(client: TestClient, body: dict, path: str = "/jobs") -> dict:
    """Submit a job, read its event stream to the end, and return the job as it ended."""
    r = client.post(path, json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    with client.stream("GET", f"/jobs/{job_id}/events", headers=AUTH) as s:
        events = [line[7:] for line in s.iter_lines() if line.startswith("event: ")]
    job = client.get(f"/jobs/{job_id}", headers=AUTH).json()
    return {**job, "event_names": events}


# --- paths are checked when a job is submitted ---------------------------------------------


@pytest.fixture
def client(tmp_path):
    clinic_copy(tmp_path, pool=["routine_booking"], heldout=["heldout_terse_booking"])
    with TestClient(create_app(settings(tmp_path))) as c:
        yield c


def _problem(response) -> tuple[list, str]:
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    return error["loc"], error["msg"]


def test_a_path_that_does_not_exist_is_a_422_naming_its_field(client):
    gate = {"kind": "gate", "candidate": "v1", "bot": "clinic/expert.py",
            "scenarios": "clinic/handwritten/heldout"}  # fmt: skip
    cases = [
        ({"kind": "cycle", "config": "nope/loop.yaml"}, ["body", "config"]),
        ({**gate, "config": "gate-typo.yaml"}, ["body", "config"]),
        ({**gate, "scenarios": "clinic/handwritten/held-out"}, ["body", "scenarios"]),
        ({**gate, "bot": "clinic/expret.py"}, ["body", "bot"]),
        ({**gate, "bot": "clinic/handwritten"}, ["body", "bot"]),  # a folder is not a bot file
        ({"kind": "simulate", "scenarios": ["clinic/handwritten/pool", "clinic/x.yaml"],
          "bot": "clinic/expert.py:run_bot"}, ["body", "scenarios", 1]),
        ({"kind": "promote", "receipt": "receipts/r1/receipt.json"}, ["body", "receipt"]),
    ]  # fmt: skip
    for body, loc in cases:
        where, message = _problem(client.post("/jobs", json=body, headers=AUTH))
        assert where == loc, body
        assert message.startswith(f"{loc[1]}: no such") and "data directory" in message
    where, _ = _problem(client.post("/live", json={"action": "promote", "receipt": "r.json"},
                                    headers=AUTH))  # fmt: skip
    assert where == ["body", "receipt"]
    where, message = _problem(client.post("/live", json={"action": "promote"}, headers=AUTH))
    assert where == ["body", "receipt"] and "needs a receipt" in message
    # An online training run needs both its scenarios and its bot.
    r = client.post("/jobs", json={"kind": "train", "algo": "grpo", "bot": "clinic/expert.py"},
                    headers=AUTH)  # fmt: skip
    assert r.status_code == 422 and "both scenarios and bot" in r.text
    assert client.get("/jobs", headers=AUTH).json() == []  # nothing was queued
    # Paths that exist are queued resolved, a bot's function kept (a run that needs no model:
    # an embedded vLLM started for it would take ~45 s to see the cancel below).
    body = {"kind": "simulate", "scenarios": ["clinic/handwritten/pool"],
            "bot": "clinic/expert.py:run_bot", "persona": "scripted",
            "no_server": True}  # fmt: skip
    r = client.post("/jobs", json=body, headers=AUTH)
    assert r.status_code == 202
    root = client.app.state.settings.data_dir.resolve()
    assert r.json()["params"]["bot"] == f"{root / 'clinic' / 'expert.py'}:run_bot"
    assert r.json()["params"]["scenarios"] == [str(root / "clinic" / "handwritten" / "pool")]
    # Cancelled and seen to its end: the service's worker thread outlives the app, and this
    # simulation, left to run, was still inside `simulation_environment` when later tests in
    # the same process began (docs/flaky.md).
    job_id = r.json()["id"]
    client.delete(f"/jobs/{job_id}", headers=AUTH)
    with client.stream("GET", f"/jobs/{job_id}/events", headers=AUTH) as s:
        for _ in s.iter_lines():
            pass
    assert client.get(f"/jobs/{job_id}", headers=AUTH).json()["state"] in ("cancelled", "done")


def test_requests_default_to_what_the_cli_verbs_default_to():
    from pipecat_rl.cli import gate, simulate, train

    jobs = {
        simulate.simulate_command: SimulateJob(scenarios=["s"], bot="b.py"),
        gate.gate: GateJob(candidate="v1", scenarios="s", bot="b.py"),
        train.train_command: TrainJob(algo="sft"),
    }
    for verb, job in jobs.items():
        flags = inspect.signature(verb).parameters
        shared = [name for name in type(job).model_fields if name in flags and name != "kind"]
        assert len(shared) >= 4, (job.kind, shared)
        for name in shared:
            if name not in ("scenarios", "bot", "candidate", "incumbent", "algo", "config"):
                assert getattr(job, name) == flags[name].default, (job.kind, name)
    # ... and both take them from the one place: the options record and the gate's K.
    options, gate_job = SimulationOptions(), jobs[gate.gate]
    assert gate_job.repeats == GATE_REPEATS
    for name in ("persona", "concurrency", "max_tokens"):
        assert getattr(gate_job, name) == getattr(options, name)
    config = TrainConfig()
    assert jobs[train.train_command].epochs == config.epochs
    assert config.lora_alpha == 2 * jobs[train.train_command].rank  # alpha as `pipecat-rl train`


# --- the train job: a real run on a tiny model ------------------------------------------------


@pytest.mark.slow  # trains (a tiny model, ~1 s a step, plus loading torch)
def test_a_train_job_trains_registers_and_streams_its_progress(tmp_path, tiny_dir):
    from transformers import AutoModelForCausalLM

    from tests.train_helpers import sample_turn

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    with Ledger(tmp_path / "ledger.db") as ledger:
        for repeat, verifier in enumerate((1.0, 0.0, 1.0, 0.0)):  # one group, with variance
            sid = f"booking-{repeat}"
            ledger.write_session(
                SessionRecord(
                    id=sid, source="simulate", started_at=float(repeat), ended_at=repeat + 0.5,
                    scenario_id="booking", scenario_hash="hash-booking", split="pool",
                    policy="base", outcome="pass" if verifier else "fail",
                    reward_parts={"verifier": verifier, "tool_credit": 0.1 * repeat},
                ),
                [sample_turn(model, [1, 2, 3, 4], 5, session_id=sid, seed=repeat)],
            )  # fmt: skip
    with TestClient(create_app(settings(tmp_path, model=str(tiny_dir)))) as c:
        job = run_to_end(c, {"kind": "train", "algo": "grpo", "steps": 1, "rank": 4})
        assert job["state"] == "done", job["error"]
        assert "progress" in job["event_names"]
        name = job["result"]["adapter"]
        adapters = {a["name"]: a for a in c.get("/adapters", headers=AUTH).json()}
        assert adapters[name]["parent"] == "base" and adapters[name]["training_sessions"] == 4
        folder = Path(job["result"]["path"])
        assert folder.is_relative_to(tmp_path / "adapters")
        config = json.loads((folder / "adapter_config.json").read_text())
        assert config["r"] == 4 and config["lora_alpha"] == 8  # alpha twice the rank


# --- the cycle job --------------------------------------------------------------------------


def loop_file(bot: str = "clinic/expert.py", filter_repeats: int = 2, extra: str = "") -> str:
    """A loop.yaml for the clinic's scripted agents (no model anywhere), paths from the file."""
    return (
        f"bot: {bot}\nexpert_bot: clinic/expert.py\npool: clinic/handwritten/pool\n"
        "heldout: clinic/handwritten/heldout\nout: cycle\npersona: scripted\nconcurrency: 4\n"
        f"filter: {{repeats: {filter_repeats}}}\ntrain: {{grpo_steps: 1}}\n"
        "gate: {repeats: 1, overrides: {require_latency: false}}\n" + extra
    )


def test_a_cycle_job_runs_its_stages_in_the_services_ledger(tmp_path):
    clinic_copy(tmp_path, pool=["routine_booking", "handoff_request"],
                heldout=["heldout_terse_booking", "heldout_chatty_medical"])  # fmt: skip
    (tmp_path / "loop.yaml").write_text(loop_file(extra="ledger: elsewhere.db\n"))
    with FakeVLLM() as vllm, TestClient(create_app(settings(tmp_path, llm_url=vllm.url))) as c:
        job = run_to_end(c, {"kind": "cycle", "config": "loop.yaml", "stop_after": "filter"})
    assert job["state"] == "done", job["error"]
    summary = job["result"]
    assert summary["state"] == "stopped" and summary["reason"] == "stop_after: filter"
    assert list(summary["stages"]) == ["snapshot", "preflight", "filter"]
    assert summary["stages"]["preflight"]["url"] == vllm.url  # the service's server
    assert summary["stages"]["filter"]["episodes"] == 4
    assert job["event_names"].count("stage_finished") == 3
    # The filter's calls are in the service's ledger, never the file's.
    assert summary["stages"]["snapshot"]["ledger"] == str(tmp_path / "ledger.db")
    with Ledger(tmp_path / "ledger.db") as ledger:
        assert len(ledger.sessions(source="simulate")) == 4
    assert not (tmp_path / "elsewhere.db").exists()


def test_a_whole_cycle_job_promotes_and_the_service_sees_the_move(tmp_path, monkeypatch):
    from tests.test_cycle import FakeTraining

    clinic = clinic_copy(tmp_path, pool=["routine_booking", "handoff_request"],
                         heldout=GATE_HELDOUT)  # fmt: skip
    better_candidate_bot(clinic)
    # Under the base model the agent calls no tool: the train stage warm-starts (SFT on the
    # expert's demonstrations, by a stand-in trainer), and the candidate, the expert, beats it.
    (tmp_path / "loop.yaml").write_text(loop_file(bot="clinic/better_candidate.py"))
    training = FakeTraining(tmp_path / "ledger.db")
    monkeypatch.setitem(sys.modules, "pipecat_rl.training", training.module())
    with FakeVLLM() as vllm, TestClient(create_app(settings(tmp_path, llm_url=vllm.url))) as c:
        job = run_to_end(c, {"kind": "cycle", "config": "loop.yaml"})
        assert job["state"] == "done", job["error"]
        summary = job["result"]
        assert summary["state"] == "finished" and summary["verdict"] == "PROMOTE", summary
        train = summary["stages"]["train"]
        assert train["warm_start"] and [r["algo"] for r in train["runs"]] == ["sft"]
        candidate = train["candidate"]
        assert c.get("/live", headers=AUTH).json()["adapter"] == candidate
        assert candidate in vllm.adapters  # loaded into the service's vLLM before the move
        receipts = [r["id"] for r in c.get("/receipts", headers=AUTH).json()]
        assert receipts == ["receipt"]  # <out>/receipt/receipt.json, under the data directory
