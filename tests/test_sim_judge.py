"""The judge is Pipecat's own simulation judge over an OpenAI-compatible endpoint: the goal once
over the whole call (tool calls where they were made), each criterion once per agent turn."""

from pipecat_rl.scenarios.scenario import Metric, Scenario
from pipecat_rl.simulator.judge import Endpoint, ToolCallSeen, conversation, judge_call
from pipecat_rl.simulator.transport import Line
from tests.fake_openai import serve_fake_openai
from tests.pipecat_helpers import judge_and_agent

TRANSCRIPT = [
    Line("caller", "What is the capital of Germany?", "", 0.0),
    Line("agent", "Berlin.", "", 2.0),
    Line("caller", "You idiot.", "", 3.0),
    Line("agent", "Goodbye.", "", 4.0),
]
SCENARIO = Scenario(
    name="capital",
    persona="a traveler",
    goal="learn the capital",
    success="the bot said Berlin",
    metrics=[
        Metric(name="courteous", criterion="the reply is courteous", min_score=1),
        Metric(measure="turns", max_value=10),  # measured, not the judge's business
    ],
)


def test_tool_calls_sit_where_the_bot_made_them():
    calls = [ToolCallSeen("lookup", {"q": "Germany"}, 1.0, cancelled=True)]
    roles = [m["role"] for m in conversation(TRANSCRIPT, calls)]
    assert roles == ["user", "tool_call", "assistant", "user", "assistant"]


async def test_goal_and_criteria_are_judged_as_pipecat_judges_them():
    seen: list[tuple[str, dict]] = []
    async with serve_fake_openai([], answer=judge_and_agent, seen=seen) as url:
        judgement = await judge_call(SCENARIO, TRANSCRIPT[:2], [], Endpoint(url, "judge"))
        assert judgement.goal.verdict == "yes"
        (courteous,) = judgement.metrics
        assert (courteous.name, courteous.score, courteous.passed) == ("courteous", 1.0, True)

        insulted = await judge_call(SCENARIO, TRANSCRIPT, [], Endpoint(url, "judge"))
        assert insulted.goal.verdict == "no"
        (courteous,) = insulted.metrics
        assert courteous.score == 0.5 and not courteous.passed  # turn 2 follows the insult
    assert {body["model"] for _, body in seen} == {"judge"}
    assert all(body["response_format"]["type"] == "json_schema" for _, body in seen)


async def test_a_judge_that_cannot_answer_gives_no_verdict_not_a_guess():
    async with serve_fake_openai(["not json"]) as url:
        judgement = await judge_call(SCENARIO, TRANSCRIPT, [], Endpoint(url, "judge"))
    assert judgement.goal.verdict == "none"
    assert "did not answer with a JSON object" in judgement.goal.reason
    (courteous,) = judgement.metrics
    assert courteous.score is None and courteous.passed  # unscored, not a failed metric
    assert "did not answer with a JSON object" in courteous.reason
