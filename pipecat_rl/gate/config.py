"""Gate thresholds and the price table, from defaults, a YAML/JSON file, and flags (in that order).

Defaults, and why:

| field | default | meaning |
|---|---|---|
| `min_delta` | 0.02 | the paired 95% CI's lower bound must exceed this reward gain |
| `tie_band` | 0.05 | a scenario whose mean delta is within ±this is a tie, not a win or loss |
| `max_regressions` | 1 | most scenarios the candidate may lose (delta < -tie_band) |
| `p95_budget_ms` | 1500 | absolute budget on the candidate's voice-to-voice P95 |
| `p95_margin_ms` | 100 | how much slower than the incumbent's P95 the candidate may be |
| `pass_threshold` | 0.5 | a run passes (for pass^k and cost per success) when reward >= this |
| `resamples` | 10000 | bootstrap resamples (at least 10,000 by design) |
| `seed` | 0 | seed of every bootstrap, so a receipt can be reproduced exactly |
| `require_guard` | False | fail when no training guard can be read (imported, scores) |
| `require_latency` | True | latency checks cannot pass without v2v samples for both policies |

The price table's defaults are illustrative round numbers of the right order for a small hosted
LLM, a streaming STT and a streaming TTS; set your own vendor's prices before comparing costs.
"""

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipecat_rl.errors import ConfigError


class PriceTable(BaseModel):
    """What one call costs per unit: LLM tokens, STT audio minutes, TTS audio minutes (USD).

    STT is billed on the streamed call audio (a streaming STT bills for the whole call), TTS on the
    seconds of audio the bot spoke. Defaults are illustrative; configure your own.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    llm_input_usd_per_mtok: float = Field(0.15, ge=0)
    llm_output_usd_per_mtok: float = Field(0.60, ge=0)
    stt_usd_per_min: float = Field(0.0077, ge=0)
    tts_usd_per_min: float = Field(0.05, ge=0)


class GateConfig(BaseModel):
    """Every threshold the verdict uses; see the module docstring for the defaults' meaning."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_delta: float = 0.02
    tie_band: float = Field(0.05, ge=0)
    max_regressions: int = Field(1, ge=0)
    p95_budget_ms: float = Field(1500.0, gt=0)
    p95_margin_ms: float = Field(100.0, ge=0)
    pass_threshold: float = 0.5
    resamples: int = Field(10_000, ge=10_000)
    seed: int = 0
    require_guard: bool = False
    require_latency: bool = True
    prices: PriceTable = PriceTable()


def load_gate_config(path: Path | None = None, **overrides: Any) -> GateConfig:
    """Build a config from an optional YAML/JSON file, then apply non-None `overrides` (flags).

    A file may hold the fields at the top level or under a `gate:` key, so one project config file
    can carry several sections.

    Raises:
        ConfigError: the file is missing or unparsable, or a field is unknown or out of range.
    """
    values: dict[str, Any] = {}
    if path is not None:
        values = _read_mapping(path)
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return GateConfig.model_validate(values)
    except ValidationError as e:
        where = f" in {path}" if path else ""
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()
        )
        raise ConfigError(
            f"invalid gate config{where}: {problems}. Fix the field or remove it for the default."
        ) from e


def _read_mapping(path: Path) -> dict[str, Any]:
    """Read a YAML or JSON file (JSON is YAML) holding a mapping, optionally under `gate:`."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read gate config {path}: {e.strerror}; check the path.") from e
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"gate config {path} is not valid YAML/JSON: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"gate config {path} must be a mapping of field: value.")
    section = data.get("gate", data)
    if not isinstance(section, dict):
        raise ConfigError(f"gate config {path}: `gate:` must be a mapping of field: value.")
    return dict(section)
