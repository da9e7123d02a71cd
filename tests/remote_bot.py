"""A bot Pipecat's own development runner serves, over WebSocket or SmallWebRTC, for `--bot-url`.

`python tests/remote_bot.py -t websocket --port PORT` serves ws://localhost:PORT/ws-client
(protobuf frames), and `-t webrtc` takes SmallWebRTC offers at http://localhost:PORT/api/offer,
as the runner serves any bot (`bot(runner_args)`, `create_transport`). It greets the caller when
it connects and says back what its STT heard ("You said ...", with no pause a listener could
take for the end of its turn), on the embedded offline services (Silero VAD, Whisper tiny.en,
Piper) and a `ScriptedLLMService`, so it needs no key and no model server, and its reply shows
what it heard of the caller.
"""

from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.frames.frames import LLMRunFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.audio.vad_processor import VADProcessor
from pipecat.runner.types import RunnerArguments
from pipecat.runner.utils import create_transport
from pipecat.serializers.protobuf import ProtobufFrameSerializer
from pipecat.transports.base_transport import TransportParams
from pipecat.transports.websocket.fastapi import FastAPIWebsocketParams
from pipecat.workers.runner import WorkerRunner

from pipecat_rl.simulator.audio.services import piper_tts, whisper_stt
from pipecat_rl.simulator.scripted import (
    ScriptedLLMService,
    ScriptedReply,
    last_message,
    message_text,
)

RING = "(The phone rings. Greet the caller.)"
GREETING = "Hello, you have reached the echo desk. What do you need?"


def echo(messages: list[dict]) -> ScriptedReply:
    """Greet on the ring; then say back the caller's last line as the bot's STT wrote it."""
    heard = message_text(last_message(messages, "user"))
    return ScriptedReply(text=GREETING if heard == RING else f"You said {heard}")


async def bot(runner_args: RunnerArguments):
    """One call, as Pipecat's runner starts it for each WebSocket or WebRTC offer that comes."""
    transport = await create_transport(
        runner_args,
        {
            "websocket": lambda: FastAPIWebsocketParams(
                audio_in_enabled=True,
                audio_out_enabled=True,
                serializer=ProtobufFrameSerializer(),
            ),
            "webrtc": lambda: TransportParams(audio_in_enabled=True, audio_out_enabled=True),
        },
    )
    context = LLMContext()
    user_aggregator, assistant_aggregator = LLMContextAggregatorPair(context)
    pipeline = Pipeline(
        [
            transport.input(),
            VADProcessor(vad_analyzer=SileroVADAnalyzer()),
            whisper_stt(),
            user_aggregator,
            ScriptedLLMService(echo),
            piper_tts(),
            transport.output(),
            assistant_aggregator,
        ]
    )
    worker = PipelineWorker(pipeline)

    @transport.event_handler("on_client_connected")
    async def connected(_transport, _client):
        context.add_message({"role": "user", "content": RING})
        await worker.queue_frames([LLMRunFrame()])

    @transport.event_handler("on_client_disconnected")
    async def disconnected(_transport, _client):
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


if __name__ == "__main__":
    from pipecat.runner.run import main

    main()
