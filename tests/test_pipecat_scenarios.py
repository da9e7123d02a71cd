"""Pipecat's own scenario files count as Pipecat counts them: success judged, criterion and
measured metrics scored with their `min_score`, scripted `turns:` run with their `within_ms`
budgets and `stop_on_failure`, mixed folders run, what cannot run is skipped with a warning and
what is not honoured is a warning naming it (the judge is a deterministic fake on loopback)."""

import textwrap
import time
from pathlib import Path

import pytest
from loguru import logger

from pipecat_rl.errors import ConfigError, ServingError
from pipecat_rl.ledger import Ledger
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate
from pipecat_rl.simulator.judge import Endpoint, ToolCallSeen, endpoint_for, resolve_endpoint
from pipecat_rl.simulator.pipecat_metrics import score_scenario
from pipecat_rl.simulator.script_turns import score_turns
from pipecat_rl.simulator.transport import Line
from tests.fake_openai import serve_fake_openai
from tests.pipecat_helpers import BOTS, SCENARIOS, judge_and_agent

BOT = str(BOTS / "function_calling.py")


async def _simulate(paths, tmp_path, *, judge_flag=False, **overrides):
    async with serve_fake_openai([], answer=judge_and_agent) as url:
        if judge_flag:
            overrides["judge_llm_url"] = url
        config = SimulationConfig(llm_url=url, persona="scripted", concurrency=2, **overrides)
        ledger = Ledger(tmp_path / "l.db")
        return await simulate(load_scenarios(paths), load_bot(BOT), config, ledger), ledger


async def test_success_and_every_metric_are_judged_and_stored_as_scores(tmp_path):
    report, ledger = await _simulate([SCENARIOS / "capital.yaml"], tmp_path)
    (episode,) = report.episodes
    assert episode.error is None, episode.error
    assert episode.outcome == "pass"  # no verifier: Pipecat's judged success decides
    parts = episode.reward_parts
    assert parts["judge:success"] == 1.0
    assert parts["judge:politeness"] == 1.0 and parts["judge:rudeness_free"] == 1.0
    assert parts["metric:words"] == 1.0 and parts["metric:no_lookups"] == 1.0
    scores = {s.name: s for s in ledger.scores(episode.session_id)}
    assert set(scores) == set(parts)
    assert scores["judge:success"].detail["goal"] == "yes"
    assert scores["metric:words"].detail["value"] == 10.0
    assert scores["judge:rudeness_free"].detail["min_score"] == 0.5  # min_quality, read


def test_pipecat_fails_a_run_that_misses_a_metric_or_its_goal(tmp_path):
    (scenario,) = load_scenarios([SCENARIOS / "capital.yaml"])
    caller, agent = "caller", "agent"
    long_reply = " ".join(["word"] * 50)
    transcript = [Line(caller, "Hi", "Hi", 0.0), Line(agent, long_reply, long_reply, 1.0, 500.0)]
    score = score_scenario(scenario, transcript, [], judgement=None, end_reason="caller_hung_up")
    assert score.parts() == {"metric:words": 0.0, "metric:no_lookups": 1.0}  # nobody judged
    assert score.success is None
    stopped = score_scenario(scenario, transcript, [], judgement=None, end_reason="max_turns")
    assert stopped.success == 0.0  # a run a backstop ended has not succeeded


async def test_a_goal_the_judge_says_no_to_fails_the_run(tmp_path):
    rude = tmp_path / "rude.yaml"
    rude.write_text(
        (SCENARIOS / "capital.yaml").read_text().replace("Thanks, goodbye!", "You idiot, bye!")
    )
    report, ledger = await _simulate([rude], tmp_path)
    (episode,) = report.episodes
    assert episode.reward_parts["judge:success"] == 0.0 and episode.outcome == "fail"
    assert episode.reward_parts["judge:politeness"] == 1.0  # every agent turn was courteous
    detail = {s.name: s.detail for s in ledger.scores(episode.session_id)}["judge:success"]
    assert detail["goal"] == "no"


async def test_a_metric_out_of_bounds_fails_a_run_whose_goal_was_met(tmp_path):
    terse = tmp_path / "terse.yaml"
    text = (SCENARIOS / "capital.yaml").read_text()
    terse.write_text(text.replace("max_value: 40", "max_value: 5"))
    report, ledger = await _simulate([terse], tmp_path)
    (episode,) = report.episodes
    assert episode.reward_parts["metric:words"] == 0.0
    assert episode.reward_parts["judge:success"] == 0.0 and episode.outcome == "fail"
    detail = {s.name: s.detail for s in ledger.scores(episode.session_id)}["judge:success"]
    assert detail["goal"] == "yes" and detail["failed_metrics"] == ["words"]


async def test_a_scripted_turns_scenario_runs_with_its_checks_scored(tmp_path):
    report, ledger = await _simulate([SCENARIOS / "scripted.yaml"], tmp_path)
    (episode,) = report.episodes
    assert episode.error is None, episode.error
    callers = [line.text for line in episode.transcript if line.speaker == "caller"]
    assert callers == ["What is the capital of Germany?", "And what is its river?"]
    assert episode.reward_parts == {
        "judge:success": 1.0,
        "tool_credit": 0.0,
        "metric:turn1.1.llm_started": 1.0,
        "metric:turn1.2.llm_response": 1.0,
        "metric:turn2.1.llm_response": 1.0,
        "metric:turn2.2.function_call": 1.0,
    }
    assert episode.outcome == "pass" and episode.end_reason == "caller_hung_up"


async def test_a_folder_mixing_kinds_runs_all_and_skips_what_it_cannot_run(tmp_path):
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING")
    try:
        scenarios = load_scenarios([SCENARIOS])
    finally:
        logger.remove(sink)
    assert sorted(s.id for s in scenarios) == ["capital/berlin", "scripted_capital/two_turns"]
    assert any("manifest.yaml" in w for w in warnings)
    assert any("dtmf.yaml" in w and "audio harness" in w for w in warnings)
    report, _ = await _simulate([SCENARIOS], tmp_path)
    assert sorted(e.outcome for e in report.episodes) == ["pass", "pass"]


def test_judge_and_simulator_blocks_pick_the_endpoint_or_name_the_flag(tmp_path):
    block = {"service": "ollama", "endpoint": "http://127.0.0.1:5/v1", "model": "gemma"}
    assert endpoint_for(block, where="judge.eval", flag="--judge-llm-url").model == "gemma"
    flag = resolve_endpoint(
        block, flag_url="http://127.0.0.1:7/v1", flag_model=None, served_url=None,
        where="judge.eval", flag="--judge-llm-url",
    )  # fmt: skip
    assert flag == Endpoint("http://127.0.0.1:7/v1", "base", source=flag.source)
    with pytest.raises(ConfigError, match="--persona-llm-url URL --persona-model NAME"):
        endpoint_for({"service": "openai"}, where="simulator", flag="--persona-llm-url")
    with pytest.raises(ConfigError, match="--judge-llm-url"):
        endpoint_for({"factory": "my.judge"}, where="judge.eval", flag="--judge-llm-url")


async def test_a_block_we_cannot_reach_stops_the_run_before_any_episode(tmp_path):
    scenario = tmp_path / "remote_judge.yaml"
    scenario.write_text(
        (SCENARIOS / "capital.yaml")
        .read_text()
        .replace(
            "judge:\n  modality: text",
            textwrap.dedent("""\
                judge:
                  modality: text
                  eval: {service: ollama, endpoint: "http://127.0.0.1:9/v1", model: gemma}"""),
        )
    )
    with pytest.raises(ServingError, match="--judge-llm-url URL --judge-model NAME"):
        await _simulate([scenario], tmp_path)  # a service that is not there (exit 69)
    assert Ledger(tmp_path / "l.db").sessions() == []
    (tmp_path / "flag").mkdir()
    report, _ = await _simulate([scenario], tmp_path / "flag", judge_flag=True)  # the flag wins
    assert report.episodes[0].reward_parts["judge:success"] == 1.0


def test_pipecat_accepts_what_we_accept_and_rejects_both_kinds_at_once(tmp_path):
    both = tmp_path / "both.yaml"
    both.write_text("name: x\npersona: p\ngoal: g\nsuccess: s\nturns: [{user: hi}]\n")
    with pytest.raises(Exception, match="not both"):
        load_scenarios([both])


def test_the_cli_names_the_flag_for_a_block_it_cannot_reach(tmp_path):
    from typer.testing import CliRunner

    from pipecat_rl.cli.common import EXIT_USAGE
    from tests.test_sim_episode import _cli

    scenario = tmp_path / "cloud_persona.yaml"
    scenario.write_text(
        (SCENARIOS / "capital.yaml")
        .read_text()
        .replace("judge:\n  modality: text", "simulator: {service: openai, model: gpt-4o}")
    )
    args = ["simulate", str(scenario), "--bot", BOT, "--no-server",
            "--ledger", str(tmp_path / "l.db")]  # fmt: skip
    result = CliRunner().invoke(_cli(), args)
    assert result.exit_code == EXIT_USAGE, result.output
    assert "--persona-llm-url" in result.output and "simulator.service 'openai'" in result.output


async def test_a_scripted_eval_check_without_a_judge_is_unscored_not_failed():
    (scenario,) = load_scenarios([SCENARIOS / "scripted.yaml"])
    transcript = [
        Line("caller", "What is the capital of Germany?", "", 1.0),
        Line("agent", "Berlin.", "", 2.0, answers=1),
        Line("caller", "And what is its river?", "", 3.0),
        Line("agent", "The Spree.", "", 4.0, answers=2),
    ]
    parts, details = await score_turns(scenario, transcript, [], None)
    assert parts == {
        "metric:turn1.1.llm_started": 1.0,
        "metric:turn1.2.llm_response": 1.0,
        "metric:turn2.2.function_call": 1.0,
    }  # no judge:success: the eval check could not be asked
    assert details["judge:success"]["unjudged_checks"] == ["metric:turn2.1.llm_response"]
    late = [line for line in transcript if line.text != "Berlin."]  # turn 1 went unanswered
    parts, _ = await score_turns(scenario, late, [], None)
    assert parts["metric:turn1.2.llm_response"] == 0.0 and parts["judge:success"] == 0.0


TWO_TURNS = """\
name: timed
scenarios:
  - name: capital
    {stop}turns:
      - user: "What is the capital of Germany?"
        expect:
{first}
      - user: "And what is its river?"
        expect:
          - event: llm_response
            text_contains: Spree
"""


def _two_turns(tmp_path, first: str, stop: str = "") -> Path:
    path = tmp_path / "timed.yaml"
    path.write_text(TWO_TURNS.format(first=textwrap.indent(textwrap.dedent(first), " " * 10),
                                     stop=f"{stop}\n    " if stop else ""))  # fmt: skip
    return path


def _slow_agent(body: dict) -> str:
    """The fixtures' agent and judge, the agent 300 ms slow to answer (a planted latency)."""
    if "response_format" not in body:
        time.sleep(0.3)
    return judge_and_agent(body)


async def test_within_ms_is_the_budget_a_reply_must_arrive_in(tmp_path):
    path = _two_turns(tmp_path, """\
        - event: llm_response
          text_contains: Berlin
          within_ms: 30000
        - event: llm_response
          text_contains: Berlin
          within_ms: 100
    """)  # fmt: skip
    async with serve_fake_openai([], answer=_slow_agent) as url:
        config = SimulationConfig(llm_url=url, persona="scripted")
        report = await simulate(load_scenarios([path]), load_bot(BOT), config,
                                Ledger(tmp_path / "l.db"))  # fmt: skip
    (episode,) = report.episodes
    assert episode.error is None, episode.error
    parts = episode.reward_parts
    assert parts["metric:turn1.1.llm_response"] == 1.0  # the same reply, in a 30 s budget
    assert parts["metric:turn1.2.llm_response"] == 0.0  # ...is 300 ms late for a 100 ms one
    assert parts["judge:success"] == 0.0
    reason = episode.score_details["metric:turn1.2.llm_response"]["reason"]
    assert "within 100 ms" in reason


async def test_within_ms_times_first_text_and_whole_replies_and_calls(tmp_path):
    path = _two_turns(tmp_path, """\
        - event: llm_started
          within_ms: 1000
        - event: llm_response
          text_contains: Berlin
          within_ms: 1000
        - event: function_call
          within_ms: 1000
        - event: function_call
          absent: true
          within_ms: 1000
    """)  # fmt: skip
    (scenario,) = load_scenarios([path])
    said = "What is the capital of Germany?"
    transcript = [  # first text 0.5 s after the send, the whole reply after 2.5 s
        Line("caller", said, said, 10.0),
        Line("agent", "Berlin.", "Berlin.", 12.5, latency_ms=500.0, answers=1),
    ]
    late = [ToolCallSeen("lookup", {}, at=11.5)]
    parts, _ = await score_turns(scenario, transcript, late, None)
    assert parts["metric:turn1.1.llm_started"] == 1.0
    assert parts["metric:turn1.2.llm_response"] == 0.0
    assert parts["metric:turn1.3.function_call"] == 0.0  # a call, but 1.5 s after the send
    assert parts["metric:turn1.4.function_call"] == 1.0  # so none arrived within the budget
    early = [ToolCallSeen("lookup", {}, at=10.2)]  # a bare function_call matches any call
    parts, _ = await score_turns(scenario, transcript, early, None)
    assert parts["metric:turn1.3.function_call"] == 1.0
    assert parts["metric:turn1.4.function_call"] == 0.0


@pytest.mark.parametrize("stop", ["", "stop_on_failure: true", "stop_on_failure: false"])
async def test_stop_on_failure_ends_the_scenario_at_its_first_failed_turn(tmp_path, stop):
    path = _two_turns(tmp_path, """\
        - event: llm_response
          text_contains: Paris
    """, stop)  # fmt: skip
    report, ledger = await _simulate([path], tmp_path)
    (episode,) = report.episodes
    assert episode.error is None, episode.error
    callers = [line.text for line in episode.transcript if line.speaker == "caller"]
    parts, details = episode.reward_parts, episode.score_details
    assert parts["metric:turn1.1.llm_response"] == 0.0 and parts["judge:success"] == 0.0
    if stop.endswith("false"):  # every turn driven and scored
        assert len(callers) == 2 and parts["metric:turn2.1.llm_response"] == 1.0
        assert details["judge:success"]["not_run_checks"] == []
    else:  # Pipecat's default: the caller hangs up after the failed turn
        assert callers == ["What is the capital of Germany?"]
        assert "metric:turn2.1.llm_response" not in parts
        assert details["judge:success"]["not_run_checks"] == ["metric:turn2.1.llm_response"]
        assert "stop_on_failure" in details["metric:turn2.1.llm_response"]["reason"]
    scores = {s.name for s in ledger.scores(episode.session_id)}
    assert scores == set(parts)


async def test_a_turn_failed_after_the_call_ends_the_scenario_in_the_score(tmp_path):
    path = _two_turns(tmp_path, """\
        - event: function_call
          calls: [get_weather]
    """)  # fmt: skip
    (scenario,) = load_scenarios([path])
    transcript = [
        Line("caller", "What is the capital of Germany?", "", 1.0),
        Line("agent", "Berlin.", "", 2.0, answers=1),
        Line("caller", "And what is its river?", "", 3.0),
        Line("agent", "The Spree.", "", 4.0, answers=2),
    ]
    parts, details = await score_turns(scenario, transcript, [], None)
    assert parts == {"judge:success": 0.0, "metric:turn1.1.function_call": 0.0}
    assert details["judge:success"]["not_run_checks"] == ["metric:turn2.1.llm_response"]


def test_pipecat_fields_the_simulator_does_not_honour_are_warnings_naming_them(tmp_path):
    path = tmp_path / "voiced.yaml"
    path.write_text(textwrap.dedent("""\
        name: voiced
        user: {modality: audio, speech: {service: kokoro, voice: af_heart}}
        judge: {modality: audio, transcription: {service: moonshine}}
        scenarios:
          - name: one
            turns:
              - user: "What is the capital of Germany?"
                expect:
                  - {event: response, text_contians: Berlin}
    """))  # fmt: skip
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING")
    try:
        (scenario,) = load_scenarios([path])
    finally:
        logger.remove(sink)
    text = "\n".join(warnings)
    assert "user.modality / user.speech: not used" in text
    assert "judge.modality / judge.transcription: not used" in text
    assert "voiced/one: turns.0.expect.0.text_contians: not a field of Pipecat's turns" in text
    assert scenario.parsed_turns[0].expect[0].text_contains is None  # Pipecat ignores it too
