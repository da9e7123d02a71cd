"""Every LLM service of a bot is pointed at the served model or refused, before any episode, and
no request ever leaves this machine (every socket destination is recorded and checked)."""

import os

import pytest

from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import Ledger
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate
from pipecat_rl.simulator.botloader import PLACEHOLDER, simulation_environment
from tests.fake_openai import serve_fake_openai
from tests.pipecat_helpers import AGENT_SAYS, BOTS, SCENARIOS, NetworkGuard, judge_and_agent

CAPITAL = SCENARIOS / "capital.yaml"


@pytest.fixture
def guard(monkeypatch):
    """Real-looking provider keys in the environment, and a record of every destination."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-looking-key")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-real-looking-key")
    return NetworkGuard(monkeypatch)


async def test_a_responses_api_bot_is_served_by_the_local_model(tmp_path, guard):
    seen: list[tuple[str, dict]] = []
    async with serve_fake_openai([], answer=judge_and_agent, seen=seen) as url:
        config = SimulationConfig(llm_url=url, persona="scripted", concurrency=1)
        with Ledger(tmp_path / "l.db") as ledger:
            report = await simulate(
                load_scenarios([CAPITAL]), load_bot(str(BOTS / "responses_bot.py")), config, ledger
            )
    (episode,) = report.episodes
    assert episode.error is None, episode.error
    assert episode.redirected == ["OpenAIResponsesLLMService"]
    assert [line.text for line in episode.transcript if line.speaker == "agent"] == [AGENT_SAYS]
    served = [body for path, body in seen if path == "/v1/responses"]
    assert served and {body["model"] for body in served} == {"base"}
    assert guard.destinations and guard.outside == []


async def test_a_provider_we_cannot_redirect_is_refused_before_any_episode(tmp_path, guard):
    async with serve_fake_openai([], answer=judge_and_agent) as url:
        config = SimulationConfig(llm_url=url, persona="scripted", concurrency=1)
        with Ledger(tmp_path / "l.db") as ledger:
            with pytest.raises(ConfigError) as refused:
                await simulate(
                    load_scenarios([CAPITAL]), load_bot(str(BOTS / "anthropic_bot.py")), config,
                    ledger,
                )  # fmt: skip
            assert ledger.sessions() == []  # before any episode
    message = str(refused.value)
    assert "AnthropicLLMService" in message and "--bot file.py:entry" in message
    assert guard.outside == []


async def test_no_served_model_means_an_openai_bot_is_refused_not_sent_out(tmp_path, guard):
    config = SimulationConfig(persona="scripted", concurrency=1)  # --no-server
    with Ledger(tmp_path / "l.db") as ledger, pytest.raises(ConfigError, match="--no-server"):
        await simulate(
            load_scenarios([CAPITAL]), load_bot(str(BOTS / "responses_bot.py")), config, ledger
        )
    assert guard.outside == []


def test_the_simulation_environment_holds_no_real_provider_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real")
    monkeypatch.setenv("MY_PROVIDER_API_KEY", "real")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "real")
    with simulation_environment(None, []):
        assert os.environ["OPENAI_API_KEY"] == PLACEHOLDER
        assert os.environ["MY_PROVIDER_API_KEY"] == PLACEHOLDER
        assert os.environ["AWS_SECRET_ACCESS_KEY"] == PLACEHOLDER
        assert os.environ["OPENAI_BASE_URL"].startswith("http://127.0.0.1:")
    assert os.environ["OPENAI_API_KEY"] == "sk-real"
