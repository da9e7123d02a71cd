"""Promote and rollback move the live pointer and the served adapter; a call keeps its adapter.

A tiny FastAPI app on loopback stands in for vLLM's admin endpoints and its streaming chat
endpoint (it records the `model` of every request), so these tests run without a model.
"""

import asyncio
import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pipecat.frames.frames import EndFrame, LLMContextFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.workers.runner import WorkerRunner
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.cli.common import EXIT_USAGE
from pipecat_rl.errors import GateError, ServingError
from pipecat_rl.gate import promote, rollback
from pipecat_rl.ledger import AdapterRecord, Ledger
from pipecat_rl.recording.live_adapter import LiveAdapterSelector
from pipecat_rl.serving.server import VLLMAdmin, free_port
from tests.test_gate_receipts import gated_receipt

# --- a stand-in for vLLM ---------------------------------------------------------------------


class FakeVLLM:
    """vLLM's model list, LoRA admin and streaming chat endpoints, in a thread on loopback."""

    def __init__(self):
        self.adapters: dict[str, str] = {}
        self.requests: list[str] = []
        self.served: queue.Queue[str] = queue.Queue()
        """Models of chat requests answered, for a test to wait on."""
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

        @api.post("/v1/unload_lora_adapter")
        async def unload(request: Request):
            self.adapters.pop((await request.json())["lora_name"])
            return "ok"

        @api.post("/v1/chat/completions")
        async def chat(request: Request):
            model = (await request.json())["model"]
            self.requests.append(model)
            self.served.put(model)

            def chunk(delta, finish=None):
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
                body = {"id": "c", "object": "chat.completion.chunk", "created": 0,
                        "model": model, "choices": [choice]}  # fmt: skip
                return f"data: {json.dumps(body)}\n\n"

            events = [chunk({"role": "assistant", "content": "hello"}), chunk({}, "stop")]
            return StreamingResponse(
                iter([*events, "data: [DONE]\n\n"]), media_type="text/event-stream"
            )

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


@pytest.fixture
def vllm():
    with FakeVLLM() as server:
        yield server


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.db") as store:
        for name in ("v1", "v2"):
            folder = tmp_path / name
            folder.mkdir()
            (folder / "adapter_config.json").write_text("{}")
            store.register_adapter(
                AdapterRecord(name=name, path=str(folder), base_model="smollm2", created_at=1.0,
                              training_run={"id": name, "guard": {"passed": True}})
            )  # fmt: skip
        yield store


def receipt_file(
    tmp_path: Path, ledger: Ledger, verdict: str, candidate: str, incumbent: str = "v1"
) -> Path:
    """A genuine receipt of `verdict`, evaluated and recorded by the gate's own functions.

    The incumbent is recorded as requested `live`, as `pipecat-rl gate --incumbent live` does.
    """
    return gated_receipt(tmp_path / f"gate-{verdict}-{candidate}", ledger, verdict, candidate,
                         incumbent, requested_incumbent="live")  # fmt: skip


# --- promote and rollback --------------------------------------------------------------------


def test_promote_loads_the_adapter_then_moves_the_pointer(ledger, vllm, tmp_path):
    ledger.move_live("v1")
    admin = VLLMAdmin(vllm.url)
    receipt = receipt_file(tmp_path, ledger, "PROMOTE", "v2")
    move = promote(receipt, ledger, admin)
    assert (move.adapter, move.previous, move.server) == ("v2", "v1", "loaded")
    assert vllm.adapters == {"v2": str((tmp_path / "v2").resolve())}
    live = ledger.live()
    assert live.adapter == "v2" and live.receipt == str(receipt.resolve())
    # Rolling back needs v1 served too: it is loaded before the pointer moves back.
    back = rollback(ledger, admin)
    assert (back.adapter, back.previous, back.server) == ("v1", "v2", "loaded")
    assert ledger.live().adapter == "v1"
    assert set(vllm.adapters) == {"v1", "v2"}
    assert [p.adapter for p in ledger.live_history()] == ["v1", "v2", "v1"]


def test_promote_refuses_anything_but_a_current_promote_receipt(ledger, vllm, tmp_path):
    ledger.move_live("v1")
    admin = VLLMAdmin(vllm.url)
    with pytest.raises(GateError, match=r"refused \(verdict\).*says REJECT"):
        promote(receipt_file(tmp_path, ledger, "REJECT", "v2"), ledger, admin)
    with pytest.raises(GateError, match="no longer exists"):
        promote(receipt_file(tmp_path, ledger, "PROMOTE", "v9"), ledger, admin)
    ledger.move_live("v2")
    with pytest.raises(GateError, match="'v2' is live now"):
        promote(receipt_file(tmp_path, ledger, "PROMOTE", "v2", incumbent="v1"), ledger, admin)
    assert vllm.adapters == {} and ledger.live().adapter == "v2"


def test_a_server_refusal_leaves_the_pointer_where_it_was(ledger, tmp_path):
    ledger.move_live("v1")
    admin = VLLMAdmin(f"http://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(ServingError):
        promote(receipt_file(tmp_path, ledger, "PROMOTE", "v2"), ledger, admin)
    assert ledger.live().adapter == "v1"


def test_cli_promote_and_rollback(ledger, vllm, tmp_path, monkeypatch):
    ledger.move_live("v1")
    receipt = receipt_file(tmp_path, ledger, "PROMOTE", "v2")
    monkeypatch.delenv("PIPECAT_RL_LLM_URL", raising=False)
    args = ["--ledger", str(ledger.path), "--json"]
    result = CliRunner().invoke(app, ["promote", str(receipt.parent), *args])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["server"] == "not_touched"
    assert "not touched" in result.stderr
    assert ledger.live().adapter == "v2" and vllm.adapters == {}

    monkeypatch.setenv("PIPECAT_RL_LLM_URL", vllm.url)
    result = CliRunner().invoke(app, ["rollback", *args])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "adapter": "v1", "previous": "v2", "receipt": None, "server": "loaded"
    }  # fmt: skip
    assert "v1" in vllm.adapters

    # v1 is live again, the incumbent the receipt was gated against: it may promote again.
    result = CliRunner().invoke(app, ["promote", str(receipt), "--llm-url", vllm.url, *args])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["server"] == "loaded"
    assert ledger.live().adapter == "v2" and "v2" in vllm.adapters


def test_rollback_with_nothing_to_go_back_to(ledger):
    with pytest.raises(GateError, match="nothing was ever promoted"):
        rollback(ledger)
    ledger.move_live("v1")
    back = rollback(ledger)  # the base model served before v1
    assert (back.adapter, back.previous) == ("base", "v1")


def test_two_rollbacks_step_two_promotions_back_and_never_forward(ledger, tmp_path, monkeypatch):
    """Issue 38: a second rollback re-promoted the adapter the first one had rolled back."""
    monkeypatch.delenv("PIPECAT_RL_LLM_URL", raising=False)
    args = ["--ledger", str(ledger.path), "--json"]

    def cli(*argv: str):
        return CliRunner().invoke(app, [*argv, *args])

    first = receipt_file(tmp_path / "a", ledger, "PROMOTE", "v1", incumbent="base")
    second = receipt_file(tmp_path / "b", ledger, "PROMOTE", "v2", incumbent="v1")
    assert cli("promote", str(first)).exit_code == 0
    assert cli("promote", str(second)).exit_code == 0
    assert ledger.rollback_target() == "v1"

    back = cli("rollback")
    assert back.exit_code == 0, back.output
    assert json.loads(back.stdout)["adapter"] == "v1" and ledger.live().adapter == "v1"
    assert ledger.rollback_target() == "base"  # not "v2", which the rollback just left

    back = cli("rollback")
    assert back.exit_code == 0, back.output
    assert json.loads(back.stdout) == {
        "adapter": "base", "previous": "v1", "receipt": None, "server": "base_model"
    }  # fmt: skip

    nothing = cli("rollback")
    assert nothing.exit_code == EXIT_USAGE
    assert "nothing to roll back to" in json.loads(nothing.stdout)["error"]
    assert [p.adapter for p in ledger.live_history()] == ["v1", "v2", "v1", "base"]

    # Moving forward again is a promotion; a rollback then returns to where it came from.
    assert cli("promote", str(first)).exit_code == 0
    assert (rollback(ledger).adapter, ledger.rollback_target()) == ("base", None)


def test_rollback_after_promoting_back_an_earlier_adapter_follows_the_promotions(ledger, tmp_path):
    """A receipt that promotes v1 over v2 is a step forward: rolling it back returns to v2."""
    ledger.move_live("v1", receipt="receipts/v1.json")
    ledger.move_live("v2", receipt="receipts/v2.json")
    ledger.move_live("v1", receipt="receipts/v1-again.json")
    assert [rollback(ledger).adapter for _ in range(3)] == ["v2", "v1", "base"]
    with pytest.raises(GateError, match="nothing to roll back to: 'base' is live"):
        rollback(ledger)


def test_a_ledger_rolled_back_the_old_way_still_steps_back(ledger):
    """Rows written before this rule (a rollback naming what it left) read as steps back."""
    from pipecat_rl.ledger import LivePointer
    from pipecat_rl.ledger.adapters import rollback_path

    moves = [("v1", "base", "r1"), ("v2", "v1", "r2"), ("v1", "v2", None)]
    old = [LivePointer(adapter=a, previous=p, receipt=r, moved_at=i) for i, (a, p, r) in
           enumerate(moves)]  # fmt: skip
    assert rollback_path(old) == ["base", "v1"]


# --- the live adapter inside a running pipeline ----------------------------------------------


HANG_S = 120


async def _call(vllm: FakeVLLM, ledger_path: Path, turns, between=None) -> LiveAdapterSelector:
    """One call: a fresh pipeline with the selector before a real OpenAI-compatible LLM.

    Sends one LLM turn per entry of `turns`, running `between` after the first completes.
    """
    llm = OpenAILLMService(
        api_key="none",
        base_url=f"{vllm.url}/v1",
        settings=OpenAILLMService.Settings(model="base"),
    )
    selector = LiveAdapterSelector(llm, ledger=ledger_path)
    worker = PipelineWorker(Pipeline([selector, llm]), cancel_on_idle_timeout=False)
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker, frame):
        started.set()

    # The limits below only keep a broken pipeline from hanging the suite: CI once took over 10 s
    # to start this one (a loaded 2-core box, with the service's own thread beside it).
    async def drive():
        await asyncio.wait_for(started.wait(), HANG_S)
        for i in range(turns):
            context = LLMContext(messages=[{"role": "user", "content": f"turn {i}"}])
            await worker.queue_frame(LLMContextFrame(context))
            await asyncio.to_thread(vllm.served.get, timeout=HANG_S)
            if i == 0 and between is not None:
                between()
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), drive())
    return selector


@pytest.mark.integration
async def test_a_mid_call_promotion_changes_only_the_next_call(ledger, vllm, tmp_path):
    admin = VLLMAdmin(vllm.url)
    admin.load_adapter("v1", tmp_path / "v1")
    ledger.move_live("v1")
    receipt = receipt_file(tmp_path, ledger, "PROMOTE", "v2")

    first = await _call(vllm, ledger.path, 3, between=lambda: promote(receipt, ledger, admin))
    assert ledger.live().adapter == "v2"
    assert first.adapter == "v1"
    assert vllm.requests == ["v1", "v1", "v1"]

    second = await _call(vllm, ledger.path, 1)
    assert second.adapter == "v2"
    assert vllm.requests[-1] == "v2"


@pytest.mark.integration
async def test_without_a_promotion_the_configured_base_model_serves(vllm, tmp_path):
    await _call(vllm, tmp_path / "absent.db", 1)
    assert vllm.requests == ["base"]
    assert not (tmp_path / "absent.db").exists()


def test_the_hook_and_the_gate_import_neither_torch_nor_vllm():
    code = (
        "import sys, pipecat_rl.gate, pipecat_rl.recording.live_adapter;"
        "heavy = [m for m in ('torch', 'vllm', 'matplotlib') if m in sys.modules];"
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
