"""The grouped vLLM-cpu LoRA ops: equal to vLLM's own wherever a row has an adapter, zero where
it has none (vLLM's add the last slot there), installed only when asked, on a real server too."""

import asyncio
import contextlib

import httpx
import pytest
import torch

from pipecat_rl.errors import ServingError
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
    """Put vLLM's own ops and methods back wherever the plugin installs its own."""
    saved = [
        (owner, name, owner.__dict__.get(name)) for owner, name, _ in vllm_cpu_lora._bindings()
    ]
    yield
    for owner, name, original in saved:
        if original is None:  # inherited (the CPU runner's prompt logprobs): inherit it again
            if name in owner.__dict__:
                delattr(owner, name)
        else:
            setattr(owner, name, original)


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


def test_rows_and_indices_of_different_lengths_are_refused_not_broadcast():
    a = weights(RANK, HIDDEN, 1)
    out = torch.zeros(85, RANK)
    with pytest.raises(ValueError, match="85 rows, 2 indices"):
        vllm_cpu_lora.bgmv_shrink(torch.randn(85, HIDDEN), a, out, torch.tensor([0, -1]))


VOCAB, LM_RANK = 64, 4
PROMPT_BATCH = {  # request: (adapter id, prompt length, computed before, scheduled now, logprobs)
    "adapter-a": (1, 12, 0, 12, True),  # a whole prompt with prompt logprobs
    "decoding": (0, 7, 7, 1, False),  # a base request decoding beside the prefills
    "adapter-b chunk": (2, 20, 5, 8, True),  # chunked prefill: a middle chunk, more to come
    "base": (0, 5, 0, 5, True),  # 4 logit rows: as many as the batch has requests
}
"""One step vLLM can form: prompt-logprob prefills of two adapters and the base, chunked and
whole, beside a decode. Adapter ids 1 and 2 sit in slots 0 and 1; 0 is the base model."""


def prompt_step(seed: int = 0):
    """The step's hidden states, a fake runner holding it, and its model's lm head and LoRA."""
    from types import SimpleNamespace

    import numpy as np
    from vllm.lora.layers.utils import LoRAMapping
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU
    from vllm.v1.sample.sampler import Sampler

    g = torch.Generator().manual_seed(seed)
    ids = [spec[0] for spec in PROMPT_BATCH.values()]
    now = [spec[3] for spec in PROMPT_BATCH.values()]
    punica = PunicaWrapperCPU(256, 8, "cpu")
    token_map = tuple(i for i, n in zip(ids, now, strict=True) for _ in range(n))
    punica.update_metadata(
        LoRAMapping(token_map, tuple(ids), is_prefill=True), [1, 2, None], 3, VOCAB
    )
    head = torch.randn(VOCAB, HIDDEN, generator=g) / HIDDEN**0.5
    lora_a = torch.randn(SLOTS, 1, LM_RANK, HIDDEN, generator=g) / HIDDEN**0.5
    lora_b = torch.randn(SLOTS, 1, VOCAB, LM_RANK, generator=g)

    def compute_logits(hidden_rows: torch.Tensor) -> torch.Tensor:  # LogitsProcessorWithLoRA's
        logits = hidden_rows @ head.T
        punica.add_lora_logits(logits, hidden_rows, lora_a, lora_b, 1.0)
        return logits

    starts = np.cumsum([0, *now])
    runner = SimpleNamespace(
        num_prompt_logprobs={r: 1 for r, spec in PROMPT_BATCH.items() if spec[4]},
        requests={
            r: SimpleNamespace(
                prompt_token_ids=torch.randint(VOCAB, (spec[1],), generator=g).tolist(),
                num_computed_tokens=spec[2], in_progress_prompt_logprobs_cpu=None,
            )
            for r, spec in PROMPT_BATCH.items()
        },
        input_batch=SimpleNamespace(req_id_to_index={r: i for i, r in enumerate(PROMPT_BATCH)}),
        query_start_loc=SimpleNamespace(np=starts),
        model=SimpleNamespace(compute_logits=compute_logits),
        sampler=Sampler, model_config=SimpleNamespace(logprobs_mode="processed_logprobs"),
        _sync_device=lambda: None, device="cpu",
    )  # fmt: skip
    hidden = torch.randn(int(starts[-1]), HIDDEN, generator=g)
    return hidden, runner, head, (lora_a, lora_b)


def prompt_logprobs_alone(request: str, hidden, runner, head, lora) -> torch.Tensor:
    """Its prompt logprobs computed from its rows alone, with vLLM's own ops (`ORIGINAL`)."""
    lora_id, _, done, now, _ = PROMPT_BATCH[request]
    prompt = runner.requests[request].prompt_token_ids
    count = min(now, len(prompt) - done - 1)
    start = int(runner.query_start_loc.np[list(PROMPT_BATCH).index(request)])
    rows = hidden[start : start + count]
    logits = rows @ head.T
    if lora_id:  # one index for every row: vLLM's einsum broadcasts it, rightly here
        index = torch.tensor([lora_id - 1])
        buffer = torch.zeros(count, LM_RANK)
        ORIGINAL["bgmv_shrink"](rows, lora[0], buffer, index, 1.0)
        ORIGINAL["bgmv_expand"](buffer, lora[1], logits, index, True)
    targets = torch.tensor(prompt[done + 1 : done + 1 + count])
    return logits.log_softmax(-1).gather(1, targets[:, None]).squeeze(1)


def test_prompt_logprobs_of_a_mixed_batch_use_each_requests_adapter(monkeypatch, restore_ops):
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    monkeypatch.setenv(vllm_cpu_lora.ENV, "1")
    vllm_cpu_lora.register()
    hidden, runner, head, lora = prompt_step()
    scheduled = {r: spec[3] for r, spec in PROMPT_BATCH.items()}
    done = CPUModelRunner._get_prompt_logprobs_dict(runner, hidden, scheduled)
    assert set(done) == {"adapter-a", "base"}  # the chunk has more prompt to come
    chunk = runner.requests["adapter-b chunk"].in_progress_prompt_logprobs_cpu
    got = {
        "adapter-a": done["adapter-a"].logprobs[:, 0],
        "adapter-b chunk": chunk.logprobs[5:13, 0],
        "base": done["base"].logprobs[:, 0],
    }
    for request, logprobs in got.items():
        want = prompt_logprobs_alone(request, hidden, runner, head, lora)
        torch.testing.assert_close(logprobs, want, atol=1e-5, rtol=1e-5)
    no_lora = prompt_logprobs_alone("base", hidden, runner, head, lora)
    torch.testing.assert_close(got["base"], no_lora)  # 4 rows, 4 requests: still the base's
    bare = (hidden[:11] @ head.T).log_softmax(-1)  # adapter-a's rows without its lm-head LoRA
    targets = torch.tensor(runner.requests["adapter-a"].prompt_token_ids[1:])
    assert (bare.gather(1, targets[:, None]).squeeze(1) - got["adapter-a"]).abs().max() > 1e-2


def test_vllms_own_logits_lora_fails_on_that_batch(restore_ops):
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    hidden, runner, _, _ = prompt_step()
    scheduled = {r: spec[3] for r, spec in PROMPT_BATCH.items()}
    with pytest.raises(RuntimeError):  # the 12 rows of adapter-a against 4 sampler indices
        CPUModelRunner._get_prompt_logprobs_dict(runner, hidden, scheduled)


def test_sampled_rows_keep_the_sampler_indices(monkeypatch, restore_ops):
    monkeypatch.setenv(vllm_cpu_lora.ENV, "1")
    vllm_cpu_lora.register()
    hidden, runner, head, lora = prompt_step()
    last_rows = torch.tensor(runner.query_start_loc.np[1:] - 1)
    sampled = hidden[last_rows]  # a copy, one row per request, as vLLM's sampler path makes
    logits = runner.model.compute_logits(sampled)
    for row, (lora_id, *_) in enumerate(PROMPT_BATCH.values()):
        want = sampled[row] @ head.T
        if lora_id:
            want = want + (sampled[row] @ lora[0][lora_id - 1, 0].T) @ lora[1][lora_id - 1, 0].T
        torch.testing.assert_close(logits[row], want, atol=1e-4, rtol=1e-4)


def test_prompt_rows_that_are_not_a_slice_of_the_step_are_refused():
    hidden = torch.randn(10, HIDDEN)
    token = vllm_cpu_lora._PROMPT_HIDDEN.set(hidden)
    try:
        indices = torch.tensor([0] * 4 + [-1] * 6)
        got = vllm_cpu_lora.logits_lora_indices(hidden[4:9], torch.tensor([0, -1]), indices)
        assert got.tolist() == [-1] * 5
        with pytest.raises(RuntimeError, match="cannot place these prompt-logprob rows"):
            vllm_cpu_lora.logits_lora_indices(hidden[4:9].clone(), torch.tensor([0, -1]), indices)
    finally:
        vllm_cpu_lora._PROMPT_HIDDEN.reset(token)


def test_the_cpu_runner_inherits_the_prompt_logprobs_it_wraps(restore_ops):
    """The reliance `get_prompt_logprobs_dict` makes: the CPU runner has no method of its own."""
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    assert "_get_prompt_logprobs_dict" not in CPUModelRunner.__dict__


def installed() -> list[bool]:
    return [getattr(owner, name) is fn for owner, name, fn in vllm_cpu_lora._bindings()]


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
    from vllm.lora.model_manager import LoRAModelManager

    wrapped = vllm_cpu_lora._VLLM["activate_adapter"]  # what ours calls: vLLM's, never ours
    assert wrapped is not vllm_cpu_lora.activate_adapter
    assert wrapped.__qualname__ == "LoRAModelManager.activate_adapter"
    assert LoRAModelManager.activate_adapter is vllm_cpu_lora.activate_adapter


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


PROMPT = (
    "You are a careful insurance agent. A caller wants a quote for a family car: two drivers, "
    "one of them nineteen, a clean record, parked in a garage at night, about twelve thousand "
    "miles a year. Ask for the one detail you still need, then summarise the quote in a "
    "sentence. Keep it short and polite."
)
"""About 85 prompt tokens, the size of the failing prompt-logprobs rows."""


def prompt_logprobs(scored: list, prompt_ids: list[int]) -> list[float]:
    """The logprob of each prompt token after the first, from vLLM's `prompt_logprobs`."""
    assert scored[0] is None
    pairs = zip(prompt_ids[1:], scored[1:], strict=True)
    return [entry[str(token)]["logprob"] for token, entry in pairs]


async def mixed_request(client: httpx.AsyncClient, kind: str, model: str, delay: float) -> dict:
    """One request of a mixed burst: its sampled token ids and the logprobs it asked for.

    `chat` samples greedily with logprobs; `complete` asks the completions API for
    `prompt_logprobs`; `score` asks chat for them as an OpenAI client's `extra_body` does.
    """
    await asyncio.sleep(delay)
    body = {"model": model, "temperature": 0, "return_token_ids": True}
    if kind == "complete":
        path = "/completions"
        body |= {"prompt": PROMPT, "max_tokens": 3, "prompt_logprobs": 1}
    else:
        path = "/chat/completions"
        body |= {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16}
        body |= {"max_tokens": 1, "prompt_logprobs": 1} if kind == "score" else {"logprobs": True}
    response = await client.post(path, json=body, timeout=600)
    assert response.status_code == 200, response.text
    data = response.json()
    choice = data["choices"][0]
    if kind == "chat":
        return {
            "ids": choice["token_ids"],
            "lp": [t["logprob"] for t in choice["logprobs"]["content"]],
        }
    scored = choice if kind == "complete" else data  # where each API puts them
    return {
        "ids": choice["token_ids"],
        "lp": prompt_logprobs(scored["prompt_logprobs"], scored["prompt_token_ids"]),
    }


async def mixed_burst(server, requests: list[tuple[str, str, float]]) -> list[dict]:
    async with httpx.AsyncClient(base_url=server.url) as client:
        return await asyncio.gather(*(mixed_request(client, *r) for r in requests))


@pytest.mark.slow
@pytest.mark.integration
def test_prompt_logprobs_beside_adapter_and_base_requests_keep_the_engine_alive(
    vllm_server, random_lora
):
    adapter = "cpu-lora-mixed"
    vllm_server.admin.load_adapter(adapter, random_lora)
    kinds = [
        (kind, model) for kind in ("chat", "complete", "score") for model in (adapter, BASE_ALIAS)
    ]
    try:
        alone = {(k, m): asyncio.run(mixed_burst(vllm_server, [(k, m, 0.0)]))[0] for k, m in kinds}
        for kind in ("chat", "complete", "score"):  # the adapter changes what each one reads
            assert not close(alone[kind, adapter], alone[kind, BASE_ALIAS])
        bursts = {
            "together": [(k, m, 0.0) for k, m in kinds],
            # the scoring requests arrive while the chats decode: prefill rows beside decode rows
            "scoring beside decoding": [(k, m, 0.0 if k == "chat" else 1.5) for k, m in kinds],
        }
        for burst in bursts.values():
            got = asyncio.run(mixed_burst(vllm_server, burst))
            for (kind, model, _), result in zip(burst, got, strict=True):
                assert close(result, alone[kind, model]), (kind, model)
    finally:
        with contextlib.suppress(ServingError):  # a dead server is reported just below
            vllm_server.admin.unload_adapter(adapter)
    vllm_server.check_alive()
    assert httpx.get(f"{vllm_server.base_url}/health", timeout=30).status_code == 200


def test_the_cpu_wrapper_inherits_the_metadata_update_it_wraps():
    """The reliances `update_metadata` makes: vLLM's CPU wrapper has no update of its own, and
    a step's token indices are a view of one buffer, from its start, rewritten in place."""
    from vllm.lora.layers.utils import LoRAMapping
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    assert "update_metadata" not in PunicaWrapperCPU.__dict__
    punica = PunicaWrapperCPU(256, 8, "cpu")
    buffer = punica._token_lora_indices.data_ptr()
    for tokens in ((1, 1, 2), (2, 0, 0, 1, 1)):
        punica.update_metadata(LoRAMapping(tokens, tokens, is_prefill=False), [1, 2, None], 3, 64)
        assert punica.token_lora_indices.data_ptr() == buffer
        assert punica.token_lora_indices.numel() == len(tokens)


def test_a_decode_step_counts_its_adapters_once_and_never_reuses_a_stale_count(monkeypatch):
    """Each of a step's ops gets a fresh view of the step's indices: the slots counted when the
    step's metadata was set serve them all; a new step (other adapters, base rows) recounts."""
    from vllm.lora.layers.utils import LoRAMapping
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    counted = []
    unique = torch.unique
    monkeypatch.setattr(torch, "unique", lambda t, *a, **k: counted.append(t) or unique(t, *a, **k))
    monkeypatch.setattr(vllm_cpu_lora, "_STEP_SLOTS", None)
    punica = PunicaWrapperCPU(256, 8, "cpu")
    a, b = weights(RANK, HIDDEN, 1), weights(OUT_SIZES["q"], RANK, 2)
    g = torch.Generator().manual_seed(3)
    for step, tokens in enumerate(((1,) * 8, (1, 0, 2, 0, 1, 1, 0, 2))):  # 0: the base model
        vllm_cpu_lora.update_metadata(
            punica, LoRAMapping(tokens, tokens, is_prefill=False), [1, 2, None], 3, 64
        )
        counted.clear()
        x = torch.randn(len(tokens), HIDDEN, generator=g)
        for _ in range(5):  # five layers' projections, each with its own view of the indices
            mid, ref_mid = torch.zeros(len(tokens), RANK), torch.zeros(len(tokens), RANK)
            out, ref_out = torch.zeros(len(tokens), 576), torch.zeros(len(tokens), 576)
            vllm_cpu_lora.bgmv_shrink(x, a, mid, punica.token_lora_indices, 0.5)
            vllm_cpu_lora.bgmv_expand(mid, b, out, punica.token_lora_indices, True)
            idx = punica.token_lora_indices.clone()
            ORIGINAL["bgmv_shrink"](x, a, ref_mid, idx, 0.5)
            ORIGINAL["bgmv_expand"](ref_mid, b, ref_out, idx, True)
            expect_rows(out, ref_out, torch.zeros_like(out), idx.tolist())
        assert counted == [], step  # no op counted the step's adapters again
        vllm_cpu_lora.bgmv_shrink(x, a, mid, punica.token_lora_indices.clone(), 0.5)
        assert len(counted) == 1  # any other tensor of indices is counted


LAYERS = {  # SmolLM2's LoRA layers as vLLM stacks them: (in features, output slices)
    "qkv": (HIDDEN, (OUT_SIZES["q"], OUT_SIZES["k"], OUT_SIZES["v"])),
    "o": (IN_SIZES["o"], (OUT_SIZES["o"],)),
    "gate_up": (HIDDEN, (OUT_SIZES["gate"], OUT_SIZES["up"])),
    "down": (IN_SIZES["down"], (OUT_SIZES["down"],)),
}
TOKEN_IDS = {  # adapter ids per token (0: the base model); ids 1 and 2 sit in slots 0 and 1
    "one adapter": (2,) * 9,
    "mixed": (1, 0, 2, 2, 0, 1, 1, 0, 2),
    "no adapter": (0,) * 9,
}


def layer_step(layer: str, ids: tuple[int, ...], is_prefill: bool, seed: int = 0):
    """A wrapper holding the step's metadata, a layer's stacks (random in all 3 slots), x, y."""
    from vllm.lora.layers.utils import LoRAMapping
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    in_features, slices = LAYERS[layer]
    punica = PunicaWrapperCPU(256, 8, "cpu")
    vllm_cpu_lora.update_metadata(
        punica, LoRAMapping(ids, ids, is_prefill=is_prefill), [1, 2, None], 3, 64
    )
    a = tuple(weights(RANK, in_features, seed + i) for i in range(len(slices)))
    b = tuple(weights(size, RANK, seed + 10 + i) for i, size in enumerate(slices))
    g = torch.Generator().manual_seed(seed + 20)
    x = torch.randn(len(ids), in_features, generator=g)
    return punica, a, b, x, torch.randn(len(ids), sum(slices), generator=g)


def by_hand(y0, x, a, b, slots: list[int], scale: float) -> torch.Tensor:
    """`y0`, plus `scale * x @ A.T @ B.T` of each row's slot on its slices' columns."""
    want, columns = y0.clone(), torch.cumsum(torch.tensor([0, *[s.shape[2] for s in b]]), 0)
    for row, slot in enumerate(slots):
        for i, (a_i, b_i) in enumerate(zip(a, b, strict=True)):
            if slot >= 0:
                want[row, columns[i] : columns[i + 1]] += scale * x[row] @ a_i[slot, 0].T @ b_i[
                    slot, 0
                ].T
    return want


@pytest.mark.parametrize("is_prefill", [False, True], ids=["decode", "prefill"])
@pytest.mark.parametrize("ids", TOKEN_IDS.values(), ids=TOKEN_IDS.keys())
@pytest.mark.parametrize("layer", LAYERS)
def test_a_layers_lora_in_one_call_equals_vllms_per_slice_ops(layer, ids, is_prefill, restore_ops):
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    punica, a, b, x, y0 = layer_step(layer, ids, is_prefill)
    slots = punica.token_lora_indices.tolist()
    y = y0.clone()
    vllm_cpu_lora.add_lora_linear(punica, y, x, a, b, 0.5, LAYERS[layer][1])
    torch.testing.assert_close(y, by_hand(y0, x, a, b, slots, 0.5), atol=1e-5, rtol=1e-5)
    # vLLM's own method and ops agree on every row with an adapter (they add the last slot's
    # adapter to the others: `test_vllm_adds_the_last_slot_where_the_index_is_minus_one`)
    ref = y0.clone()
    PunicaWrapperCPU.add_lora_linear(punica, ref, x, a, b, 0.5, LAYERS[layer][1])
    expect_rows(y, ref, y0, slots)


def test_rows_that_are_not_the_steps_tokens_and_bfloat16_take_vllms_way(monkeypatch):
    """Not the step's rows (a caller's own x) or not float32: the per-slice ops, as vLLM's."""
    punica, a, b, x, y0 = layer_step("qkv", TOKEN_IDS["one adapter"], False)
    slices = LAYERS["qkv"][1]
    calls = []
    monkeypatch.setattr(type(punica), "add_shrink", lambda self, *a, **k: calls.append("shrink"))
    monkeypatch.setattr(type(punica), "add_expand", lambda self, *a, **k: calls.append("expand"))
    vllm_cpu_lora.add_lora_linear(punica, y0[:4].clone(), x[:4], a, b, 1.0, slices)
    vllm_cpu_lora.add_lora_linear(punica, y0.bfloat16(), x.bfloat16(), a, b, 1.0, slices)
    assert calls == ["shrink", "expand"] * 2
    vllm_cpu_lora.add_lora_linear(punica, y0.clone(), x, a, b, 1.0, slices)
    assert calls == ["shrink", "expand"] * 2  # the step's float32 rows: one call, no ops


def test_an_adapter_activated_into_its_slot_is_what_the_next_step_computes(monkeypatch):
    """vLLM writes an adapter into a slot in `activate_adapter`; the layers' fused copies of the
    slot's weights are rebuilt after it, never served stale."""
    punica, a, b, x, y0 = layer_step("gate_up", TOKEN_IDS["one adapter"], False)
    slots, slices = punica.token_lora_indices.tolist(), LAYERS["gate_up"][1]
    y = y0.clone()
    vllm_cpu_lora.add_lora_linear(punica, y, x, a, b, 1.0, slices)  # copies of slot 1 made

    def write(manager, lora_id):  # what vLLM's does to each layer: `set_lora` copies in place
        for i, stack in enumerate(b):
            g = torch.Generator().manual_seed(i)
            stack[1, 0].copy_(torch.randn(stack.shape[2:], generator=g))
        return True

    monkeypatch.setitem(vllm_cpu_lora._VLLM, "activate_adapter", lambda manager, lora_id: False)
    kept = dict(vllm_cpu_lora._FUSED)
    assert kept and vllm_cpu_lora.activate_adapter(object(), 2) is False  # already in its slot:
    assert vllm_cpu_lora._FUSED == kept  # what vLLM does for every adapter of every step
    monkeypatch.setitem(vllm_cpu_lora._VLLM, "activate_adapter", write)
    assert vllm_cpu_lora.activate_adapter(object(), 2) is True
    y = y0.clone()
    vllm_cpu_lora.add_lora_linear(punica, y, x, a, b, 1.0, slices)
    torch.testing.assert_close(y, by_hand(y0, x, a, b, slots, 1.0), atol=1e-5, rtol=1e-5)


def test_vllm_writes_adapters_into_slots_only_when_it_activates_one():
    """The reliance the fused copies make: in vLLM's LoRA code outside the layers themselves,
    every `set_lora` / `reset_lora` call is in `LoRAModelManager.activate_adapter`, which its LRU
    manager reaches through `super()`; and the wrapper's method has the signature ours keeps."""
    import ast
    import inspect

    import vllm.lora.model_manager as manager_module
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    tree = ast.parse(inspect.getsource(manager_module))
    writers = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for call in ast.walk(node):
                if isinstance(call, ast.Attribute) and call.attr in ("set_lora", "reset_lora"):
                    writers.add(node.name)
    assert writers == {"activate_adapter"}
    lru = inspect.getsource(manager_module.LRUCacheLoRAModelManager.activate_adapter)
    assert "super().activate_adapter(" in lru
    # an adapter already in a slot: False before anything is written
    first = ast.parse(
        inspect.cleandoc(inspect.getsource(manager_module.LoRAModelManager.activate_adapter))
    ).body[0].body  # fmt: skip
    check = next(node for node in first if isinstance(node, ast.If))
    assert ast.unparse(check.test) == "lora_id in self._active_adapters"
    assert ast.unparse(check.body[0]) == "return False"
    ours = inspect.signature(vllm_cpu_lora.add_lora_linear)
    assert list(inspect.signature(PunicaWrapperCPU.add_lora_linear).parameters) == list(
        ours.parameters
    )


def test_the_cpu_server_gives_the_model_every_core_unless_told_not_to(monkeypatch, tmp_path):
    reserved = "VLLM_CPU_NUM_OF_RESERVED_CPU"
    monkeypatch.setattr("pipecat_rl.serving.server.running_on_cpu", lambda: True)
    monkeypatch.delenv(reserved, raising=False)
    assert VLLMServer(tmp_path).environment()[reserved] == "0"
    assert VLLMServer(tmp_path, reserve_core=True).environment()[reserved] == "1"
    monkeypatch.setenv(reserved, "1")  # vLLM's own way, asked for
    assert VLLMServer(tmp_path).environment()[reserved] == "1"
    monkeypatch.setattr("pipecat_rl.serving.server.running_on_cpu", lambda: False)
    monkeypatch.delenv(reserved)
    assert reserved not in VLLMServer(tmp_path).environment()


@pytest.mark.parametrize("mode", ["text", "audio"])
async def test_an_audio_simulation_keeps_vllms_scheduler_core(monkeypatch, tmp_path, mode):
    """Audio calls run Whisper and Piper beside the model, whose threads would stall behind
    them on every core: their embedded server keeps vLLM's reserved core; text takes them all."""
    from pipecat_rl.ledger import Ledger
    from pipecat_rl.simulator import endpoint, simulation
    from pipecat_rl.simulator.options import Server, SimulationOptions

    asked = {}

    @contextlib.asynccontextmanager
    async def fake(url, **kwargs):
        asked.update(kwargs)
        yield "http://127.0.0.1:1/v1"

    monkeypatch.setattr(endpoint, "llm_endpoint", fake)
    with Ledger(tmp_path / "l.db") as ledger:
        options = SimulationOptions(mode=mode, concurrency=3)
        async with simulation._endpoint(Server(), ledger, ["base"], options) as url:
            assert url == "http://127.0.0.1:1/v1"
    assert asked["reserve_core"] is (mode == "audio") and asked["concurrency"] == 3
