"""No command destroys data: each case plants the slip of a path that used to cost a user data.

`ledger export --out` onto the ledger (by any spelling of its path), a symlink, a FIFO, a device
or a folder; `gate --out` onto a folder holding a receipt; `ledger migrate` into itself or over
a session the destination holds with other content. Each is refused (exit 64, naming the path
and the flag that would allow it) and leaves what was there as it was; `--force` or
`--on-conflict skip` allows what may be allowed, atomically, and says what it did.
"""

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pipecat_rl.cli.common import EXIT_IO, EXIT_USAGE
from pipecat_rl.cli.output import output_file
from pipecat_rl.errors import ConfigError
from pipecat_rl.gate.receipt import receipt_sha256
from pipecat_rl.ledger import Ledger, ScoreRecord, SessionRecord
from tests.cli_helpers import invoke

CLI = str(Path(sys.executable).with_name("pipecat-rl"))


def _session(sid: str, started_at: float, outcome: str = "pass") -> SessionRecord:
    return SessionRecord(id=sid, source="simulate", started_at=started_at,
                         ended_at=started_at + 1.0, outcome=outcome)  # fmt: skip


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    """A ledger of three sessions, each with a score; the working folder is `tmp_path`."""
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "calls.db"
    with Ledger(path) as store:
        for k, sid in enumerate(("a", "b", "c")):
            store.write_session(
                _session(sid, 100.0 + k),
                scores=[ScoreRecord(session_id=sid, name="task", value=0.5)],
            )
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _intact(path: Path, digest: str) -> None:
    assert _digest(path) == digest, f"{path} was changed"
    with Ledger(path) as store:
        assert [s.id for s in store.sessions()] == ["c", "b", "a"]


def _export(ledger: Path, out: str, *extra: str):
    return invoke("ledger", "export", "--ledger", str(ledger), "--out", out, *extra)


# -- ledger export --out ---------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["same", "dot", "absolute", "symlink", "hardlink", "wal"])
@pytest.mark.parametrize("force", [False, True])
def test_export_onto_the_ledger_is_refused_under_any_spelling(ledger, spelling, force):
    digest = _digest(ledger)
    out = {
        "same": "calls.db",
        "dot": "./sub/../calls.db",
        "absolute": str(ledger),
        "symlink": "link.db",
        "hardlink": "hard.db",
        "wal": "calls.db-wal",
    }[spelling]
    Path("sub").mkdir()
    Path("link.db").symlink_to(ledger)
    os.link(ledger, "hard.db")
    result = _export(ledger, out, *(["--force"] if force else []))
    assert result.exit_code == EXIT_USAGE, result.output
    assert f"--out {Path(out)} is the ledger this reads" in result.stderr
    _intact(ledger, digest)
    assert Path("link.db").is_symlink() and Path("hard.db").samefile(ledger)
    assert not Path("calls.db-wal").exists() or Path("calls.db-wal").stat().st_size == 0


def test_an_export_writes_a_new_file_and_replaces_a_plain_one(ledger):
    out = Path("calls.jsonl")
    result = _export(ledger, str(out))
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a", "b", "c"]
    out.write_text("yesterday's export\n")
    out.chmod(0o600)
    assert _export(ledger, str(out), "--session", "b").exit_code == 0
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["b"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o600  # replaced, its permissions kept
    assert sorted(p.name for p in Path().iterdir()) == ["calls.db", "calls.jsonl"]


def test_force_replaces_another_ledger_atomically(ledger, tmp_path):
    other = tmp_path / "other.db"
    with Ledger(other) as store:
        store.write_session(_session("z", 1.0))
    digest = _digest(other)
    refused = _export(ledger, str(other))
    assert refused.exit_code == EXIT_USAGE
    assert "SQLite database" in refused.stderr and "--force" in refused.stderr
    assert _digest(other) == digest

    forced = _export(ledger, str(other), "--force")
    assert forced.exit_code == 0, forced.output
    assert [json.loads(x)["id"] for x in other.read_text().splitlines()] == ["a", "b", "c"]
    assert not list(tmp_path.glob(".*partial"))


def test_a_failed_write_leaves_the_old_file_and_no_partial(ledger, tmp_path, monkeypatch):
    """A full disk half-way through: exit 74 naming the file, which is as it was."""
    out = tmp_path / "calls.jsonl"
    out.write_text("kept\n")

    def full_disk(self, f, session_ids=None):
        f.write('{"id": "a"}\n')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Ledger, "export_jsonl", full_disk)
    result = _export(ledger, str(out))
    assert result.exit_code == EXIT_IO, result.output
    assert str(out) in result.stderr and "No space left on device" in result.stderr
    assert out.read_text() == "kept\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls.db", "calls.jsonl"]
    gone = tmp_path / "new.jsonl"
    assert _export(ledger, str(gone)).exit_code == EXIT_IO
    assert not gone.exists()


def test_a_symlink_is_refused_and_followed_only_with_force(ledger, tmp_path):
    target = tmp_path / "exports" / "latest.jsonl"
    target.parent.mkdir()
    target.write_text("last week\n")
    link = tmp_path / "latest.jsonl"
    link.symlink_to(target)
    refused = _export(ledger, str(link))
    assert refused.exit_code == EXIT_USAGE
    assert "symbolic link" in refused.stderr and "--force" in refused.stderr
    assert link.is_symlink() and target.read_text() == "last week\n"

    assert _export(ledger, str(link), "--force").exit_code == 0
    assert link.is_symlink(), "the link was replaced by a file"
    assert len(target.read_text().splitlines()) == 3


def test_a_fifo_a_device_and_a_folder_are_refused(ledger, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = _export(ledger, str(fifo))
    assert result.exit_code == EXIT_USAGE and "FIFO" in result.stderr
    assert stat.S_ISFIFO(fifo.stat().st_mode), "the FIFO was replaced by a file"

    for device in (Path("/dev/null"), Path("/dev/full")):  # checked, never written by a test
        if device.exists():
            with pytest.raises(ConfigError, match="device"):
                output_file(device, "--out")

    for force in ([], ["--force"]):  # a folder cannot be forced into a file
        result = _export(ledger, str(tmp_path), *force)
        assert result.exit_code == EXIT_USAGE and "is a folder" in result.stderr
    assert (tmp_path / "calls.db").is_file()


def test_an_existing_receipt_file_needs_force(ledger, tmp_path):
    folder = tmp_path / "receipt"
    folder.mkdir()
    (folder / "receipt.json").write_text('{"verdict": "PROMOTE"}\n')
    (folder / "receipt.md").write_text("# PROMOTE\n")
    result = _export(ledger, str(folder / "receipt.md"))
    assert result.exit_code == EXIT_USAGE and "gate receipt" in result.stderr
    assert (folder / "receipt.md").read_text() == "# PROMOTE\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_a_full_stdout_or_device_is_an_io_error(ledger):
    """`> /dev/full` and `--out /dev/full --force` exit 74 naming the cause, never 0."""
    with open("/dev/full", "w") as full:
        code = subprocess.run([CLI, "ledger", "export", "--ledger", str(ledger)], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    assert code.returncode == EXIT_IO and "No space left on device" in code.stderr
    forced = subprocess.run(
        [CLI, "ledger", "export", "--ledger", str(ledger), "--out", "/dev/full", "--force"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert forced.returncode == EXIT_IO, forced.stderr
    assert "/dev/full" in forced.stderr and "No space left on device" in forced.stderr
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


# -- gate --out ------------------------------------------------------------------------------------


def _gate(tmp_path: Path, *extra: str):
    scores = tmp_path / "scores.jsonl"
    rows = [
        {"policy": policy, "scenario": f"s{i}", "run": r, "reward": reward}
        for i in range(8) for r in range(2)
        for policy, reward in (("cand", 1.0), ("inc", 0.0))
    ]  # fmt: skip
    scores.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return invoke("gate", "--candidate", "cand", "--incumbent", "inc", "--scores", str(scores),
                  "--no-require-latency", "--ledger", str(tmp_path / "gate.db"),
                  *extra)  # fmt: skip


def test_gate_refuses_a_folder_holding_a_receipt_until_forced(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    out = tmp_path / "receipt"
    first = _gate(tmp_path, "--out", str(out))
    assert first.exit_code in (0, 1, 2), first.output
    before = {name: (out / name).read_bytes() for name in ("receipt.json", "receipt.md")}

    again = _gate(tmp_path, "--out", str(out))
    assert again.exit_code == EXIT_USAGE, again.output
    assert f"--out {out} already holds a receipt" in again.stderr and "--force" in again.stderr
    assert {name: (out / name).read_bytes() for name in before} == before

    forced = _gate(tmp_path, "--out", str(out), "--force")
    assert forced.exit_code == first.exit_code, forced.output
    with Ledger(tmp_path / "gate.db") as store:  # the new receipt is the one promote accepts
        assert store.gate_receipt(receipt_sha256(out / "receipt.json")) is not None

    not_a_folder = _gate(tmp_path, "--out", str(tmp_path / "scores.jsonl"))
    assert not_a_folder.exit_code == EXIT_USAGE and "is not a folder" in not_a_folder.stderr


def test_gate_refuses_its_default_folder_taken_in_the_same_second(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("pipecat_rl.cli.gate._default_out", lambda c, i: Path("receipts/same"))
    assert _gate(tmp_path).exit_code in (0, 1, 2)
    digest = _digest(tmp_path / "receipts/same/receipt.json")
    second = _gate(tmp_path)
    assert second.exit_code == EXIT_USAGE and "already holds a receipt" in second.stderr
    assert _digest(tmp_path / "receipts/same/receipt.json") == digest


@pytest.mark.parametrize("spelling", ["receipts/v2", "./receipts/v2/", "deep/er/receipts/v2"])
def test_gate_makes_the_folders_missing_above_its_out(tmp_path, monkeypatch, spelling):
    """Issue 38: `--out receipts/v2` failed on a clone with no `receipts/` yet."""
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    monkeypatch.chdir(tmp_path)
    made = _gate(tmp_path, "--out", spelling)
    assert made.exit_code in (0, 1, 2), made.output
    assert (tmp_path / spelling / "receipt.json").is_file()


def test_gate_refuses_an_out_under_a_file_or_on_the_ledger(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPECAT_RL_LEDGER", raising=False)
    (tmp_path / "receipts").write_text("a file, not a folder\n")
    under_a_file = _gate(tmp_path, "--out", str(tmp_path / "receipts" / "v2"))
    assert under_a_file.exit_code == EXIT_USAGE, under_a_file.output
    assert "receipts is not a folder" in under_a_file.stderr
    # The ledger the gate is about to make, and the one it has made, are never its receipt.
    not_yet = _gate(tmp_path, "--out", str(tmp_path / "gate.db"))
    assert not_yet.exit_code == EXIT_USAGE and "is the ledger" in not_yet.stderr
    assert not (tmp_path / "gate.db").exists()  # refused before anything ran
    assert _gate(tmp_path, "--out", str(tmp_path / "r")).exit_code in (0, 1, 2)
    made = _gate(tmp_path, "--out", str(tmp_path / "gate.db"), "--force")
    assert made.exit_code == EXIT_USAGE and "is the ledger" in made.stderr
    with Ledger(tmp_path / "gate.db") as store:
        assert store.sessions() == [] and store.path.is_file()


def test_an_export_makes_the_folders_missing_above_its_out(ledger, tmp_path):
    made = _export(ledger, "exports/2026/calls.jsonl")
    assert made.exit_code == 0, made.output
    assert len((tmp_path / "exports/2026/calls.jsonl").read_text().splitlines()) == 3
    blocked = _export(ledger, "calls.db/x.jsonl")  # the ledger is a file: nothing goes under it
    assert blocked.exit_code == EXIT_USAGE and "calls.db is not a folder" in blocked.stderr


# -- ledger migrate --------------------------------------------------------------------------------


def _migrate(source: Path, dest: str, *extra: str):
    return invoke("ledger", "migrate", "--from", str(source), "--to", dest, *extra)


@pytest.mark.parametrize("spelling", ["dot", "symlink", "hardlink", "wal"])
def test_migrate_into_itself_is_refused_under_any_spelling(ledger, spelling):
    Path("link.db").symlink_to(ledger)
    os.link(ledger, "hard.db")
    dest = {"dot": "./calls.db", "symlink": "link.db", "hardlink": "hard.db",
            "wal": "calls.db-wal"}[spelling]  # fmt: skip
    digest = _digest(ledger)
    result = _migrate(ledger, dest)
    assert result.exit_code == EXIT_USAGE, result.output
    assert "the same ledger" in result.stderr
    _intact(ledger, digest)


def _with_conflict(ledger: Path, tmp_path: Path) -> Path:
    """A destination holding `a` as the source has it, and `b` with another outcome."""
    dest = tmp_path / "dest.db"
    with Ledger(ledger) as source, Ledger(dest) as into:
        into.write_session(_session("a", 100.0), scores=source.scores("a"))
        into.write_session(_session("b", 101.0, outcome="fail"), scores=source.scores("b"))
    return dest


def test_migrate_fails_on_a_conflict_naming_the_id_and_the_flag(ledger, tmp_path):
    dest = _with_conflict(ledger, tmp_path)
    result = _migrate(ledger, str(dest))
    assert result.exit_code == EXIT_USAGE, result.output
    assert "1 session(s)" in result.stderr and ": b;" in result.stderr
    assert "--on-conflict skip" in result.stderr
    with Ledger(dest) as into:  # nothing copied: `c` is not there, `b` is as it was
        assert sorted(s.id for s in into.sessions()) == ["a", "b"]
        assert into.session("b").outcome == "fail"


def test_migrate_skip_keeps_the_destination_and_says_how_many(ledger, tmp_path):
    dest = _with_conflict(ledger, tmp_path)
    result = _migrate(ledger, str(dest), "--on-conflict", "skip", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["conflicts"] == ["b"]
    assert report["tables"]["sessions"] == {"source": 3, "copied": 1, "present": 2}
    with Ledger(dest) as into:
        assert sorted(s.id for s in into.sessions()) == ["a", "b", "c"]
        assert into.session("b").outcome == "fail"

    human = _migrate(ledger, str(dest), "--on-conflict", "skip")
    assert human.exit_code == 0
    assert "skipped 1 session(s)" in human.stderr and "b" in human.stderr


def test_migrate_again_with_identical_content_is_no_conflict(ledger, tmp_path):
    dest = tmp_path / "copy.db"
    assert _migrate(ledger, str(dest)).exit_code == 0
    again = _migrate(ledger, str(dest), "--json")
    assert again.exit_code == 0, again.output
    report = json.loads(again.stdout)
    assert report["conflicts"] == []
    assert report["tables"]["sessions"] == {"source": 3, "copied": 0, "present": 3}
