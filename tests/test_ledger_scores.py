"""Scores posted for calls: one per (session, metric, source), refusals, a live call's verdict,
and which live calls the eligibility query lets train."""

import sqlite3
import time

import pytest
from pydantic import ValidationError

from pipecat_rl.errors import NotInLedgerError, ScoreRefusedError
from pipecat_rl.ledger import Ledger, LiveTrust, ScoreIn, SessionRecord, TurnRecord, schema
from pipecat_rl.ledger.scores import MAX_EXPLANATION_CHARS


def session(sid: str, **kw) -> SessionRecord:
    fields = {"source": "live", "started_at": 100.0, "ended_at": 160.0, "outcome": "completed"}
    return SessionRecord(id=sid, **{**fields, **kw})


def turn(sid: str, index: int = 0, redacted: bool = True) -> TurnRecord:
    return TurnRecord(
        session_id=sid, index=index, adapter="base", created_at=101.0 + index,
        request={"messages": [{"role": "user", "content": f"hello {index}"}]},
        prompt_token_ids=[1, 2], completion_token_ids=[3], logprobs=[-0.1], token_exact=True,
        usage={"completion_tokens": 1},
        generated_text="hi", redacted=redacted,
    )  # fmt: skip


def score(metric: str = "success", value: object = 1.0, source: str = "coval", **kw) -> ScoreIn:
    return ScoreIn(metric=metric, value=value, source=source, **kw)


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.db") as store:
        yield store


def test_a_score_posted_twice_is_one_row_and_the_retry_replaces_it(ledger):
    ledger.write_session(session("call-1"), [turn("call-1")])
    first = ledger.post_score("call-1", score(value=0.0, explanation="no booking"))
    again = ledger.post_score("call-1", score(value=1.0, explanation="booked", external_id="e-9"))
    assert (first.created, again.created) == (True, False)
    (row,) = ledger.scores("call-1")
    assert (row.name, row.source, row.value, row.explanation, row.external_id) == (
        "success", "coval", 1.0, "booked", "e-9"
    )  # fmt: skip
    # another source's score of the same metric is its own row, never an overwrite
    ledger.post_score("call-1", score(source="judge", value=0.0))
    assert sorted((r.source, r.value) for r in ledger.scores("call-1")) == [
        ("coval", 1.0), ("judge", 0.0)
    ]  # fmt: skip


def test_the_deciding_source_sets_a_live_calls_verdict(ledger):
    ledger.write_session(session("call-1"), [turn("call-1")])
    judged = ledger.post_score("call-1", score(source="judge", value="fail", explanation="rude"))
    assert (judged.outcome, judged.decided_by) == ("fail", "judge")
    s = ledger.session("call-1")
    assert s.reward_parts == {"judge:success": 0.0} and s.reward == 0.0
    assert s.metadata["verdict"]["explanation"] == "rude"
    # a platform outranks our judge, a person outranks both; their other metrics become parts
    ledger.post_score("call-1", score(metric="politeness", value=0.25, source="coval"))
    assert ledger.session("call-1").outcome == "fail"  # coval has not posted success yet
    coval = ledger.post_score("call-1", score(value="pass", source="coval"))
    assert (coval.outcome, coval.decided_by) == ("pass", "coval")
    assert ledger.session("call-1").reward_parts == {
        "judge:success": 1.0, "judge:politeness": 0.25
    }  # fmt: skip
    human = ledger.post_score("call-1", score(value=0.0, source="human", explanation="wrong day"))
    assert (human.outcome, human.decided_by) == ("fail", "human")
    assert ledger.session("call-1").reward_parts == {"judge:success": 0.0}
    assert ledger.session("call-1").metadata["verdict"]["source"] == "human"
    # a lower-ranked source posting later does not take the call back
    assert ledger.post_score("call-1", score(value=1.0, source="judge")).decided_by == "human"


def test_a_simulated_episode_keeps_the_simulators_verdict(ledger):
    ledger.write_session(
        session("sim-1", source="simulate", split="pool", outcome="fail",
                reward_parts={"verifier": 0.0}),
        [turn("sim-1")],
    )  # fmt: skip
    posted = ledger.post_score("sim-1", score(value=1.0, source="human"))
    assert (posted.outcome, posted.decided_by) == ("fail", None)
    assert ledger.session("sim-1").reward_parts == {"verifier": 0.0}
    assert [r.source for r in ledger.scores("sim-1")] == ["human"]


def test_an_unknown_call_id_writes_nothing(ledger):
    with pytest.raises(NotInLedgerError, match="no call 'nope'"):
        ledger.post_score("nope", score())
    assert ledger.stats()["counts"]["scores"] == 0


def test_gate_heldout_and_open_sessions_refuse_scores(ledger):
    ledger.write_session(session("gate-1", source="gate", split="heldout"))
    ledger.write_session(session("held-1", source="simulate", split="heldout"))
    ledger.write_session(session("hash-1", source="simulate", split="pool", scenario_hash="h1"))
    ledger.record_heldout_hashes([("h1", "held-scenario", None)])
    ledger.write_session(session("open-1", ended_at=None, outcome=None))
    for sid, why in (("gate-1", "a gate run"), ("held-1", "held out"), ("hash-1", "held out"),
                     ("open-1", "has not ended")):  # fmt: skip
        with pytest.raises(ScoreRefusedError, match=why):
            ledger.post_score(sid, score())
    assert ledger.stats()["counts"]["scores"] == 0


def test_a_long_explanation_is_cut_and_the_result_says_so(ledger):
    ledger.write_session(session("call-1"))
    posted = ledger.post_score("call-1", score(explanation="x" * 100_000))
    assert posted.truncated and posted.explanation_chars == 100_000
    assert len(ledger.scores("call-1")[0].explanation) == MAX_EXPLANATION_CHARS
    short = ledger.post_score("call-1", score(explanation="fine"))
    assert not short.truncated and short.explanation_chars == 4


@pytest.mark.parametrize(
    "fields",
    [
        {"value": 1.5}, {"value": -0.1}, {"value": "maybe"}, {"value": float("nan")},
        {"source": "Coval Inc"}, {"source": "simulator"}, {"metric": "judge:success"},
        {"metric": ""}, {"extra": 1},
    ],
)  # fmt: skip
def test_a_score_that_is_not_one_is_refused(fields):
    with pytest.raises(ValidationError):
        ScoreIn(**{"metric": "success", "value": 1.0, "source": "coval", **fields})


def test_pass_and_fail_are_one_and_zero():
    assert score(value="pass").value == 1.0 and score(value="FAIL").value == 0.0


# -- which live calls train -----------------------------------------------------------------------


def _live_cases(ledger: Ledger) -> None:
    now = time.time()
    cases = {  # id: (session fields, turns redacted, score source or None)
        "trusted": ({}, True, "coval"),
        "failed": ({}, True, "coval"),
        "unscored": ({}, True, None),
        "unredacted": ({}, False, "coval"),
        "untrusted": ({}, True, "my-qa"),
        "no-consent": ({"consent": False}, True, "coval"),
        "excluded": ({"excluded_from_training": True}, True, "coval"),
        "recent": ({"started_at": now - 60, "ended_at": now - 30}, True, "coval"),
    }
    for sid, (fields, redacted, source) in cases.items():
        ledger.write_session(session(sid, **fields), [turn(sid, 0, redacted), turn(sid, 1)])
        if source is not None:
            ledger.post_score(sid, score(value=0.0 if sid == "failed" else 1.0, source=source))


def _trained(ledger: Ledger, **kw) -> set[str]:
    return {t.session_id for t in ledger.training_turns(source="live", **kw)}


def test_only_consented_redacted_trusted_settled_live_calls_train(ledger):
    _live_cases(ledger)
    assert _trained(ledger) == {"trusted", "failed"}  # SFT keeps only the pass; OPSD both
    assert _trained(ledger, live=LiveTrust(sources=("coval", "my-qa"))) == {
        "trusted", "failed", "untrusted"
    }  # fmt: skip
    assert _trained(ledger, live=LiveTrust(settle_s=0)) == {"trusted", "failed", "recent"}
    assert _trained(ledger, live=LiveTrust(sources=())) == set()
    with pytest.raises(ValidationError, match="not source names"):
        LiveTrust(sources=("Coval'; DROP TABLE scores; --",))


def test_stats_count_live_calls_by_score_state_as_the_eligibility_query_does(ledger):
    _live_cases(ledger)
    ledger.write_session(session("sim-1", source="simulate", split="pool", outcome="pass"))
    for trust in (LiveTrust(), LiveTrust(settle_s=0), LiveTrust(sources=("human",))):
        states = ledger.stats(live=trust)["live_sessions"]
        trainable = _trained(ledger, live=trust, require_token_exact=False)
        assert states == {"unscored": 1, "scored": 7, "trainable": len(trainable)}
    assert ledger.stats()["live_sessions"]["trainable"] == 2


def test_the_judge_takes_only_unscored_ended_live_calls_that_could_train(ledger):
    _live_cases(ledger)
    ledger.write_session(session("open", ended_at=None, outcome=None))
    ledger.write_session(session("later-unscored", started_at=500.0, ended_at=560.0))
    ledger.write_session(session("no-consent-unscored", consent=False))
    assert [s.id for s in ledger.unscored_live_sessions()] == ["unscored", "later-unscored"]
    assert [s.id for s in ledger.unscored_live_sessions(since=200.0)] == ["later-unscored"]
    assert [s.id for s in ledger.unscored_live_sessions(limit=1)] == ["unscored"]


def test_a_version_6_file_keeps_its_scores_as_the_simulators(tmp_path, monkeypatch):
    path = tmp_path / "v6.db"
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:6])
    with Ledger(path) as store:
        store.add_session(session("old", source="simulate", outcome="pass"))
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO scores (session_id, name, value) VALUES ('old', 'verifier', 1.0)")
    conn.commit()
    conn.close()
    monkeypatch.undo()
    with Ledger(path) as store:
        (kept,) = store.scores("old")
        assert (kept.name, kept.value, kept.source) == ("verifier", 1.0, "simulator")
        store.post_score("old", score(metric="verifier", value=0.0, source="human"))
        assert sorted(r.source for r in store.scores("old")) == ["human", "simulator"]
