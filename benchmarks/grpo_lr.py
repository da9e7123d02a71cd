"""How far one GRPO optimiser step moves SmolLM2's LoRA, per learning rate: the default's evidence.

One batch as an online GRPO step gets it: clinic-like chats, four completions each sampled by the
policy itself at T = 1 (so the recorded logprobs are the trainer's, as vLLM's processed ones
agree to ~1e-3 in fp32), alternate rewards 1 / 0 (advantages ±0.5). For each learning rate, from
the same fresh rank-16 LoRA, one `grpo_update` with the default mini-batches; after every
optimiser step the canary (the registry's prompt, its greedy continuation under the starting
weights) is re-scored: the max |Δ logp| there is what tells consecutive versions apart (the
canary's threshold is 0.05). Also per step: clip fraction, importance ratio, KL to the sampler.
Prints JSON.
"""

import argparse
import copy
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from pipecat_rl.ledger import SessionRecord  # noqa: E402
from pipecat_rl.training import registry  # noqa: E402
from pipecat_rl.training.config import TrainConfig  # noqa: E402
from pipecat_rl.training.grpo import build_groups, grpo_update  # noqa: E402
from pipecat_rl.training.policy import load_policy, score  # noqa: E402
from pipecat_rl.training.rows import Sampling, TrainableTurn, build_sequences  # noqa: E402
from pipecat_rl.training.sft import optimizer_for  # noqa: E402

SYSTEM = "You are the receptionist of Bright Smile Dental, on the phone. Be brief and warm."
CHATS = ["Hi, I'd like to book a checkup, please.", "I need to cancel my appointment."]
SAMPLES = 4
TOKENS = 40


def _prompt(tokenizer, messages) -> list[int]:
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(rendered["input_ids"] if not isinstance(rendered, list) else rendered)


def batch(policy) -> tuple[list, list[SessionRecord]]:
    """Completions the policy samples at T = 1, with their logprobs, in groups of `SAMPLES`."""
    turns, sessions = [], []
    gen = torch.Generator().manual_seed(0)
    policy.model.eval()
    for g, text in enumerate(CHATS):
        prompt = _prompt(policy.tokenizer, [
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": text}])  # fmt: skip
        for i in range(SAMPLES):
            ids, logprobs = list(prompt), []
            with torch.no_grad():
                for _ in range(TOKENS):
                    logits = policy.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
                    logp = torch.log_softmax(logits, -1)
                    token = int(torch.multinomial(logp.exp(), 1, generator=gen))
                    logprobs.append(float(logp[token]))
                    ids.append(token)
            sid = f"g{g}-{i}"
            turns.append(TrainableTurn(
                session_id=sid, index=0, prompt_ids=prompt, sampled_ids=ids[len(prompt):],
                sampler_logprobs=logprobs, adapter="base", sampling=Sampling(temperature=1.0),
            ))  # fmt: skip
            sessions.append(SessionRecord(
                id=sid, source="simulate", started_at=0.0, ended_at=1.0, scenario_hash=f"h{g}",
                reward_parts={"verifier": float(i % 2)},
            ))  # fmt: skip
    return turns, sessions


def canary(policy, ids: list[int], mask: list[bool]) -> torch.Tensor:
    was = policy.model.training
    policy.model.eval()
    with torch.no_grad():
        out = score(policy.model, ids, mask).logprobs
    policy.model.train(was)
    return out


def main(lrs: list[float]) -> dict:
    config = TrainConfig(algo="grpo")
    policy = load_policy(config)
    start = copy.deepcopy({k: v.detach().clone() for k, v in policy.model.state_dict().items()})
    turns, sessions = batch(policy)
    sequences, _ = build_sequences(turns)
    prompt = registry._canary_ids(policy.tokenizer)
    with torch.no_grad():
        greedy = policy.model.generate(
            torch.tensor([prompt]), max_new_tokens=16, do_sample=False
        )[0, len(prompt):].tolist()  # fmt: skip
    c_ids, c_mask = [*prompt, *greedy], [False] * len(prompt) + [True] * len(greedy)
    before = canary(policy, c_ids, c_mask)
    out = {
        "model": policy.base_dir.name, "rank": config.rank, "sequences": len(sequences),
        "loss_tokens": sum(s.num_loss_tokens for s in sequences),
        "mini_batches": config.mini_batches, "ppo_epochs": config.ppo_epochs, "lrs": {},
    }  # fmt: skip
    for lr in lrs:
        policy.model.load_state_dict(start)
        run = config.model_copy(update={"lr": lr})
        groups = build_groups(sessions, sequences, run)
        steps: list[dict] = []

        def on_step(m: dict, steps=steps) -> None:
            moved = (canary(policy, c_ids, c_mask) - before).abs()
            steps.append({
                "canary_max_abs_dlogp": round(float(moved.max()), 4),
                "canary_mean_abs_dlogp": round(float(moved.mean()), 4),
                **{k: m[k] for k in ("clip_ratio", "importance_ratio/min", "importance_ratio/max",
                                     "kl", "grad_norm")},
            })  # fmt: skip

        t0 = time.monotonic()
        grpo_update(policy, optimizer_for(policy, lr), groups.sequences, run, on_step=on_step)
        first = steps[0]["canary_max_abs_dlogp"]
        out["lrs"][f"{lr:g}"] = {"first_step_canary": first, "steps": steps,
                                 "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lr", type=float, nargs="+", default=[2e-5, 5e-5, 1e-4, 2e-4, 3e-4])
    print(json.dumps(main(parser.parse_args().lr), indent=2))
