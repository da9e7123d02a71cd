from pathlib import Path

import pytest

from pipecat_rl.errors import ScenarioError
from pipecat_rl.scenarios import load_scenario_file
from pipecat_rl.simulator import load_scenarios

CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic" / "handwritten"

PIPECAT_FORMAT = """\
name: diner
persona: "Jamie, calling a restaurant. Friendly and to the point."
success: "the bot did what the caller asked and confirmed it"
judge:
  eval: {service: openai, model: base}
metrics:
  - name: politeness
    criterion: "the bot stayed courteous throughout"
    min_score: 0.5
  - measure: turns
    max_value: 8
scenarios:
  - name: book
    goal: "Book a table for two at 6 PM tonight, then end the call."
    max_turns: 3
  - name: cancel
    goal: "Cancel tonight's booking under the name Jamie, then end the call."
    runs: 2
"""


def test_clinic_pool_and_heldout_load():
    pool = load_scenarios([CLINIC / "pool"])
    heldout = load_scenarios([CLINIC / "heldout"])
    assert len(pool) >= 16 and len(heldout) >= 8
    assert {s.split for s in pool} == {"pool"}
    assert {s.split for s in heldout} == {"heldout"}
    assert pool.heldout_set_id is None
    assert heldout.heldout_set_id and heldout.heldout_set_id.startswith("heldout-")
    both = load_scenarios([CLINIC / "pool", CLINIC / "heldout"])
    assert both.heldout_set_id == heldout.heldout_set_id


def test_heldout_id_is_frozen_by_file_contents(tmp_path):
    for name in ("a", "b"):
        (tmp_path / "heldout").mkdir(exist_ok=True)
        (tmp_path / "heldout" / f"{name}.yaml").write_text(
            f"name: {name}\npersona: p\ngoal: g\nsuccess: s\n"
        )
    first = load_scenarios([tmp_path / "heldout"]).heldout_set_id
    assert load_scenarios([tmp_path / "heldout"]).heldout_set_id == first
    (tmp_path / "heldout" / "b.yaml").write_text("name: b\npersona: p\ngoal: g2\nsuccess: s\n")
    assert load_scenarios([tmp_path / "heldout"]).heldout_set_id != first


def test_scenario_hash_is_content_identity():
    a, b = load_scenarios([CLINIC / "pool"]).scenarios[:2]
    assert a.content_hash() == load_scenario_file(a.source_path)[0].content_hash()
    assert a.content_hash() != b.content_hash()


def test_pipecat_simulated_scenario_file_loads(tmp_path):
    path = tmp_path / "diner.yaml"
    path.write_text(PIPECAT_FORMAT)
    book, cancel = load_scenario_file(path)
    assert book.name == "diner/book" and cancel.name == "diner/cancel"
    assert book.max_turns == 3 and cancel.runs == 2 and book.persona.startswith("Jamie")
    assert [m.key for m in book.metrics] == ["politeness", "turns"]
    assert book.judge == {"eval": {"service": "openai", "model": "base"}}
    assert book.split == "pool" and book.world.state == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: x\npersona: p\ngoal: g\nsuccess: s\nmax_turns: many\n", ["line 5", "max_turns"]),
        ("name: x\npersona: p\ngoal: g\nsuccess: s\nmood: happy\n", ["line 5", "mood", "unknown"]),
        ("name: x\ngoal: g\nsuccess: s\n", ["persona", "missing"]),
        ("name: x\npersona: [unclosed\n", ["invalid YAML", "line"]),
        (
            "name: x\npersona: p\ngoal: g\nsuccess: s\n"
            "faults:\n  - {tool: book, kind: boom, on_call: 1}\n",
            ["line 6", "faults.0.kind"],
        ),
    ],
    ids=["wrong-type", "unknown-field", "missing-persona", "bad-yaml", "bad-fault"],
)
def test_bad_files_give_one_clear_error(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenarios([path])
    message = str(info.value)
    assert str(path) in message
    assert len(message.splitlines()) == 1
    for part in expected:
        assert part in message


def test_missing_path_is_a_scenario_error(tmp_path):
    with pytest.raises(ScenarioError, match="no such scenario"):
        load_scenarios([tmp_path / "nope.yaml"])
