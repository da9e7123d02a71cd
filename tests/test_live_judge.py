"""The nightly judge over live calls (a deterministic fake judge on loopback), the conversation
it reads, and the scenario drafts grown from live failures."""

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.cli.common import EXIT_UNAVAILABLE
from pipecat_rl.cli.judge import parse_span
from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import Ledger, ScoreIn, SessionRecord, TurnRecord
from pipecat_rl.ledger.transcript import conversation
from pipecat_rl.loop.drafts import draft_from_live_failures
from pipecat_rl.scenarios import load_scenarios
from pipecat_rl.simulator.live_judge import load_judge_rubric
from tests.fake_openai import fake_openai_thread
from tests.pipecat_helpers import judge_and_agent

runner = CliRunner()

RUBRIC = """\
success: The agent answered the caller's question correctly.
metrics:
  - name: polite
    criterion: The reply is polite.
"""


def turns(sid: str, exchange: list[tuple[str, str]], **kw) -> list[TurnRecord]:
    """One turn per (caller line, agent reply), each request holding the context so far."""
    messages = [{"role": "system", "content": "You answer geography questions."}]
    out = []
    for i, (caller, agent) in enumerate(exchange):
        messages = [*messages, {"role": "user", "content": caller}]
        out.append(TurnRecord(
            session_id=sid, index=i, adapter="base", created_at=100.0 + i,
            request={"messages": list(messages)}, generated_text=agent, redacted=True, **kw,
        ))  # fmt: skip
        messages = [*messages, {"role": "assistant", "content": agent}]
    return out


@pytest.fixture
def ledger_path(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    now = time.time()
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        calls = {
            "good": [("What is the capital of Germany?", "Berlin, on the Spree.")],
            "rude": [("Capital of Germany? Call me on 415 555 0134.", "Paris, you idiot."),
                     ("That is wrong.", "Whatever.")],
            "scored": [("What is the capital of Germany?", "Berlin.")],
            "old": [("What is the capital of Germany?", "Berlin.")],
        }  # fmt: skip
        for i, (sid, exchange) in enumerate(calls.items()):
            started = now - (3 * 86400 if sid == "old" else 600 - i)
            ledger.write_session(
                SessionRecord(id=sid, source="live", started_at=started, ended_at=started + 60,
                              outcome="completed"),
                turns(sid, exchange),
            )  # fmt: skip
        ledger.write_session(
            SessionRecord(id="sim", source="simulate", started_at=now, ended_at=now + 1,
                          outcome="pass"),
            turns("sim", calls["good"]),
        )  # fmt: skip
        ledger.post_score("scored", ScoreIn(metric="success", value=1, source="coval"))
    (tmp_path / "rubric.yaml").write_text(RUBRIC)
    return path


@pytest.fixture(scope="module")
def judge_url():
    """The fake OpenAI server as a judge, served from its own thread and loop."""
    with fake_openai_thread([], answer=judge_and_agent) as url:
        yield url


def judge(ledger_path, url, *args: str):
    rubric = ledger_path.parent / "rubric.yaml"
    return runner.invoke(app, ["judge", "--rubric", str(rubric), "--judge-llm-url", url,
                               "--ledger", str(ledger_path), *args])  # fmt: skip


def test_the_judge_scores_unscored_live_calls_and_their_verdict_follows(ledger_path, judge_url):
    drafts = ledger_path.parent / "drafts"
    result = judge(ledger_path, judge_url, "--json", "--drafts", str(drafts))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [c["session_id"] for c in report["calls"]] == ["good", "rude"]  # not old, scored, sim
    assert (report["passed"], report["failed"], report["remaining"]) == (1, 1, 0)
    with Ledger(ledger_path) as ledger:
        good, rude = ledger.session("good"), ledger.session("rude")
        assert (good.outcome, rude.outcome) == ("pass", "fail")
        assert rude.metadata["verdict"]["source"] == "judge"
        assert rude.metadata["verdict"]["explanation"]  # the judge's why, the teacher's hint
        assert {(s.name, s.source) for s in ledger.scores("rude")} == {
            ("success", "judge"), ("polite", "judge")
        }  # fmt: skip
        assert [s.source for s in ledger.scores("scored")] == ["coval"]  # left as it was
        assert ledger.unscored_live_sessions(since=time.time() - 86400) == []
    # the failed, explained call became a draft for review, redacted, that loads as a scenario
    (path,) = [Path(p) for p in report["drafts"]]
    assert path == drafts / "live_rude_draft.yaml"
    text = path.read_text()
    assert text.startswith("# DRAFT FOR REVIEW") and "failed by judge" in text
    assert "415 555 0134" not in text and "[PHONE]" in text
    (draft,) = load_scenarios([path])
    assert [r.say for r in draft.script.rules] == [
        "Capital of Germany? Call me on [PHONE].", "That is wrong."
    ]  # fmt: skip
    assert draft.script.rules[-1].end_call
    # a second night finds nothing new to judge
    again = judge(ledger_path, judge_url, "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["calls"] == []


def test_the_budget_caps_the_calls_judged(ledger_path, judge_url):
    result = judge(ledger_path, judge_url, "--max-calls", "1", "--since", "7d")
    assert result.exit_code == 0, result.output
    assert "judged 1 call(s)" in result.stderr and "2 more left" in result.stderr
    with Ledger(ledger_path) as ledger:
        assert ledger.session("old").outcome == "pass"  # the oldest first
        assert ledger.session("good").outcome == "completed"


def test_a_judge_that_does_not_answer_is_unavailable_a_bad_rubric_refused(ledger_path, tmp_path):
    result = judge(ledger_path, "http://127.0.0.1:9/v1")  # a service that is not there: 69
    assert result.exit_code == EXIT_UNAVAILABLE and "does not answer" in result.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("success: ok\nmetrics:\n  - {measure: turns, max_value: 3}\n")
    with pytest.raises(ConfigError, match="measured"):
        load_judge_rubric(bad)
    bad.write_text("metrics: []\n")
    with pytest.raises(ConfigError, match="success"):
        load_judge_rubric(bad)
    with pytest.raises(ConfigError, match="--since"):
        parse_span("yesterday")
    assert parse_span("24h") == 86400 and parse_span("90m") == 5400 and parse_span("30") == 30


def test_the_conversation_is_rebuilt_from_the_turns_once_each():
    exchange = [("Hi", "Hello, how can I help?"), ("Book Tuesday", "")]
    recorded = turns("c", exchange)
    recorded[1] = recorded[1].model_copy(update={
        "tool_calls": [{"id": "t1", "name": "book", "arguments": '{"day": "tuesday"}'}],
    })  # fmt: skip
    interrupted = recorded[0].model_copy(update={"spoken_text": "Hello, how"})
    assert conversation([recorded[1], interrupted]) == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello, how"},  # what the caller heard
        {"role": "user", "content": "Book Tuesday"},
        {"role": "tool_call", "name": "book", "arguments": {"day": "tuesday"}, "cancelled": False},
    ]
    # a bot that rewrites its context (a Flows node change) repeats no line
    node = [{"role": "system", "content": "New node."}, {"role": "user", "content": "Book Tuesday"}]
    rewritten = recorded[1].model_copy(update={"request": {"messages": node}})
    said = [m["content"] for m in conversation([recorded[0], rewritten]) if m["role"] == "user"]
    assert said == ["Hi", "Book Tuesday"]


def test_only_failed_explained_live_calls_become_drafts_outside_the_heldout_folder(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        for sid, value, why in (("f", 0, "Booked the wrong day for Maria."), ("p", 1, "fine"),
                                ("u", 0, None)):  # fmt: skip
            ledger.write_session(
                SessionRecord(id=sid, source="live", started_at=1.0, ended_at=2.0,
                              outcome="completed"),
                turns(sid, [("Book me for Tuesday, mail maria@example.com", "Done.")]),
            )  # fmt: skip
            ledger.post_score(sid, ScoreIn(metric="success", value=value, source="human",
                                           explanation=why))  # fmt: skip
        drafts = tmp_path / "drafts"
        (path,) = draft_from_live_failures(ledger, drafts)
        assert draft_from_live_failures(ledger, drafts) == [path]  # kept, not duplicated
        text = path.read_text()
        assert "failed by human: Booked the wrong day for Maria." in text
        assert "maria@example.com" not in text and "[EMAIL]" in text
        with pytest.raises(ConfigError, match="never grows"):
            draft_from_live_failures(ledger, tmp_path / "held" / "d", heldout=tmp_path / "held")
    assert "\nname: live_f_draft\n" in text
