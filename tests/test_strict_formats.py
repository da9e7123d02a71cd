"""One meaning per file: unknown keys, keys given twice and unreadable numbers are refused.

A scores line with a misspelt `unauthorised_writes` used to read as "no writes" and promote;
a gate config with `min_delta` twice meant its last spelling. Each case here names the file, the
line and the key, exits with EXIT_DATA, and reaches no verdict.
"""

import json
from pathlib import Path

import pytest

from pipecat_rl.cli.common import EXIT_DATA, EXIT_OK
from pipecat_rl.errors import ScenarioError
from pipecat_rl.scenarios import load_scenarios
from pipecat_rl.strict import loads_json, loads_yaml
from tests.test_gate_inputs import gate, lines

CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic"


def _text(rows: list[dict]) -> str:
    return "".join(json.dumps(x) + "\n" for x in rows)


def test_a_misspelt_key_is_refused_with_the_key_it_meant(tmp_path):
    rows = lines()
    rows[3]["unauthorised_writes"] = 2  # British spelling of the field: must not read as 0
    result, scores, err = gate(tmp_path, rows)
    assert result.exit_code == EXIT_DATA, err
    assert f"{scores}:4: unknown key 'unauthorised_writes'" in err
    assert "'unauthorized_writes'" in err  # what it most likely meant
    assert not (tmp_path / "r").exists()


def test_a_tools_own_data_goes_under_meta(tmp_path):
    rows = [dict(r, meta={"tool": "coval", "run_url": "x"}) for r in lines()]
    result, _, err = gate(tmp_path, rows, "--no-require-latency")
    assert result.exit_code != EXIT_DATA, err


@pytest.mark.parametrize(
    "line",
    [
        '{"scenario": "s0", "policy": "cand", "run": 0, "reward": 1.0, "reward": 0.0}',
        '{"scenario": "s0", "policy": "cand", "run": 0, "reward": ' + "9" * 5000 + "}",
        '{"scenario": "s0", "policy": "cand", "run": 0, "meta": ' + "[" * 100_000 + "]" * 100_000
        + ', "reward": 1.0}',
        '{"scenario": "' + "s" * 1_000_000 + '", "policy": "cand", "run": 0, "reward": 1.0}',
    ],
    ids=["duplicate-key", "5000-digit-int", "deep-nesting", "megabyte-name"],
)
def test_a_line_no_field_can_hold_is_a_data_error_naming_the_line(tmp_path, line):
    text = _text(lines()[:2]) + line + "\n" + _text(lines()[2:])
    result, scores, err = gate(tmp_path, text)
    assert result.exit_code == EXIT_DATA, err
    assert f"{scores}:3:" in err
    assert "unexpected" not in err and "report" not in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "name,text",
    [
        ("g.yaml", "min_delta: 0.1\nmin_delta: -0.2\n"),
        ("g.yaml", "gate:\n  tie_band: 0.1\n  tie_band: 0.2\n"),
        ("g.json", '{"min_delta": 0.1, "min_delta": -0.2}'),
    ],
)
def test_a_gate_config_that_names_a_key_twice_is_refused(tmp_path, name, text):
    config = tmp_path / name
    config.write_text(text)
    result, _, err = gate(tmp_path, lines(), "--config", str(config))
    assert result.exit_code == EXIT_DATA, err
    assert str(config) in err and "appears twice" in err


def test_the_same_config_once_is_read(tmp_path):
    config = tmp_path / "g.yaml"
    config.write_text("min_delta: -0.2\nrequire_latency: false\n")
    result, _, err = gate(tmp_path, lines(), "--config", str(config))
    assert result.exit_code == EXIT_OK, err


def test_a_scenario_file_that_names_a_key_twice_is_refused(tmp_path):
    text = (CLINIC / "handwritten" / "pool" / "routine_booking.yaml").read_text()
    bad = tmp_path / "twice.yaml"
    bad.write_text(text.replace("max_turns: 8\n", "max_turns: 8\nmax_turns: 30\n"))
    (tmp_path / "world.yaml").write_text((CLINIC / "handwritten" / "world.yaml").read_text())
    with pytest.raises(ScenarioError, match=r"twice.yaml.*'max_turns' appears twice"):
        load_scenarios([bad])


def test_the_readers_themselves():
    with pytest.raises(ValueError, match="'a' appears twice"):
        loads_json('{"a": 1, "b": {"c": 2}, "a": 3}')
    assert loads_json('{"a": {"a": 1}}') == {"a": {"a": 1}}  # nested, not repeated
    with pytest.raises(ValueError, match="too long"):
        loads_json("1" * 5000)
    with pytest.raises(ValueError, match="nested too deeply"):
        loads_json("[" * 100_000 + "]" * 100_000)
    assert loads_yaml("a: 1\nb: {a: 2}\n") == {"a": 1, "b": {"a": 2}}
    with pytest.raises(Exception, match="'a' appears twice"):
        loads_yaml("a: 1\nb: 2\na: 3\n")
