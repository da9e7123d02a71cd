"""`pipecat-rl ledger score` and the live calls by score state `ledger stats` shows."""

import json

import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.cli.common import EXIT_USAGE
from pipecat_rl.ledger import Ledger, SessionRecord, TurnRecord
from pipecat_rl.ledger.scores import MAX_EXPLANATION_CHARS

runner = CliRunner()


@pytest.fixture
def ledger_path(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    path = tmp_path / "ledger.db"
    with Ledger(path) as store:
        for sid, source in (("call-a", "live"), ("call-b", "live"), ("call-c", "live"),
                            ("gate-1", "gate")):  # fmt: skip
            store.write_session(
                SessionRecord(id=sid, source=source, started_at=1.0, ended_at=2.0,
                              outcome="completed"),
                [TurnRecord(session_id=sid, index=0, adapter="base", created_at=1.0,
                            request={}, redacted=sid != "call-c")],
            )  # fmt: skip
    return path


def score(path, *args: str):
    return runner.invoke(app, ["ledger", "score", *args, "--ledger", str(path)])


def test_a_score_is_stored_then_replaced_and_decides_the_call(ledger_path):
    first = score(ledger_path, "call-a", "--value", "fail", "--source", "coval",
                  "--explanation", "wrong day")  # fmt: skip
    assert first.exit_code == 0, first.output
    assert "stored success = 0 (coval) for call-a: outcome fail, decided by coval" in first.stderr
    again = score(ledger_path, "call-a", "--value", "pass", "--source", "coval", "--json")
    assert again.exit_code == 0, again.output
    body = json.loads(again.stdout)
    assert body["created"] is False and body["outcome"] == "pass"
    assert body["score"]["explanation"] is None  # the retry replaced the whole score
    with Ledger(ledger_path) as store:
        assert [(s.source, s.value) for s in store.scores("call-a")] == [("coval", 1.0)]


def test_refusals_are_usage_errors_that_write_nothing(ledger_path):
    for args, said in (
        (("nope", "--value", "1"), "no call 'nope'"),
        (("gate-1", "--value", "1"), "is a gate run"),
        (("call-a", "--value", "2"), "less than or equal to 1"),
        (("call-a", "--value", "1", "--source", "Coval Inc"), "not a source name"),
    ):
        result = score(ledger_path, *args)
        assert result.exit_code == EXIT_USAGE, result.output
        assert said in result.stderr
    with Ledger(ledger_path) as store:
        assert store.stats()["counts"]["scores"] == 0


def test_a_long_explanation_is_cut_and_said_so(ledger_path):
    result = score(ledger_path, "call-a", "--value", "0", "--explanation", "z" * 100_000)
    assert result.exit_code == 0, result.output
    assert f"cut to its first {MAX_EXPLANATION_CHARS} of 100000 characters" in result.stderr


def test_stats_show_live_calls_by_score_state_as_the_eligibility_query_counts(ledger_path):
    def stats() -> tuple[dict, str]:
        as_json = runner.invoke(app, ["ledger", "stats", "--ledger", str(ledger_path), "--json"])
        human = runner.invoke(app, ["ledger", "stats", "--ledger", str(ledger_path)])
        return json.loads(as_json.stdout)["live_sessions"], human.stdout

    states, human = stats()
    assert states == {"unscored": 3, "scored": 0, "trainable": 0}
    assert "live sessions: 3 unscored, 0 scored (0 trainable)" in human
    score(ledger_path, "call-a", "--value", "pass")
    score(ledger_path, "call-c", "--value", "pass")  # unredacted: scored, never trainable
    states, human = stats()
    assert states == {"unscored": 1, "scored": 2, "trainable": 1}
    assert "live sessions: 1 unscored, 2 scored (1 trainable)" in human
    assert "live sessions kept out of training: 1 no score, 1 unredacted (trusting" in human
    kept_out = json.loads(
        runner.invoke(app, ["ledger", "stats", "--ledger", str(ledger_path), "--json"]).stdout
    )["live_kept_out"]
    assert {k: n for k, n in kept_out.items() if n} == {"unscored": 1, "unredacted": 1}
    with Ledger(ledger_path) as store:
        trainable = {t.session_id for t in store.training_turns(require_token_exact=False)}
    assert trainable == {"call-a"} and len(trainable) == states["trainable"]
