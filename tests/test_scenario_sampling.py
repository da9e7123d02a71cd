"""A fixed, stratified sample of a scenario set: what the main job gates on.

On the clinic matrix: every held-out combination drawn once before any twice, each axis spread
evenly, the same scenarios whatever order they were loaded in; in the cycle: the whole held-out
set frozen and kept out of training, the sample run; on the CLI: `--sample` lists and runs it.
"""

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from pipecat_rl.errors import ScenarioError
from pipecat_rl.ledger import Ledger
from pipecat_rl.loop.cycle import run_cycle
from pipecat_rl.scenarios import axes_of, load_scenarios
from pipecat_rl.scenarios.sampling import stratified_sample
from tests.cli_helpers import invoke
from tests.test_cycle import loop, world  # noqa: F401  (the fixture)

MATRIX = Path(__file__).resolve().parents[1] / "examples" / "clinic" / "scenarios"
HANDWRITTEN = MATRIX.parent / "handwritten"
UNIT = ("style", "task", "fault")


@pytest.fixture(scope="module")
def heldout():
    return load_scenarios([MATRIX / "heldout"])


@pytest.fixture(scope="module")
def pool():
    return load_scenarios([MATRIX / "pool"])


def combination(scenario) -> tuple[str, ...]:
    axes = axes_of(scenario.id)
    return tuple(axes[a] for a in UNIT)


def test_each_heldout_combination_is_drawn_once_before_any_twice(heldout):
    combinations = Counter(combination(s) for s in heldout)
    assert len(combinations) == 50 and len(heldout) == 100
    for n in (20, 50, 72, 99):
        drawn = Counter(combination(s) for s in stratified_sample(heldout, n, by=UNIT))
        assert sum(drawn.values()) == n
        if n <= 50:
            assert max(drawn.values()) == 1, n
        else:
            assert set(drawn) == set(combinations) and max(drawn.values()) == 2, n


def test_the_sample_spreads_every_axis_evenly(pool):
    sample = stratified_sample(pool, 49)  # 7 styles: 7 each
    styles = Counter(axes_of(s.id)["style"] for s in sample)
    assert len(styles) == 7 and set(styles.values()) == {7}
    for axis in ("task", "fault", "patient"):
        spread = Counter(axes_of(s.id)[axis] for s in sample)
        values = {axes_of(s.id)[axis] for s in pool}
        assert set(spread) == values, axis  # every value drawn
    # a plain first-49 (the files' order) would hold two styles only
    assert len({axes_of(s.id)["style"] for s in list(pool)[:49]}) < 7


def test_the_sample_is_fixed_whatever_the_load_order(heldout):
    first = [s.id for s in stratified_sample(heldout, 72, by=UNIT)]
    shuffled = list(heldout)
    random.Random(7).shuffle(shuffled)
    again = stratified_sample(heldout.model_copy(update={"scenarios": shuffled}), 72, by=UNIT)
    assert sorted(first) == sorted(s.id for s in again)
    assert [s.id for s in again] == [s.id for s in shuffled if s.id in set(first)]  # set order
    assert stratified_sample(heldout, 72, by=UNIT).heldout_set_id == heldout.heldout_set_id


def test_scenarios_without_axes_are_drawn_by_a_hash_of_their_id():
    loaded = load_scenarios([HANDWRITTEN / "pool"])
    sample = stratified_sample(loaded, 5)
    again = stratified_sample(loaded, 5)
    assert len(sample) == 5 and [s.id for s in sample] == [s.id for s in again]
    assert stratified_sample(loaded, 500) is loaded


def test_a_bad_sample_is_one_error_naming_it(heldout):
    with pytest.raises(ScenarioError, match="heldout_sample: 0 is not a sample size"):
        stratified_sample(heldout, 0, what="heldout_sample")
    with pytest.raises(ScenarioError, match=r"heldout_sample: clinic\[.*has no axis 'colour'"):
        stratified_sample(heldout, 5, by=("style", "colour"), what="heldout_sample")


# -- the CLI ---------------------------------------------------------------------------------------


def test_scenarios_list_shows_the_sample_simulate_and_gate_run():
    flags = ["--sample", "72", *[x for a in UNIT for x in ("--sample-by", a)]]
    result = invoke("scenarios", "list", str(MATRIX / "heldout"), *flags, "--json")
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert listed["counts"] == {"total": 72, "guarded": 72, "heldout": 72}
    expected = stratified_sample(load_scenarios([MATRIX / "heldout"]), 72, by=UNIT)
    assert [r["id"] for r in listed["scenarios"]] == [s.id for s in expected]
    whole = json.loads(invoke("scenarios", "list", str(MATRIX / "heldout"), "--json").stdout)
    assert whole["counts"]["total"] == 100 and whole["counts"]["guarded"] >= 60


def test_bad_sample_flags_are_usage_errors_naming_the_flag(tmp_path):
    held = str(MATRIX / "heldout")
    result = invoke("scenarios", "list", held, "--sample-by", "style")
    assert result.exit_code == 64 and "--sample-by needs --sample N" in result.output
    result = invoke("scenarios", "list", held, "--sample", "3", "--sample-by", "colour")
    assert result.exit_code == 64 and "no axis 'colour'" in result.output
    scores = tmp_path / "scores.jsonl"
    scores.write_text("")
    result = invoke("gate", "--candidate", "a", "--incumbent", "base", "--scores", str(scores),
                    "--sample", "3", "--ledger", str(tmp_path / "l.db"))  # fmt: skip
    assert result.exit_code == 64 and "--sample chooses the scenarios" in result.output


def test_simulate_runs_the_sample(tmp_path):
    ledger = tmp_path / "l.db"
    result = invoke(
        "simulate", str(HANDWRITTEN / "pool"), "--bot", str(MATRIX.parent / "expert.py"),
        "--persona", "scripted", "--no-server", "--ledger", str(ledger), "--json",
        "--sample", "3", "--repeats", "1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    expected = stratified_sample(load_scenarios([HANDWRITTEN / "pool"]), 3)
    with Ledger(ledger) as store:
        ran = {s.scenario_id for s in store.sessions()}
    assert ran == {s.id for s in expected}


# -- the cycle -------------------------------------------------------------------------------------


def test_a_cycle_gates_on_its_sample_and_keeps_the_whole_heldout_set_out_of_training(
    tmp_path, world  # noqa: F811
):
    clinic, training, vllm = world
    config = loop(tmp_path, clinic, vllm, heldout_sample={"size": 1}, pool_sample={"size": 1},
                  train={"warm_start": "always"})  # fmt: skip
    summary = run_cycle(config)
    snap = summary.stages["snapshot"]
    assert snap["heldout_scenarios"] == 2 and snap["heldout_sampled"] == 1
    assert snap["pool_scenarios"] == 2 and snap["pool_sampled"] == 1
    assert len(snap["heldout_hashes"]) == 2  # both frozen, both never trained on
    heldout = load_scenarios([config.heldout])
    (sampled,) = stratified_sample(heldout, 1)
    (pool_one,) = stratified_sample(load_scenarios([config.pool]), 1)
    assert summary.stages["evaluate"]["n_scenarios"] == 1
    with Ledger(tmp_path / "ledger.db") as ledger:
        assert {s.scenario_id for s in ledger.sessions(source="gate")} == {sampled.id}
        assert set(snap["heldout_hashes"].values()) <= set(ledger.heldout_hashes())
    filtered = summary.stages["filter"]
    assert set(filtered["scenario_files"]) == {pool_one.id}


def test_a_sample_by_an_axis_the_scenarios_lack_stops_the_cycle_naming_it(
    tmp_path, world  # noqa: F811
):
    clinic, training, vllm = world
    config = loop(tmp_path, clinic, vllm, heldout_sample={"size": 1, "by": ["style"]})
    with pytest.raises(ScenarioError, match="heldout_sample: .* has no axis 'style'"):
        run_cycle(config)
    assert not training.calls
