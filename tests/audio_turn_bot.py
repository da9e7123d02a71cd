"""An agent for the recorded-turn tests: it says back what its STT heard ("You said: ...").

The pipeline is Pipecat's example shape on the embedded offline services (Whisper tiny.en,
Piper) with a `ScriptedLLMService` that echoes the caller's last transcription, so a check on
its reply (`text_contains`) passes only when the agent's STT heard those words. It says
nothing until the caller has spoken.
"""

from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.workers.runner import WorkerRunner

from pipecat_rl.simulator.audio.services import piper_tts, whisper_stt
from pipecat_rl.simulator.scripted import (
    ScriptedLLMService,
    ScriptedReply,
    last_message,
    message_text,
)


def echo(messages: list[dict]) -> ScriptedReply:
    """Say back the caller's last line as the agent's STT wrote it."""
    return ScriptedReply(text=f"You said: {message_text(last_message(messages, 'user'))}")


async def run_bot(transport, runner_args):
    """The echoing agent."""
    context = LLMContext()
    user_aggregator, assistant_aggregator = LLMContextAggregatorPair(context)
    pipeline = Pipeline(
        [
            transport.input(),
            whisper_stt(),
            user_aggregator,
            ScriptedLLMService(echo),
            piper_tts(),
            transport.output(),
            assistant_aggregator,
        ]
    )
    worker = PipelineWorker(pipeline)

    @transport.event_handler("on_client_disconnected")
    async def disconnected(_transport, _client):
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()
