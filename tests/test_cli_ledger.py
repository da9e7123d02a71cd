import json
import sqlite3

import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.cli.common import EXIT_IO, EXIT_USAGE
from pipecat_rl.errors import LedgerError
from pipecat_rl.ledger import (
    AdapterRecord,
    LatencyRecord,
    Ledger,
    ScoreRecord,
    SessionRecord,
    ToolCallRecord,
    TurnRecord,
)
from tests.cli_helpers import invoke as run_cli

runner = CliRunner()


def _turn(sid: str, index: int, user: str, text: str, **kw) -> TurnRecord:
    messages = [{"role": "system", "content": "You are a clinic receptionist."}]
    for k in range(index + 1):
        messages.append({"role": "user", "content": user if k == index else f"earlier {k}"})
    fields = dict(
        adapter="clinic-v1",
        created_at=100.0 + index,
        request={"model": "clinic-v1", "messages": messages},
        prompt_token_ids=list(range(40)),
        completion_token_ids=[1, 2, 3],
        logprobs=[-0.1, -0.2, -0.3],
        token_exact=True,
        usage={"completion_tokens": 3},
        generated_text=text,
    )
    fields.update(kw)
    return TurnRecord(session_id=sid, index=index, **fields)


@pytest.fixture
def ledger_path(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    path = tmp_path / "ledger.db"
    with Ledger(path) as store:
        store.write_session(
            SessionRecord(
                id="sim-1",
                source="simulate",
                started_at=100.0,
                ended_at=160.0,
                scenario_id="book-cleaning",
                split="pool",
                policy="clinic-v1",
                seed=3,
                outcome="pass",
                reward=1.1,
                reward_parts={"verifier": 1.0, "tool_credit": 0.1},
                failure_labels=["misheard_slot"],
            ),
            turns=[
                _turn("sim-1", 0, "I'd like a [cleaning] on Monday", "Let me check Monday."),
                _turn(
                    "sim-1",
                    1,
                    "Actually Tuesday",
                    "Tuesday at nine works. Shall I book it?",
                    spoken_text="Tuesday at nine",
                    interrupted=True,
                ),
            ],
            tool_calls=[
                ToolCallRecord(
                    session_id="sim-1",
                    turn_index=0,
                    call_id="c1",
                    name="find_slots",
                    arguments={"day": "monday"},
                    result={"slots": ["09:00"]},
                    started_at=101.0,
                    duration_ms=12.0,
                ),
                ToolCallRecord(
                    session_id="sim-1",
                    turn_index=1,
                    call_id="c2",
                    name="book_slot",
                    arguments={"day": "tuesday"},
                    error="backend timeout",
                    started_at=102.0,
                    duration_ms=5000.0,
                ),
            ],
            latencies=[
                LatencyRecord.from_timestamps(
                    "sim-1",
                    0,
                    user_stopped_at=100.0,
                    stt_final_at=100.3,
                    llm_request_at=100.31,
                    llm_first_token_at=100.5,
                    tts_first_audio_at=100.6,
                    bot_started_at=100.65,
                    stt_ms=120.0,
                    heard_gap_ms=700.0,
                )
            ],
            scores=[ScoreRecord(session_id="sim-1", name="judge", value=0.8)],
        )
        store.write_session(
            SessionRecord(
                id="held-1",
                source="gate",
                started_at=200.0,
                split="heldout",
                scenario_id="reschedule",
                policy="clinic-v1",
            )
        )
        store.write_session(SessionRecord(id="live-1", source="live", started_at=300.0))
    return path


def invoke(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(app, ["ledger", *args], env=env)


def test_help_on_every_verb():
    result = invoke("--help")
    assert result.exit_code == 0
    for verb in ("stats", "sessions", "show", "export"):
        assert verb in result.stdout
        sub = invoke(verb, "--help")
        assert sub.exit_code == 0, sub.output
        assert "--ledger" in sub.stdout and "--json" in sub.stdout


def test_stats_json(ledger_path):
    result = invoke("stats", "--ledger", str(ledger_path), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["counts"]["sessions"] == 3
    assert data["counts"]["turns"] == 2
    assert data["sessions_by_source"] == {"simulate": 1, "gate": 1, "live": 1}
    assert data["eligible_turns"] == {"sft": 1, "rl": 1}  # the caller barged in on turn 1
    assert {k: n for k, n in data["dropped_turns"].items() if n} == {"interrupted": 1}
    assert data["path"] == str(ledger_path)


def test_stats_human(ledger_path):
    result = invoke("stats", "--ledger", str(ledger_path))
    assert result.exit_code == 0, result.output
    assert "training-eligible turns: SFT 1 (demonstrations included), RL 1" in result.stdout
    assert "sampled turns kept out of training: interrupted 1" in result.stdout


def test_ledger_path_from_environment(ledger_path):
    result = invoke("stats", "--json", env={"PIPECAT_RL_LEDGER": str(ledger_path)})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["path"] == str(ledger_path)


def test_default_ledger_in_cwd(ledger_path, monkeypatch):
    monkeypatch.chdir(ledger_path.parent)
    ledger_path.rename(ledger_path.parent / "pipecat-rl.db")
    result = invoke("sessions", "--json")
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)) == 3


def test_missing_ledger_file_is_a_usage_error(tmp_path):
    missing = tmp_path / "nope.db"
    result = invoke("stats", "--ledger", str(missing))
    assert result.exit_code == EXIT_USAGE
    assert str(missing) in result.output
    assert not missing.exists()


def test_sessions_json_and_filters(ledger_path):
    result = invoke("sessions", "--ledger", str(ledger_path), "--json")
    assert result.exit_code == 0, result.output
    assert [s["id"] for s in json.loads(result.stdout)] == ["live-1", "held-1", "sim-1"]

    result = invoke("sessions", "--ledger", str(ledger_path), "--json", "--split", "heldout")
    assert [s["id"] for s in json.loads(result.stdout)] == ["held-1"]
    result = invoke("sessions", "--ledger", str(ledger_path), "--json", "--source", "simulate")
    assert [s["id"] for s in json.loads(result.stdout)] == ["sim-1"]
    result = invoke(
        "sessions", "--ledger", str(ledger_path), "--json", "--policy", "clinic-v1", "--limit", "1"
    )
    assert [s["id"] for s in json.loads(result.stdout)] == ["held-1"]
    result = invoke("sessions", "--ledger", str(ledger_path), "--json", "--scenario", "reschedule")
    assert [s["id"] for s in json.loads(result.stdout)] == ["held-1"]


def test_sessions_table(ledger_path):
    result = invoke("sessions", "--ledger", str(ledger_path))
    assert result.exit_code == 0, result.output
    for sid in ("sim-1", "held-1", "live-1"):
        assert sid in result.stdout
    assert "misheard_slot" in result.stdout


def test_sessions_bad_split_is_a_usage_error(ledger_path):
    result = invoke("sessions", "--ledger", str(ledger_path), "--split", "held-out")
    assert result.exit_code == EXIT_USAGE
    assert "pool, heldout" in result.output


def test_show_transcript(ledger_path):
    result = invoke("show", "sim-1", "--ledger", str(ledger_path))
    assert result.exit_code == 0, result.output
    out = result.stdout
    for expected in (
        "sim-1",
        "book-cleaning",
        "clinic-v1",
        "pass",
        "misheard_slot",
        "I'd like a [cleaning] on Monday",  # markup in user text is shown, not interpreted
        "Let me check Monday.",
        "Tuesday at nine works. Shall I book it?",
        "Tuesday at nine",
        "(interrupted)",
        "find_slots",
        "'09:00'",
        "book_slot",
        "backend timeout",
        "5000 ms",
        "tokens 40→3",
        "token-exact",
        "endpointing 300 ms",
        "STT 120 ms",
        "TTFT 190 ms",
        "TTS TTFB 100 ms",
        "v2v 650 ms",
        "heard 700 ms",
        "judge",
    ):
        assert expected in out, expected
    # the latency row follows the turn that answered that user turn, before the next turn
    assert out.index("v2v 650 ms") < out.index("turn 1")


def test_show_json(ledger_path):
    result = invoke("show", "sim-1", "--ledger", str(ledger_path), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["id"] == "sim-1"
    assert [t["index"] for t in data["turns"]] == [0, 1]
    assert data["tool_calls"][1]["error"] == "backend timeout"
    assert data["latencies"][0]["v2v_ms"] == pytest.approx(650.0)
    assert data["scores"][0]["value"] == 0.8


def test_show_missing_session_is_a_usage_error(ledger_path):
    result = invoke("show", "no-such-id", "--ledger", str(ledger_path))
    assert result.exit_code == EXIT_USAGE
    assert "no-such-id" in result.output
    assert "pipecat-rl ledger sessions" in result.output


def test_export_stdout_and_file(ledger_path, tmp_path):
    result = invoke("export", "--ledger", str(ledger_path))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in rows] == ["sim-1", "held-1", "live-1"]
    assert len(rows[0]["turns"]) == 2

    out = tmp_path / "all.jsonl"
    result = invoke("export", "--ledger", str(ledger_path), "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"count": 3, "out": str(out)}
    assert len(out.read_text().splitlines()) == 3

    result = invoke("export", "--ledger", str(ledger_path), "--session", "live-1")
    assert [json.loads(x)["id"] for x in result.stdout.splitlines()] == ["live-1"]


def test_export_errors(ledger_path):
    result = invoke("export", "--ledger", str(ledger_path), "--format", "csv")
    assert result.exit_code == EXIT_USAGE
    result = invoke("export", "--ledger", str(ledger_path), "--session", "ghost")
    assert result.exit_code == EXIT_USAGE
    assert "ghost" in result.output


def test_corrupt_ledger_is_an_io_error(tmp_path):
    path = tmp_path / "bad.db"
    path.write_text("not sqlite at all\n" * 20)
    result = invoke("stats", "--ledger", str(path))
    assert result.exit_code == EXIT_IO
    assert str(path) in result.output


def test_unloading_the_live_adapter_is_refused_unless_forced(tmp_path):
    db = tmp_path / "l.db"
    with Ledger(db) as ledger:
        ledger.register_adapter(AdapterRecord(
            name="v3", path=str(tmp_path), base_model="smollm2", created_at=1.0
        ))  # fmt: skip
        ledger.move_live("v3")
    # nothing listens on this port: the refusal must come before any request
    args = ["llm", "unload-adapter", "v3", "--llm-url", "http://127.0.0.1:9", "--ledger", str(db)]
    result = runner.invoke(app, args)
    assert result.exit_code == EXIT_USAGE
    assert "v3 is the live adapter" in " ".join(result.output.split())
    forced = runner.invoke(app, [*args, "--force"])  # passes the check, then finds no server
    assert forced.exit_code != EXIT_USAGE and "live adapter" not in forced.output


def test_show_and_stats_read_a_simulated_call_as_it_happened(tmp_path):
    """The clinic expert books over three tool calls: the ledger holds eight LLM calls, four of
    them after tool results, and the simulator's tool executions carry no turn index."""
    db = tmp_path / "l.db"
    simulated = run_cli(
        "simulate", "examples/clinic/handwritten/pool/routine_booking.yaml",
        "--bot", "examples/clinic/expert.py", "--persona", "scripted", "--no-server",
        "--ledger", str(db), "--json",
    )  # fmt: skip
    assert simulated.exit_code == 0, simulated.output
    (episode,) = json.loads(simulated.stdout)["episodes"]
    out = invoke("show", episode["session_id"], "--ledger", str(db)).stdout

    assert out.count("user: Maria Lopez.") == 1  # the calls after tool results add no line
    assert out.count("user: Yes, please book it.") == 1
    assert "prompt: (The phone rings. Greet the caller.)" in out  # the bot's cue, no caller
    assert "(after tool results)" in out
    assert "not attached to a turn" not in out
    turn = {i: out.index(f"turn {i} ") for i in range(8)}
    for name, made_in in (("lookup_patient", 2), ("find_slots", 3), ("book", 5)):
        assert turn[made_in] < out.index(f"tool {name}(") < turn[made_in + 1], name
    gap = out.index("latency (user turn 0): response gap ")  # text mode: the response gap
    assert out.index("user: Hi, I'd like to book") < gap < turn[2]
    assert "endpointing" not in out and "v2v" not in out  # not measured in text mode
    assert "score 1 (verifier)" in out and "training reward 1.3" in out  # the gate's scale
    assert "unscored judge:success: no judge to ask" in out

    stats = json.loads(invoke("stats", "--ledger", str(db), "--json").stdout)
    assert stats["eligible_turns"] == {"sft": 8, "rl": 0}  # demonstrations train SFT only
    listed = invoke("sessions", "--ledger", str(db)).stdout
    assert " 1.3 " not in listed and listed.split()[-2:] == ["1", "-"]


def _files(folder):
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.iterdir())}


def test_read_only_verbs_never_write_the_ledger(ledger_path):
    """stats, sessions, show and export open read-only: not a byte changes, no -wal/-shm."""
    with Ledger(ledger_path) as store:  # a live call whose process is gone: an open session
        store.write_session(SessionRecord(id="live-9", source="live", started_at=200.0))
    with sqlite3.connect(ledger_path) as conn:  # checkpoint, then leave no WAL beside it
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode = DELETE")
    before = _files(ledger_path.parent)
    for verb in (["stats"], ["sessions"], ["show", "sim-1"], ["export"]):
        result = run_cli("ledger", *verb, "--ledger", str(ledger_path))
        assert result.exit_code == 0, (verb, result.stderr)
    assert _files(ledger_path.parent) == before  # not even the dead session was closed
    with Ledger(ledger_path, read_only=True) as store:
        assert store.session("live-9").ended_at is None
        with pytest.raises(LedgerError, match="opened read-only"):
            store.write_session(SessionRecord(id="x", source="live", started_at=1.0))
