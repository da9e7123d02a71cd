"""Tiny models the training tests build (no weights loaded), and turns they 'sample'."""

from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from pipecat_rl.ledger import TurnRecord
from pipecat_rl.serving.server import LOGPROBS_MODE
from pipecat_rl.training.config import LORA_TARGETS
from pipecat_rl.training.policy import Policy, loss_positions, selective_logprobs


def tiny_llama(
    vocab: int = 64, seed: int = 0, hidden: int = 32, heads: int = 4
) -> LlamaForCausalLM:
    """A 2-layer Llama (hidden size 32 by default): fast enough for many steps on CPU."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=heads // 2,
        max_position_embeddings=8192, tie_word_embeddings=False,
    )  # fmt: skip
    return LlamaForCausalLM(config).float()


def tiny_policy(vocab: int = 64, seed: int = 0, tokenizer=None, parent=None) -> Policy:
    """The tiny model with a fresh LoRA on all seven projections."""
    lora = LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0,
        target_modules=list(LORA_TARGETS),
    )  # fmt: skip
    model = get_peft_model(tiny_llama(vocab, seed), lora)
    return Policy(model=model, tokenizer=tokenizer, base_dir=Path("tiny"), parent=parent)


def sample_turn(
    model, prompt: list[int], n: int, *, temperature: float = 1.0, adapter: str = "base",
    session_id: str = "s", index: int = 0, seed: int = 0, request: dict | None = None,
    space: str = LOGPROBS_MODE,
) -> TurnRecord:  # fmt: skip
    """Sample `n` tokens from `model` at `temperature`, recording logprobs as vLLM does in `space`
    (processed: after temperature, as our server runs; raw: before it, vLLM's default)."""
    gen = torch.Generator().manual_seed(seed)
    ids, logprobs = list(prompt), []
    scale = temperature if space == "processed_logprobs" else 1.0
    model.eval()
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            probs = torch.softmax(logits / temperature, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=gen))
            logprobs.append(float(torch.log_softmax(logits / scale, dim=-1)[token]))
            ids.append(token)
    return TurnRecord(
        session_id=session_id, index=index, adapter=adapter, created_at=0.0,
        request=request or {"model": adapter, "temperature": temperature},
        prompt_token_ids=list(prompt), completion_token_ids=ids[len(prompt):],
        logprobs=logprobs, token_exact=True, usage={"completion_tokens": n},
    )  # fmt: skip


def sequence_logprob(model, ids: list[int], mask: list[bool]) -> float:
    """Total log p of the masked tokens of `ids` under `model`."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
        pos = loss_positions(mask)
        return float(selective_logprobs(logits[pos], torch.tensor(ids)[pos + 1]).sum())
