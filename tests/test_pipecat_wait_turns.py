"""Pipecat scripted scenarios that open with a turn that only waits (no `user:`), as its release
evals do (a restaurant line greeting the caller; `capital_question_recording`): they load and
run, in text mode and in audio mode. The caller says nothing until the agent has greeted it, the
opening turn's checks apply to the greeting, and the caller's first line is turn 2 (its text,
or its recording). `user_transcription` checks read what the agent heard, as Pipecat's do.

Pipecat's release eval files are not in the installed package (only the manifest in
`pipecat.evals.suite`'s docstring names them), so the files here are written in their shape.
"""

import textwrap
from pathlib import Path

import pytest

from pipecat_rl.errors import UnsupportedScenarioError
from pipecat_rl.ledger import Ledger
from pipecat_rl.scenarios import load_scenario_file, load_scenarios
from pipecat_rl.scenarios.loading import runnable
from pipecat_rl.simulator import SimulationConfig, load_bot, simulate
from pipecat_rl.simulator.audio.episode import AudioEpisode
from pipecat_rl.simulator.judge import ToolCallSeen
from pipecat_rl.simulator.script_turns import score_turns
from pipecat_rl.simulator.transport import Line
from tests.fake_openai import serve_fake_openai
from tests.pipecat_helpers import AGENT_SAYS, BOTS, judge_and_agent, logged_warnings
from tests.test_pipecat_audio_turns import _piper_wav, _tone

BOT = str(BOTS / "function_calling.py")  # greets on connecting: the fake LLM says AGENT_SAYS
ASK = "What is the capital of Germany?"

GREETED = """\
name: reservation
scenarios:
  - name: greeted
    turns:
      - expect:
          - event: response
            text_contains: {greeting}
          - event: function_call
            absent: true
      - user: "{ask}"
        expect:
          - event: user_transcription
            text_contains: capital
          - event: response
            text_contains: Berlin
"""

RECORDED = """\
name: capital_question_recording
user: {modality: audio}
scenarios:
  - name: recorded
    turns:
      - expect:
          - event: response
            text_contains: Berlin
      - user: "Book a table, please."
        audio: booking.wav
        expect:
          - event: user_transcription
            text_contains: tonight
          - event: response
            text_contains: Berlin
"""


def _greeted(tmp_path: Path, greeting: str = "Berlin") -> Path:
    path = tmp_path / "reservation.yaml"
    path.write_text(GREETED.replace("{greeting}", greeting).replace("{ask}", ASK))
    return path


def test_a_scenario_opening_with_a_wait_loads_and_runs_in_both_modes(tmp_path):
    _tone(tmp_path / "booking.wav")
    (tmp_path / "recorded.yaml").write_text(RECORDED)
    _greeted(tmp_path)
    both, warned = logged_warnings(lambda: load_scenarios([tmp_path]))
    assert sorted(s.id for s in both) == [
        "capital_question_recording/recorded", "reservation/greeted",
    ]  # fmt: skip
    assert "skipped" not in warned
    (scenario,) = [s for s in both if s.id == "reservation/greeted"]
    assert scenario.parsed_turns[0].user is None and scenario.parsed_turns[1].user == ASK
    assert [s.id for s in runnable(both, "text")] == ["reservation/greeted"]  # the recording
    assert len(runnable(both, "audio")) == 2


def test_the_caller_plays_a_recorded_turn_as_its_first_line_after_a_wait(tmp_path):
    wav = _tone(tmp_path / "booking.wav")
    (tmp_path / "recorded.yaml").write_text(RECORDED)
    (scenario,) = load_scenario_file(tmp_path / "recorded.yaml")
    # caller line 1 is turn 2: the line tap plays the file for the caller's first line
    assert AudioEpisode.build(scenario, seed=0).recorded == {1: str(wav.resolve())}


def test_only_an_opening_turn_may_wait(tmp_path):
    path = tmp_path / "late.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: late
        scenarios:
          - name: wait_later
            turns:
              - user: "{ASK}"
              - expect: [{{event: response}}]
    """))  # fmt: skip
    with pytest.raises(UnsupportedScenarioError, match="turn 2 has no `user:` text"):
        load_scenario_file(path)


def test_a_budget_on_the_waiting_turn_is_a_warning_naming_it(tmp_path):
    path = tmp_path / "timed.yaml"
    path.write_text(GREETED.replace("{greeting}", "Berlin\n            within_ms: 5000")
                    .replace("{ask}", ASK))  # fmt: skip
    _, warned = logged_warnings(lambda: load_scenario_file(path))
    assert "reservation/greeted: turns.0.expect.0.within_ms: not checked" in warned


def _call(*, greeting: bool = True, heard: str = ASK) -> list[Line]:
    lines = [Line("agent", AGENT_SAYS, AGENT_SAYS, 1.0, answers=0)] if greeting else []
    return [
        *lines,
        Line("caller", ASK, heard, 2.0),
        Line("agent", AGENT_SAYS, AGENT_SAYS, 3.0, 400.0, answers=1),
    ]


async def test_the_opening_checks_score_the_greeting_and_turn_2_the_first_line(tmp_path):
    (scenario,) = load_scenarios([_greeted(tmp_path)])
    parts, _ = await score_turns(scenario, _call(), [], None)
    assert parts == {
        "judge:success": 1.0,
        "metric:turn1.1.llm_response": 1.0,
        "metric:turn1.2.function_call": 1.0,
        "metric:turn2.1.user_transcription": 1.0,
        "metric:turn2.2.llm_response": 1.0,
    }
    greeting_call = [ToolCallSeen("lookup", {}, at=1.5)]  # before the caller's first line
    parts, details = await score_turns(scenario, _call(), greeting_call, None)
    assert parts["metric:turn1.2.function_call"] == 0.0 and parts["judge:success"] == 0.0
    assert details["judge:success"]["not_run_checks"] == [
        "metric:turn2.1.user_transcription", "metric:turn2.2.llm_response",
    ]  # fmt: skip
    parts, details = await score_turns(scenario, _call(greeting=False), [], None)
    assert parts["metric:turn1.1.llm_response"] == 0.0  # no greeting: the reply to turn 2 is
    assert "did not reply" in details["metric:turn1.1.llm_response"]["reason"]  # not one


async def test_user_transcription_reads_what_the_agent_heard(tmp_path):
    path = tmp_path / "heard.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: heard
        stop_on_failure: false
        scenarios:
          - name: stt
            turns:
              - user: "{ASK}"
                expect:
                  - {{event: user_transcription, text_contains: "Hamburg"}}
                  - {{event: user_transcription, text_contains: "Germany?"}}
                  - {{event: user_transcription, text_excludes: "Hamburg"}}
                  - {{event: user_started_speaking}}
    """))  # fmt: skip
    (scenario,) = load_scenarios([path])
    misheard = "what is the capital of hamburg"  # the agent's STT got it wrong
    transcript = [line for line in _call(heard=misheard) if line.answers != 0]
    parts, details = await score_turns(scenario, transcript, [], None)
    assert parts["metric:turn1.1.user_transcription"] == 1.0  # only the STT said Hamburg
    assert parts["metric:turn1.2.user_transcription"] == 0.0  # the caller said it; unheard
    assert parts["metric:turn1.3.user_transcription"] == 0.0
    assert parts["metric:turn1.4.user_started_speaking"] == 1.0
    assert misheard in details["metric:turn1.2.user_transcription"]["reason"]


async def _simulate(paths, tmp_path, **overrides):
    async with serve_fake_openai([], answer=judge_and_agent) as url:
        config = SimulationConfig(llm_url=url, persona="scripted", concurrency=1, **overrides)
        return await simulate(load_scenarios(paths), load_bot(BOT), config,
                              Ledger(tmp_path / "l.db"))  # fmt: skip


async def test_the_caller_waits_for_the_greeting_then_says_turn_2(tmp_path):
    report = await _simulate([_greeted(tmp_path)], tmp_path)
    (episode,) = report.episodes
    assert episode.error is None, episode.error
    assert [(line.speaker, line.text) for line in episode.transcript] == [
        ("agent", AGENT_SAYS), ("caller", ASK), ("agent", AGENT_SAYS),
    ]  # fmt: skip
    assert episode.transcript[0].answers == 0  # the greeting, before the caller said a word
    assert episode.reward_parts["metric:turn1.1.llm_response"] == 1.0
    assert episode.reward_parts["metric:turn2.1.user_transcription"] == 1.0
    assert episode.reward_parts["judge:success"] == 1.0
    assert episode.outcome == "pass" and episode.end_reason == "caller_hung_up"


async def test_a_greeting_that_fails_its_check_ends_the_call_before_turn_2(tmp_path):
    report = await _simulate([_greeted(tmp_path, greeting="Paris")], tmp_path)
    (episode,) = report.episodes
    assert episode.error is None, episode.error
    assert [line.speaker for line in episode.transcript] == ["agent"]  # the caller hung up
    assert episode.reward_parts["metric:turn1.1.llm_response"] == 0.0
    assert episode.outcome == "fail" and episode.end_reason == "caller_hung_up"
    not_run = episode.score_details["judge:success"]["not_run_checks"]
    assert not_run == ["metric:turn2.1.user_transcription", "metric:turn2.2.llm_response"]


@pytest.mark.slow
@pytest.mark.shares_machine
@pytest.mark.integration
async def test_a_recorded_turn_after_the_greeting_is_heard_in_audio_mode(tmp_path, monkeypatch):
    for key in ("DEEPGRAM_API_KEY", "CARTESIA_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    # the recording says "tonight", its `user:` text does not: turn 2's user_transcription
    # passes only on what the agent's Whisper heard of the played file
    _piper_wav(tmp_path / "booking.wav", "Please book a table for tonight.")
    (tmp_path / "recorded.yaml").write_text(RECORDED)
    report = await _simulate([tmp_path / "recorded.yaml"], tmp_path, mode="audio")
    (episode,) = report.episodes
    assert episode.error is None, episode.error
    speakers = [line.speaker for line in episode.transcript]
    assert speakers[:2] == ["agent", "caller"] and speakers.count("caller") == 1, speakers
    (caller,) = [line for line in episode.transcript if line.speaker == "caller"]
    assert caller.text == "Book a table, please." and "tonight" in caller.heard.lower()
    assert episode.reward_parts["metric:turn1.1.llm_response"] == 1.0, episode.reward_parts
    assert episode.reward_parts["metric:turn2.1.user_transcription"] == 1.0
    assert episode.outcome == "pass" and episode.end_reason == "caller_hung_up"
