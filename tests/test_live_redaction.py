"""The live path trains as documented: redacted by default, and told why when it cannot train.

A live call recorded the README's way (`RLRecorder("calls.db", call_id=...)`, or the setup file)
is redacted, so once a trusted source scores it and it has settled, the eligibility query takes
it. One recorded with redaction off is kept out, and `ledger stats` and `train` say so per
reason, from the rules the eligibility query is made of; `train` says it before importing torch.
Against the vLLM-shaped fake server (`tests/fake_openai.py`): no model is needed.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loguru import logger
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.cli.common import EXIT_NO_SIGNAL
from pipecat_rl.cli.train import refuse_without_rows
from pipecat_rl.errors import NoTrainingSignalError
from pipecat_rl.ledger import Ledger, LiveTrust, ScoreIn, live_exclusions
from pipecat_rl.ledger.eligibility import LIVE_REASONS, SESSION_RULES, live_rules
from pipecat_rl.recording import Redactor, RLRecorder, SessionInfo, install, record_session
from pipecat_rl.recording.setup_file import redactor_from_env, setup_pipeline_worker
from tests.fake_openai import serve_fake_openai
from tests.recording_helpers import Call, vllm_llm
from tests.test_ledger_scores import _live_cases, session, turn

ROOT = Path(__file__).resolve().parents[1]
CALLER = "I'm on +1 (415) 555-0134, or mail ann.lee@example.org"
SETTLED = LiveTrust(settle_s=0)  # a call that just ended: no time for late scores in a test


async def _record(path: Path, call_id: str, **recorder) -> None:
    """One live call of one turn through `RLRecorder(path, call_id=call_id, **recorder)`."""
    rl = RLRecorder(path, call_id=call_id, **recorder)
    async with serve_fake_openai(["Thanks", ", noted."], vllm=True) as url:
        async with Call([rl], llm=vllm_llm(url)) as call:
            await call.say(CALLER)
    await rl.recorder.flush()


def _sft_sessions(ledger: Ledger, trust: LiveTrust) -> set[str]:
    return {t.session_id for t in ledger.training_turns(purpose="sft", live=trust)}


async def test_a_live_call_recorded_by_default_is_redacted_and_trains_once_trusted(tmp_path):
    path = tmp_path / "calls.db"
    await _record(path, "default")  # the README's line
    await _record(path, "as-said", redact=False)
    with Ledger(path) as ledger:
        (turn,) = ledger.turns("default")
        stored = json.dumps(turn.request)
        assert "555-0134" not in stored and "ann.lee@" not in stored
        assert "[PHONE]" in stored and "[EMAIL]" in stored
        assert turn.redacted and turn.token_exact  # consented by default: its ids are kept
        (raw,) = ledger.turns("as-said")
        assert not raw.redacted and "555-0134" in json.dumps(raw.request)

        assert _sft_sessions(ledger, SETTLED) == set()  # nobody scored either yet
        for sid in ("default", "as-said"):
            ledger.post_score(sid, ScoreIn(metric="success", value="pass", source="human"))
        assert _sft_sessions(ledger, SETTLED) == {"default"}
        assert _sft_sessions(ledger, LiveTrust()) == set()  # ended just now: not settled
        assert _sft_sessions(ledger, LiveTrust(sources=("coval",), settle_s=0)) == set()
        refuse_without_rows(ledger, "sft", SETTLED, None)  # rows: no refusal

        kept = live_exclusions(ledger, SETTLED)
        assert (kept.calls, kept.trainable) == (2, 1)
        assert {k: n for k, n in kept.kept_out.items() if n} == {"unredacted": 1}
        kept = live_exclusions(ledger, LiveTrust(sources=("coval",)))
        assert {k: n for k, n in kept.kept_out.items() if n} == {
            "untrusted_source": 2, "not_settled": 2, "unredacted": 1,
        }  # fmt: skip
        said = "2 decided by an untrusted source, 2 not settled yet, 1 unredacted"
        assert kept.describe() == said


def test_redact_false_with_a_redactor_is_refused():
    with pytest.raises(ValueError, match="redact=False with a redactor"):
        RLRecorder("calls.db", redactor=Redactor(names=["Ann"]), redact=False)


async def test_a_simulated_session_is_not_redacted_by_default(tmp_path):
    # A scenario's caller reads out the world's phone number: redacting it would break the
    # lookup the episode is scored on. Only live calls are redacted by default.
    with Ledger(tmp_path / "sim.db") as ledger:
        info = SessionInfo(call_id="episode-1", source="simulate", scenario_id="book")
        async with serve_fake_openai(["Found", " you."], vllm=True) as url:
            with record_session(ledger, info) as handle:
                call = Call([], llm=vllm_llm(url))
                await install(call.worker)
                async with call:
                    await call.say(CALLER)
            await handle.flush()
        (turn,) = ledger.turns("episode-1")
    assert not turn.redacted and "555-0134" in json.dumps(turn.request)


@pytest.fixture
def logged():
    caught: list[str] = []
    sink = logger.add(lambda m: caught.append(str(m)), level="WARNING")
    yield caught
    logger.remove(sink)


@pytest.mark.parametrize(
    ("env", "redacts", "names", "said"),
    [
        ({}, True, [], None),
        ({"PIPECAT_RL_REDACT": "1"}, True, [], None),
        ({"PIPECAT_RL_REDACT": "0"}, False, [], None),
        ({"PIPECAT_RL_REDACT": "off"}, False, [], None),
        ({"PIPECAT_RL_REDACT_NAMES": "Ann Lee, Bob"}, True, ["Ann Lee", "Bob"], None),
        (
            {"PIPECAT_RL_REDACT": "0", "PIPECAT_RL_REDACT_NAMES": "Ann"},
            True,
            ["Ann"],
            "PIPECAT_RL_REDACT=0 but PIPECAT_RL_REDACT_NAMES names people",
        ),
        ({"PIPECAT_RL_REDACT": "maybe"}, True, [], "PIPECAT_RL_REDACT='maybe' is neither"),
    ],  # fmt: skip
)
def test_the_setup_files_redaction_comes_from_its_environment(env, redacts, names, said, logged):
    redactor = redactor_from_env(env)
    assert (redactor is not None) == redacts
    if redactor is not None:
        assert redactor.names == names
    assert [m for m in logged if said and said in m] if said else not logged


@pytest.mark.parametrize(("value", "redacted"), [(None, True), ("0", False)])
async def test_the_setup_file_records_a_live_call_redacted_unless_turned_off(
    tmp_path, monkeypatch, value, redacted
):
    path = tmp_path / "calls.db"
    monkeypatch.setenv("PIPECAT_RL_LEDGER", str(path))
    monkeypatch.delenv("PIPECAT_RL_REDACT_NAMES", raising=False)
    if value is None:
        monkeypatch.delenv("PIPECAT_RL_REDACT", raising=False)
    else:
        monkeypatch.setenv("PIPECAT_RL_REDACT", value)
    async with serve_fake_openai(["Noted."], vllm=True) as url:
        call = Call([], llm=vllm_llm(url))
        await setup_pipeline_worker(call.worker)  # what Pipecat calls for PIPECAT_SETUP_FILES
        async with call:
            await call.say(CALLER)
        await call.worker._pipecat_rl_recorder.flush()
    with Ledger(path) as ledger:
        (session,) = ledger.sessions()
        (turn,) = ledger.turns(session.id)
    assert session.source == "live" and turn.redacted == redacted
    assert ("555-0134" in json.dumps(turn.request)) != redacted


# -- why live calls are kept out ----------------------------------------------------------------


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.db") as store:
        yield store


@pytest.mark.parametrize(
    "trust",
    [LiveTrust(), SETTLED, LiveTrust(sources=("coval", "my-qa")), LiveTrust(sources=())],
    ids=["default", "settled", "more-sources", "none-trusted"],
)
def test_a_live_call_trains_exactly_when_no_reason_keeps_it_out(ledger, trust):
    _live_cases(ledger)
    trained = {t.session_id for t in ledger.training_turns(source="live", live=trust,
                                                           require_token_exact=False)}  # fmt: skip
    for call in ledger.sessions(source="live"):
        kept = live_exclusions(ledger, trust, session_ids=[call.id])
        reasons = {k for k, n in kept.kept_out.items() if n}
        assert kept.calls == 1 and bool(kept.trainable) == (call.id in trained), call.id
        assert bool(reasons) != (call.id in trained), (call.id, reasons)
    assert [r.reason for r in (*SESSION_RULES, *live_rules(trust))] == list(LIVE_REASONS)


def test_each_planted_reason_is_named(ledger):
    _live_cases(ledger)
    # still in progress: counted as that (and unscored), not also as "not settled"
    ledger.write_session(session("open", ended_at=None, outcome=None))
    expected = {
        "unscored": {"unscored", "open"}, "unredacted": {"unredacted"},
        "untrusted_source": {"untrusted"}, "not_consented": {"no-consent"},
        "excluded": {"excluded"}, "not_settled": {"recent"}, "in_progress": {"open"},
    }  # fmt: skip
    for reason, sids in expected.items():
        for sid in sids:
            kept = live_exclusions(ledger, session_ids=[sid]).kept_out
            assert kept[reason] == 1, (sid, reason, kept)
    kept = live_exclusions(ledger)
    assert {k: n for k, n in kept.kept_out.items() if n} == {k: len(v) for k, v in expected.items()}


def test_stats_json_and_text_say_why_live_calls_are_kept_out(ledger):
    _live_cases(ledger)
    stats = ["ledger", "stats", "--ledger", str(ledger.path)]
    data = json.loads(CliRunner().invoke(app, [*stats, "--json"]).stdout)
    assert {k: n for k, n in data["live_kept_out"].items() if n} == {
        "unscored": 1, "untrusted_source": 1, "not_settled": 1, "unredacted": 1,
        "not_consented": 1, "excluded": 1,
    }  # fmt: skip
    assert set(data["live_kept_out"]) == set(LIVE_REASONS)  # every reason, zeros included
    assert data["live_trust"] == {"sources": list(LiveTrust().sources), "settle_s": 3600.0}
    text = CliRunner().invoke(app, stats).stdout
    assert "live sessions: 1 unscored, 7 scored (2 trainable)" in text
    assert (
        "live sessions kept out of training: 1 excluded, 1 not consented, 1 no score, "
        "1 decided by an untrusted source, 1 not settled yet, 1 unredacted "
        "(trusting human, coval, pipecat-evals, judge; settled 1h after the call)"
    ) in " ".join(text.split())


# -- train refuses at once, before torch ---------------------------------------------------------

PROBE = """
import atexit, sys
@atexit.register
def _report():
    sys.stderr.write("TORCH " + str("torch" in sys.modules) + "\\n")
from pipecat_rl.cli import main
main()
"""


def _train(path: Path, *args: str) -> tuple[int, str, bool]:
    """`pipecat-rl train ARGS` in its own process: exit code, stderr, whether torch was imported."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PIPECAT_RL_LEDGER", None)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "train", "--ledger", str(path), *args],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (probe,) = [line for line in done.stderr.splitlines() if line.startswith("TORCH ")]
    torch = probe == "TORCH True"  # the probe reported (a missing line would read as no torch)
    return done.returncode, " ".join(done.stderr.split()), torch


def _unredacted_pass(path: Path) -> None:
    """The new user's ledger: one live call recorded unredacted, ended, scored pass by a person."""
    with Ledger(path) as store:
        now = time.time()
        store.write_session(
            session("call-1", started_at=now - 120, ended_at=now - 60),
            [turn("call-1", 0, redacted=False), turn("call-1", 1, redacted=False)],
        )
        store.post_score("call-1", ScoreIn(metric="success", value="pass", source="human"))


def test_train_with_only_unredacted_live_calls_refuses_with_the_reason_without_torch(tmp_path):
    path = tmp_path / "calls.db"
    _unredacted_pass(path)
    trust = ("--live-settle", "0", "--live-sources", "human")
    code, said, torch = _train(path, "--algo", "sft", *trust)
    assert code == EXIT_NO_SIGNAL, said
    assert not torch  # refused before the trainer (and torch, and the model) was loaded
    assert "no rows to train for --algo sft" in said
    assert "1 live call(s) scored pass but kept out of training" in said
    assert "1 unredacted: recorded without redaction (RLRecorder(redact=False)" in said
    code, said, torch = _train(path, "--algo", "opsd", "--live-since", "24h", *trust)
    assert code == EXIT_NO_SIGNAL and not torch, said
    assert "1 live call(s) kept out of training" in said and "1 unredacted" in said


def test_the_refusal_names_each_reason_under_the_runs_trust(ledger):
    _live_cases(ledger)  # six calls scored pass, all decided by coval or my-qa
    with pytest.raises(NoTrainingSignalError) as e:
        refuse_without_rows(ledger, "sft", LiveTrust(sources=("human",)), None)
    said = str(e.value)
    assert "SFT imitates sessions that passed, and none may train" in said
    assert "6 live call(s) scored pass but kept out of training" in said
    assert "(trusting human; settled 1h after the call)" in said
    for n, label in ((1, "excluded"), (1, "not consented"), (6, "decided by an untrusted source"),
                     (1, "not settled yet"), (1, "unredacted")):  # fmt: skip
        assert f"{n} {label}: " in said, label
    assert "no score" not in said  # the one unscored call has no pass for SFT to miss
