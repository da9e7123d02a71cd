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


def test_plotting_is_an_extra_with_a_helpful_error(tmp_path):
    blocked = (
        "import sys; sys.modules['matplotlib'] = None; sys.modules['matplotlib.figure'] = None\n"
        "import pipecat_rl.recording, pipecat_rl.ledger  # a recording bot needs no plots\n"
        "from pipecat_rl.gate import receipt\n"
        "try:\n"
        "    import pipecat_rl.gate.report_html\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", blocked], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'pipecat-rl[report]'" in done.stdout
