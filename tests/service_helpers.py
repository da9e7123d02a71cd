"""Shared pieces of the service and cycle tests: a stand-in vLLM, the clinic in a data folder."""

import shutil
from pathlib import Path

from fastapi import FastAPI, Request

from tests.test_gate_promote import FakeVLLM as StreamingFakeVLLM

CLINIC = Path(__file__).resolve().parent.parent / "examples" / "clinic"


class FakeVLLM(StreamingFakeVLLM):
    """The gate tests' stand-in vLLM, answering chats non-streamed with token ids and logprobs.

    (The cycle's canary asks for one plain completion; the expert agent never calls the model.)
    """

    def __init__(self):
        super().__init__()
        api: FastAPI = self._server.config.app
        api.router.routes = [
            r for r in api.router.routes if getattr(r, "path", "") != "/v1/chat/completions"
        ]

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
