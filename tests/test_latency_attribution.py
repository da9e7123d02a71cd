"""Each latency figure on its own turn: text mode's response gap runs from the caller's line to
the agent's first text; an audio session's voice-to-voice figures come from one source."""

import textwrap
from pathlib import Path

from pipecat_rl.ledger import LatencyRecord, Ledger
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate
from pipecat_rl.simulator.runner import EpisodeResult, caller_side_latencies
from pipecat_rl.simulator.transport import Line
from tests import paced_bots

CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic"


async def test_each_response_gap_is_its_turns_planted_model_time(tmp_path):
    scenario = tmp_path / "paced.yaml"
    scenario.write_text(
        textwrap.dedent(
            """
            name: paced
            persona: A caller with three questions.
            goal: Ask three questions, then hang up.
            success: The agent answered each.
            max_turns: 4
            script:
              opening: First question.
              rules:
                - {when: "Answer 1", say: "Second question."}
                - {when: "Answer 2", say: "Third question."}
                - {when: "Answer 3", say: "Bye.", end_call: true}
            """
        )
    )
    ledger = Ledger(tmp_path / "l.db")
    config = SimulationConfig(persona="scripted", concurrency=1)
    bot = load_bot(f"{Path(paced_bots.__file__)}:run_bot")
    report = await simulate(load_scenarios([scenario]), bot, config, ledger)
    (episode,) = report.episodes
    assert episode.error is None, episode.error
    agent = [x for x in episode.transcript if x.speaker == "agent"]
    assert [x.text for x in agent] == ["Answer 1.", "Answer 2.", "Answer 3."], agent
    gaps = [x.latency_ms for x in agent]
    for gap, delay in zip(gaps, paced_bots.DELAYS_S, strict=True):
        # Never below the planted time (the text cannot come before it); far under the next
        # turn's (a second apart), so each figure is its own turn's, whatever the machine's load.
        assert delay * 1000 <= gap < delay * 1000 + 800, (gaps, paced_bots.DELAYS_S)
    rows = ledger.latencies(episode.session_id)
    assert sorted(r.response_gap_ms for r in rows) == sorted(round(g, 3) for g in gaps), rows


async def test_a_reply_streaming_for_longer_than_max_silence_is_not_silence(tmp_path):
    """A text-mode turn reaches the caller whole, so the silence backstop watches the agent's
    frames: a reply still streaming is heard in full; a response that says nothing ends the call
    as silence."""
    scenario = tmp_path / "streamed.yaml"
    scenario.write_text(
        textwrap.dedent(
            """
            name: streamed
            persona: A patient caller.
            goal: Hear the answer out.
            success: The agent answered.
            max_silence_s: 1.0
            script:
              opening: First question.
              rules:
                - {when: "word by word", say: "And then?"}
              fallback: false
            """
        )
    )
    config = SimulationConfig(persona="scripted", concurrency=1)
    bot = load_bot(f"{Path(paced_bots.__file__)}:run_bot_streaming")
    report = await simulate(load_scenarios([scenario]), bot, config, Ledger(tmp_path / "l.db"))
    (episode,) = report.episodes
    said = [(x.speaker, x.text) for x in episode.transcript]
    assert len(paced_bots.STREAMED) * paced_bots.WORD_GAP_S > 1.0  # longer than the limit
    assert said == [
        ("caller", "First question."),
        ("agent", " ".join(paced_bots.STREAMED)),
        ("caller", "And then?"),
    ], said
    assert episode.end_reason == "silence"


def _audio_episode(v2v: dict[int, float]) -> EpisodeResult:
    lines = [
        Line("caller", "I want a real person. Please.", "", 1.0),
        Line("agent", "Transferring you.", "", 2.0, latency_ms=900.0),
        Line("caller", "Thanks.", "", 3.0),
        Line("agent", "Goodbye.", "", 4.0, latency_ms=700.0),
    ]
    return EpisodeResult(
        scenario_id="s", split="pool", repeat=0, seed=0, session_id="x", outcome="pass",
        transcript=lines, mode="audio", v2v_ms=v2v,
    )  # fmt: skip


def test_one_v2v_measurement_never_lands_on_two_turns():
    # The agent's VAD split the first line in two, so its recorder timed the answer as user turn
    # 1; the caller-side figure, kept per caller line, says turn 0. Both are the same answer.
    episode = _audio_episode({0: 1670.51, 1: 640.0})
    recorded = {1: LatencyRecord(session_id="x", user_turn=1, v2v_ms=1670.70)}
    rows = caller_side_latencies(episode, recorded)
    assert [(r.user_turn, r.heard_gap_ms) for r in rows] == [(0, 900.0), (1, 700.0)]
    assert all(r.v2v_ms is None for r in rows)  # the recorder's figures stand alone
    # A bot whose recorder timed nothing: the agent's own figures fill in, each on its line.
    rows = caller_side_latencies(episode, {})
    assert [(r.user_turn, r.v2v_ms) for r in rows] == [(0, 1670.51), (1, 640.0)]


async def test_a_holding_line_and_its_lookup_reach_the_caller_as_one_turn(tmp_path):
    """The clinic's expert says a holding line in the reply that starts a lookup: the caller
    hears it and the reply after the tool round as one turn, two sentences, and the recorder
    keeps the holding line beside the tool call in the demonstration the warm start learns."""
    clinic = CLINIC
    ledger = Ledger(tmp_path / "l.db")
    config = SimulationConfig(persona="scripted", concurrency=1)
    scenarios = load_scenarios([clinic / "handwritten" / "pool" / "routine_booking.yaml"])
    report = await simulate(scenarios, load_bot(str(clinic / "expert.py")), config, ledger)
    (episode,) = report.episodes
    assert episode.error is None and episode.outcome == "pass", episode.transcript
    holding = "One moment while I check that."
    joined = [x.text for x in episode.transcript if x.speaker == "agent" and holding in x.text]
    assert joined and all(t.startswith(f"{holding} ") and len(t) > len(holding) + 5 for t in joined)
    said = [t for t in ledger.turns(episode.session_id) if t.tool_calls]
    assert said and said[0].generated_text == holding and said[0].demonstration
