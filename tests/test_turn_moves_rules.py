"""Turn-taking moves of a caller that decides as it goes: a `script:` rule's, and `caller:`.

Fast: the moves parse (and malformed ones name the file, line and field), leave the identity of
a scenario without them alone, and are planned from what the caller hears (which line barges
in, after how much of the agent's voice, and which aside plays when), fed agent frames and
transcripts by hand as the audio pair and the persona's ear feed them; no speech model runs.
Text mode sends a barge-in rule's line after the reply and records turn-taking as unavailable.
Slow: a rule keyed on what the agent means barges into a real audio call once it has heard it.
"""

import asyncio
import re
from pathlib import Path

import pytest

from pipecat_rl.errors import ScenarioError
from pipecat_rl.scenarios.loading import load_scenario_file
from pipecat_rl.scenarios.turns import WORD_MS
from pipecat_rl.scoring.turntaking import MISSED_BARGE_IN_MS, read, text_mode
from pipecat_rl.simulator.audio import moves as moves_module
from pipecat_rl.simulator.audio.moves import CallerMoves
from pipecat_rl.simulator.persona import EveryReply, ScriptedPersona, caller_listener
from tests import audio_turn_bot, turn_bots

FRAME_S = 0.02
BOTS = str(Path(turn_bots.__file__))
ECHO = f"{Path(audio_turn_bot.__file__)}:run_bot"

# The caller opens; on the first sentence of the agent's long reply ("We are open from eight in
# the morning ... on weekdays, ...") it barges in; it hangs up on the short answer after it, in
# any of the ways Whisper writes it ("Saturday's 9 to 1"), but not on the long reply's "nine until
# one", which the caller may still hear as the bot yields.
RULES = """\
name: rules
persona: A caller who only needs the Saturday hours.
goal: Learn the Saturday opening hours, then hang up.
success: The agent said when the clinic opens on Saturdays.
max_silence_s: 20
script:
  opening: "What are your opening hours?"
  intents: {hours: ["open from", weekdays, "you said"]}
  rules:
    - {intent: hours, say: "Sorry, I only need Saturday.", barge_in: {after_words: 4}, times: 1}
    - {when: "saturday is|saturdays (nine|9)|(nine|9) (00 )?((to|till) )?(one|1)|only need sat",
       say: "Thank you, goodbye.", end_call: true}
  fallback: false
"""


def _write(tmp_path, text: str = RULES) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    return path


def _scenario(tmp_path, text: str = RULES):
    (scenario,) = load_scenario_file(_write(tmp_path, text))
    return scenario


def _listening(scenario):
    """The call's moves, asked of the scenario's scripted caller (`build_persona_worker`'s job)."""
    persona = ScriptedPersona(scenario.script, scenario.goal, scenario.caller)
    moves = CallerMoves.of(scenario)
    moves.listen(persona)
    return moves, persona


def _hear(moves: CallerMoves, ms: float, said: int, voiced: bool = True) -> list[tuple]:
    """`ms` of the agent's reply to line `said`, 20 ms a frame: the asides played (kind, text)."""
    played = []
    for _ in range(round(ms / (FRAME_S * 1000))):
        out = moves.agent_frame(voiced, 0.0, said, False, FRAME_S)
        played += [(kind, pcm.decode()) for kind, _, pcm in out]
    return played


@pytest.fixture
def text_audio(monkeypatch):
    """Asides 'rendered' as their own text, so no Piper runs and the test reads what played."""
    monkeypatch.setattr(moves_module, "piper_pcm", lambda text: text.encode())


# -- parsing -----------------------------------------------------------------------------------


def test_a_rules_moves_and_callers_moves_parse(tmp_path):
    extra = 'caller: {backchannel: {say: "Mm-hm.", after_ms: 1500}, barge_in: {after_ms: 900}}\n'
    scenario = _scenario(tmp_path, RULES + extra)
    rule = scenario.script.rules[0]
    assert rule.barge_in.voice_ms == 4 * WORD_MS and rule.backchannel is None
    assert scenario.caller.backchannel.say == "Mm-hm." and scenario.caller.barge_in.voice_ms == 900
    assert CallerMoves.of(scenario).any
    plain = _scenario(tmp_path, RULES.replace(", barge_in: {after_words: 4}", ""))
    assert not CallerMoves.of(plain).any  # nothing to time: the audio pair keeps no moves


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("barge_in: {after_words: 4}", "barge_in: {after_words: 4, after_ms: 900}",
         "line 10: script.rules.0.barge_in: Value error, give one of after_ms or after_words"),
        ("barge_in: {after_words: 4}", "barge_in: {after_words: 0}",
         "line 10: script.rules.0.barge_in.after_words: Input should be greater than 0"),
        ("barge_in: {after_words: 4}", 'backchannel: {say: ""}',
         "line 10: script.rules.0.backchannel.say: String should have at least 1 character"),
        ("max_silence_s: 20", "max_silence_s: 20\ncaller: {interrupt: 3}",
         "line 6: caller.interrupt: unknown field (check its spelling"),
        ("max_silence_s: 20", "max_silence_s: 20\ncaller: {side_speech: {say: Hi, after_ms: -1}}",
         "line 6: caller.side_speech.after_ms: Input should be greater than or equal to 0"),
    ],
)  # fmt: skip
def test_a_malformed_move_names_the_file_line_and_field(tmp_path, old, new, message):
    assert old in RULES
    path = _write(tmp_path, RULES.replace(old, new, 1))
    with pytest.raises(ScenarioError, match=re.escape(f"{path}: {message}")):
        load_scenario_file(path)


def test_callers_moves_are_refused_on_a_scripted_scenario(tmp_path):
    path = _write(tmp_path, """\
        name: turns
        caller: {barge_in: {after_words: 3}}
        turns:
          - user: "Hello?"
        """.replace("        ", ""))  # fmt: skip
    with pytest.raises(ScenarioError, match="a scripted scenario .'turns'. gives them turn by"):
        load_scenario_file(path)


def test_no_move_written_is_no_move_in_the_identity(tmp_path):
    """A scenario without moves hashes as before moves existed; a move is another scenario."""
    base = _scenario(tmp_path, RULES.replace(", barge_in: {after_words: 4}", ""))
    spelled = _scenario(tmp_path, RULES.replace("{after_words: 4}", "null") + "caller: null\n")
    moved = _scenario(tmp_path)
    assert base.content_hash() == spelled.content_hash() != moved.content_hash()
    assert "caller" not in base.canonical() and "barge_in" not in str(base.canonical())


# -- the moves, planned from what the caller hears ---------------------------------------------


def test_a_rule_barges_in_once_its_words_were_heard_and_after_its_share_of_voice(tmp_path):
    moves, _ = _listening(_scenario(tmp_path))
    _hear(moves, 3000, said=1)  # the reply sounds, but the ear has no words of it yet
    assert not moves.barge_in_due.is_set()
    moves.heard("We are open from eight in the morning")
    _hear(moves, 20, said=1)  # 3 s heard: past the four words (1.4 s) at the next frame
    assert moves.barge_in_due.is_set()

    moves, _ = _listening(_scenario(tmp_path))
    _hear(moves, 20, said=1)
    moves.heard("We are open from")  # the words come early: the share of voice decides
    _hear(moves, 4 * WORD_MS - 40, said=1)
    assert not moves.barge_in_due.is_set()
    _hear(moves, 20, said=1)
    assert moves.barge_in_due.is_set()


def test_no_barge_in_on_words_no_rule_answers_nor_into_a_reply_that_has_ended(tmp_path):
    moves, persona = _listening(_scenario(tmp_path))
    _hear(moves, 20, said=1)
    moves.heard("Good morning, this is the clinic")  # no rule: a fallback is never said over
    _hear(moves, 3000, said=1)
    assert not moves.barge_in_due.is_set()
    moves.heard("We are open from eight")
    _hear(moves, 3000, said=1, voiced=False)  # the words came after the agent stopped talking
    assert not moves.barge_in_due.is_set()
    # the next reply starts with nothing heard, and the rule has not run out
    _hear(moves, 3000, said=2)
    assert not moves.barge_in_due.is_set()
    assert persona.barge_in("we are open from eight").voice_ms == 4 * WORD_MS


def test_a_rules_own_barge_in_wins_over_the_callers_and_a_spent_rule_makes_none(tmp_path):
    text = RULES.replace("{after_words: 4}, times: 1", "{after_ms: 500}, times: 1")
    text += "caller: {barge_in: {after_ms: 2000}}\n"
    persona = ScriptedPersona(*(lambda s: (s.script, s.goal, s.caller))(_scenario(tmp_path, text)))
    assert persona.barge_in("we are open from eight").voice_ms == 500  # its own
    assert persona.barge_in("saturday is nine").voice_ms == 2000  # the caller's, by default
    assert persona.barge_in("nothing a rule knows") is None  # a fallback waits for the reply
    said = persona([{"role": "user", "content": "We are open from eight"}])
    assert said.text == "Sorry, I only need Saturday."
    assert persona.barge_in("we are open from eight") is None  # `times: 1` spent: no rule answers


def test_an_llm_persona_barges_in_on_every_long_reply_once_it_heard_some(tmp_path):
    caller = "caller: {barge_in: {after_words: 2}}\npersona: A caller"
    scenario = _scenario(tmp_path, RULES.replace("persona: A caller", caller))
    moves = CallerMoves.of(scenario)
    moves.listen(EveryReply(scenario.caller))
    for said in (0, 1):
        _hear(moves, 3000, said=said)  # nothing heard yet: its LLM has nothing to answer
        assert not moves.barge_in_due.is_set()
        moves.heard("Anything at all")
        _hear(moves, 20, said=said)
        assert moves.barge_in_due.is_set()
        moves.barge_in_due.clear()
    _hear(moves, 100, said=1)
    assert not moves.barge_in_due.is_set()  # once per reply


@pytest.mark.parametrize("kind", ["scripted", "llm"])
def test_the_persona_bot_hands_its_caller_to_the_calls_moves(tmp_path, kind):
    """`build_persona_worker` makes the caller's policy (its rules, or `caller:` for the LLM
    persona) the one the audio pair's moves ask; a text pair has none to ask."""
    from pipecat_rl.simulator.audio.transport import AudioTransportPair
    from pipecat_rl.simulator.judge import Endpoint
    from pipecat_rl.simulator.persona import build_persona_worker, persona_llm
    from pipecat_rl.simulator.transport import LocalTransportPair

    caller = "caller: {barge_in: {after_ms: 600}}\npersona: A caller"
    scenario = _scenario(tmp_path, RULES.replace("persona: A caller", caller))
    endpoint = Endpoint(url="http://127.0.0.1:9/v1", model="persona")  # never called here
    pair = AudioTransportPair(max_turns=4)
    pair.moves = CallerMoves.of(scenario)
    build_persona_worker(scenario, pair, persona_llm(scenario, kind, endpoint=endpoint), ([], []))
    _hear(pair.moves, 20, said=1)
    pair.moves.heard("Good morning, this is the clinic")  # no rule answers it: the LLM would
    _hear(pair.moves, 600, said=1)
    assert pair.moves.barge_in_due.is_set() == (kind == "llm")
    llm = persona_llm(scenario, kind, endpoint=endpoint)
    build_persona_worker(scenario, LocalTransportPair(max_turns=4), llm)  # text: no moves to time
    no_moves = scenario.model_copy(update={"caller": None})
    assert (caller_listener(no_moves, llm) is None) == (kind == "llm")  # rules may still move


def test_a_rules_aside_plays_during_the_reply_to_its_line_and_callers_on_the_others(
    tmp_path, text_audio
):
    own = ', backchannel: {say: "Okay.", after_ms: 400}'
    text = RULES.replace(", barge_in: {after_words: 4}", own)
    text += 'caller: {backchannel: {say: "Mm-hm.", after_ms: 1000}, side_speech: {say: "Shh!"}}\n'
    moves, persona = _listening(_scenario(tmp_path, text))
    asyncio.run(moves.prepare())
    # the greeting: the caller's asides, each once its share of the reply was heard
    assert _hear(moves, 980, said=0) == [("side_speech", "Shh!")]
    assert _hear(moves, 2000, said=0) == [("backchannel", "Mm-hm.")]
    persona([{"role": "user", "content": "We are open from eight"}])  # the rule says line 1
    # the reply to it: the rule's backchannel instead of the caller's, the caller's side speech
    assert _hear(moves, 400, said=1) == [("side_speech", "Shh!"), ("backchannel", "Okay.")]
    assert _hear(moves, 2000, said=1) == []
    persona([{"role": "user", "content": "Saturday is nine to one"}])
    assert _hear(moves, 2000, said=2) == [("side_speech", "Shh!"), ("backchannel", "Mm-hm.")]


# -- text mode: no time on the line -----------------------------------------------------------


def test_text_mode_says_a_barge_in_rules_line_after_the_reply_and_measures_nothing(tmp_path):
    from pipecat_rl.ledger import Ledger
    from pipecat_rl.scenarios import load_scenarios
    from pipecat_rl.simulator import SimulationConfig, load_bot, simulate

    scenarios = load_scenarios([_write(tmp_path)])
    config = SimulationConfig(persona="scripted", concurrency=1)
    with Ledger(tmp_path / "l.db") as ledger:
        report = asyncio.run(simulate(scenarios, load_bot(ECHO), config, ledger))
        (episode,) = report.episodes
        record = read(ledger.session(episode.session_id).metadata)
    said = [(x.speaker, x.text) for x in episode.transcript]
    assert episode.error is None and episode.end_reason == "caller_hung_up", said
    assert said == [
        ("caller", "What are your opening hours?"),
        ("agent", "You said: What are your opening hours?"),
        ("caller", "Sorry, I only need Saturday."),  # whole, after the agent's whole reply
        ("agent", "You said: Sorry, I only need Saturday."),
        ("caller", "Thank you, goodbye."),
    ]
    assert record == text_mode() and not record.measured


# -- audio: slow (a real call in real time) ----------------------------------------------------


@pytest.mark.slow
@pytest.mark.shares_machine
@pytest.mark.integration
async def test_a_rule_barges_in_on_what_it_heard_and_an_interruptible_bot_yields(
    tmp_path, monkeypatch
):
    from pipecat_rl.ledger import Ledger
    from pipecat_rl.scenarios import load_scenarios
    from pipecat_rl.simulator import SimulationConfig, load_bot, simulate

    for key in ("DEEPGRAM_API_KEY", "CARTESIA_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    scenarios = load_scenarios([_write(tmp_path)])
    config = SimulationConfig(persona="scripted", mode="audio", concurrency=1)
    with Ledger(tmp_path / "l.db") as ledger:
        report = await simulate(scenarios, load_bot(f"{BOTS}:run_bot_yielding"), config, ledger)
        (episode,) = report.episodes
        record = read(ledger.session(episode.session_id).metadata)
    heard = [(x.speaker, x.text, x.heard) for x in episode.transcript]
    assert episode.error is None and episode.end_reason == "caller_hung_up", (episode.error, heard)
    assert record == episode.turn_taking and record.measured, record
    callers = [x.text for x in episode.transcript if x.speaker == "caller"]
    assert callers == ["What are your opening hours?", "Sorry, I only need Saturday.",
                       "Thank you, goodbye."], heard  # fmt: skip
    assert record.barge_ins == 1 and record.missed_barge_ins == 0, (record, heard)
    (tty,) = record.time_to_yield_ms  # the bot yields after MIN_BARGE_IN_MS of the caller
    assert turn_bots.EARLIEST_YIELD_MS <= tty < MISSED_BARGE_IN_MS, (record, heard)
    first = next(x for x in episode.transcript if x.speaker == "agent")
    assert first.text.endswith("[interrupted]"), heard
    assert "holidays" not in first.heard.lower(), heard  # it barged in before the reply's end
