"""Shared pieces of the service and cycle tests: a stand-in vLLM, the clinic in a data folder."""

import shutil
import threading
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request

from pipecat_rl.serving import free_port

CLINIC = Path(__file__).resolve().parent.parent / "examples" / "clinic"


class FakeVLLM:
    """vLLM's model list, LoRA admin and a non-streaming chat with token ids and logprobs."""

    def __init__(self):
        self.adapters: dict[str, str] = {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        api = FastAPI()

        @api.get("/v1/models")
        def models():
            return {"data": [{"id": name} for name in ["base", *self.adapters]]}

        @api.post("/v1/load_lora_adapter")
        async def load(request: Request):
            body = await request.json()
            self.adapters[body["lora_name"]] = body["lora_path"]
            return "ok"

        @api.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            return {
                "id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                "prompt_token_ids": [1, 2, 3],
                "choices": [{
                    "index": 0, "finish_reason": "stop", "token_ids": [7, 8],
                    "message": {"role": "assistant", "content": "Hello"},
                    "logprobs": {"content": [{"token": "Hel", "logprob": -0.1},
                                             {"token": "lo", "logprob": -0.2}]},
                }],
            }  # fmt: skip

        self._server = uvicorn.Server(
            uvicorn.Config(api, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> "FakeVLLM":
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "the fake vLLM did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def clinic_copy(root: Path, *, pool: list[str] | None = None, heldout: list[str] | None = None):
    """The clinic example copied under `root` (optionally with only some scenarios)."""
    target = root / "clinic"
    shutil.copytree(CLINIC, target, ignore=shutil.ignore_patterns("__pycache__", "loop.yaml"))
    for split, keep in (("pool", pool), ("heldout", heldout)):
        if keep is None:
            continue
        for f in (target / "scenarios" / split).glob("*.yaml"):
            if f.stem not in keep:
                f.unlink()
    return target
