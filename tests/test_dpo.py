"""DPO on people's duel picks: the loss, and a run on a tiny model that learns the picks while
ties, both-bad and held-out duels never train (the guard first, as for every algorithm)."""

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.duels.make import find_moments, make_duels
from pipecat_rl.ledger import Ledger, SessionRecord
from pipecat_rl.ledger.duels import DuelReply
from pipecat_rl.training import TrainConfig, train
from pipecat_rl.training.dpo import DPOPair
from pipecat_rl.training.loss import dpo_loss
from tests.train_helpers import sample_turn, sequence_logprob


def test_the_loss_is_log_sigmoid_of_beta_times_the_reward_margin():
    loss, margin = dpo_loss(torch.tensor([-3.0]), torch.tensor([-5.0]), torch.tensor([-4.0]),
                            torch.tensor([-4.0]), beta=0.5)  # fmt: skip
    assert float(margin) == pytest.approx(0.5 * ((-3 + 4) - (-5 + 4)))
    assert float(loss) == pytest.approx(-math.log(1 / (1 + math.exp(-1.0))))
    same, zero = dpo_loss(*(torch.tensor([-2.0]),) * 4, beta=0.1)  # policy = reference
    assert float(zero) == 0 and float(same) == pytest.approx(math.log(2))


class Lengths:
    """`short` replies in 2 ids, `long` in 8 (fixed ids: only the length differs)."""

    def __call__(self, policy: str, prompt_ids: list[int], seed: int) -> DuelReply:
        ids = [500, 501] if policy == "short" else [600 + i for i in range(8)]
        return DuelReply(policy=policy, token_ids=ids, text=policy)


def _call(ledger: Ledger, model, tokenizer, sid: str, split: str | None = None) -> None:
    messages = [{"role": "user", "content": f"hi from {sid}"}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(rendered if isinstance(rendered, list) else rendered["input_ids"])
    turn = sample_turn(model, prompt, 4, session_id=sid, adapter="base",
                       request={"model": "base", "temperature": 1.0, "messages": messages})
    ledger.write_session(SessionRecord(id=sid, source="simulate", started_at=1.0, ended_at=2.0,
                                       outcome="pass", split=split), [turn])  # fmt: skip


def margin(model, pair: DPOPair) -> float:
    """log p(chosen) - log p(rejected) under `model`."""
    def logp(ids):
        return sequence_logprob(model, [*pair.prompt_ids, *ids],
                                [False] * len(pair.prompt_ids) + [True] * len(ids))
    return logp(pair.chosen_ids) - logp(pair.rejected_ids)


def test_dpo_learns_the_picks_and_never_trains_ties_both_bad_or_held_out(tmp_path, tiny_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    with Ledger(tmp_path / "l.db") as ledger:
        for sid in ("c1", "c22", "c333", "held"):
            _call(ledger, base, tokenizer, sid, split="heldout" if sid == "held" else None)
        duels = make_duels(ledger, find_moments(ledger, ["c1", "c22", "c333", "held"]),
                           ("short", "long"), Lengths(), n=4)  # fmt: skip
        by_session = {d.session_id: d for d in duels}
        for sid in ("c1", "c22"):
            ledger.vote(by_session[sid].id, "alice", "a")  # the shorter reply
        ledger.vote(by_session["c333"].id, "alice", "tie")
        ledger.vote(by_session["c333"].id, "bob", "both_bad")
        ledger.vote(by_session["held"].id, "alice", "b")  # held out: never trained
        config = TrainConfig(algo="dpo", base_model=str(tiny_dir), out_dir=tmp_path / "a",
                             steps=4, lr=5e-3, mini_batches=1, dpo_beta=0.5)  # fmt: skip
        result = train(ledger, config)
        assert result.guard["passed"] and result.session_ids == ["c1", "c22"]
        assert result.metrics["duel_votes_kept_out/tie"] == 1
        assert result.metrics["duel_votes_kept_out/both_bad"] == 1
        assert result.metrics["duel_votes_kept_out/call_not_trainable"] == 1
        assert result.metrics["pairs_trained"] == 2 and result.adapter.startswith("policy-dpo-v1")
        rows = [json.loads(x) for x in result.metrics_path.read_text().splitlines()]
        assert rows[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-4)  # starts at the parent
        assert rows[-1]["rewards/accuracies"] == 1.0 and rows[-1]["loss"] < math.log(2)
        pair = DPOPair("d", "c1", by_session["c1"].prompt_token_ids, [500, 501],
                       [600 + i for i in range(8)])  # fmt: skip
        trained = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_dir),
                                            result.path)  # fmt: skip
        assert margin(trained, pair) > margin(base, pair) + 0.1


def test_train_refuses_dpo_without_a_vote_that_may_train_before_loading_torch(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        ledger.write_session(SessionRecord(id="s", source="simulate", started_at=1.0), [])
    result = CliRunner().invoke(app, ["train", "--algo", "dpo", "--ledger", str(tmp_path / "l.db")])
    assert result.exit_code == 66 and "DPO has no pairs" in result.output
    assert "no votes" in result.output
