"""The habits a Pipecat team expects of a CLI: `--version`, results on stdout and the rest on
stderr, a closed pipe ending quietly, `-v` after the verb, ids never cut, help readable at 80
columns, one exit code per kind of failure, nothing created by a command that fails, `--json`
answered even on refusal, and values parsed strictly with the flag named."""

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer
from rich.console import Console
from rich.table import Table

from pipecat_rl.cli import app
from pipecat_rl.cli import simulate as simulate_cli
from pipecat_rl.cli.common import (
    EXIT_DATA,
    EXIT_NO,
    EXIT_OK,
    EXIT_PIPE,
    EXIT_USAGE,
    print_table,
    verbose_first,
)
from pipecat_rl.errors import SimulationError
from pipecat_rl.ledger import Ledger, SessionRecord
from tests.cli_helpers import invoke

CLINIC = Path("examples/clinic")
EXPERT = str(CLINIC / "expert.py")
BOOKING = str(CLINIC / "handwritten/pool/routine_booking.yaml")
CLI = str(Path(sys.executable).with_name("pipecat-rl"))
LONG_ID = "call-20261201-235526-6c6556bd-" + "x" * 40


@pytest.fixture
def ledger_path(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    path = tmp_path / "ledger.db"
    with Ledger(path) as store:
        for i in range(400):  # more than a pipe buffer of output
            store.write_session(
                SessionRecord(id=f"{LONG_ID}-{i:03d}", source="live", started_at=float(i),
                              ended_at=i + 1.0, scenario_id="a-scenario-id-that-is-long")
            )  # fmt: skip
    return path


def test_version():
    result = invoke("--version")
    assert result.exit_code == EXIT_OK
    assert result.stdout.startswith("pipecat-rl ") and result.stdout.split()[1][0].isdigit()


def test_verbose_is_taken_after_the_verb(ledger_path):
    assert verbose_first(["ledger", "stats", "-vv", "--", "-v"]) == [
        "-vv", "ledger", "stats", "--", "-v"
    ]  # fmt: skip
    result = invoke("ledger", "stats", "-v", "--ledger", str(ledger_path))
    assert result.exit_code == EXIT_OK, result.output
    assert "sessions" in result.stdout


def test_results_go_to_stdout_and_progress_to_stderr(tmp_path):
    listed = invoke("models", "list")
    assert listed.exit_code == EXIT_OK and "smollm2" in listed.stdout and not listed.stderr

    result = invoke("simulate", BOOKING, "--bot", EXPERT, "--persona", "scripted", "--no-server",
                    "--ledger", str(tmp_path / "l.db"))  # fmt: skip
    assert result.exit_code == EXIT_OK, result.output
    assert "routine_booking" in result.stdout and "1/1" in result.stdout
    # stderr carries the progress only: one line per call where it is no terminal
    named = [x for x in result.stderr.splitlines() if "routine_booking" in x]
    assert named == ["simulating [1/1] routine_booking#0 pass " + named[0].split(" pass ")[1]]


def test_the_gate_verdict_goes_to_stdout(tmp_path):
    scores = tmp_path / "scores.jsonl"
    rows = [
        {"policy": policy, "scenario": f"s{i}", "run": r, "reward": reward}
        for i in range(8) for r in range(2)
        for policy, reward in (("cand", 1.0), ("inc", 0.0))
    ]  # fmt: skip
    scores.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = invoke("gate", "--candidate", "cand", "--incumbent", "inc", "--scores", str(scores),
                    "--no-require-latency", "--out", str(tmp_path / "receipt"),
                    "--ledger", str(tmp_path / "l.db"))  # fmt: skip
    assert result.exit_code in (0, 1, 2), result.output
    verdict = json.loads((tmp_path / "receipt" / "receipt.json").read_text())
    assert "receipt:" in result.stdout and verdict["reason"] in result.stdout


@pytest.mark.parametrize(
    "args",
    [["ledger", "export"], ["ledger", "sessions", "--limit", "400"], ["ledger", "stats"],
     ["ledger", "sessions", "--json"], ["--version"]],  # fmt: skip
)
def test_a_closed_pipe_ends_quietly(ledger_path, args):
    """As `pipecat-rl ... | head -1`, with the reader gone before the first write."""
    child = subprocess.Popen(
        [CLI, *args, *(["--ledger", str(ledger_path)] if args[0] == "ledger" else [])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    child.stdout.close()
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=120) == EXIT_PIPE
    assert stderr == "", stderr


def test_ids_are_never_cut_or_wrapped(ledger_path):
    table = Table()
    table.add_column("id", no_wrap=True)
    table.add_column("labels", overflow="fold")
    table.add_row(LONG_ID, "misheard_slot, tool_error")
    buffer = io.StringIO()
    print_table(Console(file=buffer, width=40, soft_wrap=True), table)
    assert LONG_ID in buffer.getvalue()

    result = invoke("ledger", "sessions", "--ledger", str(ledger_path), env={"COLUMNS": "60"})
    assert f"{LONG_ID}-399" in result.stdout and "a-scenario-id-that-is-long" in result.stdout


def _commands(group: typer.main.TyperGroup, path: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        yield (*path, name), command
        if hasattr(command, "commands"):
            yield from _commands(command, (*path, name))


def test_help_is_readable_at_80_columns():
    root = typer.main.get_command(app)
    for path, command in _commands(root):
        result = invoke(*path, "--help", env={"COLUMNS": "80"})
        assert result.exit_code == EXIT_OK, (path, result.output)
        text = result.stdout
        for param in command.params:
            for flag in param.opts + param.secondary_opts:
                if flag.startswith("--"):
                    assert flag in text, (path, flag)  # never cut to `--max-regressi…`
        assert "<bool>" not in text, path
        assert all(len(line) <= 80 for line in text.splitlines()), path
    transport = invoke("simulate", "--help", env={"COLUMNS": "80"}).stdout
    assert "[webrtc]" in transport  # not eaten as rich markup


def test_a_missing_file_or_folder_is_a_usage_error_naming_it(tmp_path, ledger_path):
    cases = [
        (["simulate", BOOKING, "--bot", str(tmp_path / "bot.py"), "--no-server"], "bot.py"),
        (["simulate", str(tmp_path / "no.yaml"), "--bot", EXPERT, "--no-server"], "no.yaml"),
        (["gate", "--candidate", "c", "--config", str(tmp_path / "gate.yaml")], "gate.yaml"),
        (["cycle", "--config", str(tmp_path / "loop.yaml")], "loop.yaml"),
        (["gate", "--candidate", "c", "--scores", str(tmp_path / "s.jsonl")], "s.jsonl"),
        (["train", "--ledger", str(tmp_path / "none.db")], "none.db"),
    ]
    for args, named in cases:
        result = invoke(*args)
        assert result.exit_code == EXIT_USAGE, (args, result.output)
        assert named in result.stderr, (args, result.stderr)
    assert not (tmp_path / "none.db").exists()


def test_an_empty_rollback_is_a_usage_error(tmp_path):
    path = tmp_path / "l.db"
    Ledger(path).close()
    nothing = invoke("rollback", "--ledger", str(path), "--json")
    assert nothing.exit_code == EXIT_USAGE
    assert "nothing to roll back to" in json.loads(nothing.stdout)["error"]


def test_a_config_in_another_format_than_its_suffix_is_a_wrong_file(tmp_path):
    yaml_in_json = tmp_path / "gate.json"
    yaml_in_json.write_text("min_delta: 0.1\n")
    for args in (["gate", "--candidate", "c", "--config", str(yaml_in_json)],
                 ["cycle", "--config", str(yaml_in_json)]):  # fmt: skip
        result = invoke(*args)
        assert result.exit_code == EXIT_DATA, result.output
        assert "gate.json: not valid JSON" in result.stderr
    other = tmp_path / "gate.toml"
    other.write_text("min_delta = 0.1\n")
    assert invoke("gate", "--candidate", "c", "--config", str(other)).exit_code == EXIT_USAGE


def test_an_export_makes_its_folder_and_a_failed_one_leaves_nothing(ledger_path, tmp_path):
    target = tmp_path / "no-such-dir" / "x.jsonl"  # made, as `mkdir -p` would
    result = invoke("ledger", "export", "--out", str(target), "--ledger", str(ledger_path))
    assert result.exit_code == EXIT_OK, result.output
    assert target.is_file()

    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    result = invoke("ledger", "export", "--out", str(in_the_way / "x.jsonl"),
                    "--ledger", str(ledger_path))  # fmt: skip
    assert result.exit_code == EXIT_USAGE and f"{in_the_way} is not a folder" in result.stderr

    # A failure half-way leaves no partial file, and no folder it made for one.
    for ghost in (tmp_path / "ghost.jsonl", tmp_path / "new" / "deeper" / "ghost.jsonl"):
        result = invoke("ledger", "export", "--out", str(ghost), "--session", "ghost",
                        "--ledger", str(ledger_path))  # fmt: skip
        assert result.exit_code == EXIT_USAGE and not ghost.exists()
    assert not (tmp_path / "new").exists()
    assert list(tmp_path.glob(".*partial")) == []


def test_a_failed_gate_leaves_no_new_ledger(tmp_path):
    scores = tmp_path / "scores.jsonl"
    scores.write_text('{"policy": "c", "scenario": "a", "run": 0, "reward": 2}\n')
    path = tmp_path / "new.db"
    result = invoke("gate", "--candidate", "c", "--incumbent", "i", "--scores", str(scores),
                    "--ledger", str(path))  # fmt: skip
    assert result.exit_code == EXIT_DATA, result.output
    assert list(tmp_path.glob("new.db*")) == []


def test_the_channel_gap_page_is_written_only_where_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    empty = SimpleNamespace(episodes=[], to_json=dict)
    simulate_cli._report_gap(empty, empty, None, json_out=True)
    assert list(tmp_path.iterdir()) == []
    page = tmp_path / "gap.html"
    simulate_cli._report_gap(empty, empty, page, json_out=True)
    assert page.is_file()

    deeper = tmp_path / "reports" / "gap.html"  # its folder is made, as `mkdir -p` would
    simulate_cli._report_gap(empty, empty, deeper, json_out=True)
    assert deeper.is_file()
    (tmp_path / "nope").write_text("a file where a folder must be\n")
    blocked = invoke("simulate", BOOKING, "--bot", EXPERT, "--no-server", "--mode", "text,audio",
                     "--gap-html", str(tmp_path / "nope" / "gap.html"))  # fmt: skip
    assert blocked.exit_code == EXIT_USAGE and "nope is not a folder" in blocked.stderr


def test_promote_json_prints_json_when_it_refuses(tmp_path):
    path = tmp_path / "l.db"
    Ledger(path).close()
    receipt = tmp_path / "receipt.json"
    receipt.write_text('{"verdict": "PROMOTE"}')
    for target, code in ((tmp_path / "absent.json", EXIT_USAGE), (receipt, EXIT_DATA)):
        result = invoke("promote", str(target), "--ledger", str(path), "--json")
        assert result.exit_code == code, result.output
        refusal = json.loads(result.stdout)
        assert refusal["exit_code"] == code and refusal["error"] in result.stderr


@pytest.mark.parametrize("verb", [["simulate", BOOKING, "--bot", EXPERT], ["train"],
                                  ["gate", "--candidate", "c"]])  # fmt: skip
def test_seeds_out_of_range_are_refused_naming_the_flag(verb):
    for seed in ("1e26", str(2**63), "-1"):
        result = invoke(*verb, "--seed", seed)
        assert result.exit_code == EXIT_USAGE, (verb, seed, result.output)
        assert "'--seed'" in result.stderr


def test_simulate_fails_under_a_pass_rate_for_ci(tmp_path):
    clinic = tmp_path / "clinic"
    shutil.copytree(CLINIC, clinic)
    booking = clinic / "handwritten/pool/routine_booking.yaml"
    impossible = booking.with_name("impossible.yaml")
    impossible.write_text(booking.read_text().replace("equals: 2", "equals: 9")
                          .replace("name: routine_booking", "name: impossible"))  # fmt: skip
    args = ["simulate", str(impossible), str(booking), "--bot", str(clinic / "expert.py"),
            "--persona", "scripted", "--no-server", "--ledger", str(tmp_path / "l.db")]  # fmt: skip
    below = invoke(*args, "--fail-under", "0.6")
    assert below.exit_code == EXIT_NO, below.output
    assert "pass rate 0.500 (1/2 verified runs) is below --fail-under 0.6" in below.stderr
    assert invoke(*args, "--fail-under", "0.5").exit_code == EXIT_OK
    assert invoke(*args).exit_code == EXIT_OK  # without it, the agent's score is not the exit
    assert invoke(*args, "--fail-under", "1.5").exit_code == EXIT_USAGE


def test_the_judge_timeout_flag_reaches_the_simulation(tmp_path, monkeypatch):
    import pipecat_rl.simulator as simulator

    seen = []

    def run(scenarios, bot, options, ledger, **kwargs):
        seen.append(options)
        raise SimulationError("stopped by the test")

    monkeypatch.setattr(simulator, "run", run)
    result = invoke("simulate", BOOKING, "--bot", EXPERT, "--persona", "scripted", "--no-server",
                    "--judge-timeout", "90", "--ledger", str(tmp_path / "l.db"))  # fmt: skip
    assert "stopped by the test" in result.stderr
    assert [o.judge_timeout_s for o in seen] == [90.0]
