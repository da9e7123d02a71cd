"""The grouped vLLM-cpu LoRA ops: equal to vLLM's own wherever a row has an adapter, zero where
it has none (vLLM's add the last slot there), installed only when asked, on a real server too."""

import asyncio
import importlib

import httpx
import pytest
import torch

from pipecat_rl.serving import vllm_cpu_lora
from pipecat_rl.serving.server import BASE_ALIAS, VLLMServer

lora_ops = pytest.importorskip("vllm.lora.ops.torch_ops.lora_ops")

HIDDEN, RANK, SLOTS = 576, 16, 3
OUT_SIZES = {"q": 576, "k": 192, "v": 192, "o": 576, "gate": 1536, "up": 1536, "down": 576}
"""SmolLM2-135M's projection output sizes (9 query heads, 3 key/value heads of 64; MLP 1536)."""
IN_SIZES = {"o": 576, "down": 1536}
INDICES = {
    "mixed": [0, 0, 2, -1, 1, 1, 1, -1, 2, 0],
    "one adapter": [1] * 10,
    "no adapter": [-1] * 10,
    "adapter and base": [-1, 2, 2, -1, -1, 2, 2, 2, -1, 2],
}
ORIGINAL = {name: getattr(lora_ops, name) for name in vllm_cpu_lora.OPS}


def both(op: str) -> tuple:
    """vLLM's op and ours, by name, as (label, function) pairs."""
    return ("ref", ORIGINAL[op]), ("new", getattr(vllm_cpu_lora, op))


@pytest.fixture
def restore_ops():
    """Put vLLM's own ops back in every module the plugin patches."""
    modules = [importlib.import_module(m) for m in vllm_cpu_lora.MODULES]
    saved = [(m, op, getattr(m, op)) for m in modules for op in vllm_cpu_lora.OPS]
    yield
    for module, op, fn in saved:
        setattr(module, op, fn)


def weights(out_features: int, in_features: int, seed: int) -> torch.Tensor:
    """A vLLM LoRA stack: (slots, 1, out, in), random in every slot (the last one included)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(SLOTS, 1, out_features, in_features, generator=g) / in_features**0.5


def expect_rows(new: torch.Tensor, ref: torch.Tensor, untouched: torch.Tensor, idx: list[int]):
    """Rows with an adapter equal vLLM's; rows without one equal `untouched`."""
    for row, index in enumerate(idx):
        want = ref[row] if index >= 0 else untouched[row]
        torch.testing.assert_close(new[row], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("indices", INDICES.values(), ids=INDICES.keys())
@pytest.mark.parametrize("proj", OUT_SIZES)
def test_shrink_then_expand_equal_vllm_where_an_adapter_is_set(proj, indices):
    in_features = IN_SIZES.get(proj, HIDDEN)
    a, b = weights(RANK, in_features, 1), weights(OUT_SIZES[proj], RANK, 2)
    x = torch.randn(len(indices), in_features)
    idx = torch.tensor(indices)
    scale = 2.0
    buffers = {}
    for name, shrink in both("bgmv_shrink"):
        buffers[name] = torch.full((len(indices), RANK), 7.0)  # stale values must go
        shrink(x, a, buffers[name], idx, scale)
    expect_rows(buffers["new"], buffers["ref"], torch.zeros(len(indices), RANK), indices)
    y0 = torch.randn(len(indices), OUT_SIZES[proj])
    for add in (True, False):
        ys = {}
        for name, expand in both("bgmv_expand"):
            ys[name] = y0.clone()
            expand(buffers["ref"], b, ys[name], idx, add)
        expect_rows(ys["new"], ys["ref"], y0 if add else torch.zeros_like(y0), indices)


@pytest.mark.parametrize("indices", INDICES.values(), ids=INDICES.keys())
@pytest.mark.parametrize("add", [True, False])
def test_expand_slice_equals_vllm_per_qkv_slice(indices, add):
    sizes = [OUT_SIZES["q"], OUT_SIZES["k"], OUT_SIZES["v"]]
    x = torch.randn(len(indices), RANK)
    idx = torch.tensor(indices)
    y0 = torch.randn(len(indices), sum(sizes))
    ys = {}
    for name, fn in both("bgmv_expand_slice"):
        ys[name], offset = y0.clone(), 0
        for i, size in enumerate(sizes):
            fn(x, weights(size, RANK, 10 + i), ys[name], idx, offset, size, add)
            offset += size
    expect_rows(ys["new"], ys["ref"], y0 if add else torch.zeros_like(y0), indices)


def test_vllm_adds_the_last_slot_where_the_index_is_minus_one():
    a = weights(RANK, HIDDEN, 1)
    x = torch.randn(4, HIDDEN)
    idx = torch.tensor([0, -1, 1, -1])
    out = {}
    for name, shrink in both("bgmv_shrink"):
        out[name] = torch.zeros(4, RANK)
        shrink(x, a, out[name], idx)
    last = x @ a[-1, 0].T
    torch.testing.assert_close(out["ref"][[1, 3]], last[[1, 3]])
    assert out["ref"][[1, 3]].abs().min() > 0
    assert torch.equal(out["new"][[1, 3]], torch.zeros(2, RANK))


def test_expand_keeps_vllm_row_limit_common_length_and_casts():
    b = weights(200, RANK, 3).to(torch.float16)  # the adapter padded wider than the output
    for rows_in, idx in ((4, [0, 1, 1, 0]), (1, [2])):  # one row broadcasts to every output row
        x = torch.randn(rows_in, RANK, dtype=torch.bfloat16)
        y0 = torch.randn(4, 192)
        ys = {}
        for name, fn in both("bgmv_expand"):
            ys[name] = y0.clone()
            fn(x, b, ys[name], torch.tensor(idx), True)
        assert ys["new"].dtype == torch.float32
        torch.testing.assert_close(ys["new"], ys["ref"], atol=1e-5, rtol=1e-5)


def sgmv_outputs(seq_lens: list[int], seq_indices: list[int]) -> dict[str, torch.Tensor]:
    """vLLM's three sgmv ops on one prefill batch, through whatever bgmv ops are installed."""
    g = torch.Generator().manual_seed(5)
    tokens = sum(seq_lens)
    x = torch.randn(tokens, HIDDEN, generator=g)
    lens, idx = torch.tensor(seq_lens), torch.tensor(seq_indices)
    starts = torch.cumsum(lens, 0) - lens
    meta = (starts, lens, idx, len(seq_lens), max(seq_lens), tokens)
    shrunk = torch.zeros(tokens, RANK)
    lora_ops.sgmv_shrink(x, weights(RANK, HIDDEN, 1), shrunk, *meta, 0.5)
    expanded = torch.randn(tokens, HIDDEN, generator=g)
    lora_ops.sgmv_expand(shrunk, weights(HIDDEN, RANK, 2), expanded, *meta, True)
    sliced = torch.randn(tokens, 2 * 192, generator=g)
    lora_ops.sgmv_expand_slice(shrunk, weights(192, RANK, 3), sliced, *meta, 192, 192, True)
    return {"shrink": shrunk, "expand": expanded, "expand_slice": sliced}


def test_sgmv_ops_use_the_grouped_ops_once_registered(monkeypatch, restore_ops):
    seq_lens, seq_indices = [5, 3, 4, 2], [1, -1, 2, 1]
    ref = sgmv_outputs(seq_lens, seq_indices)
    monkeypatch.setenv(vllm_cpu_lora.ENV, "1")
    vllm_cpu_lora.register()
    new = sgmv_outputs(seq_lens, seq_indices)
    per_token = torch.repeat_interleave(torch.tensor(seq_indices), torch.tensor(seq_lens))
    base_rows = per_token < 0
    for name in ref:
        torch.testing.assert_close(new[name][~base_rows], ref[name][~base_rows])
    assert torch.equal(new["shrink"][base_rows], torch.zeros(int(base_rows.sum()), RANK))
    assert not torch.equal(new["expand"][base_rows], ref["expand"][base_rows])


def installed() -> list[bool]:
    modules = [importlib.import_module(m) for m in vllm_cpu_lora.MODULES]
    ops = vllm_cpu_lora.OPS
    return [getattr(m, op) is getattr(vllm_cpu_lora, op) for m in modules for op in ops]


@pytest.mark.parametrize("value", [None, "0", ""])
def test_register_leaves_vllm_alone_unless_asked(monkeypatch, restore_ops, value):
    if value is None:
        monkeypatch.delenv(vllm_cpu_lora.ENV, raising=False)
    else:
        monkeypatch.setenv(vllm_cpu_lora.ENV, value)
    vllm_cpu_lora.register()
    assert not any(installed())


def test_register_leaves_other_platforms_alone(monkeypatch, restore_ops):
    class NotCPU:
        def is_cpu(self) -> bool:
            return False

    monkeypatch.setattr("vllm.platforms.current_platform", NotCPU())
    monkeypatch.setenv(vllm_cpu_lora.ENV, "1")
    vllm_cpu_lora.register()
    assert not any(installed())


def test_register_patches_every_binding_once(monkeypatch, restore_ops):
    from loguru import logger

    lines: list[str] = []
    sink = logger.add(lines.append, format="{message}")
    monkeypatch.setenv(vllm_cpu_lora.ENV, "1")
    try:
        vllm_cpu_lora.register()
        vllm_cpu_lora.register()
    finally:
        logger.remove(sink)
    assert all(installed())
    assert len([line for line in lines if "LoRA ops grouped" in line]) == 1


def chat(server, model: str, content: str) -> dict:
    body = {
        "model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 12,
        "temperature": 0, "logprobs": True, "return_token_ids": True,
    }  # fmt: skip
    response = httpx.post(f"{server.url}/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return {"ids": choice["token_ids"], "lp": [t["logprob"] for t in choice["logprobs"]["content"]]}


async def batched(server, models: list[str], content: str) -> list[dict]:
    return await asyncio.gather(*(asyncio.to_thread(chat, server, m, content) for m in models))


def close(a: dict, b: dict) -> bool:
    """Same tokens, logprobs within what batching changes in fp32."""
    return (
        a["ids"] == b["ids"]
        and max(abs(x - y) for x, y in zip(a["lp"], b["lp"], strict=True)) < 1e-3
    )


@pytest.mark.slow
@pytest.mark.integration
def test_a_base_request_batched_beside_adapters_gets_the_base_model(vllm_server, random_lora):
    content = "Name three colours."
    base_alone = chat(vllm_server, BASE_ALIAS, content)
    admin = vllm_server.admin
    names = ["cpu-lora-a", "cpu-lora-b"]  # with --max-loras 2 they fill every slot, the last too
    for name in names:
        admin.load_adapter(name, random_lora)
    try:
        alone = {name: chat(vllm_server, name, content) for name in names}
        assert not close(alone[names[0]], base_alone)  # the adapter really changes the logits
        for _ in range(2):
            base, *adapters = asyncio.run(batched(vllm_server, [BASE_ALIAS, *names], content))
            assert close(base, base_alone)
            assert all(close(got, alone[name]) for got, name in zip(adapters, names, strict=True))
    finally:
        for name in names:
            admin.unload_adapter(name)
    assert "LoRA ops grouped per adapter" in vllm_server.log_path.read_text()


def test_the_cpu_server_asks_for_the_grouped_ops_unless_told_not_to(monkeypatch, tmp_path):
    monkeypatch.setattr("pipecat_rl.serving.server.running_on_cpu", lambda: True)
    monkeypatch.delenv(vllm_cpu_lora.ENV, raising=False)
    assert VLLMServer(tmp_path).environment()[vllm_cpu_lora.ENV] == "1"
    monkeypatch.setenv(vllm_cpu_lora.ENV, "0")
    assert VLLMServer(tmp_path).environment()[vllm_cpu_lora.ENV] == "0"
    monkeypatch.setattr("pipecat_rl.serving.server.running_on_cpu", lambda: False)
    monkeypatch.delenv(vllm_cpu_lora.ENV)
    assert vllm_cpu_lora.ENV not in VLLMServer(tmp_path).environment()
