"""Request and response bodies of the service: one pydantic model per job kind and resource.

Fields that name files are plain strings here; the router confines each one to the data
directory before a job is queued (`PATH_FIELDS` says which they are). Called `models.py` as in
FastAPI's own layout; the weights the server serves are `pipecat_rl.models`.
"""

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipecat_rl.ledger.jobs import JobEventRecord, JobRecord, JobState


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    PATH_FIELDS: ClassVar[tuple[str, ...]] = ()
    """Fields holding paths (or lists of paths) that must stay inside the data directory."""


class SimulateJob(_Body):
    """Simulate scenarios against a bot and record every call (`pipecat-rl simulate`)."""

    PATH_FIELDS: ClassVar[tuple[str, ...]] = ("scenarios", "bot")
    kind: Literal["simulate"] = "simulate"
    scenarios: list[str] = Field(min_length=1, max_length=64)
    bot: str
    adapter: str | None = None
    persona: Literal["scripted", "llm"] = "scripted"
    repeats: int | None = Field(default=None, ge=1, le=64)
    concurrency: int = Field(default=4, ge=1, le=64)
    seed: int = 0
    max_tokens: int | None = Field(default=None, ge=1)
    no_server: bool = False
    """Start no LLM server (a scripted persona and a bot that needs no model, e.g. the expert)."""


class TrainJob(_Body):
    """Train an adapter from the ledger (`pipecat_rl.training.train`)."""

    PATH_FIELDS: ClassVar[tuple[str, ...]] = ("scenarios", "bot")
    kind: Literal["train"] = "train"
    algo: Literal["sft", "grpo", "opsd"]
    parent: str | None = None
    steps: int | None = Field(default=None, ge=1)
    epochs: int | None = Field(default=None, ge=1)
    group_size: int | None = Field(default=None, ge=1)
    rank: int | None = Field(default=None, ge=1)
    lr: float | None = Field(default=None, gt=0)
    seed: int = 0
    scenarios: list[str] | None = None
    bot: str | None = None


class GateJob(_Body):
    """Gate a candidate on held-out scenarios and write its receipt (`pipecat-rl gate`)."""

    PATH_FIELDS: ClassVar[tuple[str, ...]] = ("scenarios", "bot", "config")
    kind: Literal["gate"] = "gate"
    candidate: str
    incumbent: str = "live"
    scenarios: str
    bot: str
    repeats: int = Field(default=2, ge=1, le=64)
    persona: Literal["scripted", "llm"] = "scripted"
    concurrency: int = Field(default=4, ge=1, le=64)
    max_tokens: int | None = Field(default=None, ge=1)
    config: str | None = None
    """A gate thresholds file (YAML/JSON)."""


class PromoteJob(_Body):
    """Load a PROMOTE receipt's candidate into the bot's vLLM, then move the live pointer."""

    PATH_FIELDS: ClassVar[tuple[str, ...]] = ("receipt",)
    kind: Literal["promote"] = "promote"
    receipt: str


class RollbackJob(_Body):
    """Serve the adapter that was live before the current one again."""

    kind: Literal["rollback"] = "rollback"


class CycleJob(_Body):
    """Run (or resume) one night-loop cycle from a loop.yaml (`pipecat-rl cycle`)."""

    PATH_FIELDS: ClassVar[tuple[str, ...]] = ("config",)
    kind: Literal["cycle"] = "cycle"
    config: str
    budget_s: float | None = Field(default=None, gt=0)


JobRequest = Annotated[
    SimulateJob | TrainJob | GateJob | PromoteJob | RollbackJob | CycleJob,
    Field(discriminator="kind"),
]
"""Any job a client may submit, told apart by `kind`."""

JOB_KINDS = ("simulate", "train", "gate", "promote", "rollback", "cycle")


class JobView(BaseModel):
    """A job as the API shows it."""

    id: str
    kind: str
    state: JobState
    params: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    attempts: int
    events: int = 0
    """How many events the job has emitted so far."""

    @classmethod
    def of(cls, job: JobRecord, events: int = 0) -> "JobView":
        """The view of a ledger job record."""
        return cls(**job.model_dump(), events=events)


class EventView(BaseModel):
    """One job event (also the `data:` of each Server-Sent Event)."""

    seq: int
    at: float
    event: str
    data: dict[str, Any]

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
    receipt: str | None = None


class ReceiptSummary(BaseModel):
    """A receipt the service can serve."""

    id: str
    verdict: str
    candidate: str
    incumbent: str
    created_at: str
