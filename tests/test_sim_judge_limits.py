"""The judge's time limit is a setting, and what the judge could not answer is unscored with its
reason: never dropped, never a guessed "no", never a failure of the call."""

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from pipecat_rl.cli.common import EXIT_USAGE
from pipecat_rl.ledger import Ledger
from pipecat_rl.simulator import load_scenarios
from pipecat_rl.simulator.judge import Endpoint, judge_call
from pipecat_rl.simulator.options import DEFAULT_JUDGE_TIMEOUT_S, SimulationOptions
from pipecat_rl.simulator.pipecat_metrics import score_scenario
from pipecat_rl.simulator.runner import EpisodeResult
from pipecat_rl.simulator.script_turns import score_turns
from pipecat_rl.simulator.transport import Line
from tests.cli_helpers import invoke
from tests.pipecat_helpers import SCENARIOS
from tests.test_sim_judge import SCENARIO, TRANSCRIPT

CLINIC = "examples/clinic"


@asynccontextmanager
async def silent_server() -> AsyncIterator[str]:
    """An endpoint that accepts every request and never answers (a server under load)."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.read(65536)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        for writer in held:
            writer.close()
        server.close()


def test_the_default_limit_fits_the_embedded_server_and_is_validated():
    assert SimulationOptions().judge_timeout_s == DEFAULT_JUDGE_TIMEOUT_S >= 60
    with pytest.raises(ValueError, match="judge_timeout_s"):
        SimulationOptions(judge_timeout_s=0)


async def test_a_judge_that_does_not_answer_in_time_leaves_goal_and_metrics_unscored():
    async with silent_server() as url:
        judgement = await judge_call(SCENARIO, TRANSCRIPT, [], Endpoint(url, "judge"), 0.2)
    assert judgement.goal.verdict == "none"
    assert "did not answer within 0.2s" in judgement.goal.reason
    (courteous,) = judgement.metrics
    assert courteous.score is None and courteous.passed  # unscored, never a failed metric
    assert courteous.reason.startswith("unscored: the judge could not answer")
    assert "within 0.2s" in courteous.reason

    score = score_scenario(SCENARIO, TRANSCRIPT, [], judgement=judgement, end_reason=None)
    assert score.success is None
    assert score.parts() == {"metric:turns": 1.0}
    details = score.details()
    assert "within 0.2s" in details["judge:courteous"]["reason"]
    assert details["judge:success"]["unscored"] == ["courteous"]


def test_without_a_judgement_every_judged_metric_is_listed_unscored_with_why():
    score = score_scenario(
        SCENARIO, TRANSCRIPT, [], judgement=None, end_reason=None, unjudged="no judge to ask"
    )
    outcomes = {o.part: o for o in score.outcomes}
    assert set(outcomes) == {"judge:courteous", "metric:turns"}  # never dropped
    assert outcomes["judge:courteous"].score is None and outcomes["judge:courteous"].passed
    assert outcomes["judge:courteous"].reason == "unscored: no judge to ask"
    assert score.details()["judge:success"]["reason"] == "no judge to ask"


async def test_a_scripted_eval_the_judge_cannot_answer_is_unscored_not_failed():
    (scenario,) = load_scenarios([SCENARIOS / "scripted.yaml"])
    transcript = [
        Line("caller", "What is the capital of Germany?", "", 1.0),
        Line("agent", "Berlin.", "", 2.0, answers=1),
        Line("caller", "And what is its river?", "", 3.0),
        Line("agent", "The Spree.", "", 4.0, answers=2),
    ]
    async with silent_server() as url:
        parts, details = await score_turns(scenario, transcript, [], Endpoint(url, "j"), 0.2)
    check = "metric:turn2.1.llm_response"
    assert check not in parts and "judge:success" not in parts  # not a "no"
    assert details[check]["passed"] is None
    assert "did not answer within 0.2s" in details[check]["reason"]
    assert details["judge:success"]["unjudged_checks"] == [check]


def test_an_episode_keeps_every_unscored_part_with_its_reason():
    result = EpisodeResult(
        scenario_id="s", split="pool", repeat=0, seed=1, session_id="x", outcome="pass",
        reward_parts={"verifier": 1.0, "judge:polite": 1.0},
        score_details={
            "judge:polite": {"score": 1.0, "reason": "all 2 turn(s)"},
            "judge:success": {"goal": "none", "reason": "the judge could not answer: late"},
            "judge:brief": {"score": None, "reason": "unscored: the judge could not answer"},
        },
    )  # fmt: skip
    assert result.unscored == {
        "judge:success": "the judge could not answer: late",
        "judge:brief": "unscored: the judge could not answer",
    }


def test_simulate_records_what_was_not_judged_and_takes_the_limit_as_a_flag(tmp_path):
    ledger = tmp_path / "l.db"
    args = ["simulate", f"{CLINIC}/handwritten/pool/routine_booking.yaml",
            "--bot", f"{CLINIC}/expert.py", "--persona", "scripted", "--no-server",
            "--judge-timeout", "90", "--ledger", str(ledger), "--json"]  # fmt: skip
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    (episode,) = json.loads(result.stdout)["episodes"]
    assert "no judge to ask" in episode["unscored"]["judge:success"]
    with Ledger(ledger) as store:
        (session,) = store.sessions()
    assert session.metadata["unscored"] == episode["unscored"]

    refused = invoke(*args[:-1], "--judge-timeout", "0")
    assert refused.exit_code == EXIT_USAGE and "--judge-timeout" in refused.stderr
