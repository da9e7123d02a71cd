"""Shared pieces of the service and cycle tests: a stand-in vLLM, the clinic in a data folder,
the service on a loopback port in this process."""

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI, Request

from pipecat_rl.service.app import create_app
from pipecat_rl.service.settings import ServiceSettings
from pipecat_rl.serving.server import free_port
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


BETTER_CANDIDATE_BOT = '''\
"""The clinic's scripted expert whenever an adapter serves; under the base model, an agent
that only apologises and never calls a tool. A gate of any adapter against `base` measures a
real, recorded improvement, on every scenario the expert passes."""

import expert

from pipecat_rl.simulator.scripted import ScriptedLLMService, ScriptedReply


def novice(messages):
    return ScriptedReply("Sorry, I cannot help with that. Please call the front desk.")


async def run_bot(transport, runner_args):
    if runner_args.model != "base":
        return await expert.run_bot(transport, runner_args)
    await expert.bot.run_bot(transport, runner_args, llm=ScriptedLLMService(novice))
'''

GATE_HELDOUT = [
    "heldout_terse_booking", "heldout_chatty_medical", "heldout_routine_booking",
    "heldout_handoff", "heldout_hesitant_cancel", "heldout_price_pressure",
]  # fmt: skip
"""Held-out scenarios the expert passes: six +1 deltas are a PROMOTE by the exact sign-flip test
(p = 2^-6), where two would never be."""


def clinic_copy(root: Path, *, pool: list[str] | None = None, heldout: list[str] | None = None):
    """The clinic example copied under `root` (optionally with only some scenarios)."""
    target = root / "clinic"
    shutil.copytree(CLINIC, target, ignore=shutil.ignore_patterns("__pycache__", "loop.yaml"))
    for split, keep in (("pool", pool), ("heldout", heldout)):
        if keep is None:
            continue
        for f in (target / "handwritten" / split).glob("*.yaml"):
            if f.stem not in keep:
                f.unlink()
    return target


def better_candidate_bot(clinic: Path) -> Path:
    """Write `BETTER_CANDIDATE_BOT` beside the clinic's expert (it imports it); returns its path."""
    path = clinic / "better_candidate.py"
    path.write_text(BETTER_CANDIDATE_BOT)
    return path


class ServiceThread:
    """The service app under uvicorn on a free loopback port, in a thread of this process.

    Unlike TestClient, a client reads its event streams as they are written (so a test can act
    on a job's first event while the job runs), and the worker shares this process, so what a
    test swaps in (a stand-in module) reaches the jobs.
    """

    def __init__(self, settings: ServiceSettings):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.headers = {"Authorization": f"Bearer {settings.token}"} if settings.token else {}
        config = uvicorn.Config(
            create_app(settings), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self.client = httpx.Client(base_url=self.url, headers=self.headers, timeout=60)

    def __enter__(self) -> "ServiceThread":
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            assert self._thread.is_alive(), "the service did not start"
            assert time.monotonic() < deadline, "the service did not start in 30 s"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        self._server.should_exit = True
        self._thread.join(timeout=30)

    def events(self, job_id: str) -> Iterator[tuple[str, dict]]:
        """The job's Server-Sent Events as (event, data), as they arrive, until the stream ends."""
        with self.client.stream("GET", f"/jobs/{job_id}/events") as r:
            assert r.status_code == 200, r.read()
            name = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    yield name, json.loads(line[6:])
