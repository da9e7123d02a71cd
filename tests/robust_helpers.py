"""Shared pieces of the robustness tests: a call that goes on, a fake vLLM in its own process."""

import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLINIC = ROOT / "examples" / "clinic"


def long_scenario(folder: Path) -> Path:
    """A call that goes on for a long time: the scripted caller always has more to say."""
    path = folder / "pool" / "long_call.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(
        "name: long_call\npersona: a caller\ngoal: talk\nsuccess: talked\nmax_turns: 400\n"
        f"world: {{pack: {CLINIC / 'world.py'}}}\n"
        "script:\n  opening: Hello?\n  fallback: {say: [Go on, please.], max: 400}\n"
    )
    return path


def start_fake_vllm(port: int, env: dict[str, str]) -> subprocess.Popen:
    """`tests/fake_openai.py` answering like vLLM on `port`, in its own process, once listening."""
    fake = subprocess.Popen(
        [sys.executable, "-m", "tests.fake_openai", "--port", str(port), "--vllm"],
        cwd=ROOT, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return fake
        if time.monotonic() > deadline or fake.poll() is not None:
            fake.kill()
            raise AssertionError("the fake vLLM server did not start")
        time.sleep(0.05)


def recorded_turns(path: Path) -> int:
    """Turns in the ledger file so far (0 while it does not exist or is busy)."""
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(path, timeout=1) as raw:
            return raw.execute("SELECT count(*) FROM turns").fetchone()[0]
    except sqlite3.Error:
        return 0


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a `pipecat-rl` subprocess run from this checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra}
    env.pop("PIPECAT_RL_LLM_API_KEY", None)
    return env
