import json
import textwrap
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from pipecat_rl.cli import simulate as simulate_cli
from pipecat_rl.cli.common import EXIT_DATA, EXIT_FAILURE
from pipecat_rl.errors import SimulationError
from pipecat_rl.ledger import Ledger
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate

ROOT = Path(__file__).resolve().parents[1]
CLINIC = ROOT / "examples" / "clinic"
POOL = CLINIC / "handwritten" / "pool"
EXPERT = str(CLINIC / "expert.py")
SCRIPTED = SimulationConfig(persona="scripted", concurrency=4)


@pytest.fixture
def no_keys(monkeypatch):
    for key in ("DEEPGRAM_API_KEY", "CARTESIA_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)


async def run(paths, bot, tmp_path, config=SCRIPTED):
    ledger = Ledger(tmp_path / "ledger.db")
    report = await simulate(load_scenarios(paths), load_bot(bot), config, ledger)
    return report, ledger


async def test_scripted_agent_books_correctly_and_scores_one(tmp_path, no_keys):
    report, ledger = await run([POOL / "routine_booking.yaml"], EXPERT, tmp_path)
    (episode,) = report.episodes
    assert episode.outcome == "pass" and episode.error is None
    assert episode.reward_parts == {
        "verifier": 1.0, "checks_held": 0.0, "violations": 0.0, "tool_credit": 0.3
    }  # fmt: skip
    assert episode.end_reason == "caller_hung_up" and episode.labels == []
    session = ledger.session(episode.session_id)
    assert (session.source, session.scenario_id, session.split) == (
        "simulate",
        "routine_booking",
        "pool",
    )
    assert (session.seed, session.repeat, session.policy) == (episode.seed, 0, "base")
    assert session.outcome == "pass" and session.reward == pytest.approx(1.3)
    assert session.reward_parts == episode.reward_parts and session.scenario_hash
    assert {s.name: s.value for s in ledger.scores(session.id)} == episode.reward_parts
    calls = [c for c in ledger.tool_calls(session.id) if c.state_diff and "world" in c.state_diff]
    assert [c.name for c in calls] == ["lookup_patient", "find_slots", "book"]
    assert calls[-1].state_diff["world"]["appointments"]["added"][0]["slot_id"] == 11
    assert session.metadata["transcript"][0]["speaker"] == "agent"


async def test_deepgram_cartesia_bot_runs_keyless_and_unmodified(tmp_path, no_keys):
    report, ledger = await run([POOL / "handoff_request.yaml"], EXPERT, tmp_path)
    (episode,) = report.episodes
    assert episode.outcome == "pass"
    assert episode.bypassed == ["DeepgramSTTService", "CartesiaTTSService"]
    assert ledger.session(episode.session_id).metadata["bypassed"] == episode.bypassed


async def test_an_agent_that_cannot_do_the_job_scores_zero(tmp_path):
    bot = tmp_path / "chatty.py"
    bot.write_text(
        textwrap.dedent("""
        from pipecat.frames.frames import LLMRunFrame
        from pipecat.pipeline.pipeline import Pipeline
        from pipecat.pipeline.worker import PipelineWorker
        from pipecat.processors.aggregators.llm_context import LLMContext
        from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
        from pipecat.workers.runner import WorkerRunner
        from pipecat_rl.simulator import ScriptedLLMService, ScriptedReply

        async def run_bot(transport, handle_sigint):
            llm = ScriptedLLMService(lambda messages: ScriptedReply("Hello! How can I help?"))
            context = LLMContext()
            user, assistant = LLMContextAggregatorPair(context)
            pipeline = Pipeline([transport.input(), user, llm, transport.output(), assistant])
            worker = PipelineWorker(pipeline)

            @transport.event_handler("on_client_connected")
            async def connected(transport, client):
                await worker.queue_frames([LLMRunFrame()])

            @transport.event_handler("on_client_disconnected")
            async def disconnected(transport, client):
                await worker.cancel()

            runner = WorkerRunner(handle_sigint=handle_sigint)
            await runner.add_workers(worker)
            await runner.run()
    """)
    )
    report, ledger = await run([POOL / "routine_booking.yaml"], str(bot), tmp_path)
    (episode,) = report.episodes
    assert episode.outcome == "fail" and episode.reward == 0.0  # doing nothing earns nothing
    assert episode.reward_parts["checks_held"] == 0.0 and episode.reward_parts["violations"] == 0
    assert episode.end_reason == "caller_hung_up" and episode.executions == []
    assert ledger.session(episode.session_id).reward == 0.0


async def test_injected_fault_and_recovery_show_in_labels(tmp_path, no_keys):
    report, _ = await run([POOL / "tool_timeout_recovery.yaml"], EXPERT, tmp_path)
    (episode,) = report.episodes
    assert [(e.name, e.fault) for e in episode.executions] == [
        ("lookup_patient", None),
        ("find_slots", "timeout"),
        ("find_slots", None),
        ("book", None),
    ]
    assert episode.outcome == "pass" and episode.labels == ["tool_error", "recovered"]
    assert episode.reward_parts["tool_credit"] == pytest.approx(0.2)


async def test_two_episodes_of_one_scenario_start_identical(tmp_path, no_keys):
    config = SimulationConfig(persona="scripted", repeats=2, concurrency=2)
    report, ledger = await run([POOL / "routine_booking.yaml"], EXPERT, tmp_path, config)
    first, second = report.episodes
    assert first.outcome == second.outcome == "pass"  # the second booked slot 11 too: no leak
    assert first.seed != second.seed
    assert [e.repeat for e in report.episodes] == [0, 1]
    assert len(ledger.sessions()) == 2


@pytest.mark.slow
@pytest.mark.shares_machine
async def test_whole_clinic_pool_with_the_expert(tmp_path, no_keys):
    report, ledger = await run([POOL, CLINIC / "handwritten" / "heldout"], EXPERT, tmp_path)
    assert report.harness_errors == 0
    assert len(ledger.sessions()) == len(report.episodes) >= 24
    heldout = [s for s in ledger.sessions() if s.split == "heldout"]
    assert heldout and all(s.heldout_set_id == report.heldout_set_id for s in heldout)
    passed = sum(1 for e in report.episodes if e.outcome == "pass")
    assert passed >= 20, [(e.scenario_id, e.outcome) for e in report.episodes]


def test_bot_signatures_are_inspected(tmp_path):
    bot = tmp_path / "bots.py"
    bot.write_text(
        "async def a(transport): pass\n"
        "async def b(transport, runner_args, wait_for_user): pass\n"
        "async def c(t, handle_sigint, extra=1): pass\n"
        "async def d(transport, session): pass\n"
    )
    assert load_bot(f"{bot}:a").parameters == ()
    assert load_bot(f"{bot}:b").parameters == ("runner_args", "wait_for_user")
    assert load_bot(f"{bot}:c").parameters == ("handle_sigint",)
    with pytest.raises(SimulationError, match="needs session"):
        load_bot(f"{bot}:d")
    with pytest.raises(SimulationError, match="no `run_bot` or `bot`"):
        load_bot(str(bot))


def _cli() -> typer.Typer:
    app = typer.Typer()
    simulate_cli.register(app)

    @app.callback()
    def main() -> None:
        pass

    return app


def test_cli_json_and_exit_codes(tmp_path, no_keys):
    args = ["simulate", str(POOL / "routine_booking.yaml"), str(POOL / "out_of_scope.yaml"),
            "--bot", EXPERT, "--persona", "scripted", "--no-server",
            "--ledger", str(tmp_path / "l.db"), "--json"]  # fmt: skip
    result = CliRunner().invoke(_cli(), args)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert {e["outcome"] for e in payload["episodes"]} == {"pass"}
    assert {s["scenario_id"] for s in payload["scenarios"]} == {"routine_booking", "out_of_scope"}

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\npersona: p\n")
    result = CliRunner().invoke(_cli(), ["simulate", str(bad), "--bot", EXPERT, "--no-server"])
    assert result.exit_code == EXIT_DATA and "goal" in result.output

    result = CliRunner().invoke(
        _cli(),
        [
            "simulate",
            str(POOL / "routine_booking.yaml"),
            "--bot",
            EXPERT,
            "--no-server",
            "--ledger",
            str(tmp_path / "l.db"),
        ],  # fmt: skip
    )
    # the LLM persona with no server: the episodes cannot run
    assert result.exit_code == EXIT_FAILURE and "could not run" in result.output


async def test_overlapping_simulations_restore_the_environment(monkeypatch):
    import asyncio
    import os

    from pipecat_rl.simulator import botloader
    from pipecat_rl.simulator.botloader import simulation_environment

    # This test's simulations only: in one local run (after the gate, service-job and promote
    # tests in one process) another test's simulation was still inside its environment here,
    # so the last of these two out was not the last of all (docs/flaky.md).
    monkeypatch.setattr(botloader, "_environment_users", 0)
    monkeypatch.delenv("PIPECAT_SETUP_FILES", raising=False)
    before = dict(os.environ)

    async def one(delay: float) -> None:
        with simulation_environment("http://127.0.0.1:1/v1", [Path("/tmp/hook.py")]):
            await asyncio.sleep(delay)
            assert os.environ["PIPECAT_SETUP_FILES"] == "/tmp/hook.py"

    await asyncio.gather(one(0.05), one(0.1))  # the first out must not undo the second
    assert dict(os.environ) == before


async def test_the_callers_non_fatal_errors_are_logged_and_the_bots_are_kept():
    from pipecat.frames.frames import ErrorFrame

    from pipecat_rl.simulator.botloader import error_recorder

    silent = ErrorFrame(error="TTS context c1 completed with no audio")
    broken = ErrorFrame(error="the TTS is gone", fatal=True)
    bot, caller = [], []
    for frame in (silent, broken):
        await error_recorder(bot)("BotWorker", frame)
        await error_recorder(caller, fatal_only=True)("PersonaWorker", frame)
    assert bot == [f"BotWorker: {silent.error}", f"BotWorker: {broken.error}"]
    assert caller == [f"PersonaWorker: {broken.error}"]


def test_a_pack_calling_sys_exit_on_import_is_exit_65_not_0(tmp_path):
    pack = tmp_path / "exiting_pack.py"
    pack.write_text("import sys\nsys.exit(0)\n")
    path = tmp_path / "exiting.yaml"
    path.write_text(
        "name: exiting\npersona: A caller.\ngoal: Ask.\nsuccess: Answered.\n"
        f"script: {{opening: Hello.}}\nworld: {{pack: {pack}}}\n"
    )
    args = ["simulate", str(path), "--bot", EXPERT, "--persona", "scripted", "--no-server",
            "--ledger", str(tmp_path / "l.db")]  # fmt: skip
    result = CliRunner().invoke(_cli(), args)
    assert result.exit_code == EXIT_DATA, result.output
    assert "exiting.yaml: world.pack" in result.stderr and "sys.exit(0)" in result.stderr
