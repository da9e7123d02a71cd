"""Scenario matrices: a template file's axes expand into scenarios, in order, named by their axes,
each a `Scenario` like a hand-written one; bad axes fail naming the file and the axis."""

import json
import re
import textwrap
from pathlib import Path

import pytest

from pipecat_rl.cli.common import EXIT_DATA, EXIT_OK
from pipecat_rl.errors import ScenarioError
from pipecat_rl.scenarios import axes_of, expand_file, load_scenario_file, load_scenarios
from pipecat_rl.scenarios.matrix import (
    DEFAULT_MAX_SCENARIOS,
    MAX_SCENARIOS_LIMIT,
    scenario_id,
    scenario_level,
    split_id,
)
from tests.cli_helpers import invoke

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "scenario-matrix.yaml"
CLINIC = ROOT / "examples" / "clinic"

MATRIX = """
template:
  name: t
  persona: "{who.name}, a caller."
  goal: Ask about opening hours.
  success: The receptionist gave the opening hours.
  facts: {name: "{who.name}"}
axes:
  who:
    ann: {vars: {name: Ann Lee, row: 1}}
    bob: {vars: {name: Bob Ray, row: 2}, level: 2}
  mood:
    calm: {persona: Calm.}
    rushed:
      persona: In a hurry.
      max_turns: 4
      level: 1
      verify: [{not_exists: {table: appointments, where: {patient_id: "{who.row}"}}}]
"""
IDS = [
    "t[who=ann,mood=calm]",
    "t[who=ann,mood=rushed]",
    "t[who=bob,mood=calm]",
    "t[who=bob,mood=rushed]",
]


def write(folder: Path, text: str, name: str = "matrix.yaml") -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_expansion_is_deterministic_and_follows_declared_order(tmp_path):
    path = write(tmp_path, MATRIX)
    first, again = load_scenario_file(path), load_scenario_file(path)
    assert [s.id for s in first] == [s.id for s in again] == IDS
    hashes = [s.content_hash() for s in first]
    assert hashes == [s.content_hash() for s in again] and len(set(hashes)) == 4
    by_id = {s.id: s for s in first}
    rushed_bob = by_id["t[who=bob,mood=rushed]"]
    assert rushed_bob.persona == "Bob Ray, a caller. In a hurry."  # template's text, then axes'
    assert rushed_bob.facts == {"name": "Bob Ray"} and rushed_bob.max_turns == 4
    assert by_id["t[who=ann,mood=calm]"].max_turns == 20  # nothing set it: Scenario's default
    assert [scenario_level(s) for s in first] == [0, 1, 2, 3]  # the sum of the values' levels
    assert [e.level for e in expand_file(path)] == [0, 1, 2, 3]
    assert [len(s.verify) for s in first] == [0, 1, 0, 1]  # no combination leaks into another
    assert [s.guarded for s in first] == [False, True, False, True]


def test_a_respelled_template_expands_to_the_same_scenarios(tmp_path):
    """Keys reordered, flow style for block style, quoting changed: same ids, same hashes."""
    respelled = """
    axes:
      who: {ann: {vars: {row: 1, name: 'Ann Lee'}}, bob: {level: 2, vars: {row: 2, name: Bob Ray}}}
      mood:
        calm: {persona: 'Calm.'}
        rushed: {level: 1, max_turns: 4, persona: In a hurry.,
                 verify: [{not_exists: {where: {patient_id: '{who.row}'}, table: appointments}}]}
    template: {facts: {name: '{who.name}'}, success: The receptionist gave the opening hours.,
               goal: Ask about opening hours., persona: '{who.name}, a caller.', name: t}
    """
    one = load_scenario_file(write(tmp_path / "a", MATRIX))
    two = load_scenario_file(write(tmp_path / "b", respelled))
    assert [(s.id, s.content_hash()) for s in one] == [(s.id, s.content_hash()) for s in two]


def test_ids_parse_back_into_their_axes(tmp_path):
    for e in expand_file(write(tmp_path, MATRIX)):
        assert axes_of(e.name) == e.axes
        assert split_id(e.name) == ("t", e.axes)
        assert scenario_id("t", e.axes) == e.name
    assert axes_of("clinic[style=terse,task=book,patient=tom]") == {
        "style": "terse",
        "task": "book",
        "patient": "tom",
    }
    for plain in ("routine_booking", "calls/routine", "a[b]", "a[b=c,b=d]", "a[b=c]x", "[b=c]"):
        assert axes_of(plain) is None, plain


def test_exclude_and_include_only_pick_combinations(tmp_path):
    def ids(extra: str) -> list[str]:
        return [s.id for s in load_scenario_file(write(tmp_path, MATRIX + extra))]

    assert ids("exclude: [{who: bob, mood: rushed}]") == IDS[:3]
    assert ids("include_only: [{mood: rushed}]") == [IDS[1], IDS[3]]
    assert ids("include_only: [{who: [ann, bob], mood: calm}, {who: bob, mood: rushed}]") == [
        IDS[0],
        IDS[2],
        IDS[3],
    ]
    assert ids("include_only: [{mood: rushed}]\nexclude: [{who: ann}]") == [IDS[3]]


def test_placeholders_fill_every_string_and_keep_a_lone_value_typed(tmp_path):
    rushed = load_scenario_file(write(tmp_path, MATRIX))[1]
    where = rushed.verify[0].not_exists.where
    assert where == {"patient_id": 1} and isinstance(where["patient_id"], int)
    assert rushed.facts["name"] == "Ann Lee" and rushed.persona.startswith("Ann Lee, a caller.")


def _error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as caught:
        load_scenario_file(path)
    message = str(caught.value)
    assert str(path) in message, message
    return message


BAD_AXES = [
    (
        "exclude: [{colour: red}]",
        r"line \d+: exclude\.0\.colour: unknown axis 'colour' \(the axes: who, mood\)",
    ),
    (
        "include_only: [{who: carl}]",
        r"line \d+: include_only\.0\.who: axis 'who' has no value 'carl' \(its values: ann, bob\)",
    ),
    ("exclude: [{mood: [calm, sleepy]}]", r"axis 'mood' has no value 'sleepy'"),
    ("include_only: [{who: []}]", r"include_only\.0\.who: axis 'who': name at least one value"),
    ("axes: {who: {ann: {}}, mood: {}}", r"axes\.mood: axis 'mood' is empty"),
    (
        "axes: {who: {ann: {Persona: Ann.}}}",
        r"axes\.who\.ann\.Persona: axis 'who': value 'ann': "
        r"'Persona' is not a scenario field",
    ),
    ("axes: {who: {ann: {name: x}}}", r"axes\.who\.ann\.name: .*'name' is set by the expansion"),
    ("axes: {who: {ann: {level: -1}}}", r"axes\.who\.ann\.level: .*an integer, 0 or more"),
    (
        "axes: {who: {ann: {vars: {yes: Y}}}}",
        r"axis 'who': value 'ann': var name True: .* quote the name",
    ),
    ("axes: {who: {a b: {}}}", r"axis 'who': value name 'a b'"),
    ("axes: {who: [{name: Ann}]}", r"axes\.who\.0: axis 'who': row 1 needs the column 'id'"),
    ("axes: {who: [{id: x}, {id: x}]}", r"axis 'who': two rows are named 'x'"),
    ("axes: {}", r"axes: a template file needs `axes:`"),
    ("persona: loose", r"persona: unknown key in a template file"),
    ("exclude: [{who: [ann, bob]}]", r"exclude: every combination of the axes is excluded"),
]


@pytest.mark.parametrize(("extra", "expected"), BAD_AXES)
def test_bad_axes_fail_naming_the_file_and_the_axis(tmp_path, extra, expected):
    text = MATRIX.split("axes:")[0] + extra if extra.startswith("axes:") else MATRIX + extra
    message = _error(tmp_path, text)
    assert re.search(expected, message), message


def test_two_values_that_contradict_fail_unless_excluded(tmp_path):
    text = MATRIX.replace(
        "bob: {vars: {name: Bob Ray, row: 2}, level: 2}",
        "bob: {vars: {name: Bob Ray, row: 2}, level: 2, max_turns: 6}",
    )
    message = _error(tmp_path, text)
    assert re.search(
        r"line \d+: axes\.mood\.rushed\.max_turns: axis 'mood': mood=rushed contradicts who=bob in "
        r"t\[who=bob,mood=rushed\]: both set max_turns \(6 vs 4\)",
        message,
    ), message
    loaded = load_scenario_file(write(tmp_path, text + "exclude: [{who: bob, mood: rushed}]"))
    assert [s.max_turns for s in loaded] == [20, 4, 6]  # a value overrides the template


def test_an_unknown_placeholder_is_an_error_naming_the_axis(tmp_path):
    message = _error(tmp_path, MATRIX.replace("{who.name}, a caller.", "{who.nick}, a caller."))
    assert "persona: unknown placeholder {who.nick} in t[who=ann,mood=calm]" in message
    assert "axis 'who': who=ann has no var 'nick' (its vars: name, row)" in message
    message = _error(tmp_path, MATRIX.replace("{who.name}, a caller.", "{whom.name}, a caller."))
    assert "no axis 'whom' (the axes: who, mood)" in message


def test_a_field_an_axis_value_gets_wrong_names_the_combination(tmp_path):
    message = _error(tmp_path, MATRIX.replace("max_turns: 4", "max_turns: 0"))
    assert "max_turns" in message and "(in t[who=ann,mood=rushed]" in message


def test_the_expansion_cap(tmp_path):
    message = _error(tmp_path, MATRIX + "max_scenarios: 3")
    assert re.search(
        r"line \d+: max_scenarios: the axes expand to 4 scenarios \(who 2 x mood 2\),"
        r" over max_scenarios 3",
        message,
    ), message
    assert len(load_scenario_file(write(tmp_path, MATRIX + "max_scenarios: 4"))) == 4
    message = _error(tmp_path, MATRIX + f"max_scenarios: {MAX_SCENARIOS_LIMIT + 1}")
    assert f"max_scenarios: must be an integer from 1 to {MAX_SCENARIOS_LIMIT:,}" in message
    wide = "\n".join(f"    v{i}: {{}}" for i in range(DEFAULT_MAX_SCENARIOS // 2 + 1))
    message = _error(tmp_path, MATRIX + f"  many:\n{wide}\n")  # 2 x 2 x 501 by default
    assert (
        f"the axes expand to 2,004 scenarios (who 2 x mood 2 x many 501), over max_scenarios "
        f"{DEFAULT_MAX_SCENARIOS:,}" in message
    )


def test_rows_come_from_an_included_table(tmp_path):
    write(
        tmp_path,
        "- {id: ann, name: Ann Lee, row: 1}\n- {id: 7, name: Bob Ray, row: 2, level: 3}\n",
        "people.yaml",
    )
    write(tmp_path, "lee: {name: Ann Lee, row: 1}\nray: {name: Bob Ray, row: 2}\n", "by_name.yaml")
    text = MATRIX.replace(
        "  who:\n    ann: {vars: {name: Ann Lee, row: 1}}\n"
        "    bob: {vars: {name: Bob Ray, row: 2}, level: 2}\n",
        "  who: !include people.yaml\n",
    )
    listed = load_scenario_file(write(tmp_path, text))
    assert [s.id for s in listed][::2] == ["t[who=ann,mood=calm]", "t[who=7,mood=calm]"]
    assert listed[2].persona == "Bob Ray, a caller. Calm." and scenario_level(listed[3]) == 4
    keyed = text.replace("who: !include people.yaml", "who: {table: !include by_name.yaml}")
    keyed = keyed.replace("name: t\n", "name: k\n")
    assert [s.id for s in load_scenario_file(write(tmp_path, keyed, "keyed.yaml"))][::2] == [
        "k[who=lee,mood=calm]",
        "k[who=ray,mood=calm]",
    ]
    # a folder is read as simulate reads it: the tables the templates include are not scenarios
    assert len(load_scenarios([tmp_path])) == 8


def test_a_template_in_heldout_is_held_out(tmp_path):
    held = load_scenario_file(write(tmp_path / "heldout", MATRIX))
    assert {s.split for s in held} == {"heldout"}
    message = _error(
        tmp_path / "pool", MATRIX.replace("  name: t\n", "  name: t\n  split: heldout\n")
    )
    assert re.search(r"line \d+: split: 'heldout' contradicts its folder pool/", message)


def test_scenarios_list_json_and_table(tmp_path):
    path = write(tmp_path / "heldout", MATRIX)
    result = invoke(
        "scenarios",
        "list",
        str(path),
        str(CLINIC / "handwritten/pool/routine_booking.yaml"),
        "--json",
    )
    assert result.exit_code == EXIT_OK, result.output
    listed = json.loads(result.stdout)
    assert listed["counts"] == {"total": 5, "guarded": 3, "heldout": 4}
    first, *_, plain = listed["scenarios"]
    assert first == {
        "id": IDS[0],
        "template": "t",
        "axes": {"who": "ann", "mood": "calm"},
        "level": 0,
        "guarded": False,
        "split": "heldout",
        "hash": load_scenario_file(path)[0].content_hash(),
        "file": str(path),
    }
    assert [s["level"] for s in listed["scenarios"]] == [0, 1, 2, 3, None]
    assert plain["id"] == "routine_booking" and plain["template"] is plain["axes"] is None
    table = invoke("scenarios", "list", str(path))
    assert table.exit_code == EXIT_OK, table.output
    assert all(i in table.stdout for i in IDS)  # ids whole: brackets are not markup
    assert "4 scenarios: 2 guarded, 4 held out" in table.stdout
    bad = write(tmp_path, MATRIX + "exclude: [{colour: red}]", "bad.yaml")
    refused = invoke("scenarios", "list", str(bad), "--json")
    assert refused.exit_code == EXIT_DATA
    assert "unknown axis 'colour'" in json.loads(refused.stdout)["error"]


def test_the_example_runs_through_the_simulator_into_the_ledger(tmp_path, monkeypatch):
    """The documented example on the clinic's world and expert: every expanded id is a session."""
    from pipecat_rl.ledger import Ledger
    from pipecat_rl.simulator import Server, SimulationOptions, load_bot, run

    for key in ("DEEPGRAM_API_KEY", "CARTESIA_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    scenarios = load_scenarios([EXAMPLE])
    expected = [e.name for e in expand_file(EXAMPLE)]
    assert [s.id for s in scenarios] == expected and len(expected) == 6
    options = SimulationOptions(persona="scripted", repeats=1, concurrency=3, seed=1)
    with Ledger(tmp_path / "ledger.db") as ledger:
        report = run(
            scenarios,
            load_bot(str(CLINIC / "expert.py")),
            options,
            ledger,
            server=Server(needed=False),
        )
        sessions = ledger.sessions(limit=100)
    assert sorted(s.scenario_id for s in sessions) == sorted(expected)
    assert all(e.error is None and e.passed for e in report.episodes), report.episodes
    by_id = {s.id: s.content_hash() for s in scenarios}
    assert {s.scenario_id: s.scenario_hash for s in sessions} == by_id
