"""Scores in by call id through the service: idempotent, refused where they could never train."""

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from pipecat_rl.ledger import Ledger, SessionRecord, TurnRecord
from pipecat_rl.ledger.scores import MAX_EXPLANATION_CHARS
from pipecat_rl.service.app import create_app
from pipecat_rl.service.settings import ServiceSettings

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        for sid, fields in {
            "call-1": {"source": "live"},
            "gate-1": {"source": "gate", "split": "heldout"},
            "held-1": {"source": "simulate", "split": "heldout", "outcome": "pass"},
        }.items():
            ledger.write_session(
                SessionRecord(id=sid, started_at=1.0, ended_at=2.0,
                              outcome=fields.pop("outcome", "completed"), **fields),
                [TurnRecord(session_id=sid, index=0, adapter="base", created_at=1.0,
                            request={}, redacted=True)],
            )  # fmt: skip
    return path


@pytest.fixture
def client(tmp_path, ledger_path):
    settings = ServiceSettings(data_dir=tmp_path, ledger=ledger_path, token=TOKEN, poll_s=0.05)
    with TestClient(create_app(settings)) as c:
        yield c


def post(client: TestClient, call_id: str, **body):
    score = {"metric": "success", "value": "fail", "source": "coval", **body}
    return client.post(f"/sessions/{call_id}/scores", json=score, headers=AUTH)


def stored(ledger_path: Path, sid: str) -> list:
    with Ledger(ledger_path) as ledger:
        return ledger.scores(sid)


def test_the_same_score_posted_twice_is_one_row(client, ledger_path):
    first = post(client, "call-1", explanation="booked the wrong day", external_id="ev-1")
    assert first.status_code == 201, first.text
    body = first.json()
    assert body["created"] and body["outcome"] == "fail" and body["decided_by"] == "coval"
    again = post(client, "call-1", explanation="booked the wrong day", external_id="ev-1")
    assert again.status_code == 200 and again.json()["created"] is False
    (row,) = stored(ledger_path, "call-1")
    assert (row.name, row.source, row.value, row.external_id) == ("success", "coval", 0.0, "ev-1")
    listed = client.get("/sessions/call-1/scores", headers=AUTH)
    assert [s["explanation"] for s in listed.json()] == ["booked the wrong day"]


def test_an_unknown_call_id_is_404_and_writes_nothing(client, ledger_path):
    r = post(client, "no-such-call")
    assert r.status_code == 404 and "no call 'no-such-call'" in r.json()["detail"]
    assert client.get("/sessions/no-such-call/scores", headers=AUTH).status_code == 404
    with Ledger(ledger_path) as ledger:
        assert ledger.stats()["counts"]["scores"] == 0


@pytest.mark.parametrize(("sid", "why"), [("gate-1", "is a gate run"), ("held-1", "is held out")])
def test_a_gate_or_heldout_session_refuses_scores(client, ledger_path, sid, why):
    r = post(client, sid)
    assert r.status_code == 409
    assert why in r.json()["detail"] and "never trains" in r.json()["detail"]
    assert stored(ledger_path, sid) == []


def test_a_100_kb_explanation_is_refused_and_a_long_one_cut_and_said_so(client, ledger_path):
    huge = post(client, "call-1", explanation="x" * 100_000)
    assert huge.status_code == 413 and "too large" in huge.json()["detail"]
    assert stored(ledger_path, "call-1") == []
    long = post(client, "call-1", explanation="y" * 20_000)
    assert long.status_code == 201
    assert long.json()["explanation_truncated"] is True
    assert long.json()["explanation_chars"] == 20_000
    assert len(long.json()["score"]["explanation"]) == MAX_EXPLANATION_CHARS
    assert post(client, "call-1", explanation="short").json()["explanation_truncated"] is False


def test_what_is_not_a_score_or_not_authorised_is_refused(client, ledger_path):
    assert post(client, "call-1", value=1.5).status_code == 422
    assert post(client, "call-1", source="simulator").status_code == 422
    assert post(client, "call-1", colour="red").status_code == 422
    r = client.post("/sessions/call-1/scores", json={"metric": "success", "value": 1,
                                                     "source": "coval"})  # fmt: skip
    assert r.status_code == 401
    assert stored(ledger_path, "call-1") == []
    paths = client.get("/openapi.json", headers=AUTH).json()["paths"]
    assert {"post", "get"} <= set(paths["/sessions/{call_id}/scores"])
