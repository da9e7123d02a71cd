"""`loop.yaml`: what one night-loop cycle runs, as a pydantic model.

Paths in the file are taken relative to the file's own folder, so a loop file travels with the
project it describes; a `ledger:` URL (postgresql://) is taken as written.
"""

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipecat_rl import defaults
from pipecat_rl.duels.calibration import JudgeCalibrationSettings
from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import LiveTrust
from pipecat_rl.ledger.dialect import is_url
from pipecat_rl.ledger.eligibility import DEFAULT_SETTLE_S, DEFAULT_TRUSTED_SOURCES
from pipecat_rl.ledger.store import LedgerLocation
from pipecat_rl.scoring.rubric import DEFAULT_RUBRIC, Rubric
from pipecat_rl.serving.roots import openai_base_url
from pipecat_rl.simulator.options import Executor

STAGES = ("snapshot", "preflight", "filter", "train", "evaluate", "promote")
"""The cycle's stages, in order; each is recorded and never rerun once finished."""


_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def span_s(value: Any) -> Any:
    """A span such as `24h`, `90m`, `7d` or `3600` (seconds) in seconds; a number as it is.

    Raises:
        ValueError: a string that is not a span.
    """
    if not isinstance(value, str):
        return value
    match = _SPAN.match(value)
    if match is None:
        raise ValueError(
            f"{value!r} is not a span: give one such as 24h, 90m, 7d or 3600 (seconds)"
        )
    return float(match.group(1)) * _UNIT_S[match.group(2)]


Span = Annotated[float, BeforeValidator(span_s), Field(ge=0, allow_inf_nan=False)]
"""Seconds, written as a span (`24h`) or a number."""


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SampleSettings(_Part):
    """A fixed, stratified sample of a scenario folder (`scenarios.sampling`)."""

    size: int = Field(ge=1)
    """Scenarios in the sample (all of them when the folder holds no more)."""
    by: tuple[str, ...] = ()
    """Axes whose combinations are drawn in turn (e.g. `[style, task, fault]`: each held-out
    combination once before any twice); the sample is spread over every axis either way."""


class FilterSettings(_Part):
    """How the pool is simulated under the incumbent to find the contested scenarios."""

    repeats: int = Field(default=2, ge=1)
    """Runs per pool scenario: one always solved or always failed in all of them is set aside."""


class TrainSettings(_Part):
    """What the train stage runs: an SFT warm start, then distill, GRPO and/or OPSD steps."""

    warm_start: Literal["auto", "always", "never"] = "auto"
    """`auto`: an SFT warm start when the incumbent cannot call tools (see `tool_use_below`)."""
    tool_use_below: float = Field(default=0.2, ge=0, le=1)
    """The incumbent "cannot call tools" when fewer than this share of its filter-stage calls
    made a successful tool execution (a stray call is not an ability)."""
    demonstrations: int = Field(default=1, ge=1)
    """Scripted-expert runs per pool scenario recorded as demonstrations for the warm start."""
    guarded_demonstrations: int = Field(default=3, ge=1)
    """The same for a pool scenario with a check on what its call must not write
    (`Scenario.guarded`: a declined slot, an out-of-scope call), the calls the gate's safety
    check counts: with one run each, the clinic's warm start transferred an out-of-scope caller
    in 2 of 4 held-out runs and booked for an emergency once (REJECT); with 3 runs of only the
    calls that write nothing, 14 writes in 196 guarded held-out runs over seven cycles."""
    sft_epochs: int = Field(default=10, ge=1)
    """At most this many (fewer once the loss reaches the trainer's `target_loss`)."""
    sft_holdout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Share of the demonstrations held aside to stop the warm start when their loss stops
    improving (`TrainConfig.holdout`). 0 by default: with a handful of demonstrations the
    held-aside loss stops a warm start before it reliably makes its tool calls; a cycle then
    trains for `sft_epochs` (or until the trainer's `target_loss`)."""
    verify_on_server: StrictBool = True
    """Let the trainer hot-load the SFT adapter and check a canary's served logprobs against its
    own (`training.registry.load_and_verify`). Off: the SFT runs offline from the ledger and the
    adapter is loaded by name for evaluation, verified only by `/v1/models`."""
    refilter_repeats: int = Field(default=8, ge=2)
    """Before RL from an adapter: runs per pool scenario under it, at the bot's own temperature
    (the gate's), to find the scenarios RL trains on: those it fails in any run, and those where
    acting is wrong (`loop.contested`; with 2 runs a p = 0.5 scenario looks settled half the
    time)."""
    distill_steps: int = Field(default=0, ge=0)
    """Online distillation steps after the warm start, before GRPO / OPSD: each rolls the
    candidate so far out on the whole pool (`distill_repeats` runs a scenario, at the bot's own
    temperature) and trains on the `teacher`'s answers at the states it reached (`--algo
    distill`)."""
    distill_repeats: int = Field(default=2, ge=2)
    teacher: str | None = None
    """Distill's teacher: a vLLM URL, or `FILE.py:FUNCTION`, a scripted policy such as
    `expert.py:expert_policy` (relative to the loop file)."""
    grpo_steps: int = Field(default=0, ge=0)
    opsd_steps: int = Field(default=0, ge=0)
    group_size: int = Field(default=defaults.GROUP_SIZE, ge=2)
    """Rollouts per scenario per RL step (GRPO's group)."""
    scenarios_per_step: int | None = Field(default=4, ge=1)
    """Scenarios each RL step rolls out, drawn afresh each step (`TrainConfig.scenarios_per_step`;
    None: all): fewer scenarios in full groups make more steps of the same rollouts."""
    rank: int = Field(default=defaults.LORA_RANK, ge=1)
    alpha: int | None = Field(default=None, ge=1)
    """None: `defaults.lora_alpha(rank)`, twice the rank, as every other way in."""
    lr: float | None = Field(default=None, gt=0)
    """None: the trainer's per-algorithm default (`TrainConfig.learning_rate`)."""
    temperature: float = Field(default=defaults.TRAIN_TEMPERATURE, ge=0)
    """Sampling temperature for GRPO/OPSD exploration."""
    opsd_hint: Literal["system", "turn"] = "system"
    """Where OPSD's teacher reads its hint (`TrainConfig.opsd_hint`)."""
    step_s: float = Field(default=6.0, gt=0)
    """Expected seconds per optimiser step (an SFT step of 4 sessions on 2 CPU cores with the
    embedded model): the budget check uses it; set it from a run's metrics on other hardware."""
    episode_s: float = Field(default=20.0, gt=0)
    """Expected seconds per simulated episode of an online step, for the same check."""

    @model_validator(mode="after")
    def _teacher_given(self) -> "TrainSettings":
        if self.distill_steps and not self.teacher:
            raise ValueError(
                "train.distill_steps needs train.teacher: a vLLM URL or FILE.py:FUNCTION (e.g. "
                "expert.py:expert_policy)"
            )
        return self


class LiveSettings(_Part):
    """Whether the train stage learns from live calls, and from which (absent: from none).

    The calls are those that started within `since` and that the eligibility query lets train
    under `trust()` (consented, redacted, decided by one of `sources`, ended `settle` ago).
    """

    since: Span = 86400.0
    """Live calls that started within this span before the train stage (e.g. `24h`)."""
    sources: tuple[str, ...] = DEFAULT_TRUSTED_SOURCES
    """The scorers whose verdict may make a live call train (`coval`, `human`, `judge`, ...)."""
    settle: Span = DEFAULT_SETTLE_S
    """How long after a call ends its late scores are waited for before it may train."""
    opsd_steps: int = Field(default=4, ge=0)
    """OPSD steps on the judged calls, each scorer's explanation in the teacher's hint
    (0: none). They run first, from the incumbent that served the calls (on-policy)."""
    sft: StrictBool = True
    """Filtered SFT (up to `train.sft_epochs`) on the calls whose verdict passed."""
    judge: JudgeCalibrationSettings = JudgeCalibrationSettings()
    """When `sources` names the judge, its calls train only once its κ with people's labels
    on the same calls clears this (`judge: {min_labels: 50, min_kappa: 0.4}`); until then the
    cycle refuses them and says so in one line."""

    @field_validator("sources")
    @classmethod
    def _sources(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        try:
            LiveTrust(sources=value)
        except ValidationError as e:  # its own words, under this field's name
            raise ValueError(e.errors()[0]["ctx"]["error"]) from None
        return value

    def trust(self) -> LiveTrust:
        """The eligibility query's trust for these settings."""
        return LiveTrust(sources=self.sources, settle_s=self.settle)


NO_LIVE = LiveTrust(sources=())
"""The trust of a loop without `live:`: no live call trains."""


class GateSettings(_Part):
    """How the candidate is evaluated and gated on the held-out set."""

    repeats: int = Field(default=2, ge=1)
    config: Path | None = None
    """A gate thresholds file (as for `pipecat-rl gate --config`)."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """Gate thresholds set here win over the file (e.g. `p95_budget_ms`)."""


class LoopConfig(_Part):
    """One cycle: the bot, its scenarios, where it is served, the budget and the stages."""

    bot: str
    """The bot as `pipecat-rl simulate --bot` takes it."""
    pool: Path
    heldout: Path
    pool_sample: SampleSettings | None = None
    """The filter and the warm start run this sample of the pool (absent: all of it)."""
    heldout_sample: SampleSettings | None = None
    """The gate runs this sample of the held-out set (absent: all of it). The whole set is still
    frozen and kept out of training; the sample is what both policies are run on."""
    regressions: Path | None = None
    """A fixed regression suite (e.g. `ledger fork --failed --out DIR`): held-out scenarios both
    policies also run at evaluation, where the candidate must not be confirmed worse than the
    incumbent (the receipt's `regression_suite` check). Never trained on, never part of the
    paired score; frozen for the cycle like the held-out set."""
    out: Path
    """The cycle's folder: events.jsonl, metrics, the receipt, drafted scenarios."""
    expert_bot: str | None = None
    """A scripted expert agent whose verified calls are the warm start's demonstrations."""
    ledger: LedgerLocation | None = None
    """A SQLite file (from the file's folder) or a postgresql:// URL (default: --ledger's rule)."""
    incumbent: str | None = None
    """The registered adapter the cycle starts from and gates against (default: the live one):
    e.g. an SFT candidate, to measure what RL from it buys on the same held-out set."""
    model: str = defaults.MODEL
    """The base model served (a packaged name or an HF folder)."""
    adapter_prefix: str = Field(
        default=defaults.ADAPTER_PREFIX, pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$"
    )
    """The first part of every adapter the cycle trains (`<prefix>-<algo>-v<n>-<hash>`)."""
    llm_url: str | None = None
    """A running vLLM server; without one the cycle starts the embedded server."""
    bot_llm_url: str | None = None
    """The bot's own vLLM, where a promotion loads the adapter (default: `llm_url`)."""
    persona: Literal["scripted", "llm"] = "scripted"
    """The scenarios' scripted callers (the embedded default), or an LLM persona."""
    concurrency: int = Field(default=defaults.LOOP_CONCURRENCY, ge=1)
    executor: Executor = "local"
    """Where the cycle's episodes run: here, or one Ray task each (`simulator.executor`)."""
    ray_address: str | None = None
    """With executor `ray`: the cluster (`auto`, `ray://host:10001`; default Ray's own)."""
    max_tokens: int | None = Field(default=96, ge=1)
    seed: int = 0
    rubric: Rubric = DEFAULT_RUBRIC
    """The reward's parts, weights and roles for simulation and training (`scoring.rubric`)."""
    budget_s: float = Field(default=1800.0, gt=0)
    """Wall-time budget of one invocation: a stage that would overrun it does not start."""
    min_free_gb: float = Field(default=1.0, ge=0)
    filter: FilterSettings = Field(default_factory=FilterSettings)
    train: TrainSettings = Field(default_factory=TrainSettings)
    gate: GateSettings = Field(default_factory=GateSettings)
    live: LiveSettings | None = None
    """Training on live calls (`live: {since: 24h, sources: [human, coval]}`); absent: none."""
    promote: Literal["auto", "approve", "never"] = "auto"
    """`auto` promotes a PROMOTE verdict; `approve` waits for `pipecat-rl promote`."""
    drafts: Path | None = None
    """Where scenarios drafted from explained failures go for review (default: out/drafts)."""
    stop_after: Literal[STAGES] | None = None  # type: ignore[valid-type]
    """Stop (resumably) once this stage has finished."""

    @field_validator("llm_url", "bot_llm_url")
    @classmethod
    def _openai_root(cls, url: str | None, info: ValidationInfo) -> str | None:
        """Each server as its /v1 root (`serving.roots`), or the file refused under this key."""
        try:
            return None if url is None else openai_base_url(url, str(info.field_name))
        except ConfigError as e:  # reported as the file's other problems are
            raise ValueError(str(e)) from None

    @property
    def drafts_dir(self) -> Path:
        """The folder for drafted scenarios."""
        return self.drafts or self.out / "drafts"


def _rebase(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Paths in the file, taken from the file's folder."""
    out = dict(data)
    for key in ("pool", "heldout", "regressions", "out", "ledger", "drafts"):
        if isinstance(out.get(key), str) and not (key == "ledger" and is_url(out[key])):
            out[key] = str((base / out[key]).resolve())
    for key in ("bot", "expert_bot"):
        value = out.get(key)
        if isinstance(value, str) and (".py" in value or "/" in value):
            out[key] = str((base / value).resolve()) if not value.startswith("/") else value
    train = out.get("train")
    teacher = train.get("teacher") if isinstance(train, dict) else None
    if isinstance(teacher, str) and ".py:" in teacher and not teacher.startswith("/"):
        out["train"] = {**train, "teacher": str((base / teacher).resolve())}
    gate = out.get("gate")
    if isinstance(gate, dict) and isinstance(gate.get("config"), str):
        out["gate"] = {**gate, "config": str((base / gate["config"]).resolve())}
    return out


def load_loop_config(path: Path, **overrides: Any) -> LoopConfig:
    """Read a loop.yaml; `overrides` (CLI flags) win over the file.

    Raises:
        ConfigError: the file cannot be read or does not describe a cycle.
    """
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ConfigError(f"{path}: a loop file is YAML, named .yaml or .yml")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read the loop file {path}: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a loop file is a mapping of settings")
    data = {**_rebase(data, path.resolve().parent), **overrides}
    try:
        return LoopConfig.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()
        )
        raise ConfigError(f"{path}: {problems}") from e
