"""A clinic's hours line whose turn-taking is a Pipecat setting: three variants, one bot.

An ordinary Pipecat voice bot (Deepgram STT, an OpenAI-compatible LLM, Cartesia TTS, Silero VAD
and Pipecat's default smart-turn stop strategy in its user aggregator). The only thing that
differs between its variants is the user turn *start* strategies it hands Pipecat
(`LLMUserAggregatorParams.user_turn_strategies`), chosen by `TURN_STRATEGY` (or by the entry
point, below):

- `default`: Pipecat's defaults (`VADUserTurnStartStrategy`, `TranscriptionUserTurnStartStrategy`):
  the caller's voice starts a turn and interrupts the bot;
- `no_interruptions`: the same strategies with `enable_interruptions=False`: the caller's turn
  starts but the bot talks on, and answers after;
- `min_words`: `MinWordsUserTurnStartStrategy(min_words=3)`: while the bot speaks, a turn (and an
  interruption) starts only once the caller's transcript has three words, so "okay" is not one.

Run it live with Pipecat's runner (`TURN_STRATEGY=min_words python bot.py`; needs the keys), or
simulate a variant in audio mode with a scripted LLM (no model server; the replies are fixed
text, so the variants differ only in the setting):

    pipecat-rl simulate examples/turn-taking/scenarios.yaml --mode audio --persona scripted \
        --no-server --bot examples/turn-taking/bot.py:no_interruptions
"""

import os

from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.frames.frames import LLMRunFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.runner.types import RunnerArguments
from pipecat.runner.utils import create_transport
from pipecat.services.cartesia.tts import CartesiaTTSService
from pipecat.services.deepgram.stt import DeepgramSTTService
from pipecat.services.llm_service import LLMService
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.transports.base_transport import BaseTransport, TransportParams
from pipecat.turns.user_start import (
    MinWordsUserTurnStartStrategy,
    TranscriptionUserTurnStartStrategy,
    VADUserTurnStartStrategy,
)
from pipecat.turns.user_turn_strategies import UserTurnStrategies
from pipecat.workers.runner import WorkerRunner

from pipecat_rl.simulator.scripted import (
    ScriptedLLMService,
    ScriptedReply,
    last_message,
    message_text,
)

SYSTEM = """You answer the phone for Bright Smile Dental's opening hours. Be warm and complete:
give the week's hours, Saturday's, and when the clinic is closed."""

GREETING = "Bright Smile Dental, how can I help?"
HOURS = (
    "We are open from eight in the morning until six in the evening, Monday to Friday. "
    "On Saturdays we open from nine until one, and we are closed on Sundays and on public "
    "holidays, when the dentist on call can be reached through the emergency line."
)
SATURDAY = "On Saturdays we are open from nine until one."
GOODBYE = "You're welcome. Goodbye!"
AGAIN = "Sorry, could you say that again?"

STRATEGIES = ("default", "no_interruptions", "min_words")


def user_turn_strategies(name: str) -> UserTurnStrategies:
    """The Pipecat turn setting of variant `name` (stop strategies: Pipecat's default)."""
    if name == "default":
        return UserTurnStrategies()
    if name == "no_interruptions":
        return UserTurnStrategies(
            start=[
                VADUserTurnStartStrategy(enable_interruptions=False),
                TranscriptionUserTurnStartStrategy(enable_interruptions=False),
            ]
        )
    if name == "min_words":
        return UserTurnStrategies(start=[MinWordsUserTurnStartStrategy(min_words=3)])
    raise ValueError(f"TURN_STRATEGY={name!r}: choose one of {', '.join(STRATEGIES)}")


def create_llm() -> LLMService:
    return OpenAILLMService(
        api_key=os.getenv("OPENAI_API_KEY"),
        settings=OpenAILLMService.Settings(
            model=os.getenv("OPENAI_MODEL", "gpt-4o-mini"), system_instruction=SYSTEM
        ),
    )


def _scripted_reply(messages: list[dict]) -> ScriptedReply:
    """The hours line as a rule: what a served model would say, fixed, so timing is all."""
    said = message_text(last_message(messages, "user")).lower()
    if "saturday" in said:
        return ScriptedReply(SATURDAY)
    if "hour" in said or "open" in said:
        return ScriptedReply(HOURS)
    if "bye" in said or "thank" in said:
        return ScriptedReply(GOODBYE)
    if "phone rings" in said:
        return ScriptedReply(GREETING)
    return ScriptedReply(AGAIN)


def scripted_llm() -> LLMService:
    """A rule-based stand-in for the LLM (`pipecat_rl.simulator.scripted`): no model needed."""
    return ScriptedLLMService(_scripted_reply)


async def run_bot(
    transport: BaseTransport,
    runner_args: RunnerArguments,
    llm: LLMService | None = None,
    strategy: str | None = None,
):
    stt = DeepgramSTTService(api_key=os.getenv("DEEPGRAM_API_KEY"))
    tts = CartesiaTTSService(
        api_key=os.getenv("CARTESIA_API_KEY"),
        settings=CartesiaTTSService.Settings(voice="71a7ad14-091c-4e8e-a314-022ece01c121"),
    )
    llm = llm or create_llm()
    context = LLMContext()
    user_aggregator, assistant_aggregator = LLMContextAggregatorPair(
        context,
        user_params=LLMUserAggregatorParams(
            vad_analyzer=SileroVADAnalyzer(),
            user_turn_strategies=user_turn_strategies(
                strategy or os.getenv("TURN_STRATEGY", "default")
            ),
        ),
    )
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
    worker = PipelineWorker(pipeline, params=PipelineParams(enable_metrics=True))

    @transport.event_handler("on_client_connected")
    async def on_client_connected(transport, client):
        context.add_message({"role": "user", "content": "(The phone rings. Greet the caller.)"})
        await worker.queue_frames([LLMRunFrame()])

    @transport.event_handler("on_client_disconnected")
    async def on_client_disconnected(transport, client):
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=runner_args.handle_sigint)
    await runner.add_workers(worker)
    await runner.run()


async def default(transport: BaseTransport, runner_args: RunnerArguments):
    """Pipecat's default start strategies, with the scripted LLM."""
    await run_bot(transport, runner_args, llm=scripted_llm(), strategy="default")


async def no_interruptions(transport: BaseTransport, runner_args: RunnerArguments):
    """The default strategies with `enable_interruptions=False`, with the scripted LLM."""
    await run_bot(transport, runner_args, llm=scripted_llm(), strategy="no_interruptions")


async def min_words(transport: BaseTransport, runner_args: RunnerArguments):
    """`MinWordsUserTurnStartStrategy(min_words=3)`, with the scripted LLM."""
    await run_bot(transport, runner_args, llm=scripted_llm(), strategy="min_words")


async def bot(runner_args: RunnerArguments):
    transport_params = {
        "webrtc": lambda: TransportParams(audio_in_enabled=True, audio_out_enabled=True),
    }
    transport = await create_transport(runner_args, transport_params)
    await run_bot(transport, runner_args)


if __name__ == "__main__":
    from pipecat.runner.run import main

    main()
