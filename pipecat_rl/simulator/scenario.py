"""Scenario files: a superset of Pipecat's simulated-scenario YAML, validated with pydantic.

Pipecat's own keys (`name`, `persona`, `goal`, `success`, `metrics`, `max_turns`,
`max_duration_s`, `max_silence_s`, `runs`, `simulator`, `user`, `judge`) mean what
`pipecat.evals.simulation` says they mean; a file Pipecat accepts, we accept, including the
`scenarios:` list whose file-level keys are defaults and whose scenarios are named
`<file name>/<scenario name>`, scripted scenarios (`turns:`, `context:`, `stop_on_failure:`,
checked by Pipecat's own parser and run by `simulator.script_turns`), and a metric's older
`min_quality` (read as `min_score`). A file the simulator cannot run (a manifest listing other
files, a scripted scenario whose checks need audio or timing) is skipped with a warning naming
it, and the others run. Ours are:

```yaml
facts: {name: Maria Lopez, phone: "0612345678"}   # the caller gives these only when asked
world:
  pack: ../../world.py        # tool implementations + schema (path relative to this file)
  state: {patients: [{id: 1, name: Maria Lopez}]}  # the initial rows, per table
verify:                       # checks on the final world state (the authoritative reward)
  - exists: {table: appointments, where: {patient_id: 1}}
  - not_exists: {table: appointments, where: {patient_id: 2}}
  - unchanged: [patients]
  - count: {table: appointments, equals: 1}
faults:                       # injected into tool executions, seeded per episode
  - {tool: find_slots, kind: timeout, on_call: 1}
  - {tool: book, kind: error, probability: 0.3, message: "database busy"}
channel: {mode: text, asr_noise: {digits: 0.1, letters: 0.1, drop_words: 0.05}}
split: pool                   # or heldout; the nearest pool/ or heldout/ folder decides
                              # (a split: that contradicts it is an error; see `heldout`)
script:                       # optional scripted caller (deterministic tests)
  opening: null
  rules: [{when: "name", say: "Maria Lopez"}, {when: "booked", say: "Thanks!", end_call: true}]
```

Errors name the file, the line, the field and the reason (`ScenarioError`).
"""

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from loguru import logger
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipecat_rl.errors import ScenarioError, UnsupportedScenarioError
from pipecat_rl.simulator import heldout
from pipecat_rl.simulator.heldout import HELDOUT, POOL
from pipecat_rl.simulator.yaml_safe import load_yaml, read_text

SCENARIO_SCHEMA_VERSION = 1
"""Bumped when the meaning of a scenario field changes (part of every scenario's hash)."""

MAX_RUNS = 1000
"""Most runs of one scenario (`runs:`, `--repeats`): more is a typo, not an experiment."""
MAX_TURNS = 500
"""Most turns one simulated call may take (`max_turns:`)."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Metric(_Model):
    """A Pipecat simulation metric: judged (`criterion`) or measured (`measure`)."""

    name: str | None = None
    criterion: str | None = None
    min_score: float | None = Field(default=None, ge=0, le=1)
    min_quality: float | None = Field(default=None, ge=0, le=1, exclude=True)
    """An older spelling of `min_score` that Pipecat still reads."""
    measure: Literal["turns", "duration", "words", "latency", "function_calls"] | None = None
    min_value: float | None = None
    max_value: float | None = None
    calls: list[str | dict[str, Any]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _older_names(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("min_quality") is not None:
            data = {**data, "min_score": data.get("min_score", data["min_quality"])}
        return data

    @model_validator(mode="after")
    def _one_kind(self) -> "Metric":
        if (self.criterion is None) == (self.measure is None):
            raise ValueError("a metric is judged ('criterion') or measured ('measure'), not both")
        if self.name is None and self.measure is None:
            raise ValueError("a judged metric needs a 'name'")
        return self

    @property
    def key(self) -> str:
        """The metric's name (a measured metric defaults to its measure)."""
        return self.name or str(self.measure)


class WorldSpec(_Model):
    """The world a scenario runs against: which pack of tools, and its initial rows."""

    pack: str | None = None
    """A Python file (relative to the scenario file) or module defining the world pack."""
    state: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)


class Where(_Model):
    """A row selector: the table and column values every matching row has."""

    table: str
    where: dict[str, Any] = Field(default_factory=dict)


class Count(Where):
    """How many rows match: exactly `equals`, or within `min`..`max`."""

    equals: int | None = Field(default=None, ge=0)
    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _bounded(self) -> "Count":
        if self.equals is None and self.min is None and self.max is None:
            raise ValueError("a count check needs 'equals', 'min' or 'max'")
        return self


class Check(_Model):
    """One verify check; exactly one of its keys is set."""

    exists: Where | None = None
    not_exists: Where | None = None
    unchanged: list[str] | None = None
    count: Count | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "Check":
        given = [k for k in ("exists", "not_exists", "unchanged", "count") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(
                "each check has exactly one of exists, not_exists, unchanged, count "
                f"(got {', '.join(given) or 'none'})"
            )
        return self

    @field_validator("unchanged", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class Fault(_Model):
    """A fault injected into a tool: on its n-th call, or with a probability, or both."""

    tool: str
    kind: Literal["timeout", "error"] = "error"
    on_call: int | None = Field(default=None, ge=1)
    """1-based: the n-th call of this tool fails."""
    probability: float | None = Field(default=None, ge=0, le=1)
    message: str | None = None

    @model_validator(mode="after")
    def _when(self) -> "Fault":
        if self.on_call is None and self.probability is None:
            raise ValueError("a fault needs 'on_call' (the n-th call) or 'probability'")
        return self


class AsrNoise(_Model):
    """Per-word rates of the text-mode ASR-noise model."""

    digits: float = Field(default=0.0, ge=0, le=1)
    """A digit is replaced by one that sounds alike (five/nine, three/two...)."""
    letters: float = Field(default=0.0, ge=0, le=1)
    """A spelled letter is replaced by one that sounds alike (B/D/P/T/V, M/N, S/F...)."""
    drop_words: float = Field(default=0.0, ge=0, le=1)


class Channel(_Model):
    """How the caller and the agent hear each other."""

    mode: Literal["text", "audio"] = "text"
    asr_noise: AsrNoise | None = None
    tts_voice: str | None = None
    background_noise: str | None = None
    """Audio mode: a 16-bit WAV file of noise (relative to the scenario), mixed at `snr_db`."""
    # -- audio mode only (see `simulator.audio.channel`) --
    stt: Literal["whisper", "deepgram"] | None = None
    """Who hears the caller when the bot's own STT cannot run offline (deepgram needs a key)."""
    tts: Literal["piper", "cartesia"] | None = None
    """Who speaks the caller and stands in for an online bot TTS (cartesia needs a key)."""
    snr_db: float | None = None
    """Background noise at this SNR over the caller's speech (generated unless a file is given)."""
    speaking_rate: float = Field(default=1.0, gt=0.25, le=4.0)
    telephony: bool = False
    """An 8 kHz mu-law round trip on the caller's audio."""
    packet_loss: float = Field(default=0.0, ge=0.0, lt=1.0)
    """The share of the caller's 20 ms frames lost (zeroed)."""

    @property
    def perturbed(self) -> bool:
        """Whether anything changes the caller's audio on its way to the agent."""
        return (
            self.snr_db is not None
            or self.speaking_rate != 1.0
            or self.telephony
            or self.packet_loss > 0
        )


class ScriptRule(_Model):
    """A scripted caller's line: said when the agent's turn matches `when` (a regex)."""

    when: str = ".*"
    say: str = ""
    end_call: bool = False
    times: int | None = Field(default=None, ge=1)
    """How many times the rule may fire (default: unlimited)."""


class Script(_Model):
    """A scripted caller, for deterministic episodes."""

    opening: str | None = None
    """What the caller says first, without waiting for a greeting."""
    rules: list[ScriptRule] = Field(default_factory=list)
    fallback: str | None = None
    """Said when no rule matches; with none, the caller hangs up."""


_SCRIPTED_FIELDS = ("turns", "context", "stop_on_failure")
"""Fields added for Pipecat's scripted scenarios; left out of a hash while unset."""


class Scenario(_Model):
    """One simulated scenario: Pipecat's keys plus facts, world, verify, faults, channel, split."""

    name: str
    persona: str | None = None
    goal: str | None = None
    success: str | None = None
    turns: list[dict[str, Any]] | None = None
    """A scripted scenario's turns (Pipecat's `turns:`), instead of a persona."""
    context: list[dict[str, Any]] | None = None
    stop_on_failure: bool | None = None
    metrics: list[Metric] = Field(default_factory=list)
    max_turns: int = Field(default=20, ge=1, le=MAX_TURNS)
    max_duration_s: float = Field(default=300.0, gt=0)
    max_silence_s: float = Field(default=30.0, gt=0)
    runs: int = Field(default=1, ge=1, le=MAX_RUNS)
    simulator: dict[str, Any] = Field(default_factory=dict)
    user: dict[str, Any] | None = None
    judge: dict[str, Any] | None = None
    trigger_disconnect: bool | None = None
    facts: dict[str, Any] = Field(default_factory=dict)
    world: WorldSpec = Field(default_factory=WorldSpec)
    verify: list[Check] = Field(default_factory=list)
    faults: list[Fault] = Field(default_factory=list)
    channel: Channel = Field(default_factory=Channel)
    split: Literal["pool", "heldout"] = POOL
    script: Script | None = None
    source_path: Path | None = Field(default=None, exclude=True)

    @field_validator("name", "persona", "goal", "success")
    @classmethod
    def _non_empty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must be a non-empty string")
        return value.strip() if value is not None else None

    @model_validator(mode="after")
    def _one_kind(self) -> "Scenario":
        if self.turns is not None and self.persona is not None:
            raise ValueError("a scenario is scripted ('turns') or simulated ('persona'), not both")
        if self.turns is None:
            missing = [k for k in ("persona", "goal", "success") if getattr(self, k) is None]
            if missing:
                raise ValueError(
                    f"{', '.join(missing)}: required field is missing (a simulated scenario "
                    "has persona, goal and success; a scripted one has turns)"
                )
        return self

    @property
    def scripted(self) -> bool:
        """Whether this is a scripted scenario (Pipecat's `turns:`)."""
        return self.turns is not None

    @property
    def id(self) -> str:
        """The scenario's id in the ledger (its name)."""
        return self.name

    @property
    def pack_path(self) -> Path | None:
        """The world pack as a file path, resolved against the scenario file's folder."""
        if self.world.pack is None or not self.world.pack.endswith(".py"):
            return None
        base = self.source_path.parent if self.source_path else Path.cwd()
        return (base / self.world.pack).resolve()

    def content_hash(self) -> str:
        """The scenario's identity: its content (not `split` or `name`) and its pack's code."""
        return heldout.scenario_hash(self, SCENARIO_SCHEMA_VERSION)


class ScenarioSet(_Model):
    """Scenarios loaded together, and the identity of their held-out split."""

    scenarios: list[Scenario]
    heldout_set_id: str | None = None
    """`heldout-<hash>` over the held-out files' names and bytes; None if none is held out."""

    def __iter__(self):  # type: ignore[override]
        return iter(self.scenarios)

    def __len__(self) -> int:
        return len(self.scenarios)


# -- loading -----------------------------------------------------------------------------------

_PIPECAT_ONLY = {"scenarios"}


class _Loader(yaml.SafeLoader):
    """SafeLoader reading only plain decimal integers as ints, so "0612" stays a string."""


_Loader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:int"]
    for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"),
    list("-+0123456789"),
)  # fmt: skip


def _parse(path: Path) -> tuple[Any, yaml.Node | None]:
    """The file's data and its node tree (for line numbers), within `yaml_safe`'s limits."""
    return load_yaml(path, _Loader)


def _line(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the deepest node along `loc` that exists in the YAML tree."""
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if getattr(k, "value", None) == key), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            node = None
        if node is None:
            break
        line = node.start_mark.line + 1
    return line


def _explain(path: Path, node: yaml.Node | None, error: ValidationError, prefix: tuple) -> str:
    problems = []
    items = error.errors()
    # `Persona:` for `persona:` is one mistake, not two: name the spelling, not the gap
    misspelt = {
        (*i["loc"][:-1], str(i["loc"][-1]).lower())
        for i in items
        if i["type"] == "extra_forbidden" and i["loc"] and str(i["loc"][-1]).lower() != i["loc"][-1]
    }
    for item in items:
        loc = tuple(item["loc"])
        if item["type"] == "missing" and loc in misspelt:
            continue
        field = ".".join(str(p) for p in (*prefix, *loc)) or "(top level)"
        line = _line(node, (*prefix, *loc))
        reason = item["msg"]
        if item["type"] == "extra_forbidden":
            lowered = (*loc[:-1], str(loc[-1]).lower()) if loc else loc
            reason = (
                f"unknown field: did you mean '{lowered[-1]}'? (field names are lower case)"
                if lowered in misspelt
                else "unknown field (check its spelling; see pipecat_rl.simulator.scenario)"
            )
        elif item["type"] == "missing":
            reason = "required field is missing"
        problems.append(f"{path}:{f' line {line}:' if line else ''} {field}: {reason}")
    return "\n".join(problems)


def load_scenario_file(path: str | Path) -> list[Scenario]:
    """Read one scenario file (a single scenario, or Pipecat's `scenarios:` list).

    Raises:
        ScenarioError: naming the file, the line, the field and the reason.
    """
    path = Path(path).resolve()
    data, node = _parse(path)
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: the top level must be a mapping of scenario fields")
    entries: list[tuple[dict, tuple]] = []
    if "scenarios" in data:
        file_name = data.get("name")
        listed = data["scenarios"]
        if not isinstance(file_name, str) or not file_name:
            raise ScenarioError(f"{path}: name: a file with 'scenarios:' needs a 'name:'")
        if not isinstance(listed, list) or not listed:
            raise ScenarioError(f"{path}: scenarios: must be a non-empty list")
        defaults = {k: v for k, v in data.items() if k not in _PIPECAT_ONLY}
        if all(isinstance(entry, str) for entry in listed):
            raise UnsupportedScenarioError(
                f"{path}: lists other files under 'scenarios:' (a manifest); name the files"
            )
        for i, entry in enumerate(listed):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise ScenarioError(f"{path}: scenarios.{i}: must be a mapping with a 'name:'")
            merged = {**defaults, **entry, "name": f"{file_name}/{entry['name']}"}
            entries.append((merged, ("scenarios", i)))
    else:
        entries.append((data, ()))
    scenarios = []
    for raw, prefix in entries:
        line = _line(node, (*prefix, "split"))
        raw = {**raw, "split": heldout.resolve_split(path, raw.get("split"), line)}
        raw["source_path"] = path
        try:
            scenarios.append(Scenario.model_validate(raw))
        except ValidationError as e:
            raise ScenarioError(_explain(path, node, e, prefix)) from e
    if any(s.scripted for s in scenarios):
        from pipecat_rl.simulator.script_turns import check_scripted  # Pipecat's own parser

        check_scripted(path, scenarios)
    return scenarios


def _files(target: Path) -> list[Path]:
    if target.is_dir():
        return sorted(p for p in target.rglob("*.y*ml") if p.suffix in (".yaml", ".yml"))
    if target.is_file():
        return [target]
    raise ScenarioError(f"{target}: no such scenario file or folder")


def load_scenarios(targets: list[str | Path]) -> ScenarioSet:
    """Load scenario files and folders (recursively, *.yaml / *.yml) into one set.

    Fragments a file `!include`s (YAML mappings without `persona`/`scenarios`) are skipped;
    any other file without them is an error or a warning (`_skip_fragment`).
    """
    scenarios: list[Scenario] = []
    heldout_files: list[Path] = []
    skipped: list[str] = []
    for target in targets:
        files = _files(Path(target))
        for f in files:
            if Path(target).is_dir() and _is_fragment(f) and _skip_fragment(f, files):
                continue
            try:
                loaded = load_scenario_file(f)
            except UnsupportedScenarioError as e:
                logger.warning(f"skipped {e}")
                skipped.append(str(f))
                continue
            scenarios.extend(loaded)
            if any(s.split == HELDOUT for s in loaded):
                heldout_files.append(f.resolve())
    if not scenarios:
        also = f" (skipped, not runnable here: {', '.join(skipped)})" if skipped else ""
        raise ScenarioError(f"no scenario files found in {', '.join(map(str, targets))}{also}")
    names = [s.name for s in scenarios]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ScenarioError(f"duplicate scenario names: {', '.join(duplicates)}; rename one")
    heldout.check_copies(scenarios)
    held = [s for s in scenarios if s.split == HELDOUT]
    set_id = heldout.heldout_set_id(held, heldout_files) if heldout_files else None
    return ScenarioSet(scenarios=scenarios, heldout_set_id=set_id)


def _is_fragment(path: Path) -> bool:
    try:
        data, _ = _parse(path)
    except ScenarioError:
        return False  # loading it reports the error
    return isinstance(data, dict) and not {"persona", "scenarios", "turns"} & set(data)


_INCLUDE = re.compile(r"!include\s+[\"']?([^\s\"'#]+)")
_SCENARIO_KEYS = {
    "name", "persona", "goal", "success", "max_turns", "runs", "scenarios", "verify", "turns",
}  # fmt: skip


def _skip_fragment(path: Path, files: list[Path]) -> bool:
    """Whether a file without `persona:` in a folder is skipped: yes if a scenario includes it.

    One that looks like a scenario (`name:`, `goal:`, `Persona:`...) is loaded so that its
    missing field is reported; any other is skipped with a warning naming it, so a held-out
    folder never shrinks without a word.
    """
    for other in files:
        if other == path:
            continue
        try:
            text = read_text(other)
        except ScenarioError:
            continue
        if any((other.parent / m).resolve() == path.resolve() for m in _INCLUDE.findall(text)):
            return True
    data, _ = _parse(path)
    if {str(k).lower() for k in data} & _SCENARIO_KEYS:
        return False
    logger.warning(
        f"{path}: skipped: not a scenario (no 'persona:', 'turns:' or 'scenarios:') and no "
        "scenario file in the folder includes it"
    )
    return True
