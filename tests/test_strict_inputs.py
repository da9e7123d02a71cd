"""Strict reading of what users write: a switch is a boolean, a file is the format its suffix
names, a pattern compiles at load, a scores file is bounded; each refusal names the file and
the field (or the cap).
"""

import json
from pathlib import Path

import pytest

from pipecat_rl.errors import ConfigError, GateError, ScenarioError
from pipecat_rl.gate import inputs
from pipecat_rl.gate.config import load_gate_config
from pipecat_rl.gate.inputs import load_scores
from pipecat_rl.scenarios import load_scenario_file

NOT_BOOLEANS = ["'no'", '"yes"', "1", "0", "'false'"]


@pytest.mark.parametrize("value", NOT_BOOLEANS)
@pytest.mark.parametrize("field", ["require_latency", "require_guard"])
def test_a_switch_written_as_a_string_or_number_is_refused(tmp_path, field, value):
    config = tmp_path / "gate.yaml"
    config.write_text(f"gate:\n  tie_band: 0.05\n  {field}: {value}\n")
    with pytest.raises(GateError) as e:
        load_gate_config(config)
    assert f"{config}:3: {field}: must be true or false" in str(e.value)


@pytest.mark.parametrize("suffix", [".yaml", ".yml"])
def test_a_switch_written_as_a_boolean_is_read(tmp_path, suffix):
    config = tmp_path / f"gate{suffix}"
    config.write_text("require_latency: false\nrequire_guard: true\n")
    settings = load_gate_config(config)
    assert (settings.require_latency, settings.require_guard) == (False, True)


def test_a_json_switch_must_be_a_json_boolean(tmp_path):
    config = tmp_path / "gate.json"
    config.write_text(json.dumps({"require_latency": "no"}, indent=1))
    with pytest.raises(GateError) as e:
        load_gate_config(config)
    assert f"{config}:2: require_latency: must be true or false, not 'no'" in str(e.value)
    config.write_text(json.dumps({"gate": {"require_latency": False}}))
    assert load_gate_config(config).require_latency is False


def test_a_switch_given_as_an_override_is_strict_too():
    with pytest.raises(ConfigError, match="--require-latency"):
        load_gate_config(None, require_latency="no")


def test_a_json_file_holding_yaml_is_refused_naming_the_file(tmp_path):
    config = tmp_path / "gate.json"
    config.write_text("gate:\n  min_delta: 0.1\n")
    with pytest.raises(GateError) as e:
        load_gate_config(config)
    assert f"gate config {config} is not valid JSON" in str(e.value)


@pytest.mark.parametrize("name", ["gate.toml", "gate.txt", "gate"])
def test_a_config_of_another_suffix_is_refused_naming_the_file(tmp_path, name):
    config = tmp_path / name
    config.write_text("min_delta: 0.1\n")
    with pytest.raises(GateError) as e:
        load_gate_config(config)
    assert f"gate config {config}: name a .yaml, .yml or .json file" in str(e.value)


def test_a_bad_script_pattern_fails_at_load_naming_file_line_and_field(tmp_path):
    scenario = tmp_path / "pool" / "bad_rule.yaml"
    scenario.parent.mkdir()
    scenario.write_text(
        "name: bad_rule\npersona: a caller\ngoal: book\nsuccess: booked\n"
        "script:\n  rules:\n    - {when: 'name', say: Maria}\n    - {when: '(date', say: Monday}\n"
    )
    with pytest.raises(ScenarioError) as e:
        load_scenario_file(scenario)
    message = str(e.value)
    assert f"{scenario.resolve()}: line 8: script.rules.1.when" in message
    assert "not a valid regular expression" in message
    scenario.write_text(scenario.read_text().replace("(date", "(date|day)"))
    assert load_scenario_file(scenario)[0].script.rules[1].when == "(date|day)"


def _scores(tmp_path: Path, change: dict) -> Path:
    rows = [{"scenario": "s0", "policy": p, "run": 0, "reward": 1.0} for p in ("cand", "inc")]
    rows[0].update(change)
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"reward": "1.0"}, "reward"),
        ({"reward": True}, "reward"),
        ({"passed": "yes"}, "passed"),
        ({"guarded": "no"}, "guarded"),
        ({"guarded": 1}, "guarded"),
    ],
    ids=["string reward", "boolean reward", "string passed", "string guarded", "number guarded"],
)
def test_a_scores_value_of_the_wrong_type_names_its_own_field(tmp_path, change, field):
    path = _scores(tmp_path, change)
    with pytest.raises(GateError) as e:
        load_scores(path, "cand", "inc")
    assert str(e.value).startswith(f"{path}:1: {field}: ")


def test_a_scores_file_over_the_cap_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as f:
        f.truncate(inputs.MAX_SCORES_BYTES + 1)  # sparse: nothing to read, only a size
    with pytest.raises(GateError) as e:
        load_scores(path, "cand", "inc")
    assert f"the scores file {path} is over the 67,108,864-byte (64 MiB) cap" in str(e.value)


def test_the_cap_holds_for_a_file_that_reports_no_size(monkeypatch):
    unsized = Path("/proc/self/maps")  # st_size 0, yet many lines to read
    if not unsized.exists():
        pytest.skip("needs Linux's /proc")
    monkeypatch.setattr(inputs, "MAX_SCORES_BYTES", 64)
    with pytest.raises(GateError, match="is over the 64-byte"):
        load_scores(unsized, "cand", "inc")


def test_a_scores_file_at_the_cap_is_read(tmp_path, monkeypatch):
    path = _scores(tmp_path, {})
    monkeypatch.setattr(inputs, "MAX_SCORES_BYTES", path.stat().st_size)
    assert len(load_scores(path, "cand", "inc").runs) == 2


def test_a_scenario_switch_written_as_a_string_is_refused_naming_it(tmp_path):
    scenario = tmp_path / "pool" / "hang_up.yaml"
    scenario.parent.mkdir()
    scenario.write_text(
        "name: hang_up\npersona: a caller\ngoal: book\nsuccess: booked\n"
        "script:\n  rules:\n    - {when: 'bye', say: Bye, end_call: 'yes'}\n"
    )
    with pytest.raises(ScenarioError) as e:
        load_scenario_file(scenario)
    assert "script.rules.0.end_call" in str(e.value)
    scenario.write_text(scenario.read_text().replace("'yes'", "true"))
    assert load_scenario_file(scenario)[0].script.rules[0].end_call is True


def test_a_loop_switch_written_as_a_string_is_refused_naming_it(tmp_path):
    from pipecat_rl.loop.config import load_loop_config

    path = tmp_path / "loop.yaml"
    path.write_text("bot: bot.py\npool: pool\nheldout: heldout\ntrain: {verify_on_server: 'no'}\n")
    with pytest.raises(ConfigError, match="verify_on_server"):
        load_loop_config(path)


def test_a_loop_file_of_another_suffix_is_refused_naming_it(tmp_path):
    from pipecat_rl.loop.config import load_loop_config

    path = tmp_path / "loop.json"
    path.write_text('{"bot": "bot.py", "pool": "pool", "heldout": "heldout"}')
    with pytest.raises(ConfigError, match=r"loop.json: a loop file is YAML"):
        load_loop_config(path)
