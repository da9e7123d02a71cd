"""Scenarios: the files, their records, their identity and the held-out rule.

A package apart from episodes: loading a scenario imports nothing of the simulator (no judge, no
world execution, no Pipecat pipeline), so the trainer, the gate and the CLI read scenarios
cheaply; Pipecat's own scenario parser is imported only for a file with scripted `turns:`.

- `scenario`: the records (`Scenario`, `ScenarioSet` and their parts);
- `loading`: files and folders into records (`load_scenarios`, `load_scenario_file`);
- `matrix`: a template file's axes expanded into scenarios (`axes_of`, `scenario_level`);
- `identity`: a scenario's canonical content and its hash;
- `heldout`: the split from the folder, held-out copies and the ledger's memory of them;
- `turns`: a Pipecat scripted scenario's turns, as data;
- `yaml_safe`: the YAML loader with Pipecat's `!include` and limits.
"""

from pipecat_rl.scenarios.loading import load_scenario_file, load_scenarios
from pipecat_rl.scenarios.matrix import axes_of, expand_file, scenario_level
from pipecat_rl.scenarios.scenario import HELDOUT, MAX_RUNS, MAX_TURNS, POOL, Scenario, ScenarioSet

__all__ = [
    "HELDOUT",
    "MAX_RUNS",
    "MAX_TURNS",
    "POOL",
    "Scenario",
    "ScenarioSet",
    "axes_of",
    "expand_file",
    "load_scenario_file",
    "load_scenarios",
    "scenario_level",
]
