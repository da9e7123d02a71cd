"""Gate thresholds and the price table, from defaults, a YAML/JSON file, and flags (in that order).

Defaults, and why:

- `min_delta` 0.02, in [-0.25, 1): the paired 95% CI's lower bound must exceed this score gain
  (a negative value is a non-inferiority margin).
- `tie_band` 0.05, in [0, 0.5): a scenario whose mean delta is within +-this is a tie.
- `max_regressions` 0, 0..1000: most units (a group, a scenario, or all of them pooled) the
  candidate may have confirmably regressed (see `gate.regressions`).
- `regression_alpha` 0.05, in (0, 0.2]: family-wise level (Holm) over every regression test.
- `regression_tests` [pooled]: which exact discordant-pair tests form that family: `pooled` (all
  paired runs), `groups` (each of `regression_groups`), `scenarios` (each scenario alone; needs
  about log2(scenarios / alpha) repeats, 9 at 24 scenarios). A configured test that could never
  fire at the repeats run is refused (a ConfigError naming the repeats it needs).
- `regression_groups` {}: group name -> glob patterns of scenario ids (the clinic's are intents).
- `judged_metrics` {}, weights in (0, 1]: `judge:<name>` parts averaged into the gate score.
- `p95_budget_ms` 1500, in (0, 60000]: budget on the candidate's voice-to-voice P95 (the
  caller-side heard gap in audio mode).
- `p95_margin_ms` 100, in [0, 60000]: how much slower than the incumbent's P95 it may be.
- `resamples` 10000, 10000..200000: latency bootstrap resamples (memory grows with it).
- `seed` 0, 0..2^32-1: seed of every bootstrap, so a receipt can be reproduced exactly.
- `require_guard` False: fail when no training guard can be read (imported, scores).
- `require_latency` True: latency checks cannot pass without samples for both policies (v2v or
  the heard gap in audio mode; the LLM stages in text mode, which has no voice).
- `max_llm_latency_ratio` 3.0, in [1, 100]: the candidate's LLM TTFT P50 and LLM time per turn
  P50 may be at most this many times the incumbent's (paired runs under the same interleaved
  load). 3, because turns on a busy CPU server spread widely (P95 / P50 near 15) and a tighter
  ratio fails identical policies; the operating characteristics at each size are the
  benchmark's (`benchmarks/gate_decision.py`, the README's table).
- `max_unusable_share` 0.1, in [0, 1]: above this share of an arm's runs being harness errors or
  unverified, the verdict is INCONCLUSIVE (a broken harness is not evidence).
- `caller_gap_p95_budget_ms` off, in (0, 600000]: budget on the candidate's P95 caller-perceived
  gap (`gate.inputs.caller_gap_samples`: the caller's line to the agent's first words, tool
  rounds included; the response gap in text mode, the heard gap in audio mode), by Woodruff's
  interval over scenarios. The per-call LLM TTFT ratio cannot see an agent that answers fast
  per call but makes the caller wait through its lookups in silence; this can.
- `turn_taking` off: checks on how the agent shares the line (`TurnTakingConfig`), each set
  alone. A configured check the runs cannot measure (text mode, no barge-in or backchannel
  happened) is `unavailable` with the reason, listed on the receipt, never a pass.

Every number must be finite, and a switch is a boolean (`true`/`false`), never a string or a
number: `require_latency: 'no'` is refused, not read as on. A file is read as its suffix says:
`.json` as JSON only, `.yaml`/`.yml` as YAML. The score the gate pairs is the authoritative one
(`pipecat_rl.scoring.outcome`: the verifier, else the judged `success`), never the shaped tool
credit; `judged_metrics` may add named judged parts, each a number in [0, 1], so the gate score
stays in [0, 1]: (authoritative + sum w_i * part_i) / (1 + sum w_i).

The price table's defaults are illustrative round numbers of the right order for a small hosted
LLM, a streaming STT and a streaming TTS; set your own vendor's prices before comparing costs.
"""

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from pipecat_rl.errors import ConfigError, GateError
from pipecat_rl.strict import loads_json, loads_yaml

RegressionKind = Literal["pooled", "groups", "scenarios"]
"""Units of the regression tests: all paired runs pooled, each configured group, each scenario."""


class PriceTable(BaseModel):
    """What one call costs per unit: LLM tokens, STT audio minutes, TTS audio minutes (USD).

    STT is billed on the streamed call audio (a streaming STT bills for the whole call), TTS on the
    seconds of audio the bot spoke. Defaults are illustrative; configure your own.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    llm_input_usd_per_mtok: float = Field(0.15, ge=0)
    llm_output_usd_per_mtok: float = Field(0.60, ge=0)
    stt_usd_per_min: float = Field(0.0077, ge=0)
    tts_usd_per_min: float = Field(0.05, ge=0)


class TurnTakingConfig(BaseModel):
    """Turn-taking checks (`gate.turntaking`), each off until set; audio runs measure them.

    - `time_to_yield_p95_ratio`, in [1, 100]: the candidate's P95 time to yield (caller's speech
      start to the agent's audio stop, per barge-in) over the incumbent's, paired over scenarios.
    - `time_to_yield_p95_ms`, in (0, 60000]: budget on the candidate's P95 time to yield.
    - `false_interruption_rate_diff`, in [0, 1): the candidate's false interruptions per
      backchannel (a "mm-hm" that stopped the agent) minus the incumbent's, paired over
      scenarios.
    - `false_interruption_rate`, in (0, 1]: budget on the candidate's false-interruption rate.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    time_to_yield_p95_ratio: float | None = Field(None, ge=1.0, le=100.0)
    time_to_yield_p95_ms: float | None = Field(None, gt=0, le=60_000)
    false_interruption_rate_diff: float | None = Field(None, ge=0, lt=1)
    false_interruption_rate: float | None = Field(None, gt=0, le=1)

    @property
    def configured(self) -> bool:
        """Whether any turn-taking check is set."""
        return any(v is not None for v in self.model_dump().values())


class GateConfig(BaseModel):
    """Every threshold the verdict uses; see the module docstring for the defaults' meaning."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    min_delta: float = Field(0.02, ge=-0.25, lt=1)
    tie_band: float = Field(0.05, ge=0, lt=0.5)
    max_regressions: int = Field(0, ge=0, le=1000)
    regression_alpha: float = Field(0.05, gt=0, le=0.2)
    regression_tests: tuple[RegressionKind, ...] = ("pooled",)
    regression_groups: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    judged_metrics: dict[str, Annotated[float, Field(gt=0, le=1)]] = Field(default_factory=dict)
    p95_budget_ms: float = Field(1500.0, gt=0, le=60_000)
    p95_margin_ms: float = Field(100.0, ge=0, le=60_000)
    resamples: int = Field(10_000, ge=10_000, le=200_000)
    seed: int = Field(0, ge=0, lt=2**32)
    require_guard: StrictBool = False
    require_latency: StrictBool = True
    max_llm_latency_ratio: float = Field(3.0, ge=1.0, le=100.0)
    max_unusable_share: float = Field(0.1, ge=0.0, le=1.0)
    caller_gap_p95_budget_ms: float | None = Field(None, gt=0, le=600_000)
    turn_taking: TurnTakingConfig = TurnTakingConfig()
    prices: PriceTable = PriceTable()

    @field_validator("judged_metrics")
    @classmethod
    def _judged_only(cls, value: dict[str, float]) -> dict[str, float]:
        for name in value:
            if not name.startswith("judge:") or name == "judge:":
                raise ValueError(
                    f"{name!r} is not a judged part; name parts as judge:<metric> (the "
                    "authoritative part is always included, tool_credit never is)"
                )
        return value

    @field_validator("regression_tests")
    @classmethod
    def _distinct_tests(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError(f"name each regression test once, got {list(value)}")
        return value

    @field_validator("regression_groups")
    @classmethod
    def _patterns(cls, value: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        for name, patterns in value.items():
            if not name.strip() or not patterns or not all(p.strip() for p in patterns):
                raise ValueError(
                    f"group {name!r} needs a name and at least one scenario-id pattern"
                )
        return value

    @model_validator(mode="after")
    def _groups_tested(self) -> "GateConfig":
        named = "groups" in self.regression_tests
        if named and not self.regression_groups:
            raise ValueError(
                "regression_tests names `groups` but regression_groups names none; add "
                "regression_groups (name: [scenario-id patterns])"
            )
        if self.regression_groups and not named:
            raise ValueError(
                "regression_groups is set but regression_tests does not name `groups`: add it, "
                "or remove the groups"
            )
        return self


FLAGS = {
    "min_delta": "--min-delta",
    "tie_band": "--tie-band",
    "max_regressions": "--max-regressions",
    "regression_alpha": "--regression-alpha",
    "p95_budget_ms": "--p95-budget-ms",
    "p95_margin_ms": "--p95-margin-ms",
    "resamples": "--resamples",
    "seed": "--seed",
    "require_guard": "--require-guard",
    "require_latency": "--require-latency",
}
"""The command-line flag of each field, for error messages."""


def load_gate_config(path: Path | None = None, **overrides: Any) -> GateConfig:
    """Build a config from an optional YAML/JSON file, then apply non-None `overrides` (flags).

    A file may hold the fields at the top level or under a `gate:` key, so one project config file
    can carry several sections.

    Raises:
        GateError: the file is missing or unparsable, or a field in it is unknown or out of range
            (naming the file, the line and the field).
        ConfigError: a flag's value is out of range (naming the flag).
    """
    values: dict[str, Any] = {}
    node: yaml.Node | None = None
    if path is not None:
        values, node = _read_mapping(path)
        try:
            GateConfig.model_validate(values)
        except ValidationError as e:
            raise GateError(_explain_file(path, node, e)) from e
    flags = {k: v for k, v in overrides.items() if v is not None}
    try:
        return GateConfig.model_validate({**values, **flags})
    except ValidationError as e:
        problems = "; ".join(
            f"{FLAGS.get(str(loc[0]), loc[0]) if (loc := err['loc']) else 'gate'}: {err['msg']}"
            for err in e.errors()
        )
        raise ConfigError(f"invalid gate flag(s): {problems}.") from e


def _explain_file(path: Path, node: yaml.Node | None, error: ValidationError) -> str:
    problems = []
    for err in error.errors():
        loc = tuple(err["loc"])
        line = _line(node, loc)
        field = ".".join(str(p) for p in loc) or "gate"
        reason = err["msg"]
        if err["type"] == "extra_forbidden":
            reason = "unknown field"
        elif err["type"] == "bool_type":
            reason = f"must be true or false, not {err['input']!r}"
        where = f"{path}:{line}" if line else str(path)
        problems.append(f"{where}: {field}: {reason}")
    return "invalid gate config: " + "; ".join(problems) + ". Fix the field or remove it."


def _line(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the deepest node along `loc` in the file's YAML tree."""
    line = None
    for key in loc:
        if not isinstance(node, yaml.MappingNode):
            break
        node = next((v for k, v in node.value if getattr(k, "value", None) == str(key)), None)
        if node is None:
            break
        line = node.start_mark.line + 1
    return line


_FORMATS = {".json": "JSON", ".yaml": "YAML", ".yml": "YAML"}
"""How a gate config is read, by its suffix."""


def _read_mapping(path: Path) -> tuple[dict[str, Any], yaml.Node | None]:
    """A YAML or JSON file, read as its suffix says, holding a mapping, optionally under `gate:`.

    JSON is YAML, so a YAML reader would take a `.json` file holding YAML: the suffix decides,
    and a file that is not what it says it is refused. Returns the mapping and its node tree
    (for line numbers; None where PyYAML cannot compose valid JSON).
    """
    kind = _FORMATS.get(path.suffix.lower())
    if kind is None:
        raise GateError(
            f"gate config {path}: name a .yaml, .yml or .json file (its suffix says how it is "
            "read)."
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise GateError(f"cannot read gate config {path}: {e}; check the path.") from e
    try:
        data = loads_json(text) if kind == "JSON" else loads_yaml(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise GateError(f"gate config {path} is not valid {kind}: {e}; fix it or rename it.") from e
    except ValueError as e:  # `strict`: a key twice, a number too long, nesting too deep
        raise GateError(f"gate config {path}: {e}; fix it.") from e
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        node = None
    if data is None:
        return {}, None
    if not isinstance(data, dict):
        raise GateError(f"gate config {path} must be a mapping of field: value.")
    if "gate" in data:
        if not isinstance(data["gate"], dict):
            raise GateError(f"gate config {path}: `gate:` must be a mapping of field: value.")
        if node is not None:
            node = next((v for k, v in node.value if getattr(k, "value", None) == "gate"), None)
        return dict(data["gate"]), node
    return dict(data), node
