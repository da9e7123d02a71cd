"""The scenarios room: loading imports no episode machinery, and identity is canonical content."""

import subprocess
import sys
from pathlib import Path

import pytest

from pipecat_rl.errors import ScenarioError
from pipecat_rl.ledger import Ledger
from pipecat_rl.scenarios import load_scenario_file, load_scenarios
from pipecat_rl.scenarios.heldout import check_against_ledger
from pipecat_rl.scenarios.identity import hash_version
from pipecat_rl.scenarios.scenario import SCENARIO_SCHEMA_VERSION
from tests.pipecat_helpers import SCENARIOS

CLINIC = Path(__file__).resolve().parents[1] / "examples" / "clinic" / "handwritten"

BASE = """\
name: base
persona: "Ana,  calm."
goal: Book a cleaning.
success: booked
facts: {name: Ana, phone: "0611"}
metrics:
  - {measure: turns, max_value: 8}
  - {name: polite, criterion: stays polite}
verify:
  - unchanged: [patients, slots]
  - count: {table: appointments, equals: 1}
faults:
  - {tool: book, kind: error, on_call: 1}
  - {tool: book, kind: timeout, on_call: 2}
"""


def _hash(tmp_path: Path, text: str, name: str = "s.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    (scenario,) = load_scenario_file(path)
    return scenario.content_hash()


def test_loading_scenarios_imports_no_episode_machinery():
    code = f"""
import sys
from pipecat_rl.scenarios import load_scenarios
load_scenarios([{str(CLINIC)!r}])
persona_only = sorted(m for m in sys.modules if m.split(".")[0] == "pipecat")
load_scenarios([{str(SCENARIOS / "scripted.yaml")!r}])
machinery = ("pipecat_rl.simulator", "pipecat.pipeline", "pipecat.evals.judge")
episode = sorted(m for m in sys.modules if m.startswith(machinery))
print(persona_only, episode)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] []", out.stdout + out.stderr


def test_identity_ignores_spacing_order_and_what_is_not_content(tmp_path):
    base = _hash(tmp_path, BASE)
    same = [
        BASE.replace("Ana,  calm.", "Ana, calm. "),  # whitespace
        BASE.replace("[patients, slots]", "[slots, patients]"),  # unchanged: a set of tables
        BASE.replace(  # metrics: by name, not position
            "  - {measure: turns, max_value: 8}\n  - {name: polite, criterion: stays polite}",
            "  - {name: polite, criterion: stays  polite}\n  - {measure: turns, max_value: 8}",
        ),
        BASE.replace("name: base", "name: renamed") + "runs: 3\nsimulator: {model: other}\n",
    ]
    for i, text in enumerate(same):
        assert text != BASE
        assert _hash(tmp_path, text, f"same{i}.yaml") == base, text
    different = [
        BASE.replace("calm", "anxious"),
        BASE.replace("equals: 1", "equals: 2"),
        BASE.replace(
            "on_call: 1}\n  - {tool: book, kind: timeout, on_call: 2}",
            "on_call: 2}\n  - {tool: book, kind: timeout, on_call: 1}",
        ),
    ]  # faults keep their order: the first that matches fires
    for i, text in enumerate(different):
        assert _hash(tmp_path, text, f"other{i}.yaml") != base, text


def test_hashes_carry_their_schema_version_and_older_ones_are_not_compared(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(BASE)
    (scenario,) = load_scenario_file(path)
    assert hash_version(scenario.content_hash()) == SCENARIO_SCHEMA_VERSION
    assert hash_version("0123456789abcdef") is None  # a hash stored before versions
    with Ledger(tmp_path / "l.db") as ledger:
        ledger.record_heldout_hashes([("0123456789abcdef", scenario.id, "heldout-old")])
        check_against_ledger(ledger, [scenario])  # an old hash of the same id is no conflict
        current = f"s{SCENARIO_SCHEMA_VERSION}-0123456789abcdef"
        ledger.record_heldout_hashes([(current, scenario.id, "heldout-new")])
        with pytest.raises(ScenarioError, match="was held out with other content"):
            check_against_ledger(ledger, [scenario])


def test_the_clinic_pool_is_disjoint_from_its_heldout_set():
    both = load_scenarios([CLINIC / "pool", CLINIC / "heldout"])
    hashes = [s.content_hash() for s in both]
    assert len(set(hashes)) == len(hashes)
