"""The clinic receptionist in production on a text channel: the recorder line, the live adapter.

What a team deploys once the loop is on: `bot.py`'s receptionist (its prompt, tools and
temperature) with `RLRecorder` (every call into the ledger token-exactly, redacted, under the
platform's call id `runner_args.session_id`, which its scores are then posted by) and
`LiveAdapterSelector` (each call served by the adapter the ledger's live pointer names when the
call starts). Its tools run on the backend the runner hands it (anything with
`execute(name, arguments)`, e.g. the clinic's database; here a caller's clinic as a scenario's
`World`, so that what a call did can be verified afterwards, as a QA team would).

`take_call` is one call to it from a scripted caller (the scenario's `script:`, played by the
simulator's persona bot) over a local transport pair that this module runs itself: no
`simulate`, no episode, no reward; the ledger gets the live call the recorder writes and nothing
else. `scripts/live_day.py` and `tests/test_train_live.py` take their days of calls with it.
"""

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import bot
import world
from loguru import logger
from pipecat.frames.frames import LLMRunFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.runner.types import RunnerArguments
from pipecat.services.llm_service import FunctionCallParams, LLMService
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.transports.base_transport import BaseTransport
from pipecat.workers.runner import WorkerRunner

from pipecat_rl import LiveAdapterSelector, Redactor, RLRecorder
from pipecat_rl.scenarios import Scenario
from pipecat_rl.serving.server import client_api_key
from pipecat_rl.simulator.persona import ScriptedPersona, build_persona_worker
from pipecat_rl.simulator.scripted import ScriptedLLMService
from pipecat_rl.simulator.transport import Line, LocalTransportPair
from pipecat_rl.simulator.world import CheckResult, World


class Backend(Protocol):
    """Where the receptionist's tools run."""

    def execute(self, name: str, arguments: dict[str, Any]) -> Any:
        """Run tool `name`; its result (or an object with `result` and `error`)."""


def _handler(backend: Backend):
    async def handle(params: FunctionCallParams) -> None:
        done = backend.execute(params.function_name, dict(params.arguments))
        error = getattr(done, "error", None)
        result = {"error": error} if error else getattr(done, "result", done)
        logger.info(f"{params.function_name}({json.dumps(dict(params.arguments))}) -> {result}")
        await params.result_callback(result)

    return handle


async def run_bot(
    transport: BaseTransport,
    runner_args: RunnerArguments,
    *,
    llm: LLMService,
    ledger: str | Path,
    backend: Backend,
) -> None:
    """The receptionist on one call, recorded under `runner_args.session_id`."""
    for name in world.PACK.tools:
        llm.register_function(name, _handler(backend))
    context = LLMContext(tools=bot.TOOLS)
    user_aggregator, assistant_aggregator = LLMContextAggregatorPair(context)
    recorder = RLRecorder(ledger, call_id=runner_args.session_id, redactor=Redactor())
    pipeline = Pipeline([
        transport.input(),
        recorder,  # the line
        LiveAdapterSelector(llm, ledger=ledger),
        user_aggregator,
        llm,
        transport.output(),
        assistant_aggregator,
    ])  # fmt: skip
    worker = PipelineWorker(pipeline, params=PipelineParams(enable_metrics=True))

    @transport.event_handler("on_client_connected")
    async def on_client_connected(transport, client):
        context.add_message({"role": "user", "content": "(The phone rings. Greet the caller.)"})
        await worker.queue_frames([LLMRunFrame()])

    @transport.event_handler("on_client_disconnected")
    async def on_client_disconnected(transport, client):
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()
    # The recorder writes off the call's path; whoever reads the ledger when this returns (QA
    # posting scores, the tests) finds the whole call there, its end included.
    await recorder.flush()


def clinic_llm(llm_url: str, model: str = "base", *, max_tokens: int | None = None) -> LLMService:
    """The receptionist's LLM as deployed: `bot.py`'s prompt and temperature on `llm_url`."""
    return OpenAILLMService(
        api_key=client_api_key(),
        base_url=llm_url,
        settings=OpenAILLMService.Settings(
            model=model, system_instruction=bot.SYSTEM, temperature=bot.TEMPERATURE,
            max_tokens=max_tokens,
        ),
    )  # fmt: skip


@dataclass(frozen=True)
class LiveCall:
    """One call as it went: what was said, why it ended, and the clinic's records checked."""

    call_id: str
    scenario: str
    transcript: list[Line]
    end_reason: str | None
    checks: list[CheckResult]

    @property
    def passed(self) -> bool:
        """Every check of the caller's clinic holds (no check: not passed)."""
        return bool(self.checks) and all(c.passed for c in self.checks)

    def failed_checks(self) -> list[str]:
        """The checks that failed, with what was found."""
        return [f"{c.check} ({c.detail})" for c in self.checks if not c.passed]


async def take_call(
    scenario: Scenario,
    *,
    call_id: str,
    llm_url: str,
    ledger: str | Path,
    max_tokens: int | None = None,
    max_duration_s: float = 300.0,
) -> LiveCall:
    """One live call from `scenario`'s scripted caller, recorded under `call_id`."""
    if scenario.script is None:
        raise ValueError(f"{scenario.name}: a live caller needs the scenario's script:")
    clinic = World(scenario)
    pair = LocalTransportPair(max_turns=scenario.max_turns)
    caller = build_persona_worker(
        scenario, pair, ScriptedLLMService(ScriptedPersona(scenario.script))
    )
    args = RunnerArguments(session_id=call_id)
    args.handle_sigint = False
    llm = clinic_llm(llm_url, max_tokens=max_tokens)
    agent = asyncio.create_task(run_bot(pair.agent, args, llm=llm, ledger=ledger, backend=clinic))

    async def run_caller() -> None:
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(caller)
        await runner.run()

    calling = asyncio.create_task(run_caller())
    ended = asyncio.create_task(pair.done.wait())
    await asyncio.wait({ended, agent}, timeout=max_duration_s, return_when="FIRST_COMPLETED")
    if not pair.done.is_set():
        pair.end("agent_hung_up" if agent.done() else "max_duration")
    await caller.cancel()
    for failed in await asyncio.gather(agent, calling, ended, return_exceptions=True):
        if isinstance(failed, BaseException):
            logger.warning(f"call {call_id}: {type(failed).__name__}: {failed}")
    try:
        return LiveCall(call_id, scenario.name, list(pair.transcript), pair.end_reason,
                        clinic.verify())  # fmt: skip
    finally:
        clinic.close()
