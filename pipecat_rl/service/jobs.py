"""The job queue's worker: one thread that runs queued jobs one at a time, in order.

Each job kind is one function `(JobContext, params) -> result`. The queue lives in the ledger,
so it survives the service: a job found `running` when the service starts was interrupted by a
crash. A cycle is resumed (it continues from its last finished stage); any other job is marked
failed, and the simulated sessions it left open are closed as harness errors, so nothing is
half-applied. A promotion is safe either way: it loads the adapter before it moves the pointer,
in one transaction.

Cancelling is cooperative. A queued job is cancelled at once and never runs; a running one is
asked to stop, and stops at its next checkpoint, raising `JobCancelled`: a simulation starts no
more episodes (those in flight finish: Pipecat pipelines are not cut mid-call), and every event
a job emits checks (a training step, a cycle's stage boundary). The worker then closes
`interrupted` the simulated sessions the job left open and records it `cancelled`. Stretches
without a checkpoint (a gate's paired runs, a promotion) run to their end, so nothing is left
half-applied.

Three modules are called `jobs.py`, one per concern of this one resource: this worker, its
HTTP routes (`routers/jobs.py`) and its records in the ledger (`ledger/jobs.py`).
"""

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from loguru import logger
from pydantic import TypeAdapter

from pipecat_rl.errors import (
    ConfigError,
    GateStopped,
    JobCancelled,
    PipecatRLError,
    first_error,
)
from pipecat_rl.ledger import Ledger
from pipecat_rl.ledger.eligibility import SIMULATED_SOURCES
from pipecat_rl.ledger.jobs import TERMINAL_STATES, JobRecord
from pipecat_rl.ledger.liveness import writer_identity
from pipecat_rl.service.bodies import (
    CycleJob,
    GateJob,
    JobRequest,
    PromoteJob,
    RollbackJob,
    SimulateJob,
    TrainJob,
)
from pipecat_rl.service.security import confine, confine_loop_file, confine_scenario_files
from pipecat_rl.service.settings import ServiceSettings
from pipecat_rl.simulator.options import Server, SimulationOptions
from pipecat_rl.training.config import teacher_kind

RESUMABLE_KINDS = frozenset({"cycle"})
"""Kinds that continue where they stopped when the service restarts; the rest are failed."""

_REQUEST = TypeAdapter(JobRequest)


def new_job_id(kind: str) -> str:
    """A fresh, never-reused job id."""
    return f"job-{kind}-{uuid.uuid4().hex[:12]}"


def split_bot(value: str) -> tuple[str, str | None]:
    """`path/bot.py:run_bot` as (`path/bot.py`, `run_bot`); a plain path has no function."""
    head, sep, tail = value.rpartition(":")
    if sep and head.endswith(".py") and tail.isidentifier():
        return head, tail
    return value, None


CALLABLE_FIELDS = frozenset({"bot", "teacher"})
"""Fields naming a Python file, optionally with its function (`bot.py:run_bot`)."""


def path_part(field_name: str, value: str) -> str | None:
    """The file or folder a path field's value names; None for a teacher given as a URL."""
    if field_name == "teacher" and teacher_kind(value) == "logprobs":
        return None
    return split_bot(value)[0] if field_name in CALLABLE_FIELDS else value


def _resolve(data_dir: Path, field_name: str, value: str) -> tuple[str, bool]:
    """`value` resolved inside `data_dir` (HTTP 403 outside it), and whether it exists.

    A bot or a scripted teacher is a file (`bot.py`, `bot.py:function`); a teacher may be a URL
    (kept as given); other fields may name files or folders.
    """
    if path_part(field_name, value) is None:
        return value, True
    if field_name in CALLABLE_FIELDS:
        path, function = split_bot(value)
        resolved = confine(data_dir, path)
        return (f"{resolved}:{function}" if function else str(resolved)), resolved.is_file()
    resolved = confine(data_dir, value)
    return str(resolved), resolved.exists()


def resolve_paths(data_dir: Path, request: Any) -> Any:
    """A copy of a request with every path field resolved inside `data_dir`.

    Checked at submission, so a typo is answered now rather than by a job failing later.

    Raises:
        HTTPException: 403 when a path resolves outside the data directory.
        RequestValidationError: 422 naming each path field whose file or folder does not exist.
    """
    changes: dict[str, Any] = {}
    missing: list[dict[str, Any]] = []
    for name in request.PATH_FIELDS:
        value = getattr(request, name)
        if value is None:
            continue
        many = isinstance(value, list)
        resolved = []
        for index, item in enumerate(value if many else [value]):
            path, exists = _resolve(data_dir, name, item)
            if not exists:
                what = "file" if name in CALLABLE_FIELDS else "file or folder"
                missing.append({
                    "type": "path_missing", "loc": ("body", name, *([index] if many else [])),
                    "msg": f"{name}: no such {what} {item!r} in the service's data directory",
                    "input": item,
                })  # fmt: skip
            resolved.append(path)
        changes[name] = resolved if many else resolved[0]
    if missing:
        raise RequestValidationError(missing)
    return request.model_copy(update=changes)


@dataclass
class JobContext:
    """What a running job gets: its record, the ledger, the settings and a way to report."""

    job: JobRecord
    ledger: Ledger
    settings: ServiceSettings
    cancel: threading.Event = field(default_factory=threading.Event)
    """Set when a DELETE asked this job to stop."""
    _stopping: bool = field(default=False, init=False)

    def emit(self, event: str, **data: Any) -> None:
        """Append an event to the job's stream (GET /jobs/{id}/events), then `checkpoint()`."""
        self.record(event, **data)
        self.checkpoint()

    def record(self, event: str, **data: Any) -> None:
        """Append an event to the job's stream, whatever was asked of the job."""
        self.ledger.add_job_event(self.job.id, event, data)

    def checkpoint(self) -> None:
        """Raise `JobCancelled` if the job was asked to stop (once: it then unwinds)."""
        if self.cancel.is_set() and not self._stopping:
            self._stopping = True
            raise JobCancelled(f"job {self.job.id} was cancelled")


# -- one function per kind -------------------------------------------------------------------


def _still_inside(ctx: JobContext, *, scenarios: Sequence[str] = (), config: str | None = None,
                  **overrides: Any) -> None:  # fmt: skip
    """Check again, as the job starts, what the router checked when it was queued.

    The files a job names can change between the two (an edit, a symlink swapped, a job
    requeued after a restart): a path that now leads outside the data dir fails the job.
    """
    root = ctx.settings.data_dir
    try:
        for target in scenarios:
            confine_scenario_files(root, target)
        if config is not None:
            confine_loop_file(root, Path(config), **overrides)
    except HTTPException as e:
        raise ConfigError(f"refused as the job started: {e.detail}") from e


def _server(ctx: JobContext, needed: bool = True) -> Server:
    return Server(url=ctx.settings.llm_url, model=ctx.settings.model, needed=needed)


def _simulate(ctx: JobContext, p: SimulateJob) -> dict[str, Any]:
    from pipecat_rl.simulator import load_bot, load_scenarios, run

    def episode(e) -> None:  # never raises: the episodes still in flight must finish whole
        ctx.record("episode", scenario=e.scenario_id, session=e.session_id, outcome=e.outcome,
                   reward=e.reward)  # fmt: skip

    options = SimulationOptions(
        persona=p.persona, seed=p.seed, repeats=p.repeats, concurrency=p.concurrency,
        max_tokens=p.max_tokens,
    )  # fmt: skip
    _still_inside(ctx, scenarios=list(p.scenarios))
    report = run(
        load_scenarios(list(p.scenarios)), load_bot(p.bot), options, ctx.ledger,
        policies=[p.adapter or "base"], server=_server(ctx, needed=not p.no_server),
        on_episode=episode, stop=ctx.cancel.is_set,
    )  # fmt: skip
    ctx.checkpoint()  # stopped: what ran is recorded, and the job ends cancelled
    episodes = report.episodes
    return {
        "episodes": len(episodes),
        "passed": sum(1 for e in episodes if e.passed),
        "errors": report.harness_errors,
        "heldout_set_id": report.heldout_set_id,
        "session_ids": [e.session_id for e in episodes],
    }


TRAIN_FIELDS = frozenset({
    "algo", "parent", "steps", "epochs", "group_size", "rank", "lr", "temperature", "seed",
    "teacher", "teacher_model",
})  # fmt: skip
"""The train request's fields that are `TrainConfig` fields of the same name."""


def _train(ctx: JobContext, p: TrainJob) -> dict[str, Any]:
    from pipecat_rl.loop.cycle import load_training

    TrainConfig, train = load_training()
    config = TrainConfig(
        base_model=ctx.settings.model, out_dir=ctx.settings.data_dir / "adapters",
        **p.model_dump(include=TRAIN_FIELDS),
    )  # fmt: skip
    rollouts = None
    if p.scenarios and p.bot:
        from pipecat_rl.simulator import load_bot, load_scenarios
        from pipecat_rl.simulator.options import Rollouts

        _still_inside(ctx, scenarios=list(p.scenarios))
        rollouts = Rollouts(
            scenarios=load_scenarios(list(p.scenarios)), bot=load_bot(p.bot),
            options=SimulationOptions(persona=p.persona, max_tokens=p.max_tokens),
        )  # fmt: skip
    result = train(
        ctx.ledger, config, server_url=ctx.settings.llm_url, rollouts=rollouts,
        progress=lambda row: ctx.emit("progress", **row),
    )  # fmt: skip
    return {"adapter": result.adapter, "path": str(result.path), "metrics": result.metrics}


def _gate(ctx: JobContext, p: GateJob) -> dict[str, Any]:
    from pipecat_rl.gate import Simulated, load_gate_config, run_gate
    from pipecat_rl.simulator import load_bot, load_scenarios

    settings = load_gate_config(Path(p.config) if p.config else None)
    _still_inside(ctx, scenarios=[p.scenarios])
    ctx.emit("simulating", candidate=p.candidate, incumbent=p.incumbent, repeats=p.repeats)
    evidence = Simulated(
        scenarios=load_scenarios([Path(p.scenarios)]), bot=load_bot(p.bot),
        options=SimulationOptions(
            persona=p.persona, seed=settings.seed, repeats=p.repeats, concurrency=p.concurrency,
            max_tokens=p.max_tokens,
        ),
        server=_server(ctx), files=Path(p.scenarios), stop=ctx.cancel.is_set,
    )  # fmt: skip
    folder = ctx.settings.data_dir / "receipts" / ctx.job.id
    try:
        done = run_gate(ctx.ledger, p.candidate, p.incumbent, evidence, settings, folder)
    except GateStopped:
        ctx.checkpoint()  # asked to stop: the job ends cancelled, with no receipt
        raise
    receipt = done.receipt
    return {"verdict": receipt.verdict, "reason": receipt.reason, "receipt_id": ctx.job.id,
            "receipt": str(done.paths["json"])}  # fmt: skip


def _admin(ctx: JobContext):
    from pipecat_rl.serving.server import VLLMAdmin

    return VLLMAdmin(ctx.settings.llm_url) if ctx.settings.llm_url else None


def _promote(ctx: JobContext, p: PromoteJob) -> dict[str, Any]:
    from pipecat_rl.gate import promote

    return promote(Path(p.receipt), ctx.ledger, _admin(ctx)).model_dump(mode="json")


def _rollback(ctx: JobContext, p: RollbackJob) -> dict[str, Any]:
    from pipecat_rl.gate import rollback

    return rollback(ctx.ledger, _admin(ctx)).model_dump(mode="json")


def _cycle(ctx: JobContext, p: CycleJob) -> dict[str, Any]:
    from pipecat_rl.loop.config import load_loop_config
    from pipecat_rl.loop.cycle import run_cycle

    overrides = p.model_dump(include={"budget_s", "stop_after"}, exclude_none=True)
    _still_inside(ctx, config=p.config, ledger=ctx.settings.ledger, **overrides)
    config = load_loop_config(Path(p.config), ledger=ctx.settings.ledger, **overrides)
    if config.llm_url is None and ctx.settings.llm_url is not None:
        config = config.model_copy(update={"llm_url": ctx.settings.llm_url})
    summary = run_cycle(config, emit=lambda event, data: ctx.emit(event, **data))
    return summary.model_dump(mode="json")


HANDLERS: dict[str, Callable[[JobContext, Any], dict[str, Any]]] = {
    "simulate": _simulate,
    "train": _train,
    "gate": _gate,
    "promote": _promote,
    "rollback": _rollback,
    "cycle": _cycle,
}


# -- the worker --------------------------------------------------------------------------------


def recover_interrupted(ledger: Ledger) -> list[JobRecord]:
    """Resume or fail every job a crash left `running`; returns them as they are now."""
    recovered = []
    for job in ledger.jobs(state="running", limit=10_000):
        closed = ledger.close_dead_sessions(
            since=job.started_at or job.submitted_at,
            sources=SIMULATED_SOURCES,
            reason=f"interrupted: the service stopped while job {job.id} ran",
        )
        if job.kind in RESUMABLE_KINDS:
            ledger.add_job_event(job.id, "interrupted", {"resume": True, "closed": closed})
            recovered.append(ledger.finish_job(job.id, "queued"))
        else:
            ledger.add_job_event(job.id, "interrupted", {"resume": False, "closed": closed})
            recovered.append(
                ledger.finish_job(
                    job.id, "failed",
                    error=f"interrupted: the service stopped while this {job.kind} job ran "
                    f"(attempt {job.attempts}); what it finished is in the ledger, "
                    f"{len(closed)} session(s) it left open were closed as errors; submit it "
                    "again",
                )
            )  # fmt: skip
        logger.warning(f"job {job.id} ({job.kind}) was interrupted: {recovered[-1].state}")
    return recovered


def close_job_sessions(ctx: JobContext, reason: str) -> list[str]:
    """Close `interrupted` the simulated sessions a job that did not finish left open.

    Its sessions are the simulated ones this process started since the job did: the worker
    runs one job at a time, and they name this process as their writer. This process is alive,
    so the ledger's closer of dead writers' sessions would never close them.
    """
    me = writer_identity()
    ids = [
        s.id
        for s in ctx.ledger.sessions(since=ctx.job.started_at or ctx.job.submitted_at)
        if s.source in SIMULATED_SOURCES and s.metadata.get("writer") == me
    ]
    return ctx.ledger.close_sessions(ids, reason=reason)


@dataclass(frozen=True)
class Cancellation:
    """What a cancel request did to a job."""

    job: JobRecord
    """The job as it is now."""
    outcome: Literal["cancelled", "requested", "ended", "elsewhere"]
    """`cancelled`: it was queued and never runs; `requested`: it runs and stops at its next
    checkpoint; `ended`: it had already ended; `elsewhere`: another service process runs it."""


class JobWorker:
    """Runs queued jobs one at a time on a background thread, in submission order."""

    def __init__(self, settings: ServiceSettings):
        self.settings = settings
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # a claim and a cancel never interleave
        self._running: JobContext | None = None

    def start(self) -> None:
        """Recover interrupted jobs, then start taking jobs from the queue."""
        with Ledger(self.settings.ledger) as ledger:
            recover_interrupted(ledger)
        self._thread = threading.Thread(target=self._loop, name="pipecat-rl-jobs", daemon=True)
        self._thread.start()

    def notify(self) -> None:
        """A job was queued: look now rather than at the next poll."""
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the running job (a job still running after `timeout` is left to recovery)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def cancel(self, ledger: Ledger, job_id: str) -> Cancellation:
        """Cancel a queued job at once, or ask the running one to stop at its next checkpoint.

        Raises:
            NotInLedgerError: there is no such job.
        """
        with self._lock:
            if ledger.cancel_queued_job(job_id):
                ledger.add_job_event(job_id, "cancelled", {"was": "queued"})
                return Cancellation(ledger.job(job_id), "cancelled")
            job = ledger.job(job_id)
            if job.state in TERMINAL_STATES:
                return Cancellation(job, "ended")
            running = self._running
            if running is None or running.job.id != job_id:
                return Cancellation(job, "elsewhere")
            if not running.cancel.is_set():
                running.cancel.set()
                ledger.add_job_event(job_id, "cancel_requested", {})
            return Cancellation(job, "requested")

    def _loop(self) -> None:
        with Ledger(self.settings.ledger) as ledger:
            while not self._stop.is_set():
                with self._lock:
                    job = ledger.claim_next_job()
                    self._running = None if job is None else JobContext(job, ledger, self.settings)
                if self._running is None:
                    self._wake.wait(self.settings.poll_s * 5)
                    self._wake.clear()
                    continue
                run_job(self._running)
                with self._lock:
                    self._running = None


def run_job(ctx: JobContext) -> JobRecord:
    """Run one claimed job to its end and record how it ended.

    A job that did not finish (failed, crashed or cancelled) has the simulated sessions it left
    open closed `interrupted`, so none stays open beside a live service.
    """
    job = ctx.job
    ctx.record("started", kind=job.kind, attempt=job.attempts)
    try:
        params = _REQUEST.validate_python({**job.params, "kind": job.kind})
        result = HANDLERS[job.kind](ctx, params)
    except (Exception, JobCancelled, BaseExceptionGroup) as raised:
        # a task group wraps what its tasks raised: the job records the error itself
        e = first_error(raised)
        if isinstance(e, JobCancelled):
            closed = close_job_sessions(ctx, f"interrupted: job {job.id} was cancelled")
            ctx.record("cancelled", closed=closed)
            return ctx.ledger.finish_job(
                job.id, "cancelled",
                error=f"cancelled while running; {len(closed)} session(s) it left open were "
                "closed interrupted (never trained on); what it finished is in the ledger",
            )  # fmt: skip
        if not isinstance(e, Exception):
            raise  # an interrupt of the service itself, inside a group: not the job's
        # a bug in a job must not kill the worker: record it
        error = str(e) if isinstance(e, PipecatRLError) else f"{type(e).__name__}: {e}"
        if not isinstance(e, PipecatRLError):
            logger.opt(exception=raised).error(f"job {job.id} crashed")
        closed = close_job_sessions(ctx, f"interrupted: job {job.id} failed")
        ctx.record("failed", error=error, closed=closed)
        return ctx.ledger.finish_job(job.id, "failed", error=error)
    ctx.record("done", result=result)
    return ctx.ledger.finish_job(job.id, "done", result=result)
