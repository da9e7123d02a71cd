"""Scripted callers react to what the agent means, not to how the expert happens to word it.

The clinic's scripted expert is re-worded line by line (`WORDINGS`: three rewordings of every
line it says, none of them its own): the same policy, other words, must earn the same outcome
on every clinic scenario; agents that *do* the wrong thing in any words must still fail. Below
them, unit tests of the intent matcher, of a scenario's own intents and of the fallback.
"""

import re
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from pipecat_rl.errors import ScenarioError
from pipecat_rl.ledger import Ledger
from pipecat_rl.scenarios import load_scenario_file
from pipecat_rl.scenarios.intents import IntentMatcher, merge, normalise, pattern_regex
from pipecat_rl.scenarios.scenario import Script
from pipecat_rl.simulator import Server, SimulationOptions, load_bot, load_scenarios, run
from pipecat_rl.simulator.persona import (
    GIVE_UP_LINE,
    ScriptedPersona,
    caller_notes,
    fallback_lines,
    persona_llm,
)
from pipecat_rl.simulator.scripted import ScriptedLLMService, ScriptedReply

CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic"
SCENARIOS = CLINIC / "handwritten"
INTENTS = CLINIC / "intents.yaml"

TIME_WORDS = {
    "09:00": ("9 in the morning", "nine o'clock", "9am"),
    "14:00": ("2 in the afternoon", "two pm", "2pm"),
    "10:30": ("half past ten", "ten thirty", "10:30am"),
    "16:30": ("half past four", "4:30 this afternoon", "four thirty"),
}
"""How the slot times are said aloud, one way per wording."""

WORDINGS: list[tuple[str, tuple[str, str, str]]] = [
    (r"Thank you for calling Bright Smile Dental\. How can I help you\?", (
        "Bright Smile Dental, good morning! What can I do for you?",
        "Hi, you've reached Bright Smile Dental. How may I assist you?",
        "Bright Smile Dental, Anna speaking. What are you calling about today?",
    )),
    (r"One moment while I check that\.", (
        "Just a moment, please.",
        "Bear with me for a second.",
        "Give me a second here.",
    )),
    (r"Certainly\. May I have your full name\?", (
        "Sure thing. Who am I speaking with?",
        "Of course! Could I get your first and last name?",
        "Happy to sort that out. What name is the appointment under?",
    )),
    (r"I couldn't find that name\. Could you spell it for me\?", (
        "Hmm, nothing comes up under that name. Can you spell it out for me?",
        "I'm not seeing you in our system. Could you give me that letter by letter?",
        "Sorry, that doesn't match any of our patients. How do you spell that?",
    )),
    (r"I have (?P<day>\w+) at (?P<time>[\d:]+) with (?P<dentist>.+?), slot \d+\. "
     r"Shall I book it\?", (
        "The first opening is {day} at {time} with {dentist}. Would you like me to reserve it?",
        "{dentist} is free {day}, {time_words}. Does that work for you?",
        "I can offer {day}, {time_words}, with {dentist}. Shall I put you down for that?",
    )),
    (r"I also have (?P<day>\w+) at (?P<time>[\d:]+) with (?P<dentist>.+?), slot \d+\. "
     r"Shall I book it\?", (
        "Alternatively there's {day} at {time} with {dentist}. Would that suit you?",
        "How about {day}, {time_words}, with {dentist} instead? I can hold it for you.",
        "{dentist} also has {day} at {time_words}. Want me to book that one?",
    )),
    (r"The booking did not go through\. Shall I try to book it again\?", (
        "Sorry, the system didn't take that. Shall I give it another try?",
        "Hmm, that failed on our end. Want me to try again?",
        "Apologies, something went wrong saving it. Can I have another go?",
    )),
    (r"You're booked\. Your confirmation number is (?P<number>\S+)\.", (
        "All done! Your reference is {number}.",
        "You're all set. Please note down your confirmation code: {number}.",
        "Great, that's confirmed, and the booking reference is {number}.",
    )),
    (r"You're booked\. See you then\.", (  # said only by an agent that withholds the number
        "That's booked in for you. See you then!",
        "You're all set, we'll see you then.",
        "All done, you're in the diary.",
    )),
    (r"Of course\. What is your confirmation number\?", (
        "Sure, I can help with that. Do you have the booking reference?",
        "No problem. Could you read me the confirmation code?",
        "Okay, what's the confirmation number on the appointment?",
    )),
    (r"I can't find that confirmation number\. Could you repeat it\?", (
        "Hmm, that number doesn't match anything here. Could you say it again?",
        "I'm not finding a booking under that reference. Can you read it once more?",
        "That code isn't coming up, I'm afraid. Would you repeat it for me?",
    )),
    (r"Your appointment is cancelled\.", (
        "Done, I've cancelled that appointment for you.",
        "That's taken care of: the appointment has been removed.",
        "Okay, your visit is canceled. We won't be expecting you.",
    )),
    (r"I can't quote prices on the phone; the front desk can help you\.", (
        "I'm afraid I'm not able to give prices over the phone; our front desk can.",
        "Unfortunately pricing isn't something I can share by phone. Please ask at the front desk.",
        "We don't give out quotes on the phone, sorry. The front desk can help you there.",
    )),
    (r"I can't give medical advice, but I can book you an emergency visit today\.", (
        "I'm not able to advise on medication, but we could see you as an emergency today.",
        "That's a question for a dentist, I'm afraid; I could get you seen urgently today.",
        "Unfortunately I can't recommend medicines. We do have emergency visits today.",
    )),
    (r"I'm transferring you to the front desk now\.", (
        "Let me put you through to the front desk.",
        "One moment, I'll connect you with a colleague at the front desk.",
        "Sure, I'm handing you over to the front desk now.",
    )),
    (r"Our booking system is down\. Let me transfer you\.", (
        "Our booking system isn't responding, so I'll put you through to a colleague.",
        "The bookings computer is down; let me connect you to the front desk.",
        "I can't reach the diary right now. I'm passing you to the front desk.",
    )),
    (r"I'm sorry, (?:there are no free slots|that was the last free slot)\. "
     r"Shall I transfer you\?", (
        "I'm sorry, there's nothing else free. Shall I put you through to the front desk?",
        "Unfortunately that's all we have. Would you like me to connect you to a colleague?",
        "Sorry, no other openings. I can pass you to the front desk if you like.",
    )),
    (r"Thank you for calling Bright Smile Dental\. Goodbye!", (
        "Thanks for calling, bye now!",
        "Take care, goodbye.",
        "Have a lovely day, bye!",
    )),
    (r"How can I help you today\?", (
        "What can I do for you?",
        "Is there something I can help you with?",
        "How may I help?",
    )),
]  # fmt: skip
"""Each line the expert says (a regex over its text) and three ways of saying the same thing."""


def _expert():
    if str(CLINIC) not in sys.path:  # the expert imports its bot from beside it
        sys.path.insert(0, str(CLINIC))
    import expert

    return expert


def reword(text: str, wording: int) -> str:
    """The expert's `text` in wording `wording` (0..2).

    Raises:
        AssertionError: a line the tables do not cover (the expert learned something new).
    """
    for regex, lines in WORDINGS:
        m = re.fullmatch(regex, text)
        if m:
            values = m.groupdict()
            if "time" in values:
                values["time_words"] = TIME_WORDS[values["time"]][wording]
            if values.get("day") == "Today":
                values["day"] = "today"
            return lines[wording].format(**values)
    raise AssertionError(f"no rewording of the expert's line {text!r}: add it to WORDINGS")


class Reworded:
    """The expert's policy, its spoken lines reworded; it reads its own past lines as its own.

    `mutate(original_reply, messages)` may change what the agent does (a wrong agent); what it
    returns is then reworded like any other line.
    """

    def __init__(self, wording: int | None, mutate=None):
        self._wording = wording
        self._mutate = mutate
        self._said: dict[str, str] = {}  # spoken -> the expert's own text
        self._turns = 0

    def __call__(self, messages: list[dict]) -> ScriptedReply:
        restored = [
            {**m, "content": self._said.get(_key(m.get("content")), m.get("content"))}
            if m.get("role") == "assistant"
            else m
            for m in messages
        ]
        reply = _expert().expert_policy(restored)
        if self._mutate is not None:
            reply = self._mutate(reply, restored)
        if reply.text:
            self._turns += 1
            # None: each line in the next wording in turn, so the wordings mix within a call
            wording = self._wording if self._wording is not None else self._turns % 3
            spoken = reword(reply.text, wording)
            self._said[_key(spoken)] = reply.text
            reply = ScriptedReply(spoken, reply.tool_calls)
        return reply


def _key(text) -> str:
    return " ".join(str(text or "").split())


# -- agents that do the wrong thing, in the reworded words -------------------------------------


def reoffer_declined(reply: ScriptedReply, messages: list[dict]) -> ScriptedReply:
    """Offers the slot the caller just turned down, again, instead of the next one."""
    m = re.match(r"I also have .*? slot \d+\. Shall I book it\?", reply.text)
    if not m:
        return reply
    first = next(
        _text for msg in messages if (_text := str(msg.get("content") or "")).startswith("I have ")
    )
    return ScriptedReply(first)


def transfer_everyone(reply: ScriptedReply, messages: list[dict]) -> ScriptedReply:
    """Hands every caller it cannot serve to the front desk."""
    if messages and messages[-1].get("role") == "tool":
        return reply
    if reply.text in ("How can I help you today?",) or reply.text.startswith("I can't"):
        return ScriptedReply(tool_calls=[("transfer", {"reason": "caller"})])
    return reply


def claims_booked(reply: ScriptedReply, messages: list[dict]) -> ScriptedReply:
    """Says the slot is booked without booking it: no confirmation, because no booking."""
    if any(name == "book" for name, _ in reply.tool_calls):
        number = "BSD-0000-00000"
        return ScriptedReply(f"You're booked. Your confirmation number is {number}.")
    return reply


def withholds_number(reply: ScriptedReply, messages: list[dict]) -> ScriptedReply:
    """Books, then never reads the confirmation number out, whatever it is asked."""
    if reply.text.startswith("You're booked."):
        return ScriptedReply("You're booked. See you then.")
    booked = _expert()._tool_results(messages).get("book")
    if isinstance(booked, dict) and "confirmation" in booked:
        return ScriptedReply("How can I help you today?")
    return reply


def _agent(model: str):
    if model == "expert":
        return _expert().expert_policy
    kind, _, wording = model.partition("-")
    mutate = {
        "reworded": None,
        "reoffer": reoffer_declined,
        "transfer": transfer_everyone,
        "claims": claims_booked,
        "withholds": withholds_number,
    }[kind]
    return Reworded(None if wording == "mixed" else int(wording), mutate)


async def run_bot(transport, runner_args):
    """The clinic bot, its LLM the agent the run's policy names (`expert`, `reworded-1`...)."""
    expert = _expert()
    await expert.bot.run_bot(
        transport, runner_args, llm=ScriptedLLMService(_agent(runner_args.model))
    )


def _outcomes(folder: str | Path, policies: list[str], names: list[str] | None = None):
    """{policy: {scenario: episode}} for the clinic's scenarios in `folder` under each agent."""
    scenarios = load_scenarios([SCENARIOS / folder])
    if names is not None:
        scenarios = scenarios.model_copy(
            update={"scenarios": [s for s in scenarios if s.id in names]}
        )
    options = SimulationOptions(persona="scripted", repeats=1, concurrency=2 * len(policies))
    bot = load_bot(f"{__name__}:run_bot")
    with tempfile.TemporaryDirectory() as tmp, Ledger(Path(tmp) / "l.db") as ledger:
        report = run(scenarios, bot, options, ledger, policies=policies,
                     server=Server(needed=False))  # fmt: skip
        sessions = {s.id: s for s in ledger.sessions()}
    out: dict[str, dict] = {p: {} for p in policies}
    for e in report.episodes:
        e.fallbacks = _fallbacks_said(e, next(s for s in scenarios if s.id == e.scenario_id))
        recorded = sessions[e.session_id].metadata  # the episode's count, as the ledger holds it
        assert recorded["fallbacks"] == e.caller["fallbacks"] == e.fallbacks, recorded
        assert recorded["caller_gave_up"] == e.caller["caller_gave_up"]
        out[sessions[e.session_id].policy][e.scenario_id] = e
    return out


def _fallbacks_said(episode, scenario) -> int:
    """How often the caller restated its need: its fallback lines in the transcript."""
    lines = set(scenario.script.fallback.say or fallback_lines(scenario.goal))
    return sum(ln.speaker == "caller" and ln.text in lines for ln in episode.transcript)


@pytest.fixture
def no_keys(monkeypatch):
    for key in ("DEEPGRAM_API_KEY", "CARTESIA_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)


# -- the same policy in other words: the same outcomes -----------------------------------------


@pytest.mark.slow  # 225 episodes: about a minute a folder on two cores
@pytest.mark.shares_machine
@pytest.mark.parametrize("folder", ["pool", "heldout"])
def test_reworded_expert_keeps_the_experts_outcome_on_every_clinic_scenario(folder, no_keys):
    policies = ["expert", "reworded-0", "reworded-1", "reworded-2", "reworded-mixed"]
    runs = _outcomes(folder, policies)
    expert = {sid: str(e.outcome) for sid, e in runs["expert"].items()}
    assert expert and all(e.error is None for e in runs["expert"].values())
    for policy in policies[1:]:
        got = {sid: str(e.outcome) for sid, e in runs[policy].items()}
        differs = {
            sid: (expert[sid], got[sid], [f"{ln.speaker}: {ln.text}" for ln in e.transcript])
            for sid, e in runs[policy].items()
            if got[sid] != expert[sid]
        }
        assert not differs, f"{policy}: {differs}"
        # and the caller understood every line at once: it never had to restate its need
        restated = {sid: e.fallbacks for sid, e in runs[policy].items() if e.fallbacks}
        assert not restated, f"{policy}: the caller restated its need in {restated}"
        # and in other words for real: no line the agent said is the expert's own
        said = [
            ln.text for e in runs[policy].values() for ln in e.transcript if ln.speaker == "agent"
        ]
        assert not any(re.fullmatch(rx, t) for t in said for rx, _ in WORDINGS)


LITERAL_ROUTINE_BOOKING = """\
name: literal_routine_booking
persona: Maria Lopez, a patient of the clinic, polite and a little busy.
goal: Book a routine checkup at the first free time, get the confirmation number, then hang up.
success: The receptionist booked the first free routine slot and read back the confirmation number.
max_turns: 8
facts: {name: Maria Lopez, date_of_birth: "1984-03-12"}
world: !include ../world.yaml
verify:
  - exists: {table: appointments, where: {patient_id: 1, slot_id: 11, status: booked}}
script:
  fallback: false
  rules:
    - {when: "full name|your name", say: "Maria Lopez."}
    - {when: "book it", say: "Yes, please book it."}
    - {when: "confirmation number is", say: "Great, thank you. Goodbye!", end_call: true}
    - {when: "help", say: "Hi, I'd like to book a routine checkup, please.", times: 1}
"""
"""`routine_booking` as it was written before intents: keywords of the expert's wording."""


def test_the_rewording_is_a_real_test_keyword_callers_fail_it(tmp_path, no_keys):
    """The planted case: the caller that keyed on the expert's spelling fails the very agent
    whose reworded lines every intent caller above understands."""
    world = (SCENARIOS / "world.yaml").read_text()
    (tmp_path / "world.yaml").write_text(world.replace("../../world.py", str(CLINIC / "world.py")))
    (tmp_path / "pool").mkdir()
    (tmp_path / "pool" / "literal.yaml").write_text(LITERAL_ROUTINE_BOOKING)
    runs = _outcomes(tmp_path / "pool", ["expert", "reworded-0", "reworded-2"])
    assert str(runs["expert"]["literal_routine_booking"].outcome) == "pass"
    for policy in ("reworded-0", "reworded-2"):
        e = runs[policy]["literal_routine_booking"]
        assert str(e.outcome) == "fail" and len(e.transcript) <= 4, (policy, e.transcript)


# -- the wrong thing, in any words: still a failure ----------------------------------------------


SECOND_SLOT = ["book_second_slot", "second_slot_afternoon"]
BOOKING = ["routine_booking", "emergency_same_day"]
OUT_OF_SCOPE = ["heldout_chatty_out_of_scope", "heldout_price_pressure"]
"""Held out, where a hand-over is a write the scenario forbids (`unchanged: [handoffs]`)."""


def test_wrong_agents_fail_in_any_words(no_keys):
    policies = ["reoffer-0", "reoffer-2", "claims-1", "claims-mixed", "transfer-0"]
    runs = _outcomes("pool", policies, [*SECOND_SLOT, *BOOKING, "out_of_scope"])
    for policy in ("reoffer-0", "reoffer-2"):  # offers the morning slot the caller turned down
        for sid in SECOND_SLOT:
            e = runs[policy][sid]
            assert str(e.outcome) == "fail", (policy, sid, e.transcript)
            caller = [ln.text for ln in e.transcript if ln.speaker == "caller"]
            assert caller.count(caller[2]) >= 2  # it turned the morning down, again and again
    for policy in ("claims-1", "claims-mixed"):  # "booked", with no booking behind the number
        for sid in BOOKING:
            assert str(runs[policy][sid].outcome) == "fail", (policy, sid)
    held = _outcomes("heldout", ["transfer-1", "transfer-2"], OUT_OF_SCOPE)
    # hands to the front desk a caller the clinic had no business transferring
    for e in [runs["transfer-0"]["out_of_scope"], *held["transfer-1"].values(),
              *held["transfer-2"].values()]:  # fmt: skip
        assert str(e.outcome) == "fail" and "unauthorised_write" in e.labels, (e.scenario_id,)


def test_a_caller_never_given_its_number_asks_restates_and_hangs_up(no_keys):
    """The booking is made, but the caller never hears its confirmation number: it asks for it,
    restates its need twice, then hangs up unanswered.

    The outcome is the world's verifier's, which sees the booking and passes the call: what
    shows the failure is the caller's side (`caller_notes`: fallbacks, gave up).
    """
    runs = _outcomes("pool", ["withholds-1", "withholds-mixed"], BOOKING)
    for policy, by_scenario in runs.items():
        for sid, e in by_scenario.items():
            caller = [ln.text for ln in e.transcript if ln.speaker == "caller"]
            assert "Could I have the confirmation number" in caller[3], (policy, sid, caller)
            assert e.fallbacks == 2, (policy, sid, caller)  # restated twice, then gave up
            assert caller[-1] == GIVE_UP_LINE and e.end_reason == "caller_hung_up"


# -- the intent matcher --------------------------------------------------------------------------


def test_patterns_ignore_case_punctuation_and_spacing():
    m = IntentMatcher({"offer": ["shall I book it", "can't give"]})
    assert m.matches("offer", "SHALL i   book-it?")
    assert m.matches("offer", "shall I\nbook it...")
    assert m.matches("offer", "I can\u2019t give medical advice")  # a curly apostrophe
    assert m.matches("offer", "I CANT GIVE that")
    assert not m.matches("offer", "shall I look it up")
    assert normalise("It's 09:00, O.K.?") == "its 09 00 o k"


def test_patterns_match_whole_words_a_star_word_a_prefix():
    m = IntentMatcher({"book": ["book"], "booking": ["book*"], "slot": ["slot 1"]})
    assert m.matches("book", "Shall I book it?")
    assert not m.matches("book", "The booking failed")  # "book" is not in "booking"
    assert not m.matches("book", "You're booked")
    assert not m.matches("book", "notebook")
    assert m.matches("booking", "The booking failed") and m.matches("booking", "booked")
    assert not m.matches("booking", "rebooked")  # a prefix, not a substring
    assert not m.matches("slot", "slot 11")  # digits are words too


def test_a_star_stands_for_a_few_words_and_re_for_a_regex():
    m = IntentMatcher({"offer": ["shall i * book"], "code": [r"re:\b[a-z]{2,4} \d{3,} \d{3,}\b"]})
    assert m.matches("offer", "Shall I book it?")  # none
    assert m.matches("offer", "Shall I go ahead and book it?")
    assert not m.matches("offer", "Shall I tell you about all the ways we could possibly book")
    assert m.matches("code", "Your reference is BSD-0001-00011.")
    assert not m.matches("code", "Slot 11 at 09:00")
    assert m.found("Shall I book it? It's DX 48213 77065") == ["offer", "code"]


@pytest.mark.parametrize("bad", ["", "*", " * * ", "re:", "re:(unclosed"])
def test_a_pattern_that_cannot_match_is_refused(bad):
    with pytest.raises(ValueError, match="pattern"):
        pattern_regex(bad)


def test_the_clinics_intents_tell_apart_what_the_agent_means():
    import yaml

    m = IntentMatcher(merge(yaml.safe_load(INTENTS.read_text())))
    said = {
        "Could you spell your surname for me?": {"ask_spelling", "ask_name"},
        "I have Tuesday at 09:00 with Dr. Okafor. Shall I book it?": {"offer_slot", "morning"},
        "Dr. Lin has today at half past four. Want me to pencil you in?": {"offer_slot"},
        "You're booked. Your confirmation number is BSD-0001-00011.":
            {"booked", "read_confirmation"},
        "What is your confirmation number?": {"ask_confirmation_number"},
        "I can't give medical advice.": {"refuse"},
        "Let me put you through to the front desk.": {"transfer"},
    }  # fmt: skip
    for line, meant in said.items():
        assert meant <= set(m.found(line)), (line, m.found(line))
    assert "read_confirmation" not in m.found("What is your confirmation number?")
    assert "offer_slot" not in m.found("Would you like me to transfer you?")
    assert "morning" not in m.found("I have Tuesday at 14:00 with Dr. Okafor, shall I book it?")


# -- a scenario's intents ------------------------------------------------------------------------


def _scenario(tmp_path: Path, script: str, name: str = "s") -> Path:
    folder = tmp_path / "scenarios" / "pool"
    folder.mkdir(parents=True, exist_ok=True)
    (tmp_path / "scenarios" / "intents.yaml").write_text(INTENTS.read_text())
    path = folder / f"{name}.yaml"
    path.write_text(
        f"name: {name}\npersona: a caller\ngoal: Book a checkup, then hang up.\nsuccess: booked\n"
        + textwrap.dedent(script)
    )
    return path


def test_a_scenario_extends_the_shared_intents(tmp_path):
    path = _scenario(tmp_path, """\
        script:
          intents: [!include ../intents.yaml, {offer_slot: [care to take it], wrap_up: [all done]}]
          rules:
            - {intent: offer_slot, say: "Yes."}
            - {intent: [wrap_up], say: "Bye.", end_call: true}
        """)  # fmt: skip
    script = load_scenario_file(path)[0].script
    assert "care to take it" in script.intents["offer_slot"]
    assert "shall i book" in script.intents["offer_slot"]  # the shared ones are kept
    assert script.intents["wrap_up"] == ("all done",) and script.rules[1].intent == ("wrap_up",)
    persona = ScriptedPersona(script)
    assert persona([{"role": "user", "content": "Tuesday at two. Care to take it?"}]).text == "Yes."


def test_an_unknown_intent_names_the_file_the_rule_and_the_intent(tmp_path):
    path = _scenario(tmp_path, """\
        script:
          intents: !include ../intents.yaml
          rules:
            - {intent: ask_name, say: "Maria Lopez."}
            - {intent: ofer_slot, say: "Yes, please."}
        """)  # fmt: skip
    with pytest.raises(ScenarioError) as e:
        load_scenario_file(path)
    message = str(e.value)
    assert str(path) in message and "line 6" in message
    assert "rules.1 (say: 'Yes, please.')" in message and "'ofer_slot'" in message
    assert "offer_slot" in message  # the known ones, to spot the typo


def test_an_intent_without_an_intents_mapping_is_refused():
    with pytest.raises(ValueError, match="unknown intent 'ask_name'.*add 'intents:'"):
        Script(rules=[{"intent": "ask_name", "say": "Maria."}])


# -- the fallback --------------------------------------------------------------------------------


def _heard(line: str) -> list[dict]:
    return [{"role": "user", "content": line}]


def test_no_answer_is_restated_then_the_caller_hangs_up():
    script = Script(intents={"ask_name": ["your name"]},
                    rules=[{"intent": "ask_name", "say": "Maria Lopez."}])  # fmt: skip
    persona = ScriptedPersona(script, goal="Book a routine checkup, get the number, then hang up.")
    first = persona(_heard("Lovely weather today."))
    assert (
        first.text.startswith("Sorry") and "book a routine checkup and get the number" in first.text
    )
    assert not first.tool_calls
    assert persona(_heard("Your name?")).text == "Maria Lopez."  # an answer resets the count
    assert persona(_heard("Hmm.")).text == first.text  # so the first line comes again
    second = persona(_heard("Hmm hmm."))
    assert second.text != first.text and not second.tool_calls
    assert persona.fallbacks == 3 and not persona.gave_up
    last = persona(_heard("Still nothing."))  # the third non-answer in a row: it hangs up
    assert last.text == GIVE_UP_LINE and last.tool_calls[0][1]["success"] is False
    assert persona.gave_up and persona.fallbacks == 3


def test_an_agent_going_in_circles_is_answered_max_times_more_then_hung_up_on():
    """The loop the SFT candidate fell into on the clinic matrix: the same failed booking, the
    same "yes", until `max_turns`. A person answers a repeated reply a couple of times, then
    gives up; a reply that changes (or an answer between) is no repeat."""
    script = Script(intents={"retry": ["try again"]},
                    rules=[{"intent": "retry", "say": "Yes, please book it."}])  # fmt: skip
    persona = ScriptedPersona(script)
    stuck = "The booking did not go through. Shall I try again?"
    reworded = "The booking didn't go through; shall I try again?"
    lines = (stuck, stuck.upper(), f"{stuck}  ", reworded, stuck)
    said = [persona(_heard(line)).text for line in lines]
    # once, twice and thrice (case and spacing are no new reply); an apostrophe's change is a
    # new wording ("didn't" vs "did not"), so the count starts again
    assert said == ["Yes, please book it."] * 5, said
    again = [persona(_heard(stuck)).text for _ in range(3)]
    assert again == ["Yes, please book it.", "Yes, please book it.", GIVE_UP_LINE], again
    assert persona.gave_up and persona.fallbacks == 0
    no_fallback = Script(fallback=False).fallback
    strict = ScriptedPersona(script.model_copy(update={"fallback": no_fallback}))
    assert strict(_heard(stuck)).text == "Yes, please book it."
    assert strict(_heard(stuck)).tool_calls and not strict.gave_up  # no patience: at once


def test_fallback_lines_and_limit_are_the_scripts_to_set():
    script = Script(fallback={"say": ["Pardon?", "Hello?"], "max": 3})
    persona = ScriptedPersona(script, goal="Anything.")
    assert [persona(_heard("x")).text for _ in range(4)] == [
        "Pardon?",
        "Hello?",
        "Hello?",
        GIVE_UP_LINE,
    ]
    assert Script(fallback="Go on.").fallback.say == ("Go on.",)
    assert Script(fallback=["A", "B"]).fallback.max == 2
    off = ScriptedPersona(Script(fallback=False))  # no fallback: hang up at once, silently
    reply = off(_heard("x"))
    assert reply.text == "" and reply.tool_calls and off.fallbacks == 0 and not off.gave_up
    assert Script(fallback=None).fallback.max == 0


def test_the_fallback_restates_the_goal_in_the_callers_words():
    lines = fallback_lines("Cancel your appointment with your confirmation number, then hang up.")
    assert lines[0] == (
        "Sorry, I'm not sure I follow. I'm calling to cancel my appointment with my "
        "confirmation number."
    )
    assert "hang up" not in " ".join(lines)
    assert fallback_lines(None)[0].startswith("Sorry")


def test_caller_notes_count_the_fallbacks_for_the_episodes_metadata():
    scenario = load_scenario_file(SCENARIOS / "pool" / "routine_booking.yaml")[0]
    llm = persona_llm(scenario, "scripted", endpoint=None)
    assert caller_notes(llm) == {"fallbacks": 0, "caller_gave_up": False}
    llm._policy(_heard("The weather is nice."))
    assert caller_notes(llm) == {"fallbacks": 1, "caller_gave_up": False}
    assert caller_notes(ScriptedLLMService(lambda m: ScriptedReply("hi"))) == {}
