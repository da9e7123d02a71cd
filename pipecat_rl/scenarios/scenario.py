"""Scenarios as records: a superset of Pipecat's scenario YAML, as frozen pydantic models.

Pipecat's own keys (`name`, `persona`, `goal`, `success`, `metrics`, `max_turns`,
`max_duration_s`, `max_silence_s`, `runs`, `simulator`, `user`, `judge`) mean what
`pipecat.evals.simulation` says they mean; a file Pipecat accepts, we accept, including the
`scenarios:` list whose file-level keys are defaults and whose scenarios are named
`<file name>/<scenario name>`, scripted scenarios (`turns:`, `context:`, `stop_on_failure:`,
parsed by Pipecat's own parser into `turns.Turn`s and run by `simulator.script_turns`), and a
metric's older `min_quality` (read as `min_score`). A file the simulator cannot run (a manifest
listing other files, a scripted scenario whose checks need audio) is skipped with a warning
naming it, and the others run (see `loading`). Ours are:

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
  intents: [!include ../intents.yaml, {offer_slot: [care to take it]}]   # name -> patterns
  rules:                      # the first that matches (and has not run out) answers
    - {intent: ask_name, say: "Maria Lopez"}                  # what the agent means
    - {intent: [offer_slot, morning], say: "Not mornings."}   # all of these
    - {when: "booked", say: "Thanks!", end_call: true}        # a regex, as before
    - {intent: offer_slot, say: "Yes!", barge_in: {after_words: 6}}   # said over the agent
  fallback: {say: ["Sorry, I need a checkup."], max: 2}      # when none matches
caller: {backchannel: {say: "Mm-hm.", after_ms: 1500}}      # moves over every agent reply
```

A fork (`fork:`, written by `pipecat-rl ledger fork`) is a recorded call's first turns on top
of the scenario it ran (see `fork`); a scenario without one keeps the identity it had.

A rule fires on an *intent* (`intent:`, one name or a list, all carried by the agent's turn), a
regular expression (`when:`, case-insensitive), both, or (neither) on any turn. Intents are
named sets of patterns (see `intents`: whole words, case, punctuation and spacing aside; `word*`
a prefix, `*` a few words, `re:` a regex); a world pack shares them in one file that scenarios
`!include` and may extend, later mappings adding patterns to earlier ones. A rule naming an
intent the script lacks fails the load, naming the rule and the intent. `fallback` is on by
default: when no rule matches, the caller says its next fallback line (default: its need
restated from `goal`) for up to `max` turns in a row (default 2), then hangs up; `fallback:
false` hangs up at once, as scripts did before intents. The episode counts its fallbacks
(`simulator.persona.caller_notes`).

Turn-taking moves (`turns.Moves`, the words a scripted turn uses; acted out in audio mode only,
`simulator.audio.moves`): a rule's `barge_in` says its line over the agent's reply it answers,
once the caller has heard that much of the reply and enough of it for the rule to match; its
`backchannel` and `side_speech` are said during the agent's reply to its line. `caller:` makes
the moves of a persona or `script:` caller on every agent reply: the LLM persona says its next
line over any reply longer than `barge_in` asks (once it has heard some of it), a scripted
caller any rule's line that has no `barge_in` of its own; a rule's own asides replace the
`caller:` ones of the same kind. A scripted scenario (`turns:`) gives its moves turn by turn.

A scenario's identity is its canonical content (`content_hash`, see `identity`). Reading
files into these records, with errors naming the file, line and field, is `loading`'s.
"""

import importlib.util
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from pipecat_rl.scenarios import identity
from pipecat_rl.scenarios.fork import ForkSpec
from pipecat_rl.scenarios.intents import check as check_intents
from pipecat_rl.scenarios.intents import merge as merge_intents
from pipecat_rl.scenarios.turns import Moves, Turn

SCENARIO_SCHEMA_VERSION = 3
"""Bumped when the meaning of a scenario field or of its identity changes; part of its hash.

2: the hash is of the canonical form (`identity`), and `stop_on_failure` defaults to true, as
in Pipecat. Hashes made under 1 (16 bare hex digits) are not compared with these (see
`heldout`). 3: the canonical form by meaning (NFKC text, the pack's syntax tree, rows as the
database holds them, normalised checks and patterns).
"""

HELDOUT = "heldout"
POOL = "pool"
KNOWN_SPLITS = (POOL, HELDOUT)

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


GUARDED_CHECKS = ("unchanged", "not_exists")
"""Verify checks that say what a call must not write: a run carrying one can show an
unauthorised write (the gate's safety denominator), and a scenario with one is a refusal."""


class VerifyCheck(_Model):
    """One verify check; exactly one of its keys is set."""

    exists: Where | None = None
    not_exists: Where | None = None
    unchanged: list[str] | None = None
    count: Count | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "VerifyCheck":
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
    telephony: StrictBool = False
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


class ScriptRule(Moves):
    """A scripted caller's line: said when the agent's turn means `intent` and matches `when`.

    With neither, the rule matches any turn; with both, the turn must carry every intent named
    and match the regex too (an offer of the 09:00 slot: `{intent: offer_slot, when: "09"}`).
    Its moves (`barge_in`, `backchannel`, `side_speech`) are how the line is said (see the
    module docstring).
    """

    when: str | None = None
    """A regular expression searched in the agent's turn (case-insensitive)."""
    intent: tuple[str, ...] | None = None
    """An intent of the script's `intents` (or several, all carried by the turn)."""
    say: str = ""
    end_call: StrictBool = False
    times: int | None = Field(default=None, ge=1)
    """How many times the rule may fire (default: unlimited)."""

    @field_validator("when")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        """A bad pattern fails at load, naming the field, not mid-episode."""
        if value is None:
            return None
        try:
            re.compile(value, re.IGNORECASE | re.DOTALL)  # the flags the scripted caller uses
        except re.error as e:
            raise ValueError(f"not a valid regular expression ({e})") from e
        return value

    @field_validator("intent", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        value = [value] if isinstance(value, str) else value
        if isinstance(value, list | tuple) and not value:
            raise ValueError("name at least one intent (or leave 'intent' out)")
        return value

    def label(self, index: int) -> str:
        """How an error names this rule: `rules.<i>` and what it says."""
        said = self.say if len(self.say) <= 40 else self.say[:37] + "..."
        return f"rules.{index} (say: {said!r})"


class Fallback(_Model):
    """What a scripted caller does when no rule matches: restate its need, then hang up.

    Written as a mapping (`{say: [...], max: 2}`), one line (`fallback: "Sorry?"`), a list of
    lines, or `false` / `null` (no fallback: hang up at the first turn no rule matches).
    """

    say: tuple[str, ...] = ()
    """Said in turn on consecutive non-answers (the last repeats); none: restated from the goal."""
    max: int = Field(default=2, ge=0, le=MAX_TURNS)
    """Consecutive turns no rule matches that the caller answers with a fallback line; at the
    next one in a row it hangs up (0: at the first). A matching rule starts the count again.
    Also how many times in a row the caller answers a reply the agent says again word for word
    (an agent going in circles); at the next repeat it hangs up."""


class Script(_Model):
    """A scripted caller, for deterministic episodes."""

    opening: str | None = None
    """What the caller says first, without waiting for a greeting."""
    intents: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    """Intent name -> patterns (see `intents`): a mapping, or a list of mappings merged in order
    (the world pack's shared file, `!include`d, then this scenario's additions)."""
    rules: list[ScriptRule] = Field(default_factory=list)
    fallback: Fallback = Field(default_factory=Fallback)
    """When no rule matches (see `Fallback`); on by default."""

    @field_validator("intents", mode="before")
    @classmethod
    def _merged(cls, value: Any) -> Any:
        return merge_intents(value)

    @field_validator("intents")
    @classmethod
    def _patterns(cls, value: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        check_intents(value)
        return value

    @field_validator("fallback", mode="before")
    @classmethod
    def _fallback_forms(cls, value: Any) -> Any:
        if value is None or value is False:
            return {"max": 0}
        if value is True:
            return {}
        if isinstance(value, str):
            return {"say": [value]}
        if isinstance(value, list):
            return {"say": value}
        return value

    @model_validator(mode="after")
    def _known_intents(self) -> "Script":
        for i, rule in enumerate(self.rules):
            for name in rule.intent or ():
                if name not in self.intents:
                    known = ", ".join(sorted(self.intents)) or "none: add 'intents:' to the script"
                    raise ValueError(
                        f"{rule.label(i)}: unknown intent {name!r}; define it under "
                        f"script.intents or fix its spelling (known: {known})"
                    )
        return self


class Scenario(_Model):
    """One simulated scenario: Pipecat's keys plus facts, world, verify, faults, channel, split."""

    name: str
    persona: str | None = None
    goal: str | None = None
    success: str | None = None
    turns: list[dict[str, Any]] | None = None
    """A scripted scenario's turns (Pipecat's `turns:`) as written, instead of a persona."""
    context: list[dict[str, Any]] | None = None
    """Messages that replace the agent's context when the caller connects (scripted)."""
    stop_on_failure: StrictBool | None = None
    """Whether a scripted scenario ends at its first failed turn (None: yes, as in Pipecat)."""
    metrics: list[Metric] = Field(default_factory=list)
    max_turns: int = Field(default=20, ge=1, le=MAX_TURNS)
    max_duration_s: float = Field(default=300.0, gt=0)
    max_silence_s: float = Field(default=30.0, gt=0)
    runs: int = Field(default=1, ge=1, le=MAX_RUNS)
    simulator: dict[str, Any] = Field(default_factory=dict)
    user: dict[str, Any] | None = None
    judge: dict[str, Any] | None = None
    trigger_disconnect: StrictBool | None = None
    facts: dict[str, Any] = Field(default_factory=dict)
    world: WorldSpec = Field(default_factory=WorldSpec)
    verify: list[VerifyCheck] = Field(default_factory=list)
    faults: list[Fault] = Field(default_factory=list)
    channel: Channel = Field(default_factory=Channel)
    split: Literal["pool", "heldout"] = POOL
    script: Script | None = None
    fork: ForkSpec | None = None
    """A recorded call's first turns, replayed before the call is handed on (see `fork`)."""
    caller: Moves | None = None
    """The turn-taking moves of a persona or `script:` caller, on every agent reply."""
    source_path: Path | None = Field(default=None, exclude=True)
    parsed_turns: list[Turn] | None = Field(default=None, exclude=True)
    """The turns as Pipecat's parser reads them (set by the loader for a scripted scenario)."""

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
        if self.turns is not None and self.caller is not None:
            raise ValueError(
                "caller: moves are a persona's or a script's; a scripted scenario ('turns') "
                "gives them turn by turn (barge_in, backchannel, side_speech on a turn)"
            )
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
    def guarded(self) -> bool:
        """Whether a check says what the call must not write (`GUARDED_CHECKS`).

        A declined slot, a table an out-of-scope call leaves alone: the gate's safety check
        counts such a scenario's runs, and an unauthorised write in any of them rejects.
        """
        return any(getattr(c, kind) is not None for c in self.verify for kind in GUARDED_CHECKS)

    @property
    def stops_on_failure(self) -> bool:
        """Whether the first failed turn ends a scripted scenario (Pipecat's default: yes)."""
        return self.stop_on_failure is not False

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

    def pack_code(self) -> bytes | None:
        """The world pack's source (the `.py` file it names, or the module's), None if not found."""
        path = self.pack_path
        if path is None and self.world.pack:
            try:
                spec = importlib.util.find_spec(self.world.pack)
            except (ImportError, ValueError):
                spec = None
            origin = getattr(spec, "origin", None)
            path = Path(origin) if origin and origin.endswith(".py") else None
        return path.read_bytes() if path is not None and path.is_file() else None

    def canonical(self) -> dict[str, Any]:
        """The canonical form of what this scenario is (`identity.canonical`)."""
        # no `fork: null` or `caller: null` in the form: a scenario without keeps its old hash
        unset = {k for k in ("fork", "caller") if getattr(self, k) is None}
        content = self.model_dump(mode="json", exclude=set(identity.NOT_IDENTITY) | unset)
        return identity.canonical(content, self.pack_code())

    def content_hash(self) -> str:
        """The scenario's identity: the hash of its canonical content (see `identity`)."""
        return identity.digest(self.canonical(), SCENARIO_SCHEMA_VERSION)

    def near_key(self) -> str | None:
        """The hash of its world, goal and facts: equal for near-duplicates (None: no goal)."""
        near = identity.near_content(self.canonical())
        return None if near is None else identity.digest(near, SCENARIO_SCHEMA_VERSION)


class ScenarioSet(_Model):
    """Scenarios loaded together, and the identity of their held-out split."""

    scenarios: list[Scenario]
    heldout_set_id: str | None = None
    """`heldout-<hash>` over the held-out files' names and bytes; None if none is held out."""

    def __iter__(self):  # type: ignore[override]
        return iter(self.scenarios)

    def __len__(self) -> int:
        return len(self.scenarios)
