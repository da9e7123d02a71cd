"""Judged metrics: one constrained yes/no verdict per agent turn, the share that passed."""

from pipecat_rl.simulator.judge import judge_metrics
from pipecat_rl.simulator.scenario import Metric
from pipecat_rl.simulator.transport import Line
from tests.fake_openai import serve_fake_openai

TRANSCRIPT = [
    Line("caller", "How much is whitening?", "How much is whitening?", 0.0),
    Line("agent", "I can't quote prices.", "I can't quote prices.", 1.0),
    Line("caller", "Roughly?", "Roughly?", 2.0),
    Line("agent", "Please ask the front desk.", "Please ask the front desk.", 3.0),
]
METRICS = [
    Metric(name="no_price", criterion="Never states a price.", min_score=1),
    Metric(measure="turns", max_value=10),  # measured, not judged: not the judge's business
]


async def test_every_agent_turn_is_judged_and_the_score_is_the_share_that_passed():
    async with serve_fake_openai(["yes"], vllm=True) as url:
        assert await judge_metrics(METRICS, TRANSCRIPT, llm_url=url) == {"no_price": 1.0}
    async with serve_fake_openai(["no"], vllm=True) as url:
        assert await judge_metrics(METRICS, TRANSCRIPT, llm_url=url) == {"no_price": 0.0}


async def test_a_judge_that_refuses_leaves_the_metric_unscored():
    async with serve_fake_openai(["yes"]) as url:  # not vLLM: rejects structured outputs
        assert await judge_metrics(METRICS, TRANSCRIPT, llm_url=url) == {}


async def test_nothing_to_judge_asks_nothing():
    assert await judge_metrics(METRICS[1:], TRANSCRIPT, llm_url="http://127.0.0.1:9/v1") == {}
    assert await judge_metrics(METRICS, TRANSCRIPT[:1], llm_url="http://127.0.0.1:9/v1") == {}
