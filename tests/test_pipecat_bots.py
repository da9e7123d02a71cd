"""Bots written as Pipecat's examples write them: heard through an `LLMTextProcessor`, their own
(Flows-style) tool handlers credited, Pipecat Cloud's `bot(runner_args)` entry run as is."""

import textwrap

import pytest

from pipecat_rl.errors import SimulationError
from pipecat_rl.ledger import Ledger
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate
from tests.fake_openai import serve_fake_openai
from tests.pipecat_helpers import AGENT_SAYS, BOTS, SCENARIOS, judge_and_agent

CAPITAL = SCENARIOS / "capital.yaml"


async def _episode(bot: str, tmp_path, scenario=CAPITAL, served: bool = True):
    ledger = Ledger(tmp_path / "l.db")
    if not served:
        config = SimulationConfig(persona="scripted", concurrency=1)
        report = await simulate(load_scenarios([scenario]), load_bot(bot), config, ledger)
        return report.episodes[0], ledger
    async with serve_fake_openai([], answer=judge_and_agent) as url:
        config = SimulationConfig(llm_url=url, persona="scripted", concurrency=1)
        report = await simulate(load_scenarios([scenario]), load_bot(bot), config, ledger)
    return report.episodes[0], ledger


async def test_a_bot_speaking_through_llm_text_processor_is_heard_once(tmp_path):
    episode, _ = await _episode(str(BOTS / "text_processor_bot.py"), tmp_path)
    assert episode.error is None, episode.error
    agent = [line.text for line in episode.transcript if line.speaker == "agent"]
    assert agent and set(agent) == {AGENT_SAYS}  # the sentence, heard whole and not twice
    assert episode.end_reason == "caller_hung_up"
    assert episode.bypassed == ["CartesiaTTSService"]


async def test_a_flows_style_bots_own_functions_earn_tool_credit(tmp_path):
    scenario = tmp_path / "booking.yaml"
    scenario.write_text(
        textwrap.dedent("""\
            name: booking
            persona: A patient who wants a visit on Monday.
            goal: Book a visit on Monday.
            success: the bot booked a visit on Monday
            metrics:
              - measure: function_calls
                calls: [check_availability, {name: book_slot, args: {time: "10:00"}}, hold_slot]
            script:
              opening: I'd like to book a visit.
              rules:
                - {when: booked, say: "Thanks!", end_call: true}
                - {when: would you like, say: ""}  # the greeting: the opening already asked
        """)
    )
    episode, ledger = await _episode(str(BOTS / "flows_bot.py"), tmp_path, scenario, served=False)
    assert episode.error is None, episode.error
    assert [(e.name, e.ok) for e in episode.executions] == [
        ("check_availability", True),
        ("hold_slot", False),  # its handler raised: a failed call, not a broken episode
        ("book_slot", True),
    ]
    assert episode.reward_parts["tool_credit"] == pytest.approx(0.1)
    assert episode.reward_parts["metric:function_calls"] == 1.0
    assert "tool_error" in episode.labels
    recorded = [c.name for c in ledger.tool_calls(episode.session_id)]
    assert recorded == ["check_availability", "hold_slot", "book_slot"]  # written once each


@pytest.mark.parametrize("spec", ["cloud_bot.py", "function_calling.py:bot"])
async def test_pipecat_cloud_entry_gets_the_local_transport_from_create_transport(tmp_path, spec):
    episode, _ = await _episode(str(BOTS / spec), tmp_path)
    assert episode.error is None, episode.error
    assert AGENT_SAYS in [line.text for line in episode.transcript if line.speaker == "agent"]
    assert episode.reward_parts["judge:success"] == 1.0


def test_entry_parameters_get_documented_values_or_a_clear_error(tmp_path):
    bots = tmp_path / "telephony.py"
    bots.write_text(
        "async def twilio(transport, handle_sigint, testing, call_sid, stream_sid): pass\n"
        "async def custom(transport, runner_args, room_secret): pass\n"
        "async def bot(runner_args, sample_rate): pass\n"
    )
    assert load_bot(f"{bots}:twilio").parameters == (
        "handle_sigint", "testing", "call_sid", "stream_sid",
    )  # fmt: skip
    cloud = load_bot(f"{bots}:bot")
    assert cloud.takes_runner_args and cloud.parameters == ("sample_rate",)
    with pytest.raises(SimulationError, match="needs room_secret"):
        load_bot(f"{bots}:custom")
    assert load_bot(str(bots)).fn.__name__ == "bot"  # no run_bot: Pipecat Cloud's entry


def test_the_caller_hears_each_text_that_would_reach_tts_in_order_and_once():
    from pipecat.frames.frames import (
        AggregatedTextFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSSpeakFrame,
        TTSTextFrame,
    )

    from pipecat_rl.simulator.transport import _PairOutput

    heard: list[str] = []
    output = _PairOutput(lambda text, first: heard.append(text))
    output._observe(TTSSpeakFrame("Welcome."))  # a greeting spoken on its own: a turn
    sentence = AggregatedTextFrame("Hello there.", text_type="sentence")
    hidden = LLMTextFrame("(internal)")
    hidden.skip_tts = True
    frames = [
        LLMFullResponseStartFrame(),
        LLMTextFrame("Sure, "),
        LLMTextFrame("one moment."),
        sentence,
        TTSTextFrame("Hello", text_type="word", segment_id=sentence.id),  # part of `sentence`
        hidden,
        TTSTextFrame("Bye.", text_type="sentence"),
        LLMFullResponseEndFrame(),
    ]
    for frame in frames:
        output._observe(frame)
    assert heard == ["Welcome.", "Sure, one moment. Hello there. Bye."]
