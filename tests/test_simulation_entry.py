"""`simulator.run`: the one entry point every caller uses, and what it promises them."""

from pathlib import Path

import pytest
from pipecat.services.openai.llm import OpenAILLMService

from pipecat_rl import compat
from pipecat_rl.ledger import Ledger
from pipecat_rl.simulator import Server, SimulationOptions, load_bot, load_scenarios, run
from pipecat_rl.simulator.botloader import Episode, point_llm

CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic"
POOL = CLINIC / "handwritten" / "pool"


@pytest.fixture
def no_keys(monkeypatch):
    for key in ("DEEPGRAM_API_KEY", "CARTESIA_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)


def test_two_policies_run_interleaved_with_the_same_seeds(tmp_path, no_keys):
    scenarios = load_scenarios([POOL / "routine_booking.yaml", POOL / "handoff_request.yaml"])
    options = SimulationOptions(persona="scripted", repeats=2, concurrency=4, seed=3)
    with Ledger(tmp_path / "ledger.db") as ledger:
        report = run(
            scenarios, load_bot(str(CLINIC / "expert.py")), options, ledger,
            policies=["cand", "base"], source="gate", server=Server(needed=False),
        )  # fmt: skip
        sessions = ledger.sessions(source="gate")
    assert len(report.episodes) == 8 and all(e.error is None for e in report.episodes)
    by_policy: dict[str, dict[tuple[str, int], int]] = {}
    for s in sessions:
        by_policy.setdefault(s.policy, {})[(s.scenario_id, s.repeat)] = s.seed
    assert set(by_policy) == {"cand", "base"}
    assert by_policy["cand"] == by_policy["base"]  # run r of each arm shares its seed
    assert len(set(by_policy["base"].values())) == 4  # and the runs differ from one another


def test_only_the_scenarios_handed_over_run(tmp_path, no_keys):
    pool = load_scenarios([POOL])
    one = pool.model_copy(update={"scenarios": [s for s in pool if s.id == "routine_booking"]})
    options = SimulationOptions(persona="scripted", repeats=1)
    with Ledger(tmp_path / "ledger.db") as ledger:
        report = run(one, load_bot(str(CLINIC / "expert.py")), options, ledger,
                     server=Server(needed=False))  # fmt: skip
    assert [e.scenario_id for e in report.episodes] == ["routine_booking"]


def test_the_agent_samples_with_the_episode_seed_unless_the_bot_set_one():
    def llm(seed: int | None = None) -> OpenAILLMService:
        settings = OpenAILLMService.Settings(model="base", seed=seed)
        return OpenAILLMService(api_key="k", base_url="http://127.0.0.1:9/v1", settings=settings)

    episode = Episode(world=None, llm_url="http://127.0.0.1:9/v1", model="cand", seed=1234)
    unseeded, seeded = llm(), llm(seed=7)
    point_llm(unseeded, episode)
    point_llm(seeded, episode)
    assert compat.llm_settings(unseeded).seed == 1234  # what every request will carry
    assert compat.llm_settings(seeded).seed == 7  # the bot's own choice stands


def test_the_agent_reply_cap_reaches_the_request_of_chat_and_responses_services():
    """`--max-tokens` caps what each service actually sends; a bot's own cap stands."""
    from pipecat.services.openai.responses.llm import OpenAIResponsesLLMService

    url = "http://127.0.0.1:9/v1"
    episode = Episode(world=None, llm_url=url, model="cand", max_tokens=32)
    chat = OpenAILLMService(api_key="k", base_url=url)
    responses = OpenAIResponsesLLMService(api_key="k")
    own = OpenAIResponsesLLMService(
        api_key="k", settings=OpenAIResponsesLLMService.Settings(max_completion_tokens=7)
    )
    for llm in (chat, responses, own):
        point_llm(llm, episode)
    assert compat.llm_settings(chat).max_tokens == 32
    # The Responses API's only cap is `max_output_tokens`, which Pipecat fills from this field.
    assert responses._build_response_params({"input": []})["max_output_tokens"] == 32
    assert own._build_response_params({"input": []})["max_output_tokens"] == 7
