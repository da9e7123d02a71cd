"""The persona caller: a Pipecat bot that plays the scenario's caller against the agent bot.

Its pipeline is `transport in -> persona turns -> persona LLM -> transport out -> assistant
aggregator`. The persona LLM runs under Pipecat's own persona instruction (`EvalPersona`) plus the
scenario's facts, which it gives only when asked, and ends the call with Pipecat's `end_call`
tool; the call also ends on `max_turns`. The LLM persona is the default; it runs on the
scenario's persona endpoint (`--persona-llm-url`, the file's `simulator:` block, or the served
model, see `judge.resolve_endpoint`). A scripted persona (the scenario's `script:` rules, keyed
on what the agent says, chosen with `--persona scripted`) replaces the LLM with a
`ScriptedLLMService` for deterministic episodes, and a Pipecat scripted scenario (`turns:`)
always has its turns said by one (`script_turns.TurnsCaller`), which opens with turn 1, or
says nothing until the agent greets it when turn 1 only waits.
"""

import re

from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.evals.persona import END_CALL_FUNCTION, END_CALL_SCHEMA, EvalPersona
from pipecat.frames.frames import (
    Frame,
    FunctionCallResultProperties,
    LLMContextFrame,
    TranscriptionFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMAssistantAggregator
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams, LLMService
from pipecat.services.openai.llm import OpenAILLMService

from pipecat_rl.errors import SimulationError
from pipecat_rl.scenarios.scenario import Scenario, Script
from pipecat_rl.serving.server import client_api_key
from pipecat_rl.simulator.judge import Endpoint
from pipecat_rl.simulator.options import PersonaKind
from pipecat_rl.simulator.scripted import (
    ScriptedLLMService,
    ScriptedReply,
    last_message,
    message_text,
)
from pipecat_rl.simulator.transport import LocalTransportPair

FACTS_TEMPLATE = """

What you know (give each item only when the assistant asks for it, exactly as written here, and \
never volunteer it): {facts}"""


def persona_instruction(scenario: Scenario) -> str:
    """Pipecat's persona instruction for the scenario, plus the facts the caller knows."""
    text = EvalPersona(scenario.persona, scenario.goal, llm=None).instruction  # type: ignore[arg-type]
    if scenario.facts:
        facts = "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in scenario.facts.items())
        text += FACTS_TEMPLATE.format(facts=facts)
    return text


class PersonaTurns(FrameProcessor):
    """Turns each agent line (a transcription from the caller transport) into a persona turn."""

    def __init__(self, context: LLMContext, pair: LocalTransportPair | None = None, **kwargs):
        super().__init__(**kwargs)
        self._context = context
        self._pair = pair

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        """Append an agent line to the persona's context and run the persona LLM on it."""
        await super().process_frame(frame, direction)
        if isinstance(frame, TranscriptionFrame) and direction == FrameDirection.DOWNSTREAM:
            self._context.add_message({"role": "user", "content": frame.text})
            if self._pair is not None:
                self._pair.caller_responding = True  # a hang-up now waits for this turn
            await self.push_frame(LLMContextFrame(self._context))
        else:
            await self.push_frame(frame, direction)


class ScriptedPersona:
    """The policy of a scripted caller: the first matching rule that has not run out."""

    def __init__(self, script: Script):
        self._script = script
        self._fired = [0] * len(script.rules)

    def __call__(self, messages: list[dict]) -> ScriptedReply:
        """The caller's reply to the agent's last turn."""
        heard = message_text(last_message(messages, "user"))
        for i, rule in enumerate(self._script.rules):
            if rule.times is not None and self._fired[i] >= rule.times:
                continue
            if re.search(rule.when, heard, flags=re.IGNORECASE | re.DOTALL):
                self._fired[i] += 1
                return _reply(rule.say, rule.end_call)
        if self._script.fallback is not None:
            return ScriptedReply(text=self._script.fallback)
        return _reply("", end_call=True)


def _reply(text: str, end_call: bool) -> ScriptedReply:
    calls = [(END_CALL_FUNCTION, {"success": True, "reason": "scripted"})] if end_call else []
    return ScriptedReply(text=text, tool_calls=calls)


def persona_llm(
    scenario: Scenario,
    kind: PersonaKind,
    *,
    endpoint: Endpoint | None,
    pair: LocalTransportPair | None = None,
) -> LLMService:
    """The persona's LLM: a scripted scenario's turns, the `script:` rules, or an LLM."""
    if scenario.scripted:
        from pipecat_rl.simulator.script_turns import TurnsCaller

        if pair is None:
            raise SimulationError("a scripted scenario's caller needs the transport pair")
        return ScriptedLLMService(TurnsCaller(scenario, pair))
    if kind == "scripted":
        if scenario.script is None:
            raise SimulationError(
                f"{scenario.source_path}: a scripted persona needs a 'script:' in the scenario; "
                "add one, or run with the LLM persona"
            )
        return ScriptedLLMService(ScriptedPersona(scenario.script))
    if endpoint is None:
        raise SimulationError(
            "the LLM persona needs an LLM server: pass --llm-url (or --persona-llm-url)"
        )
    return OpenAILLMService(
        api_key=client_api_key(),
        base_url=endpoint.url,
        settings=OpenAILLMService.Settings(
            model=endpoint.model,
            temperature=0.7,
            max_tokens=96,
            system_instruction=persona_instruction(scenario),
            extra=dict(endpoint.extra),
        ),
    )


class PersonaWorker(PipelineWorker):
    """The persona's worker: it runs no setup files.

    The persona is the simulator's own bot, not the user's, so the `PIPECAT_SETUP_FILES` hooks
    (the recorder's among them) are not run for it: the caller's side of a simulated call is
    never recorded as a call of its own.
    """

    async def _load_setup_files(self):
        """Run no setup files (see the class docstring)."""


def build_persona_worker(
    scenario: Scenario,
    pair: LocalTransportPair,
    llm: LLMService,
    audio_stages: tuple[list[FrameProcessor], list[FrameProcessor]] | None = None,
) -> PipelineWorker:
    """The persona caller bot, ready to run on the caller side of `pair`.

    In audio mode `audio_stages` are its ear (VAD, STT, hearing: before its turn logic) and its
    mouth (line tap, TTS: after its LLM); see `simulator.audio.episode`.
    """
    ear, mouth = audio_stages or ([], [])
    # Who the caller is lives in the LLM service's system instruction (see `persona_llm`).
    opening = scenario.script.opening if scenario.script else None
    if scenario.scripted:
        from pipecat_rl.simulator.script_turns import opening_line

        opening = opening_line(scenario)  # none: turn 1 waits for the agent's greeting
        pair.agent_context = scenario.context or None  # none given: the bot keeps its own
    messages = [{"role": "assistant", "content": opening}] if opening else []
    context = LLMContext(messages, tools=ToolsSchema(standard_tools=[END_CALL_SCHEMA]))

    async def end_call(params: FunctionCallParams) -> None:
        await params.result_callback(
            {"ok": True}, properties=FunctionCallResultProperties(run_llm=False)
        )
        pair.request_hang_up()

    llm.register_function(END_CALL_FUNCTION, end_call)
    transport = pair.caller
    pipeline = Pipeline(
        [
            transport.input(),
            *ear,
            PersonaTurns(context, pair),
            llm,
            *mouth,
            transport.output(),
            LLMAssistantAggregator(context),
        ]
    )
    if opening:
        pair.caller_opening = opening
    return PersonaWorker(
        pipeline,
        params=PipelineParams(enable_metrics=False),
        enable_rtvi=False,
        enable_turn_tracking=False,  # the caller needs no turn spans: spare the shared cores
        idle_timeout_secs=None,
        cancel_on_idle_timeout=False,
    )
