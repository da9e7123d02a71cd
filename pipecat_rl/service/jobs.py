"""The job queue's worker: one thread that runs queued jobs one at a time, in order.

Each job kind is one function `(JobContext, params) -> result`. The queue lives in the ledger,
so it survives the service: a job found `running` when the service starts was interrupted by a
crash. A cycle is resumed (it continues from its last finished stage); any other job is marked
failed, and the simulated sessions it left open are closed as harness errors, so nothing is
half-applied. A promotion is safe either way: it loads the adapter before it moves the pointer,
in one transaction.

Three modules are called `jobs.py`, one per concern of this one resource: this worker, its
HTTP routes (`routers/jobs.py`) and its records in the ledger (`ledger/jobs.py`).
"""

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger
from pydantic import TypeAdapter

from pipecat_rl.errors import PipecatRLError
from pipecat_rl.ledger import Ledger
from pipecat_rl.ledger.eligibility import SIMULATED_SOURCES
from pipecat_rl.ledger.jobs import JobRecord
from pipecat_rl.service.models import (
    CycleJob,
    GateJob,
    JobRequest,
    PromoteJob,
    RollbackJob,
    SimulateJob,
    TrainJob,
)
from pipecat_rl.service.security import confine
from pipecat_rl.service.settings import ServiceSettings
from pipecat_rl.simulator.options import Server, SimulationOptions

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


def confine_bot(data_dir: Path, value: str) -> str:
    """The bot spec with its file confined to the data directory (a module name is refused)."""
    path, function = split_bot(value)
    resolved = confine(data_dir, path)
    return f"{resolved}:{function}" if function else str(resolved)


def confine_params(data_dir: Path, request: Any) -> Any:
    """A copy of a request with every path field resolved inside `data_dir` (or HTTP 403)."""
    changes: dict[str, Any] = {}
    for name in request.PATH_FIELDS:
        value = getattr(request, name)
        if value is None:
            continue
        fix = confine_bot if name == "bot" else lambda d, v: str(confine(d, v))
        changes[name] = (
            [fix(data_dir, v) for v in value] if isinstance(value, list) else fix(data_dir, value)
        )
    return request.model_copy(update=changes)


@dataclass
class JobContext:
    """What a running job gets: its record, the ledger, the settings and a way to report."""

    job: JobRecord
    ledger: Ledger
    settings: ServiceSettings

    def emit(self, event: str, **data: Any) -> None:
        """Append an event to the job's stream (GET /jobs/{id}/events)."""
        self.ledger.add_job_event(self.job.id, event, data)

    @property
    def resumed(self) -> bool:
        """Whether this run continues an attempt a crash interrupted."""
        return self.job.attempts > 1


# -- one function per kind -------------------------------------------------------------------


def _server(ctx: JobContext, needed: bool = True) -> Server:
    return Server(url=ctx.settings.llm_url, model=ctx.settings.model, needed=needed)


def _simulate(ctx: JobContext, p: SimulateJob) -> dict[str, Any]:
    from pipecat_rl.simulator import load_bot, load_scenarios, run

    def episode(e) -> None:
        ctx.emit("episode", scenario=e.scenario_id, session=e.session_id, outcome=e.outcome,
                 reward=e.reward)  # fmt: skip

    options = SimulationOptions(
        persona=p.persona, seed=p.seed, repeats=p.repeats, concurrency=p.concurrency,
        max_tokens=p.max_tokens,
    )  # fmt: skip
    report = run(
        load_scenarios(list(p.scenarios)), load_bot(p.bot), options, ctx.ledger,
        policies=[p.adapter or "base"], server=_server(ctx, needed=not p.no_server),
        on_episode=episode,
    )  # fmt: skip
    episodes = report.episodes
    return {
        "episodes": len(episodes),
        "passed": sum(1 for e in episodes if e.outcome == "pass"),
        "errors": report.harness_errors,
        "heldout_set_id": report.heldout_set_id,
        "session_ids": [e.session_id for e in episodes],
    }


def _train(ctx: JobContext, p: TrainJob) -> dict[str, Any]:
    from pipecat_rl.service.cycle import load_training

    TrainConfig, train = load_training()
    fields = p.model_dump(exclude={"kind", "scenarios", "bot"}, exclude_none=True)
    config = TrainConfig(out_dir=ctx.settings.data_dir / "adapters", **fields)
    rollouts = None
    if p.scenarios and p.bot:
        from pipecat_rl.simulator import load_bot, load_scenarios
        from pipecat_rl.simulator.options import Rollouts

        rollouts = Rollouts(
            scenarios=load_scenarios(list(p.scenarios)), bot=load_bot(p.bot),
            options=SimulationOptions(persona="scripted"),
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
    ctx.emit("simulating", candidate=p.candidate, incumbent=p.incumbent, repeats=p.repeats)
    evidence = Simulated(
        scenarios=load_scenarios([Path(p.scenarios)]), bot=load_bot(p.bot),
        options=SimulationOptions(
            persona=p.persona, seed=settings.seed, repeats=p.repeats, concurrency=p.concurrency,
            max_tokens=p.max_tokens,
        ),
        server=_server(ctx), files=Path(p.scenarios),
    )  # fmt: skip
    folder = ctx.settings.data_dir / "receipts" / ctx.job.id
    done = run_gate(ctx.ledger, p.candidate, p.incumbent, evidence, settings, folder)
    receipt = done.receipt
    return {"verdict": receipt.verdict, "reason": receipt.reason, "receipt_id": ctx.job.id,
            "receipt": str(done.paths["json"])}  # fmt: skip


def _admin(ctx: JobContext):
    from pipecat_rl.serving import VLLMAdmin

    return VLLMAdmin(ctx.settings.llm_url) if ctx.settings.llm_url else None


def _promote(ctx: JobContext, p: PromoteJob) -> dict[str, Any]:
    from pipecat_rl.gate import promote

    return promote(Path(p.receipt), ctx.ledger, _admin(ctx)).model_dump(mode="json")


def _rollback(ctx: JobContext, p: RollbackJob) -> dict[str, Any]:
    from pipecat_rl.gate import rollback

    return rollback(ctx.ledger, _admin(ctx)).model_dump(mode="json")


def _cycle(ctx: JobContext, p: CycleJob) -> dict[str, Any]:
    from pipecat_rl.service.cycle import run_cycle
    from pipecat_rl.service.loop import load_loop_config

    config = load_loop_config(Path(p.config))
    if p.budget_s is not None:
        config = config.model_copy(update={"budget_s": p.budget_s})
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


class JobWorker:
    """Runs queued jobs one at a time on a background thread, in submission order."""

    def __init__(self, settings: ServiceSettings):
        self.settings = settings
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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

    def _loop(self) -> None:
        with Ledger(self.settings.ledger) as ledger:
            while not self._stop.is_set():
                job = ledger.claim_next_job()
                if job is None:
                    self._wake.wait(self.settings.poll_s * 5)
                    self._wake.clear()
                    continue
                run_job(JobContext(job, ledger, self.settings))


def run_job(ctx: JobContext) -> JobRecord:
    """Run one claimed job to its end and record how it ended."""
    job = ctx.job
    ctx.emit("started", kind=job.kind, attempt=job.attempts)
    try:
        params = _REQUEST.validate_python({**job.params, "kind": job.kind})
        result = HANDLERS[job.kind](ctx, params)
    except PipecatRLError as e:
        ctx.emit("failed", error=str(e))
        return ctx.ledger.finish_job(job.id, "failed", error=str(e))
    except Exception as e:  # a bug in a job must not kill the worker: record it
        logger.exception(f"job {job.id} crashed")
        error = f"{type(e).__name__}: {e}"
        ctx.emit("failed", error=error)
        return ctx.ledger.finish_job(job.id, "failed", error=error)
    ctx.emit("done", result=result)
    return ctx.ledger.finish_job(job.id, "done", result=result)
