"""Request and response bodies of the service: one pydantic model per job kind and resource.

Fields that name files are strings that can be paths here (`PathText`: no NUL byte, not over
`security.MAX_PATH_BYTES`); before a job is queued the router resolves each one inside the data
directory and checks that it exists (`PATH_FIELDS` says which they are), and that every path in
the files it names is inside the data directory too.
What a simulation or the gate shares with the CLI takes its default from the same place the
verbs do (`SimulationOptions`, `GATE_REPEATS`), so a request left at its defaults runs what the
verb would. Each field's docstring is its description in the OpenAPI document.
"""

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, model_validator

from pipecat_rl.ledger.jobs import JobEventRecord, JobRecord, JobState
from pipecat_rl.loop.config import STAGES
from pipecat_rl.service.security import path_problem
from pipecat_rl.simulator.options import GATE_REPEATS, PersonaKind, SimulationOptions
from pipecat_rl.training.config import ONLINE_ALGOS, ROLLOUT_ONLY, Algo, TrainConfig

MAX_REPEATS = 64
"""Runs per scenario one request may ask for (the service is shared: a typo must not book it
for a week)."""
MAX_CONCURRENCY = 64


def _path_text(value: str) -> str:
    problem = path_problem(value)
    if problem:
        raise ValueError(f"not a path: it {problem}")
    return value


PathText = Annotated[str, AfterValidator(_path_text)]
"""A string that can be a path (a NUL byte or an over-long path is a 422 naming the field)."""


def _like(model: type[BaseModel], name: str, **constraints: Any) -> Any:
    """A field defaulting to `model`'s own default for `name`: the one the CLI verbs use too."""
    return Field(default=model.model_fields[name].default, **constraints)


def _option(name: str, **constraints: Any) -> Any:
    return _like(SimulationOptions, name, **constraints)


def _training(name: str, **constraints: Any) -> Any:
    return _like(TrainConfig, name, **constraints)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    PATH_FIELDS: ClassVar[tuple[str, ...]] = ()
    """Fields holding paths (or lists of paths) that must exist inside the data directory."""


class SimulateJob(_Body):
    """Simulate scenarios against a bot and record every call (`pipecat-rl simulate`)."""

    PATH_FIELDS: ClassVar[tuple[str, ...]] = ("scenarios", "bot")
    kind: Literal["simulate"] = "simulate"
    """The job kind."""
    scenarios: list[PathText] = Field(min_length=1, max_length=64)
    """Scenario files or folders, relative to the data directory."""
    bot: PathText
    """The bot file (`bot.py`, or `bot.py:function`), relative to the data directory."""
    adapter: str | None = None
    """The adapter to serve the agent (None: the base model)."""
    persona: PersonaKind = _option("persona")
    """The caller: an LLM persona, or the scenarios' `script:` rules (a scenario with a script
    is always played by it)."""
    repeats: int | None = _option("repeats", ge=1, le=MAX_REPEATS)
    """Runs per scenario (None: each scenario's own `runs`)."""
    concurrency: int = _option("concurrency", ge=1, le=MAX_CONCURRENCY)
    """Episodes at once."""
    seed: int = _option("seed", ge=0, le=2**63 - 1)
    """Run seed; each episode derives its own from it."""
    max_tokens: int | None = _option("max_tokens", ge=1)
    """Cap on the agent's replies when its bot sets none (None: leave it)."""
    no_server: StrictBool = False
    """Start no LLM server (a scripted persona and a bot that needs no model, e.g. the expert)."""


class TrainJob(_Body):
    """Train an adapter from the ledger (`pipecat-rl train`) on the model the service serves.

    Defaults are the trainer's own (`pipecat_rl.training.TrainConfig`).
    """

    PATH_FIELDS: ClassVar[tuple[str, ...]] = ("scenarios", "bot", "teacher")
    kind: Literal["train"] = "train"
    """The job kind."""
    algo: Algo
    """SFT on passed calls and demonstrations, GRPO on groups of rewarded calls, OPSD, RFT on
    the parent's passed rollouts, distill from a `teacher`, or DPO on duel picks."""
    parent: str | None = _training("parent")
    """The adapter to continue from (None: a fresh LoRA on the base model)."""
    steps: int = _training("steps", ge=1)
    """GRPO / OPSD optimiser steps (each an online round when `scenarios` are given)."""
    epochs: int = _training("epochs", ge=1)
    """SFT: most passes over the rows."""
    group_size: int = _training("group_size", ge=2)
    """GRPO: episodes per scenario per step."""
    rank: int = _training("rank", ge=1)
    """LoRA rank (alpha is `defaults.lora_alpha(rank)`, as every other way in)."""
    lr: float | None = _training("lr", gt=0)
    """Learning rate (None: the trainer's per-algorithm default)."""
    temperature: float = _training("temperature", ge=0)
    """GRPO / OPSD exploration temperature."""
    seed: int = _training("seed", ge=0)
    """Training seed."""
    scenarios: list[PathText] | None = Field(default=None, min_length=1, max_length=64)
    """Online GRPO / OPSD: the scenarios to simulate at every step (with `bot`)."""
    bot: PathText | None = None
    """Online GRPO / OPSD: the bot to simulate (with `scenarios`)."""
    persona: PersonaKind = _option("persona")
    """Online: the caller of the simulated calls."""
    max_tokens: int | None = _option("max_tokens", ge=1)
    """Online: cap on the agent's replies when its bot sets none."""
    teacher: PathText | None = None
    """Distill: a vLLM URL serving a model with the student's tokenizer, or a scripted policy
    `teacher.py:function` relative to the data directory (`TrainConfig.teacher`)."""
    teacher_model: str | None = None
    """Distill with a URL: the model to ask its server for (None: its first)."""

    @model_validator(mode="after")
    def _online(self) -> "TrainJob":
        online = ", ".join(ONLINE_ALGOS)
        if (self.scenarios is None) != (self.bot is None):
            raise ValueError("online training needs both scenarios and bot (or neither)")
        if self.scenarios is not None and self.algo not in ONLINE_ALGOS:
            raise ValueError(f"scenarios and bot are for algo {online} (online); not {self.algo}")
        if self.scenarios is None and self.algo in ROLLOUT_ONLY:
            raise ValueError(f"algo {self.algo} rolls the parent out: give scenarios and bot")
        if (self.teacher is None) != (self.algo != "distill"):
            raise ValueError("teacher is for algo distill, which needs one (URL or file:function)")
        return self


class GateJob(_Body):
    """Gate a candidate on held-out scenarios and record its receipt (`pipecat-rl gate`)."""

    PATH_FIELDS: ClassVar[tuple[str, ...]] = ("scenarios", "bot", "config")
    kind: Literal["gate"] = "gate"
    """The job kind."""
    candidate: str
    """The adapter to gate (or `base`)."""
    incumbent: str = "live"
    """The adapter to beat: a name, `base`, or `live` (the live pointer)."""
    scenarios: PathText
    """The held-out scenario file or folder, relative to the data directory."""
    bot: PathText
    """The bot file (`bot.py`, or `bot.py:function`), relative to the data directory."""
    repeats: int = Field(default=GATE_REPEATS, ge=1, le=MAX_REPEATS)
    """Paired runs per scenario and policy (K)."""
    persona: PersonaKind = _option("persona")
    """The caller: an LLM persona, or the scenarios' `script:` rules."""
    concurrency: int = _option("concurrency", ge=1, le=MAX_CONCURRENCY)
    """Episodes at once, shared by both policies."""
    max_tokens: int | None = _option("max_tokens", ge=1)
    """Cap on the agent's replies when its bot sets none (None: leave it)."""
    config: PathText | None = None
    """A gate thresholds file (YAML/JSON), relative to the data directory (None: defaults)."""


class PromoteJob(_Body):
    """Load a PROMOTE receipt's candidate into the bot's vLLM, then move the live pointer."""

    PATH_FIELDS: ClassVar[tuple[str, ...]] = ("receipt",)
    kind: Literal["promote"] = "promote"
    """The job kind."""
    receipt: PathText
    """A receipt.json (or its folder) the gate recorded, relative to the data directory."""


class RollbackJob(_Body):
    """Serve the adapter that was live before the current one again."""

    kind: Literal["rollback"] = "rollback"
    """The job kind."""


class CycleJob(_Body):
    """Run (or resume) one night-loop cycle from a loop.yaml (`pipecat-rl cycle`).

    The cycle records into the service's ledger and, when its file names no `llm_url`,
    simulates on the service's `--llm-url`.
    """

    PATH_FIELDS: ClassVar[tuple[str, ...]] = ("config",)
    kind: Literal["cycle"] = "cycle"
    """The job kind."""
    config: PathText
    """The loop file, relative to the data directory."""
    budget_s: float | None = Field(default=None, gt=0)
    """Wall-time budget of this run in seconds (None: the file's `budget_s`)."""
    stop_after: Literal[STAGES] | None = None  # type: ignore[valid-type]
    """Stop, resumably, once this stage has finished (None: the file's `stop_after`)."""


JobRequest = Annotated[
    SimulateJob | TrainJob | GateJob | PromoteJob | RollbackJob | CycleJob,
    Field(discriminator="kind"),
]
"""Any job a client may submit, told apart by `kind`."""

JOB_KINDS = ("simulate", "train", "gate", "promote", "rollback", "cycle")


class JobView(BaseModel):
    """A job as the API shows it."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    id: str
    """The job's id (never reused)."""
    kind: str
    """simulate, train, gate, promote, rollback or cycle."""
    state: JobState
    """queued → running → done, failed or cancelled."""
    params: dict[str, Any]
    """The request as queued, its paths resolved inside the data directory."""
    result: dict[str, Any] | None
    """What a `done` job produced."""
    error: str | None
    """Why a job failed or was cancelled."""
    submitted_at: float
    """Unix time the job was queued."""
    started_at: float | None
    """Unix time its last attempt started."""
    ended_at: float | None
    """Unix time it ended."""
    attempts: int
    """Times a worker started it (a cycle a crash interrupted runs again)."""
    events: int = 0
    """How many events the job has emitted so far."""

    @classmethod
    def of(cls, job: JobRecord, events: int = 0) -> "JobView":
        """The view of a ledger job record."""
        return cls(**job.model_dump(), events=events)


class EventView(BaseModel):
    """One job event (also the `data:` of each Server-Sent Event)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    seq: int
    """Its number, from 1 (the SSE `id:`)."""
    at: float
    """Unix time it was emitted."""
    event: str
    """Its name (started, episode, stage_finished, cancel_requested, done, failed, ...)."""
    data: dict[str, Any]
    """What it says."""

    @classmethod
    def of(cls, e: JobEventRecord) -> "EventView":
        """The view of a ledger job event."""
        return cls(seq=e.seq, at=e.at, event=e.event, data=e.data)


class AdapterView(BaseModel):
    """An adapter with its lineage: what it came from, what came from it, whether it serves."""

    name: str
    kind: Literal["base", "adapter"]
    parent: str | None
    children: list[str]
    base_model: str | None
    path: str | None
    created_at: float | None
    guard: str
    guard_detail: str
    training_sessions: int | None
    live: bool


class PointerView(BaseModel):
    """One position of the live pointer."""

    adapter: str
    moved_at: float
    receipt: str | None
    previous: str | None


class LiveView(BaseModel):
    """What serves now, and every move before."""

    adapter: str
    """The live adapter (`base` when nothing was ever promoted)."""
    pointer: PointerView | None
    history: list[PointerView]


class LiveMoveRequest(_Body):
    """Move the live pointer: promote a receipt's candidate, or roll back."""

    PATH_FIELDS: ClassVar[tuple[str, ...]] = ("receipt",)
    action: Literal["promote", "rollback"]
    """promote a receipt's candidate, or roll back to the adapter live before."""
    receipt: PathText | None = None
    """promote: a receipt.json (or its folder) the gate recorded, relative to the data
    directory."""


class ReceiptSummary(BaseModel):
    """A receipt the service can serve."""

    id: str
    verdict: str
    candidate: str
    incumbent: str
    created_at: str


class ErrorView(BaseModel):
    """An error the service answered with."""

    detail: str
    """What was wrong, and what to do about it."""


ERRORS: dict[int, str] = {
    400: "The receipt id is not one (letters, digits, `.`, `_`, `-`).",
    401: "Missing or wrong bearer token (`Authorization: Bearer <token>`).",
    403: "A path in the request, or in a file it names (a loop file's `out:`, a scenario's "
    "`!include` or world pack), lies outside the service's data directory.",
    404: "No such job or receipt (or a receipt this version cannot read).",
    409: "The job has already ended, or another service process runs it.",
    413: "The request body is over the service's limit (64 KiB unless configured).",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` declaring the service's error answers `codes` (see `ERRORS`)."""
    return {code: {"model": ErrorView, "description": ERRORS[code]} for code in codes}
