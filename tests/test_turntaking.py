"""Turn-taking: measured from planted timelines (fast), moves parsed, and real audio calls.

Each timeline is built frame by frame, as the audio pair tells it, so the 20 ms framing and the
span merging are exercised too; every figure asserted is one the timeline planted. The audio
calls (`slow`) plant the behaviour in the agent (`turn_bots`) and the move in the scenario.
"""

import asyncio
import re
from pathlib import Path

import pytest

from pipecat_rl.scoring.turntaking import MISSED_BARGE_IN_MS, TurnTaking, read, text_mode
from pipecat_rl.simulator.audio.timeline import LineTimeline, Utterance, measure
from tests import audio_turn_bot, turn_bots

FRAME = 0.02
BOTS = str(Path(turn_bots.__file__))
ECHO = f"{Path(audio_turn_bot.__file__)}:run_bot"


@pytest.fixture
def no_keys(monkeypatch):
    for key in ("DEEPGRAM_API_KEY", "CARTESIA_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)


def _frames(start: float, end: float) -> list[float]:
    return [start + i * FRAME for i in range(round((end - start) / FRAME))]


def _timeline(caller: list[tuple[str, int, float, float]], agent: list[tuple[float, float]],
              cuts: tuple[float, ...] = ()) -> LineTimeline:  # fmt: skip
    """Caller (kind, utterance, start, end) and agent (start, end) stretches of voiced frames."""
    line = LineTimeline(FRAME)
    for kind, n, start, end in caller:
        for at in _frames(start, end):
            line.caller(True, at, (kind, n))
    for start, end in agent:
        for at in _frames(start, end):
            line.agent(True, at)
    for at in cuts:
        line.cut(at)
    return line


def test_a_plain_exchange_has_nothing_to_report():
    line = _timeline([("turn", 0, 0.0, 1.0), ("turn", 1, 3.0, 4.0)], [(1.5, 2.5), (4.5, 5.0)])
    got = line.measure(caller_hung_up=False)
    assert got.measured and got.caller_turns == 2 and got.barge_ins == 0
    assert got.unanswered_turns == 0 and got.awkward_silences == 0
    assert got.overlap_ms == 0 and got.talk_ms == pytest.approx(3500, abs=1)


def test_a_barge_in_the_agent_yields_to_after_300_ms():
    # the agent talks 1.0-5.0 s; the caller barges in at 2.0 s; the agent stops at 2.3 s
    line = _timeline([("turn", 0, 0.0, 0.8), ("turn", 1, 2.0, 3.0)],
                     [(1.0, 2.3), (3.4, 4.0)], cuts=(2.3,))  # fmt: skip
    got = line.measure(caller_hung_up=False)
    assert got.barge_ins == 1 and got.missed_barge_ins == 0
    assert got.time_to_yield_ms == [pytest.approx(300, abs=1)]
    assert got.yield_rate == 1.0 and got.false_interruptions == 0
    assert got.overlap_ms == pytest.approx(300, abs=1)
    assert got.overlap_ratio == pytest.approx(300 / got.talk_ms)


def test_an_agent_that_talks_through_a_barge_in_missed_it():
    line = _timeline([("turn", 0, 0.0, 0.8), ("turn", 1, 2.0, 3.0)], [(1.0, 6.0)])
    got = line.measure(caller_hung_up=True)
    assert got.barge_ins == 1 and got.missed_barge_ins == 1
    assert got.time_to_yield_ms == [pytest.approx(4000, abs=1)]  # talked 4 s over it
    assert got.yield_rate == 0.0
    assert got.overlap_ms == pytest.approx(1000, abs=1)


def test_a_backchannel_that_stops_the_agent_is_a_false_interruption():
    caller = [("turn", 0, 0.0, 0.8), ("backchannel", 1, 2.0, 2.4)]
    kept = _timeline(caller, [(1.0, 5.0)]).measure(caller_hung_up=False)
    assert kept.backchannels == 1 and kept.false_interruptions == 0 and kept.barge_ins == 0
    assert kept.caller_turns == 1  # a backchannel is not a turn
    stopped = _timeline(caller, [(1.0, 2.3)], cuts=(2.25,)).measure(caller_hung_up=False)
    assert stopped.backchannels == 1 and stopped.false_interruptions == 1


def test_a_silence_of_2_5_s_is_awkward_but_a_callers_own_pause_is_not():
    line = _timeline([("turn", 0, 0.0, 1.0)], [(3.5, 4.0)])  # 2.5 s with nobody speaking
    assert line.measure(caller_hung_up=False).awkward_silences == 1
    line = _timeline([("turn", 0, 0.0, 1.0)], [(2.5, 3.0)])  # 1.5 s: not awkward
    assert line.measure(caller_hung_up=False).awkward_silences == 0
    paused = Utterance("turn", [(0.0, 1.0), (3.5, 4.0)])  # the caller pauses 2.5 s mid-line
    got = measure([paused], [(4.5, 5.0)])
    assert got.awkward_silences == 0 and got.premature_responses == 0


def test_an_agent_that_speaks_inside_the_callers_pause_responded_prematurely():
    paused = Utterance("turn", [(0.0, 1.0), (3.5, 4.0)])
    got = measure([paused], [(1.8, 2.6), (4.5, 5.0)])
    assert got.premature_responses == 1


def test_a_line_nobody_answers_is_unanswered_unless_the_caller_hung_up_after_it():
    caller = [("turn", 0, 0.0, 1.0), ("turn", 1, 4.0, 5.0), ("turn", 2, 8.0, 8.5)]
    line = _timeline(caller, [(1.5, 2.0)])
    assert line.measure(caller_hung_up=False).unanswered_turns == 2
    assert line.measure(caller_hung_up=True).unanswered_turns == 1


def test_the_record_round_trips_through_session_metadata():
    got = _timeline([("turn", 0, 0.0, 1.0)], [(1.5, 2.0)]).measure(caller_hung_up=True)
    metadata = {"turn_taking": got.model_dump()}
    assert read(metadata) == got and read({}) is None
    assert not text_mode().measured and TurnTaking.model_validate(text_mode().model_dump())


# -- scenario files: the moves parse, and malformed ones name their field --------------------

_MOVES = """\
name: moves
scenarios:
  - name: barge_in
    max_silence_s: 20
    turns:
      - user: "What are your opening hours?"
      - user: "Sorry, I only need Saturday."
        barge_in: {after_ms: 1500}
        expect:
          - {event: response, text_contains: Saturday}
      - user: "Thank you, goodbye."
  - name: backchannel
    max_silence_s: 20
    turns:
      - user: "What are your opening hours?"
        backchannel: {say: "okay", after_ms: 1500}
      - user: "Thank you, goodbye."
"""


def _moves(tmp_path, text: str = _MOVES):
    path = tmp_path / "moves.yaml"
    path.write_text(text)
    return path


def test_turn_taking_moves_parse_from_a_scenario_file(tmp_path):
    from pipecat_rl.scenarios import load_scenarios

    barge, back = load_scenarios([_moves(tmp_path)])
    assert barge.parsed_turns[1].barge_in.voice_ms == 1500
    assert back.parsed_turns[0].backchannel.say == "okay"
    words = _MOVES.replace("{after_ms: 1500}\n        expect", "{after_words: 4}\n        expect")
    (barge, _) = load_scenarios([_moves(tmp_path, words)])
    assert barge.parsed_turns[1].barge_in.voice_ms == 4 * 350


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("barge_in: {after_ms: 1500}", "barge_in: {after_ms: 1500, after_words: 3}",
         "turns.1.barge_in: Value error, give one of after_ms or after_words"),
        ('say: "okay"', 'say: ""', "turns.0.backchannel.say"),
        ("barge_in: {after_ms: 1500}", "send_after: {event: llm_started, delay_ms: 500}",
         "the caller can time a send from `bot_started_speaking` only"),
        ('      - user: "What are your opening hours?"\n      - user: "Sorry',
         '      - user: "Sorry', "turn 1 barges in, but no reply comes before it"),
    ],
)  # fmt: skip
def test_a_malformed_move_is_refused_naming_the_field(tmp_path, old, new, message):
    from pipecat_rl.errors import ScenarioError
    from pipecat_rl.scenarios.loading import load_scenario_file

    assert old in _MOVES
    with pytest.raises(ScenarioError, match=re.escape(message)):  # a skip, for what cannot run
        load_scenario_file(_moves(tmp_path, _MOVES.replace(old, new, 1)))


def test_a_text_mode_call_records_why_turn_taking_is_unavailable(tmp_path):
    from pipecat_rl.ledger import Ledger
    from pipecat_rl.scenarios import load_scenarios
    from pipecat_rl.simulator import SimulationConfig, load_bot, simulate

    scenarios = load_scenarios([_moves(tmp_path)])
    only = scenarios.model_copy(update={"scenarios": scenarios.scenarios[:1]})
    ledger = Ledger(tmp_path / "l.db")
    config = SimulationConfig(persona="scripted", concurrency=1)
    report = asyncio.run(simulate(only, load_bot(ECHO), config, ledger))
    (episode,) = report.episodes
    assert episode.error is None, episode.error
    record = read(ledger.session(episode.session_id).metadata)
    assert record == text_mode() and not record.measured
    assert report.to_json()["episodes"][0]["turn_taking"]["unavailable"].startswith("text mode")


# -- audio calls: slow (each runs in real time on Pipecat pipelines) -------------------------


async def _audio(tmp_path, name: str, bot: str):
    from pipecat_rl.ledger import Ledger
    from pipecat_rl.scenarios import load_scenarios
    from pipecat_rl.simulator import SimulationConfig, load_bot, simulate

    scenarios = load_scenarios([_moves(tmp_path)])
    picked = [s for s in scenarios if s.name == f"moves/{name}"]
    only = scenarios.model_copy(update={"scenarios": picked})
    ledger = Ledger(tmp_path / f"{bot}.db")
    config = SimulationConfig(persona="scripted", mode="audio", concurrency=1)
    report = await simulate(only, load_bot(f"{BOTS}:{bot}"), config, ledger)
    (episode,) = report.episodes
    heard = [(x.speaker, x.text, x.heard) for x in episode.transcript]
    assert episode.error is None and episode.end_reason == "caller_hung_up", (episode.error, heard)
    record = read(ledger.session(episode.session_id).metadata)
    assert record == episode.turn_taking and record.measured, record
    return episode, record, heard


@pytest.mark.slow
@pytest.mark.shares_machine
@pytest.mark.integration
async def test_a_barge_in_is_yielded_to_by_an_interruptible_bot_and_missed_by_a_stubborn_one(
    tmp_path, no_keys
):
    episode, yielding, heard = await _audio(tmp_path, "barge_in", "run_bot_yielding")
    assert yielding.barge_ins >= 1 and yielding.missed_barge_ins == 0, (yielding, heard)
    # it stops once the caller has spoken MIN_BARGE_IN_MS over it: that, plus the pipeline's
    # own hops, well inside the bound a talk-through would exceed by seconds
    (tty,) = yielding.time_to_yield_ms
    assert turn_bots.EARLIEST_YIELD_MS <= tty < MISSED_BARGE_IN_MS, (yielding, heard)
    agents = [x for x in episode.transcript if x.speaker == "agent"]
    assert agents[0].text.endswith("[interrupted]"), heard
    assert episode.outcome == "pass", heard  # the reply to the barge-in is the short one
    _, stubborn, heard = await _audio(tmp_path, "barge_in", "run_bot_stubborn")
    assert stubborn.barge_ins >= 1 and stubborn.missed_barge_ins >= 1, (stubborn, heard)
    (talked,) = stubborn.time_to_yield_ms  # the rest of its reply, over the caller
    assert talked > MISSED_BARGE_IN_MS and stubborn.overlap_ms > yielding.overlap_ms


@pytest.mark.slow
@pytest.mark.shares_machine
@pytest.mark.integration
async def test_a_backchannel_stops_only_a_bot_that_takes_any_sound_for_a_turn(tmp_path, no_keys):
    _, patient, heard = await _audio(tmp_path, "backchannel", "run_bot_yielding")
    assert patient.backchannels == 1 and patient.false_interruptions == 0, (patient, heard)
    assert patient.barge_ins == 0 and patient.caller_turns == 2, (patient, heard)
    _, jumpy, heard = await _audio(tmp_path, "backchannel", "run_bot_jumpy")
    assert jumpy.backchannels == 1 and jumpy.false_interruptions == 1, (jumpy, heard)
