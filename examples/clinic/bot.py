"""Bright Smile Dental's receptionist: a Pipecat bot written the way Pipecat's examples are.

Run it live with Pipecat's development runner (`python bot.py`; needs DEEPGRAM_API_KEY,
CARTESIA_API_KEY and an OpenAI-compatible LLM), or simulate it unmodified:

    pipecat-rl simulate examples/clinic/handwritten/pool --bot examples/clinic/bot.py
"""

import json
import os

import world
from dotenv import load_dotenv
from loguru import logger
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import LLMRunFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.runner.types import RunnerArguments
from pipecat.runner.utils import create_transport
from pipecat.services.cartesia.tts import CartesiaTTSService
from pipecat.services.deepgram.stt import DeepgramSTTService
from pipecat.services.llm_service import FunctionCallParams, LLMService
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.transports.base_transport import BaseTransport, TransportParams
from pipecat.workers.runner import WorkerRunner

load_dotenv(override=True)

TEMPERATURE = 0.2
"""A receptionist is deployed near-greedy: sampling at vLLM's default 1.0 loses about a third
of the passes the same weights make at 0. Evaluation and the gate run at the bot's own setting."""

SYSTEM = """You are the receptionist of Bright Smile Dental, on the phone. Be brief and warm.
You can look up patients, find free slots, book, cancel, and transfer to the front desk.
Ask for the caller's full name before booking and read the confirmation number back.
Never quote prices and never give medical advice: offer an appointment or a transfer instead.
The clinic is open Monday to Friday, 8:00 to 18:00. Never book or cancel without the caller's
explicit agreement, and only for the caller's own appointments."""

TOOLS = ToolsSchema(
    standard_tools=[
        FunctionSchema(
            name="lookup_patient",
            description="Find a patient by full name (and date of birth if given).",
            properties={"name": {"type": "string"}, "dob": {"type": "string"}},
            required=["name"],
        ),
        FunctionSchema(
            name="find_slots",
            description="List free slots. kind is 'routine' or 'emergency'.",
            properties={"kind": {"type": "string"}, "day": {"type": "string"}},
            required=[],
        ),
        FunctionSchema(
            name="book",
            description="Book a slot for a patient.",
            properties={
                "patient_id": {"type": "integer"},
                "slot_id": {"type": "integer"},
                "reason": {"type": "string"},
            },
            required=["patient_id", "slot_id"],
        ),
        FunctionSchema(
            name="cancel",
            description="Cancel an appointment by its confirmation number.",
            properties={"confirmation": {"type": "string"}},
            required=["confirmation"],
        ),
        FunctionSchema(
            name="transfer",
            description="Transfer the caller to a human at the front desk.",
            properties={"reason": {"type": "string"}},
            required=["reason"],
        ),
    ]
)

_db = world.demo_db()


async def _handle(params: FunctionCallParams):
    """Live handler: run the tool against the clinic's database."""
    fn = world.PACK.tools[params.function_name]
    try:
        result = fn(_db, **params.arguments)
        _db.commit()
    except (world.ToolError, TypeError) as e:
        result = {"error": str(e)}
    logger.info(f"{params.function_name}({json.dumps(dict(params.arguments))}) -> {result}")
    await params.result_callback(result)


def create_llm() -> LLMService:
    return OpenAILLMService(
        api_key=os.getenv("OPENAI_API_KEY"),
        settings=OpenAILLMService.Settings(
            model=os.getenv("OPENAI_MODEL", "gpt-4o-mini"),
            system_instruction=SYSTEM,
            temperature=TEMPERATURE,
        ),
    )


async def run_bot(transport: BaseTransport, runner_args: RunnerArguments, llm=None):
    logger.info("Starting the clinic bot")

    stt = DeepgramSTTService(api_key=os.getenv("DEEPGRAM_API_KEY"))
    tts = CartesiaTTSService(
        api_key=os.getenv("CARTESIA_API_KEY"),
        settings=CartesiaTTSService.Settings(voice="71a7ad14-091c-4e8e-a314-022ece01c121"),
    )
    llm = llm or create_llm()
    for name in world.PACK.tools:
        llm.register_function(name, _handle)

    context = LLMContext(tools=TOOLS)
    user_aggregator, assistant_aggregator = LLMContextAggregatorPair(context)

    pipeline = Pipeline(
        [
            transport.input(),
            stt,
            user_aggregator,
            llm,
            tts,
            transport.output(),
            assistant_aggregator,
        ]
    )

    worker = PipelineWorker(
        pipeline,
        params=PipelineParams(enable_metrics=True, enable_usage_metrics=True),
    )

    @transport.event_handler("on_client_connected")
    async def on_client_connected(transport, client):
        logger.info("Client connected")
        context.add_message({"role": "user", "content": "(The phone rings. Greet the caller.)"})
        await worker.queue_frames([LLMRunFrame()])

    @transport.event_handler("on_client_disconnected")
    async def on_client_disconnected(transport, client):
        logger.info("Client disconnected")
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=runner_args.handle_sigint)
    await runner.add_workers(worker)
    await runner.run()


async def bot(runner_args: RunnerArguments):
    transport_params = {
        "webrtc": lambda: TransportParams(audio_in_enabled=True, audio_out_enabled=True),
    }
    transport = await create_transport(runner_args, transport_params)
    await run_bot(transport, runner_args)


if __name__ == "__main__":
    from pipecat.runner.run import main

    main()
