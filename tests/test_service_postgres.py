"""The side service, the `llm` verbs and the bot's live-adapter selector on a Postgres ledger
(the one the bots record into).

On test_ledger_postgres.py's throwaway PostgreSQL cluster, skipped, saying why, where the server
binaries or psycopg are missing; the service's own pieces (its jobs, the stand-in vLLM, the
clinic) are those of test_service_jobs.py.
"""

import importlib.util

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.ledger import Ledger
from pipecat_rl.service.app import create_app
from pipecat_rl.service.settings import ServiceSettings
from tests.service_helpers import FakeVLLM, clinic_copy
from tests.test_ledger import make_adapter
from tests.test_ledger_postgres import pg_url, postgres_server  # noqa: F401
from tests.test_service_jobs import AUTH, TOKEN, loop_file, run_to_end


def test_a_cycle_job_runs_in_the_services_postgres_ledger(tmp_path, pg_url):  # noqa: F811
    clinic_copy(tmp_path, pool=["routine_booking", "handoff_request"],
                heldout=["heldout_terse_booking", "heldout_chatty_medical"])  # fmt: skip
    (tmp_path / "loop.yaml").write_text(loop_file())
    settings = ServiceSettings(data_dir=tmp_path, ledger=pg_url, token=TOKEN, poll_s=0.05)
    with FakeVLLM() as vllm:
        with TestClient(create_app(settings.model_copy(update={"llm_url": vllm.url}))) as c:
            job = run_to_end(c, {"kind": "cycle", "config": "loop.yaml", "stop_after": "filter"})
            listed = c.get("/jobs", headers=AUTH).json()
    assert job["state"] == "done", job["error"]
    summary = job["result"]
    assert list(summary["stages"]) == ["snapshot", "preflight", "filter"]
    assert summary["stages"]["snapshot"]["ledger"] == pg_url
    assert [j["id"] for j in listed] == [job["id"]]  # the queue lives in Postgres too
    with Ledger(pg_url) as ledger:
        assert len(ledger.sessions(source="simulate")) == summary["stages"]["filter"]["episodes"]
        assert ledger.job(job["id"]).state == "done"
    # No SQLite ledger anywhere but the snapshot's copy.
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.db")] == [
        "cycle/snapshot/ledger.db"
    ]


def test_the_service_verb_keeps_a_url_and_hides_its_password(monkeypatch, tmp_path):
    pytest.importorskip("psycopg", reason="psycopg is the extra pipecat-rl[postgres]")
    pytest.importorskip("psycopg_pool", reason="psycopg-pool is the extra pipecat-rl[postgres]")
    served: list[ServiceSettings] = []
    monkeypatch.setattr("pipecat_rl.service.app.serve", served.append)
    url = "postgresql://bots:s3cret@db.internal:5432/calls"
    done = CliRunner().invoke(app, ["service", "--ledger", url, "--data-dir", str(tmp_path)])
    assert done.exit_code == 0, done.output
    assert served[0].ledger == url  # not folded into a file path
    assert "s3cret" not in done.output and "bots:***@db.internal" in done.output


def test_the_service_verb_refuses_another_scheme_or_a_missing_driver(monkeypatch, tmp_path):
    monkeypatch.setattr("pipecat_rl.service.app.serve", lambda settings: None)
    bad = CliRunner().invoke(app, ["service", "--ledger", "mysql://u@h/calls"])
    assert bad.exit_code != 0 and "postgresql://" in bad.output
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "psycopg" else real(name, *a)
    )
    missing = CliRunner().invoke(app, ["service", "--ledger", "postgresql://u@h/calls"])
    assert missing.exit_code != 0 and "pipecat-rl[postgres]" in missing.output


def test_unload_adapter_refuses_the_live_adapter_of_a_postgres_ledger(pg_url):  # noqa: F811
    with Ledger(pg_url) as ledger:
        ledger.register_adapter(make_adapter("clinic-v1"))
        ledger.move_live("clinic-v1")
    # Refused before any server is asked (none listens on port 9).
    args = ["llm", "unload-adapter", "clinic-v1", "--ledger", pg_url,
            "--llm-url", "http://127.0.0.1:9/v1"]  # fmt: skip
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 64, refused.output
    assert "clinic-v1 is the live adapter in postgresql://" in " ".join(refused.output.split())


def test_the_live_adapter_selector_reads_the_pointer_of_a_postgres_ledger(pg_url):  # noqa: F811
    from pipecat.services.openai.llm import OpenAILLMService

    from pipecat_rl.recording import LiveAdapterSelector

    llm = OpenAILLMService(api_key="none", settings=OpenAILLMService.Settings(model="base"))
    selector = LiveAdapterSelector(llm, ledger=pg_url)
    assert selector._read_live() == "base"  # nothing promoted yet
    with Ledger(pg_url) as ledger:
        ledger.register_adapter(make_adapter("clinic-v2"))
        ledger.move_live("clinic-v2")
    assert selector._read_live() == "clinic-v2"
