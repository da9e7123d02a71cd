"""Verbs that build no pipeline import no Pipecat; plotting is an extra with a helpful error."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import atexit, sys
@atexit.register
def _report():
    heavy = sorted(m for m in ("pipecat", "matplotlib", "torch", "vllm") if m in sys.modules)
    sys.stderr.write("LOADED " + ",".join(heavy) + "\\n")
from pipecat_rl.cli import main
main()
"""


def _run(*args: str, cwd: Path) -> tuple[int, list[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PIPECAT_RL_LEDGER", None)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    line = next(x for x in done.stderr.splitlines() if x.startswith("LOADED "))
    return done.returncode, [m for m in line[len("LOADED ") :].split(",") if m], done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("ledger", "stats", "--ledger", "missing.db"),
        ("llm", "models", "--llm-url", "http://127.0.0.1:9"),
        ("models", "list"),
        ("--help",),
        (*"gate --candidate a --incumbent b --scores scores.jsonl --out receipt".split(),),
    ],  # fmt: skip
    ids=["ledger", "llm", "models", "help", "gate-from-scores"],
)
def test_verbs_without_a_pipeline_do_not_import_pipecat(tmp_path, args):
    lines = [
        {"scenario": f"s{i}", "policy": p, "run": r, "reward": 1.0, "v2v_ms": [500.0]}
        for i in range(4)
        for r in range(2)
        for p in ("a", "b")
    ]
    (tmp_path / "scores.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    code, loaded, stderr = _run(*args, cwd=tmp_path)
    assert "Traceback" not in stderr
    assert "pipecat" not in loaded and "torch" not in loaded and "vllm" not in loaded
    if args[0] == "gate":
        assert code in (0, 1, 2), stderr
        assert (tmp_path / "receipt" / "receipt.html").is_file()


def test_the_core_install_gates_a_scores_file_and_writes_every_receipt_file(tmp_path):
    # Without the `report` extra (matplotlib blocked), the gate still decides and writes the
    # JSON, Markdown and HTML receipt; the page says why it has no plots and how to get them.
    lines = [
        {"scenario": f"s{i}", "policy": p, "run": r, "reward": float(p == "a" or r == 0),
         "v2v_ms": [500.0]}
        for i in range(8) for r in range(2) for p in ("a", "b")
    ]  # fmt: skip
    (tmp_path / "scores.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    blocked = "import sys; sys.modules['matplotlib'] = sys.modules['matplotlib.figure'] = None\n"
    args = "gate --candidate a --incumbent b --scores scores.jsonl --out receipt".split()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PIPECAT_RL_LEDGER", None)
    done = subprocess.run(
        [sys.executable, "-c", blocked + PROBE, *args], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "Traceback" not in done.stderr
    assert done.returncode in (0, 1, 2), done.stderr  # a verdict, not a missing-extra error
    receipt = json.loads((tmp_path / "receipt" / "receipt.json").read_text())
    assert receipt["verdict"] in ("PROMOTE", "REJECT", "INCONCLUSIVE")
    assert (tmp_path / "receipt" / "receipt.md").read_text().strip()
    page = (tmp_path / "receipt" / "receipt.html").read_text()
    assert "matplotlib is not installed" in page and "pipecat-rl[report]" in page
    assert "<svg" not in page


def test_a_missing_extra_names_itself_and_the_pip_command(tmp_path):
    # `service` without fastapi (the `service` extra): one line naming the extra, exit 69.
    blocked = "import sys; sys.modules['fastapi'] = None\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", blocked + PROBE, "service", "--port", "9", "--ledger", "l.db"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 69, done.stderr
    assert "Traceback" not in done.stderr
    assert "pip install 'pipecat-rl[service]'" in done.stderr and "fastapi" in done.stderr
    assert not (tmp_path / "l.db").exists()  # nothing created by a command that could not run
