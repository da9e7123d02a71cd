"""RFT, the baseline every RL result is compared against: the parent is rolled out on the
scenarios (the stand-in vLLM serving a tiny model's real weights, one recorded turn per episode),
the passed rollouts are kept and trained on by SFT on their recorded ids, behind the guard; no
passed rollout, held-out scenarios and a run without scenarios are refused with the reason."""

from types import SimpleNamespace

import pytest

from pipecat_rl.cli.common import EXIT_USAGE
from pipecat_rl.errors import NoTrainingSignalError, TrainingError
from pipecat_rl.ledger import Ledger
from pipecat_rl.simulator import SimulationOptions
from pipecat_rl.simulator.options import Rollouts
from pipecat_rl.training import TrainConfig, train, trainer
from tests.cli_helpers import invoke
from tests.test_train_online import SCENARIOS, TinyVLLM, fake_run


@pytest.fixture
def served(tiny_dir, monkeypatch):
    """The stand-in vLLM, and `simulator.run` as `fake_run` (repeat 0 passes, repeat 1 fails)."""
    monkeypatch.setattr("pipecat_rl.simulator.run", fake_run)
    with TinyVLLM(tiny_dir) as server:
        yield server


def _rft(tiny_dir, tmp_path, **update) -> tuple[TrainConfig, Rollouts]:
    config = TrainConfig(
        base_model=str(tiny_dir), out_dir=tmp_path / "adapters", group_size=2, seed=3, epochs=2,
        holdout=0.0, **{"algo": "rft", "lr": 0.05, **update},
    )  # fmt: skip
    rollouts = Rollouts(scenarios=SCENARIOS, bot=None, options=SimulationOptions(max_tokens=4))
    return config, rollouts


def _rewriting(monkeypatch, **fields) -> None:
    """`fake_run`, its sessions recorded with `fields` changed (failed, or held out)."""

    def run(scenarios, bot, options, ledger, **kw):
        def write_session(session, turns):
            return ledger.write_session(session.model_copy(update=fields), turns)

        return fake_run(scenarios, bot, options, SimpleNamespace(write_session=write_session), **kw)

    monkeypatch.setattr("pipecat_rl.simulator.run", run)


def test_rft_trains_on_the_recorded_ids_of_the_passed_rollouts_only(
    served, tiny_dir, tmp_path, monkeypatch
):
    trained: list = []
    real = trainer.train_sft

    def train_sft(policy, sequences, config, **kw):
        trained.extend(sequences)
        return real(policy, sequences, config, **kw)

    monkeypatch.setattr(trainer, "train_sft", train_sft)
    config, rollouts = _rft(tiny_dir, tmp_path)
    rows: list[dict] = []
    with Ledger(tmp_path / "l.db") as ledger:
        result = train(
            ledger, config, server_url=served.url, rollouts=rollouts, progress=rows.append
        )
        sessions = ledger.sessions(limit=100)
        turns = {s.id: ledger.turns(s.id) for s in sessions}
        (record,) = ledger.adapters()
    passed = sorted(s.id for s in sessions if s.outcome == "pass")
    assert len(sessions) == len(SCENARIOS) * config.group_size and len(passed) == len(SCENARIOS)
    assert {s.policy for s in sessions} == {"base"}  # the parent rolled out
    assert result.adapter.split("-")[1:3] == ["rft", "v1"] and result.algo == "rft"
    assert result.session_ids == passed and record.training_data == passed
    assert record.training_run["guard"]["passed"]
    assert record.training_run["guard"]["source"] == "rollouts"
    assert result.adapter in served.listed  # loaded, and its canary moved off the parent's
    # SFT saw exactly the passed sessions' recorded prompt + sampled ids, loss on the sampled
    assert sorted(s.session_id for s in trained) == passed
    for seq in trained:
        (turn,) = turns[seq.session_id]
        assert seq.input_ids == [*turn.prompt_token_ids, *turn.completion_token_ids]
        assert seq.loss_mask == [False] * len(turn.prompt_token_ids) + [True] * len(
            turn.completion_token_ids
        )
    m = result.metrics
    assert (m["rollouts"], m["eligible_sessions"], m["passed_sessions"]) == (4, 4, 2)
    assert m["pass_rate"] == 0.5 and m["epochs"] == 2
    sft_rows = [r for r in rows if "loss" in r]
    assert sft_rows and all(r["step"] == 1 and r["total_steps"] == 1 for r in sft_rows)
    assert [r["sft_step"] for r in sft_rows] == list(range(1, len(sft_rows) + 1))
    assert all(r["guard/passed"] for r in sft_rows)


def test_rft_without_a_passed_rollout_stops_with_the_counts(
    served, tiny_dir, tmp_path, monkeypatch
):
    _rewriting(monkeypatch, outcome="fail", reward_parts={"verifier": 0.0})
    config, rollouts = _rft(tiny_dir, tmp_path)
    with Ledger(tmp_path / "l.db") as ledger:
        with pytest.raises(
            NoTrainingSignalError,
            match=r"RFT has nothing to imitate at step 1 of 1: 0 of the 4 rollouts that may train"
            r" passed; warm-start with --algo sft",
        ):
            train(ledger, config, server_url=served.url, rollouts=rollouts)
        assert ledger.adapters() == []
    assert served.listed == {}


def test_rft_on_held_out_scenarios_is_refused_as_every_online_run_is(
    served, tiny_dir, tmp_path, monkeypatch
):
    _rewriting(monkeypatch, split="heldout")
    for algo in ("rft", "grpo"):
        config, rollouts = _rft(tiny_dir, tmp_path / algo, algo=algo)
        with Ledger(tmp_path / algo / "l.db") as ledger:
            with pytest.raises(
                NoTrainingSignalError,
                match=r"none of the 4 rollouts step 1 of 1 ran under base may train: 4 are of "
                r"held-out scenarios, which never train",
            ):
                train(ledger, config, server_url=served.url, rollouts=rollouts)
            assert ledger.adapters() == []


def test_rft_needs_rollouts(tmp_path):
    config = TrainConfig(algo="rft", out_dir=tmp_path)
    with Ledger(tmp_path / "l.db") as ledger, pytest.raises(TrainingError, match="rollouts"):
        train(ledger, config, server_url="http://127.0.0.1:9/v1")
    result = invoke("train", "--algo", "rft", "--ledger", str(tmp_path / "l.db"))
    assert result.exit_code == EXIT_USAGE, result.output
    assert "--algo rft imitates the parent's own passed rollouts: give --scenarios and --bot" in (
        " ".join(result.output.split())
    )
    helped = " ".join(invoke("train", "--help").output.split())
    assert "rft (SFT on the parent's own passed rollouts" in helped


def test_online_rollouts_run_as_many_calls_at_once_as_asked(tmp_path, monkeypatch):
    """`--concurrency` reaches the rollouts' options (the server, not the default 4, bounds it)."""
    seen: list = []

    def train(ledger, config, *, rollouts, **kw):
        seen.append(rollouts.options)
        raise NoTrainingSignalError("stopped by the test")

    monkeypatch.setattr("pipecat_rl.training.train", train)
    result = invoke(
        "train", "--algo", "rft", "--scenarios", "examples/clinic/handwritten/pool",
        "--bot", "examples/clinic/bot.py", "--persona", "scripted", "--concurrency", "12",
        "--llm-url", "http://127.0.0.1:9/v1", "--ledger", str(tmp_path / "l.db"),
    )  # fmt: skip
    assert "stopped by the test" in result.output, result.output
    assert [(o.concurrency, o.persona) for o in seen] == [(12, "scripted")]
