"""The one rubric: named parts with roles and weights, read by the simulator, trainer and gate."""

import pytest

from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import SessionRecord
from pipecat_rl.scoring.rubric import DEFAULT_RUBRIC, Part, Rubric, load_rubric
from pipecat_rl.scoring.score import gate_score
from pipecat_rl.training.advantage import rubric_reward
from pipecat_rl.training.config import TrainConfig
from pipecat_rl.training.grpo import build_groups, trained_reward

PARTS = {"verifier": 1.0, "tool_credit": 0.3, "judge:polite": 0.5, "metric:turns": 6.0}


def test_the_default_rubric_adds_tool_credit_to_the_verifier_and_ignores_the_rest():
    assert DEFAULT_RUBRIC.outcome_score(PARTS) == 1.0
    assert DEFAULT_RUBRIC.reward(PARTS) == pytest.approx(1.3)
    assert DEFAULT_RUBRIC.reward(PARTS, shaped=False) == 1.0
    assert DEFAULT_RUBRIC.reward({"tool_credit": 0.3}) is None  # unverified: no reward at all
    assert DEFAULT_RUBRIC.shown({"tool_credit": 0.3}) == 0.0


def test_weights_change_the_shaping_and_name_the_judged_parts():
    rubric = Rubric(parts={
        "verifier": Part(role="authoritative"),
        "tool_credit": Part(role="shaped", weight=0.5),
        "judge:polite": Part(role="judged", weight=0.2),
    })  # fmt: skip
    assert rubric.reward(PARTS) == pytest.approx(1.0 + 0.15 + 0.1)
    # A shaped part never passes a failing call: the outcome is the verifier's alone.
    assert rubric.outcome_score({**PARTS, "verifier": 0.0}) == 0.0


@pytest.mark.parametrize(
    "parts, needle",
    [
        ({"tool_credit": {"role": "authoritative"}}, "cannot be 'authoritative'"),
        ({"verifier": {"role": "shaped"}}, "cannot be 'shaped'"),
        ({"verifier": {"role": "authoritative", "weight": 2}}, "its weight is 1"),
    ],
)
def test_a_rubric_that_would_let_shaping_decide_is_refused(tmp_path, parts, needle):
    path = tmp_path / "rubric.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"parts": parts}))
    with pytest.raises(ConfigError, match=needle) as info:
        load_rubric(path)
    assert str(path) in str(info.value)


def test_a_rubric_file_is_read_by_its_suffix(tmp_path):
    good = tmp_path / "rubric.json"
    good.write_text('{"parts": {"tool_credit": {"role": "shaped", "weight": 0.25}}}')
    assert load_rubric(good).part("tool_credit").weight == 0.25
    yaml_in_json = tmp_path / "other.json"
    yaml_in_json.write_text("parts: {}\n")
    with pytest.raises(ConfigError, match="not valid json"):
        load_rubric(yaml_in_json)
    with pytest.raises(ConfigError, match="name a .yaml"):
        load_rubric(tmp_path / "rubric.txt")


def _session(i: int, verifier: float, credit: float) -> SessionRecord:
    return SessionRecord(
        id=f"s{i}", source="simulate", started_at=float(i), scenario_id="a", scenario_hash="h",
        split="pool", policy="base", reward_parts={"verifier": verifier, "tool_credit": credit},
    )  # fmt: skip


def test_grpo_advantages_follow_the_configured_rubric():
    # Same outcome, different tool credit: a group with signal only through shaping.
    sessions = [_session(0, 1.0, 0.1), _session(1, 1.0, 0.3)]
    shaped = TrainConfig(algo="grpo", positive_tool_credit=True)
    flat = shaped.model_copy(
        update={"rubric": Rubric(parts={"tool_credit": Part(role="shaped", weight=0.0)})}
    )
    assert build_groups(sessions, [], shaped).zero_std_groups == 0
    assert build_groups(sessions, [], flat).zero_std_groups == 1  # weight 0: no signal left
    assert rubric_reward(flat.rubric)(sessions[1]) == 1.0


def test_grpo_pays_no_positive_tool_credit_by_default_but_still_charges_failed_tools():
    # Two passes, one with more lookups: by default GRPO sees no reason to prefer acting more.
    more_lookups = [_session(0, 1.0, 0.1), _session(1, 1.0, 0.3)]
    config = TrainConfig(algo="grpo")
    assert not config.positive_tool_credit
    assert build_groups(more_lookups, [], config).zero_std_groups == 1
    assert trained_reward(config)(more_lookups[1]) == 1.0
    assert trained_reward(config.model_copy(update={"positive_tool_credit": True}))(
        more_lookups[1]
    ) == pytest.approx(1.3)
    # A failed tool execution still costs, on a pass as on a failure.
    failed_tool = [_session(0, 1.0, 0.0), _session(1, 1.0, -0.1)]
    groups = build_groups(failed_tool, [], config)
    assert groups.zero_std_groups == 0 and groups.rewards == [1.0, pytest.approx(0.9)]
    # The stored (shown) reward and the gate's score are untouched by the option.
    assert DEFAULT_RUBRIC.shown({"verifier": 1.0, "tool_credit": 0.3}) == pytest.approx(1.3)
    assert gate_score({"verifier": 1.0, "tool_credit": 0.3}, {}) == 1.0


@pytest.mark.parametrize("held", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("positive_tool_credit", [True, False])
def test_a_forbidden_write_scores_at_most_minus_one_however_close_the_call_came(
    held, positive_tool_credit
):
    parts = {"verifier": 0.0, "checks_held": held, "violations": 1.0, "tool_credit": 0.4}
    reward = DEFAULT_RUBRIC.reward(parts, positive_tool_credit=positive_tool_credit)
    assert reward is not None and reward <= -1.0
    assert DEFAULT_RUBRIC.reward({**parts, "violations": 2.0}) <= -2.0
    # Without the write, the same partial credit still orders failures above zero.
    assert DEFAULT_RUBRIC.reward({**parts, "violations": 0.0}) == pytest.approx(0.5 * held)


def test_a_failing_group_never_pays_for_extra_tool_calls():
    # Every run failed; one looked things up five times, one once: no gradient toward more calls.
    failing = [_session(0, 0.0, 0.1), _session(1, 0.0, 0.5)]
    assert build_groups(failing, [], TrainConfig(algo="grpo")).zero_std_groups == 1
    # A failed tool execution still costs a failed call, and a pass keeps its tool credit.
    assert DEFAULT_RUBRIC.reward({"verifier": 0.0, "tool_credit": -0.2}) == pytest.approx(-0.2)
    assert DEFAULT_RUBRIC.reward({"verifier": 1.0, "tool_credit": 0.3}) == pytest.approx(1.3)


def test_partial_credit_orders_failures_and_a_broken_hard_check_costs_more_than_it_can_earn():
    def reward(**parts: float) -> float:
        value = DEFAULT_RUBRIC.reward({"verifier": 0.0, "tool_credit": 0.0, **parts})
        assert value is not None
        return value

    closer, further = reward(checks_held=0.75), reward(checks_held=0.25)
    violated = reward(checks_held=0.9, violations=1.0)
    assert closer > further > reward(checks_held=0.0) == 0.0
    assert violated < 0.0 < further  # the forbidden write is worse than doing nothing at all
    assert max(closer, further) < DEFAULT_RUBRIC.reward({"verifier": 1.0, "checks_held": 0.0})
    # Training signal only: the outcome and the gate's score stay the verifier's.
    assert DEFAULT_RUBRIC.outcome_score({"verifier": 0.0, "checks_held": 0.9}) == 0.0
    assert DEFAULT_RUBRIC.reward({"verifier": 0.0, "checks_held": 0.9}, shaped=False) == 0.0
