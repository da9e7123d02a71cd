"""Text mode's response gap runs from the caller's line to the agent's first text, on its turn."""

import textwrap
from pathlib import Path

from pipecat_rl.ledger import Ledger
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate
from tests import paced_bots


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
