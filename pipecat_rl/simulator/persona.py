"""The persona caller: a Pipecat bot that plays the scenario's caller against the agent bot.

Its pipeline is `transport in -> persona turns -> persona LLM -> transport out -> assistant
aggregator`. The persona LLM runs under Pipecat's own persona instruction (`EvalPersona`) plus the
scenario's facts, which it gives only when asked, and ends the call with Pipecat's `end_call`
tool; the call also ends on `max_turns`. The LLM persona is the default; it runs on the
scenario's persona endpoint (`--persona-llm-url`, the file's `simulator:` block, or the served
model, see `judge.resolve_endpoint`). A scripted persona (the scenario's `script:` rules, keyed
on what the agent means or says, with a fallback that restates the caller's need before it hangs
up, chosen with `--persona scripted`: `ScriptedPersona`) replaces the LLM with a
`ScriptedLLMService` for deterministic episodes, and a Pipecat scripted scenario (`turns:`)
always has its turns said by one (`script_turns.TurnsCaller`), which opens with turn 1, or
says nothing until the agent greets it when turn 1 only waits.

In audio mode the caller's turn-taking moves are timed by `audio.moves`; who decides them as
the call goes (`caller_listener`) is the scripted persona (its rules' moves, and the scenario's
`caller:` ones), or, for the LLM persona, the scenario's `caller:` moves on every reply
(`EveryReply`). Text mode has no time on the line: a barge-in line is said after the reply and
asides are not said.
"""

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
from pipecat_rl.scenarios.intents import IntentMatcher, normalise
from pipecat_rl.scenarios.scenario import Scenario, Script, ScriptRule
from pipecat_rl.scenarios.turns import BargeIn, Moves
from pipecat_rl.serving.server import client_api_key
from pipecat_rl.simulator.fork import ForkReplay, ForkRun
from pipecat_rl.simulator.judge import Endpoint
from pipecat_rl.simulator.options import PersonaKind
from pipecat_rl.simulator.scripted import (
    ScriptedLLMService,
    ScriptedReply,
    last_message,
    message_text,
)
from pipecat_rl.simulator.transport import LocalTransportPair

if TYPE_CHECKING:
    from pipecat_rl.simulator.audio.moves import Listener

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
    """Turns each agent line (a transcription from the caller transport) into a persona turn.

    After a barge-in (audio mode: `audio.moves`), what the caller hears before the agent's voice
    has followed its barge-in line is the rest of the reply it cut into, not a turn to answer
    (it has answered that reply, and waits for the answer to its barge-in): it is held and joined
    to the agent's next turn.
    """

    def __init__(self, context: LLMContext, pair: LocalTransportPair | None = None, **kwargs):
        super().__init__(**kwargs)
        self._context = context
        self._pair = pair
        self._held: list[str] = []
        self._answered_barge_in: int | None = None
        """The reply the caller barged into whose interrupted turn it has been handed."""

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        """Append an agent line to the persona's context and run the persona LLM on it."""
        await super().process_frame(frame, direction)
        if not isinstance(frame, TranscriptionFrame) or direction != FrameDirection.DOWNSTREAM:
            await self.push_frame(frame, direction)
            return
        if self._rest_of_interrupted_reply():
            self._held.append(frame.text)
            return
        text, self._held = " ".join([*self._held, frame.text]), []
        self._context.add_message({"role": "user", "content": text})
        if self._pair is not None:
            self._pair.caller_responding = True  # a hang-up now waits for this turn
        await self.push_frame(LLMContextFrame(self._context))

    def _rest_of_interrupted_reply(self) -> bool:
        """Whether the agent turn just heard is what followed a barge-in before its answer."""
        moves = getattr(self._pair, "moves", None)  # audio mode only (`audio.moves`)
        if self._pair is None or moves is None or moves.barged_into is None:
            return False
        barged = moves.barged_into
        last = next((x for x in reversed(self._pair.transcript) if x.speaker == "agent"), None)
        if last is None or (last.answers or 0) > barged:
            return False  # its voice followed the barge-in line: the answer to it
        if self._answered_barge_in != barged:
            self._answered_barge_in = barged  # the turn the barge-in cut: the one it answers
            return False
        return True


class ScriptedPersona:
    """The policy of a scripted caller: the first matching rule that has not run out.

    A rule matches by meaning (`intent`: see `scenarios.intents`), by spelling (`when`), or
    both. When none matches, the caller says its fallback line (`Script.fallback`: by default it
    restates its need, from the scenario's goal) for up to `max` such turns in a row, then hangs
    up, as a person would; `fallbacks` counts the lines it said so (see `caller_notes`). An agent
    going in circles is a non-answer too: a reply said again word for word (as `normalise` reads
    it) is answered by its rule up to `max` times in a row, and at the next the caller hangs up.

    In audio mode it is also the call's `audio.moves.Listener`: it barges in with the line of
    the rule that answers what it has heard of a reply so far, when that rule (or, failing its
    own, `caller`) says to; a fallback line is never said over the agent.
    """

    def __init__(self, script: Script, goal: str | None = None, caller: Moves | None = None):
        self._script = script
        self._caller = caller or Moves()
        self._fired = [0] * len(script.rules)
        self._intents = IntentMatcher(script.intents)
        self._lines = script.fallback.say or fallback_lines(goal)
        self._last: ScriptRule | None = None
        """The rule that said the caller's last line (None: a fallback, or no line yet)."""
        self._in_a_row = 0
        self.fallbacks = 0
        """Fallback lines said in this call."""
        self.gave_up = False
        """Whether the caller hung up because its need went unanswered."""
        self._previous: str | None = None
        """The agent's last reply as `normalise` reads it."""
        self._repeated = 0
        """How many times in a row the agent has said its last reply again."""

    def __call__(self, messages: list[dict]) -> ScriptedReply:
        """The caller's reply to the agent's last turn."""
        heard = message_text(last_message(messages, "user"))
        said = normalise(heard)
        self._repeated = self._repeated + 1 if said and said == self._previous else 0
        self._previous = said
        if self._repeated > self._script.fallback.max:
            return self._give_up()
        i = self._answering(heard)
        if i is not None:
            self._last = rule = self._script.rules[i]
            self._fired[i] += 1
            self._in_a_row = 0
            return _reply(rule.say, rule.end_call)
        self._last = None
        if self._in_a_row >= self._script.fallback.max:
            return self._give_up()
        line = self._lines[min(self._in_a_row, len(self._lines) - 1)]
        self._in_a_row += 1
        self.fallbacks += 1
        return ScriptedReply(text=line)

    def _give_up(self) -> ScriptedReply:
        self._last = None
        self.gave_up = self._script.fallback.max > 0
        return _reply(GIVE_UP_LINE if self.gave_up else "", end_call=True, success=False)

    def barge_in(self, heard: str) -> BargeIn | None:
        """The barge-in of the rule that answers `heard` (the agent's reply so far), if any."""
        i = self._answering(heard)
        return None if i is None else self._script.rules[i].barge_in or self._caller.barge_in

    def asides(self) -> Moves:
        """The asides during the reply to its last line: its rule's, else `caller`'s, by kind."""
        rule = self._last or Moves()
        return Moves(
            backchannel=rule.backchannel or self._caller.backchannel,
            side_speech=rule.side_speech or self._caller.side_speech,
        )

    def _answering(self, heard: str) -> int | None:
        """The rule that answers `heard`: the first that matches and has not run out."""
        for i, rule in enumerate(self._script.rules):
            if rule.times is not None and self._fired[i] >= rule.times:
                continue
            if self._matches(rule, heard):
                return i
        return None

    def _matches(self, rule: ScriptRule, heard: str) -> bool:
        if rule.intent and not all(self._intents.matches(name, heard) for name in rule.intent):
            return False
        return rule.when is None or bool(re.search(rule.when, heard, re.IGNORECASE | re.DOTALL))


GIVE_UP_LINE = "Never mind, I'll call back another time. Goodbye."
"""What a scripted caller says as it hangs up on repeated non-answers."""

_HANG_UP = re.compile(r"\bhang(s|ing)? up\b|\bgoodbye\b|\bsay (bye|goodbye)\b", re.IGNORECASE)
_YOU = re.compile(r"\b(you are|you're|yourself|yours|your|you)\b(\s+\w+)?", re.IGNORECASE)
_SUBJECT_VERBS = {
    "can", "could", "should", "will", "would", "have", "had", "do", "did", "need", "want",
    "say", "give", "know", "may", "might", "must", "were", "get", "spell", "correct",
}  # fmt: skip


def restated_need(goal: str | None) -> str | None:
    """The caller's need in its own words, from the scenario's goal ("your" becomes "my").

    The goal's first clause, and the clauses after it that ask to get something more, up to
    anything else (how to play the caller, when to hang up): "Book a routine checkup at the first
    free time, get the confirmation number, then hang up." is "book a routine checkup at the
    first free time and get the confirmation number".
    """
    if not goal or not goal.strip():
        return None
    sentence = re.split(r"(?<=[.!?])\s", goal.strip(), maxsplit=1)[0].rstrip(".!? ")
    first, *rest = (c.strip() for c in re.split(r"[,;]", sentence))
    if not first or _HANG_UP.search(first):
        return None
    clauses = [first]
    for clause in rest:
        if not re.match(r"(and )?get\b", clause, re.IGNORECASE) or _HANG_UP.search(clause):
            break
        clauses.append(re.sub(r"^and\s+", "", clause, flags=re.IGNORECASE))

    def first_person(m: re.Match) -> str:
        word, after = m.group(1).lower(), m.group(2) or ""
        if word in ("you are", "you're"):
            return "I am" + after
        if word == "you":
            verb = after.strip().lower()
            return ("I" if verb in _SUBJECT_VERBS else "me") + after
        return {"yourself": "myself", "yours": "mine", "your": "my"}[word] + after

    need = _YOU.sub(first_person, " and ".join(clauses))
    return need[:1].lower() + need[1:]


def fallback_lines(goal: str | None) -> tuple[str, ...]:
    """A scripted caller's default fallback: it asks again, restating its need from the goal."""
    need = restated_need(goal)
    if need is None:
        return ("Sorry, I didn't follow. Could you say that again?",
                "Sorry, I still don't follow. Can you help me?")  # fmt: skip
    return (
        f"Sorry, I'm not sure I follow. I'm calling to {need}.",
        f"Sorry, I still need to {need}. Can you help me with that?",
    )


def _reply(text: str, end_call: bool, success: bool = True) -> ScriptedReply:
    reason = "scripted" if success else "no answer to the caller's need"
    calls = [(END_CALL_FUNCTION, {"success": success, "reason": reason})] if end_call else []
    return ScriptedReply(text=text, tool_calls=calls)


@dataclass(frozen=True)
class EveryReply:
    """The LLM persona's moves (`caller:`): the same on every agent reply.

    It barges in once it has heard some of a reply (its LLM needs words to answer), so its line
    goes over the agent only if the LLM has written it before the reply ends.
    """

    moves: Moves

    def barge_in(self, heard: str) -> BargeIn | None:
        """`caller.barge_in`, once something of the reply was heard."""
        return self.moves.barge_in if heard.strip() else None

    def asides(self) -> Moves:
        """`caller:`'s asides, on every reply."""
        return self.moves


def _scripted_persona(llm: LLMService | None) -> ScriptedPersona | None:
    policy = getattr(llm, "_policy", None)
    return policy if isinstance(policy, ScriptedPersona) else None


def caller_notes(llm: LLMService | None) -> dict[str, Any]:
    """What a scripted caller adds to its episode's metadata: `fallbacks` (and `caller_gave_up`).

    Empty for any other caller (an LLM persona, a Pipecat scripted scenario's turns).
    """
    policy = _scripted_persona(llm)
    if policy is None:
        return {}
    return {"fallbacks": policy.fallbacks, "caller_gave_up": policy.gave_up}


def caller_listener(scenario: Scenario, llm: LLMService) -> "Listener | None":
    """Who decides the caller's moves as the call goes (see the module docstring).

    None for a scripted scenario's turns (their moves are planned line by line) and for an LLM
    persona without `caller:` moves.
    """
    persona = _scripted_persona(llm)
    if persona is not None:
        return persona
    if scenario.scripted or scenario.caller is None:
        return None
    return EveryReply(scenario.caller)


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
        return ScriptedLLMService(ScriptedPersona(scenario.script, scenario.goal, scenario.caller))
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
    fork: ForkRun | None = None,
) -> PipelineWorker:
    """The persona caller bot, ready to run on the caller side of `pair`.

    In audio mode `audio_stages` are its ear (VAD, STT, hearing: before its turn logic) and its
    mouth (line tap, TTS: after its LLM); see `simulator.audio.episode`. A fork's caller says
    the recorded lines first, its own opening included (`simulator.fork.ForkReplay`).
    """
    ear, mouth = audio_stages or ([], [])
    # Who the caller is lives in the LLM service's system instruction (see `persona_llm`).
    opening = scenario.script.opening if scenario.script else None
    if scenario.scripted:
        from pipecat_rl.simulator.script_turns import opening_line

        opening = opening_line(scenario)  # none: turn 1 waits for the agent's greeting
        pair.agent_context = scenario.context or None  # none given: the bot keeps its own
    replay: list[FrameProcessor] = []
    if fork is not None:
        opening, replay = fork.opening, [ForkReplay(fork)]
    messages = [{"role": "assistant", "content": opening}] if opening else []
    context = LLMContext(messages, tools=ToolsSchema(standard_tools=[END_CALL_SCHEMA]))

    async def end_call(params: FunctionCallParams) -> None:
        await params.result_callback(
            {"ok": True}, properties=FunctionCallResultProperties(run_llm=False)
        )
        pair.request_hang_up()

    llm.register_function(END_CALL_FUNCTION, end_call)
    moves = getattr(pair, "moves", None)  # audio mode: the call's timed moves (`audio.moves`)
    if moves is not None:
        moves.listen(caller_listener(scenario, llm))
    transport = pair.caller
    pipeline = Pipeline(
        [
            transport.input(),
            *ear,
            PersonaTurns(context, pair),
            *replay,
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
