"""The night loop: snapshot → preflight → filter → train → evaluate + gate → promote.

Every stage appends `stage_started` / `stage_finished` events (with its result and wall time)
to the cycle's `events.jsonl`. A cycle that was stopped (its wall-time budget, `stop_after`)
or killed resumes from its last finished stage: finished stages are read back, never rerun.
A stage that would overrun the budget does not start, so a budget never leaves a half-trained
candidate behind. The pool grows from explained failures (drafted scenario files, marked for
review, in their own folder); the held-out set never grows, and it must be byte-identical to
the snapshot's at every later stage. So must a regression suite (`regressions:`, e.g. the forks
of failed live calls): held out at the snapshot, before anything trains, and run by both
policies at evaluation under a "no regression" check (`scenarios.failures`).

`cli/cycle.py` is the `pipecat-rl cycle` verb that runs this (CLI modules are named after their
verbs); the service runs it as a `cycle` job.
"""

import asyncio
import hashlib
import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import httpx
from loguru import logger
from pydantic import BaseModel

from pipecat_rl.duels.calibration import judge_trust
from pipecat_rl.errors import (
    BudgetExhausted,
    ConfigError,
    NotInLedgerError,
    NoTrainingSignalError,
    ServingError,
    TrainingError,
)
from pipecat_rl.ledger import BASE_ADAPTER, Ledger, LiveTrust, resolve_ledger_path
from pipecat_rl.ledger.eligibility import SIMULATED_SOURCES
from pipecat_rl.ledger.transfer import snapshot_ledger
from pipecat_rl.loop.config import NO_LIVE, STAGES, LiveSettings, LoopConfig
from pipecat_rl.loop.contested import acting_is_wrong, rl_scenarios, runs_by_scenario
from pipecat_rl.loop.drafts import draft_from_failures
from pipecat_rl.scenarios import ScenarioSet
from pipecat_rl.scenarios.heldout import copies_of_heldout
from pipecat_rl.scoring.outcome import passed
from pipecat_rl.simulator.options import Server, SimulationOptions

Emit = Callable[[str, dict[str, Any]], None]


_FROZEN = {"heldout": "heldout_set_id", "regressions": "regressions_set_id"}
"""Where the snapshot keeps the hash of each frozen set of scenarios."""


class CycleSummary(BaseModel):
    """How one invocation of a cycle ended."""

    state: Literal["finished", "stopped", "awaiting_approval"]
    reason: str
    out: str
    stages: dict[str, dict[str, Any]]
    """Each finished stage's result, with its `wall_s`."""
    resumed_from: str | None = None
    """The first stage this invocation ran, when earlier ones had finished before."""
    verdict: str | None = None
    receipt_html: str | None = None


def sft_steps(sessions: int, config: Any) -> int:
    """The optimiser steps of an SFT run on `sessions`, for the budget check.

    A session is one sequence (each turn extends the last) and a step takes `batch_sequences`
    of them when they fit `batch_tokens` (the clinic's do: 8 steps an epoch for 31 sessions).
    """
    return math.ceil(sessions / config.batch_sequences) * config.epochs


def load_training() -> tuple[Any, Any]:
    """`(TrainConfig, train)` from `pipecat_rl.training`, or a clear error when it is missing.

    Raises:
        TrainingError: this build of pipecat-rl has no training package.
    """
    try:
        from pipecat_rl.training import TrainConfig, train
    except ImportError as e:
        raise TrainingError(
            f"the cycle needs pipecat_rl.training to train a candidate, and it is not "
            f"available here ({e}); install pipecat-rl with training (pip install "
            "'pipecat-rl[cpu]'), or run only the stages that need none with stop_after: filter"
        ) from e
    return TrainConfig, train


class EventLog:
    """The cycle's events.jsonl: appended, flushed per line, read back to resume."""

    def __init__(self, path: Path, emit: Emit | None = None):
        self.path = path
        self._emit = emit
        path.parent.mkdir(parents=True, exist_ok=True)

    def read(self) -> list[dict[str, Any]]:
        """Every event written so far (a torn last line from a kill is skipped)."""
        if not self.path.exists():
            return []
        events = []
        for line in self.path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events

    def write(self, event: str, **data: Any) -> None:
        """Append one event (and pass it on, e.g. to the service's job stream)."""
        record = {"at": time.time(), "event": event, **data}
        with self.path.open("a") as f:
            f.write(json.dumps(record, default=str) + "\n")
            f.flush()
        if self._emit is not None:
            self._emit(event, json.loads(json.dumps(data, default=str)))

    def finished(self) -> dict[str, dict[str, Any]]:
        """Results of the stages that finished, by stage."""
        return {e["stage"]: e["result"] for e in self.read() if e["event"] == "stage_finished"}


class Cycle:
    """One invocation of a cycle: its config, ledger, event log, server and budget."""

    def __init__(self, config: LoopConfig, emit: Emit | None = None):
        self.config = config
        self.log = EventLog(config.out / "events.jsonl", emit)
        self.results = self.log.finished()
        self.started = time.monotonic()
        self.deadline = self.started + config.budget_s
        self.ledger = Ledger(resolve_ledger_path(config.ledger))
        self._server = None
        self._url: str | None = config.llm_url

    # -- shared pieces -------------------------------------------------------------------------

    @property
    def remaining_s(self) -> float:
        """Seconds left in this invocation's budget."""
        return self.deadline - time.monotonic()

    def require(self, seconds: float, what: str) -> None:
        """Stop before `what` unless the budget has `seconds` left for it."""
        if seconds > self.remaining_s:
            raise BudgetExhausted(
                f"{what} needs about {seconds:.0f} s and {max(0.0, self.remaining_s):.0f} s of "
                f"the {self.config.budget_s:.0f} s budget are left; run the cycle again to "
                "resume here (finished stages are not rerun)"
            )

    def url(self) -> str:
        """The served model's URL, starting the embedded vLLM on first use."""
        if self._url is None:
            from pipecat_rl.serving.server import VLLMServer
            from pipecat_rl.serving.weights import prepare_model

            self.log.write("server_starting", model=self.config.model)
            self._server = VLLMServer(
                prepare_model(self.config.model), max_num_seqs=max(4, self.config.concurrency),
                max_loras=2, max_lora_rank=max(16, self.config.train.rank),
            )  # fmt: skip
            asyncio.run(self._server.start())
            self._url = self._server.base_url
            self.log.write("server_ready", url=self._url, pid=self._server.pid)
        if self._server is not None:  # a stage never starts against a dead engine: say why
            self._server.check_alive()
        return self._url

    def close(self) -> None:
        """Stop the embedded server (if this cycle started one) and close the ledger."""
        if self._server is not None:
            asyncio.run(self._server.stop())
            self._server = None
        self.ledger.close()

    def incumbent(self) -> str:
        """The policy the snapshot found live."""
        return self.results["snapshot"]["incumbent"]

    def scenarios(self, which: Literal["pool", "heldout", "regressions"], *, whole: bool = False):
        """The pool, the held-out set or the regression suite, loaded (and sampled).

        The pool and the held-out set come as their `pool_sample` / `heldout_sample` (`whole`:
        all of them). The held-out set and the suite must be the snapshot's, byte for byte.
        """
        from pipecat_rl.scenarios import load_scenarios

        loaded = load_scenarios([getattr(self.config, which)])
        if which != "regressions" and not whole:
            loaded = self.sampled(which, loaded)
        if which != "pool":
            what = {"heldout": "the held-out set", "regressions": "the regression suite"}[which]
            frozen = self.results.get("snapshot", {}).get(_FROZEN[which])
            if frozen is not None and loaded.heldout_set_id != frozen:
                raise ConfigError(
                    f"{what} changed since this cycle's snapshot ({frozen} → "
                    f"{loaded.heldout_set_id}); {what} never changes inside a cycle: "
                    "restore it, or start a new cycle in a new out folder"
                )
        return loaded

    def sampled(self, which: Literal["pool", "heldout"], loaded: Any) -> Any:
        """`loaded` (the whole pool or held-out set) as its `pool_sample` / `heldout_sample`."""
        from pipecat_rl.scenarios.sampling import stratified_sample

        sample = getattr(self.config, f"{which}_sample")
        if sample is None:
            return loaded
        return stratified_sample(loaded, sample.size, by=sample.by, what=f"{which}_sample")

    def options(self, **update: Any) -> SimulationOptions:
        """The loop's simulation options (caller, seed, concurrency, reply cap), with `update`."""
        c = self.config
        return SimulationOptions(
            persona=c.persona, seed=c.seed, concurrency=c.concurrency, max_tokens=c.max_tokens,
            rubric=c.rubric, executor=c.executor, ray_address=c.ray_address,
        ).model_copy(update=update)  # fmt: skip

    def server(self) -> Server:
        """The served model, started on first use."""
        return Server(url=self.url(), model=self.config.model)

    def simulate(
        self, scenarios, adapter: str, *, repeats: int, bot: str, served: bool = True, **options
    ):
        """Simulate `scenarios` with `bot` under `adapter` (`options` over the loop's)."""
        from pipecat_rl.simulator import load_bot, run

        server = self.server() if served else Server(needed=False)
        return run(
            scenarios, load_bot(bot), self.options(repeats=repeats, **options), self.ledger,
            policies=[adapter], server=server, on_episode=self.call_finished,
        )  # fmt: skip

    def call_finished(self, episode: Any) -> None:
        """One event per simulated call, in every stage that simulates.

        So a long stage is never silent in `events.jsonl`, nor on the terminal, which shows the
        same events.
        """
        self.log.write(
            "call_finished", scenario=episode.scenario_id, repeat=episode.repeat,
            session=episode.session_id, outcome=episode.outcome,
            duration_s=round(episode.duration_s, 3),
        )  # fmt: skip

    def llm_busy_s(self, since: float) -> float:
        """Wall seconds since `since` during which at least one LLM request was in flight."""
        intervals = []
        for s in self.ledger.sessions(since=since):
            for t in self.ledger.turns(s.id):
                start, end = t.timestamps.get("llm_request"), t.timestamps.get("llm_done")
                if start is not None and end is not None and end >= start:
                    intervals.append((start, end))
        busy, reach = 0.0, float("-inf")
        for start, end in sorted(intervals):
            if end <= reach:
                continue
            busy += end - max(start, reach)
            reach = end
        return round(busy, 3)

    # -- the run -------------------------------------------------------------------------------

    def _close_interrupted(self, todo: list[str]) -> None:
        """A stage that started and never finished was killed: close the sessions it left open.

        They end as harness errors (no reward), so neither training nor the gate reads them;
        the stage then runs again from its start.
        """
        started = {e["stage"]: e["at"] for e in self.log.read() if e["event"] == "stage_started"}
        for stage in todo:
            if stage in started:
                why = f"interrupted: the cycle's {stage} stage was killed"
                closed = self.ledger.close_dead_sessions(
                    since=started[stage], sources=SIMULATED_SOURCES, reason=why
                )
                self.log.write("stage_interrupted", stage=stage, closed_sessions=len(closed))

    def run(self) -> CycleSummary:
        """Run every stage not finished yet, in order, within the budget."""
        last = STAGES.index(self.config.stop_after) if self.config.stop_after else len(STAGES)
        todo = [s for s in STAGES[: last + 1] if s not in self.results]
        resumed = todo[0] if todo and todo[0] != STAGES[0] else None
        attempt = 1 + sum(1 for e in self.log.read() if e["event"] == "cycle_started")
        self.log.write(
            "cycle_started", attempt=attempt, resume_from=resumed, budget_s=self.config.budget_s
        )
        if "train" in todo:
            load_training()  # refuse at once, not after an hour of simulation
        self._close_interrupted(todo)
        state, reason = "finished", "every stage finished"
        try:
            for stage in todo:
                if stage != "promote":  # acting on a verdict already reached costs no budget
                    self.require(1.0, f"the {stage} stage")
                self.log.write("stage_started", stage=stage)
                t0, wall0 = time.monotonic(), time.time()
                result = STAGE_FUNCTIONS[stage](self)
                result = {**result, "wall_s": round(time.monotonic() - t0, 3)}
                if stage in ("filter", "evaluate"):
                    result["llm_busy_s"] = self.llm_busy_s(wall0)
                self.results[stage] = result
                self.log.write("stage_finished", stage=stage, result=result)
                if stage == "promote" and result.get("awaiting_approval"):
                    state, reason = "awaiting_approval", result["reason"]
            if state == "finished" and any(s not in self.results for s in STAGES):
                state, reason = "stopped", f"stop_after: {self.config.stop_after}"
        except BudgetExhausted as e:
            state, reason = "stopped", str(e)
            self.log.write("budget_exhausted", reason=reason)
        except BaseException as e:
            self.log.write("cycle_failed", error=f"{type(e).__name__}: {e}")
            raise
        finally:
            self.close()
        evaluated = self.results.get("evaluate", {})
        self.log.write("cycle_ended", state=state, reason=reason)
        return CycleSummary(
            state=state, reason=reason, out=str(self.config.out), stages=self.results,
            resumed_from=resumed, verdict=evaluated.get("verdict"),
            receipt_html=evaluated.get("receipt", {}).get("html"),
        )  # fmt: skip


# -- the stages --------------------------------------------------------------------------------


def snapshot(cycle: Cycle) -> dict[str, Any]:
    """Freeze what the cycle starts from: the ledger, the live adapter, the held-out set."""
    c = cycle.config
    heldout = cycle.scenarios("heldout", whole=True)  # all of it stays out of training
    pool = cycle.scenarios("pool", whole=True)
    not_heldout = [s.id for s in heldout if s.split != "heldout"]
    if not_heldout or heldout.heldout_set_id is None:
        raise ConfigError(
            f"{c.heldout} must hold only held-out scenarios (a `heldout/` folder or "
            f"`split: heldout`); it also holds {', '.join(not_heldout[:5]) or 'nothing held out'}"
        )
    heldout_hashes = {s.id: s.content_hash() for s in heldout}
    leaked = sorted(s.id for s, _ in copies_of_heldout(pool, heldout.scenarios))  # near: warns
    if leaked or any(s.split == "heldout" for s in pool):
        raise ConfigError(
            f"the pool {c.pool} holds held-out scenarios ({', '.join(leaked) or 'split: heldout'});"
            " a held-out scenario never trains: remove it from the pool"
        )
    suite = _regression_suite(cycle, pool, heldout) if c.regressions is not None else None
    # the gate records what it runs; a held-out scenario left out of its sample is held out too
    cycle.ledger.record_heldout_hashes(
        (h, sid, heldout.heldout_set_id) for sid, h in heldout_hashes.items()
    )
    if c.incumbent is not None:
        try:
            cycle.ledger.adapter(c.incumbent)
        except NotInLedgerError as e:
            raise ConfigError(f"incumbent: {c.incumbent!r} is not registered: {e}") from None
    pointer = cycle.ledger.live()
    backup = c.out / "snapshot" / "ledger.db"
    counts = snapshot_ledger(cycle.ledger, backup)
    return {
        "incumbent": c.incumbent or (BASE_ADAPTER if pointer is None else pointer.adapter),
        "heldout_set_id": heldout.heldout_set_id,
        "heldout_scenarios": len(heldout),
        "heldout_hashes": heldout_hashes,
        **({} if suite is None else {
            "regressions_set_id": suite.heldout_set_id, "regression_scenarios": len(suite),
        }),
        "pool_scenarios": len(pool),
        **{f"{which}_sampled": len(cycle.sampled(which, whole))  # type: ignore[arg-type]
           for which, whole in (("pool", pool), ("heldout", heldout))
           if getattr(c, f"{which}_sample") is not None},  # fmt: skip
        "ledger": str(cycle.ledger.path),
        "ledger_counts": counts,
        "ledger_snapshot": str(backup),
    }


def _regression_suite(cycle: Cycle, pool: Any, heldout: Any) -> Any:
    """The regression suite, checked and held out before anything trains.

    Every scenario in it must be held out (`split: heldout`; `ledger fork --failed` writes them
    so), none may be in the held-out set too (a scenario is gated once) or have a copy in the
    pool, and its test must be able to fire at the gate's repeats. Its hashes then go into the
    ledger's held-out hashes, so no session of them trains, whatever its file says later.
    """
    from pipecat_rl.gate.config import load_gate_config
    from pipecat_rl.gate.regressions import check_suite_design

    c = cycle.config
    suite = cycle.scenarios("regressions")
    where = f"regressions: {c.regressions}"
    not_heldout = [s.id for s in suite if s.split != "heldout"]
    if not_heldout:
        raise ConfigError(
            f"{where} holds scenarios that are not held out ({', '.join(not_heldout[:5])}); a "
            "regression suite never trains: write it with `pipecat-rl ledger fork --failed` "
            "(which holds its forks out), or mark the files `split: heldout`"
        )
    twice = sorted({s.id for s in suite} & {s.id for s in heldout})
    if twice:
        raise ConfigError(
            f"{where} and heldout: {c.heldout} both hold {', '.join(twice[:5])}; a scenario is "
            "gated once: keep it in one of them"
        )
    leaked = sorted(s.id for s, _ in copies_of_heldout(pool, suite.scenarios))
    if leaked:
        raise ConfigError(
            f"the pool {c.pool} holds copies of the regression suite's scenarios "
            f"({', '.join(leaked[:5])}); a regression test never trains: remove them from the pool"
        )
    alpha = load_gate_config(c.gate.config, **c.gate.overrides).regression_alpha
    check_suite_design(len(suite), c.gate.repeats, alpha, where)
    cycle.ledger.record_heldout_hashes(
        (s.content_hash(), s.id, suite.heldout_set_id) for s in suite
    )
    return suite


def canary(url: str) -> dict[str, Any]:
    """One short completion with token ids and logprobs: what training and the guard rely on.

    Raises:
        ServingError: the server does not return them.
    """
    from pipecat_rl.serving.server import openai_base_url

    body = {
        "model": BASE_ADAPTER, "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 4, "temperature": 0, "logprobs": True, "return_token_ids": True,
    }  # fmt: skip
    try:
        reply = httpx.post(f"{openai_base_url(url)}/chat/completions", json=body, timeout=60)
        reply.raise_for_status()
        data = reply.json()
        choice = data["choices"][0]
        ids = choice.get("token_ids") or []
        logprobs = [t["logprob"] for t in (choice.get("logprobs") or {}).get("content") or []]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise ServingError(f"the canary request to {url} failed: {e}") from e
    if not data.get("prompt_token_ids") or not ids or len(ids) != len(logprobs):
        raise ServingError(
            f"the server at {url} returned no token ids or logprobs for the canary (ids "
            f"{len(ids)}, logprobs {len(logprobs)}); serve the model with vLLM, which returns "
            "them with return_token_ids"
        )
    return {"tokens": len(ids), "mean_logprob": round(sum(logprobs) / len(logprobs), 4)}


def preflight(cycle: Cycle) -> dict[str, Any]:
    """Check before spending time: held-out set (and suite) frozen, disk, server, model, canary."""
    c = cycle.config
    heldout = cycle.scenarios("heldout")  # raises if it changed since the snapshot
    if c.regressions is not None:
        cycle.scenarios("regressions")  # so does the regression suite
    c.out.mkdir(parents=True, exist_ok=True)
    free_gb = shutil.disk_usage(c.out).free / 1e9
    if free_gb < c.min_free_gb:
        raise ConfigError(
            f"only {free_gb:.1f} GB free under {c.out}; a cycle needs {c.min_free_gb} GB for "
            "adapters and receipts: free some space or lower min_free_gb"
        )
    if c.expert_bot is None and c.train.warm_start == "always":
        raise ConfigError("train.warm_start: always needs expert_bot (the demonstrations)")
    from pipecat_rl.serving.server import VLLMAdmin

    url = cycle.url()
    models = VLLMAdmin(url).models()
    if BASE_ADAPTER not in models:
        raise ServingError(f"the server at {url} does not serve {BASE_ADAPTER!r}: {models}")
    incumbent = cycle.incumbent()
    if incumbent != BASE_ADAPTER:
        cycle.ledger.adapter(incumbent)  # the live adapter must still be registered
    return {
        "url": url, "models": models, "free_gb": round(free_gb, 1),
        "heldout_set_id": heldout.heldout_set_id, "canary": canary(url),
    }  # fmt: skip


def _split(report: Any) -> tuple[list[str], list[str], list[str]]:
    """Scenario ids always solved, always failed, and contested (both) over a report's runs."""
    by = runs_by_scenario(report.episodes)
    solved = sorted(s for s, runs in by.items() if all(runs))
    failed = sorted(s for s, runs in by.items() if not any(runs))
    return solved, failed, sorted(s for s, runs in by.items() if any(runs) and not all(runs))


def filter_pool(cycle: Cycle) -> dict[str, Any]:
    """Simulate the pool under the incumbent; set aside what it always solves or always fails."""
    c = cycle.config
    pool = cycle.scenarios("pool")
    cycle.require(len(pool) * c.filter.repeats * 2.0, "the filter stage")
    report = cycle.simulate(pool, cycle.incumbent(), repeats=c.filter.repeats, bot=c.bot)
    solved, failed, contested = _split(report)
    tool_calls = sum(len(e.executions) for e in report.episodes)
    using_tools = sum(1 for e in report.episodes if any(x.error is None for x in e.executions))
    drafts = draft_from_failures(cycle.ledger, [e.session_id for e in report.episodes], pool,
                                 c.drafts_dir, heldout=c.heldout)  # fmt: skip
    passed = sum(1 for e in report.episodes if e.passed)
    logger.info(f"filter: {len(contested)} contested, {len(solved)} solved, {len(failed)} failed")
    return {
        "episodes": len(report.episodes), "passed": passed, "errors": report.harness_errors,
        "always_solved": solved, "always_failed": failed, "contested": contested,
        "rl_scenarios": _rl_set(report, pool), "left": len(contested), "tool_calls": tool_calls,
        "tool_use": round(using_tools / len(report.episodes), 4) if report.episodes else 0.0,
        "drafts": [str(p) for p in drafts],
        "scenario_files": {s.id: str(s.source_path) for s in pool},
    }  # fmt: skip


def _rl_set(report: Any, pool: ScenarioSet) -> dict[str, str]:
    """The pool scenarios RL trains on after `report`'s runs, each with why (`loop.contested`)."""
    chosen = rl_scenarios(
        runs_by_scenario(report.episodes), {x.id for x in pool if acting_is_wrong(x)}
    )
    logger.info(
        f"{len(chosen)} pool scenario(s) for RL: "
        + ("; ".join(f"{k} ({why})" for k, why in chosen.items()) or "none")
    )
    return chosen


def _copy_metrics(cycle: Cycle, result: Any) -> str | None:
    source = getattr(result, "metrics_path", None)
    if not source or not Path(source).is_file():
        return None
    target = cycle.config.out / "metrics" / f"{result.adapter}.jsonl"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return str(target)


def _run_record(cycle: Cycle, algo: str, result: Any, wall_s: float) -> dict[str, Any]:
    metrics = getattr(result, "metrics", None)
    return {
        "algo": algo, "adapter": result.adapter, "path": str(result.path),
        "metrics_jsonl": _copy_metrics(cycle, result),
        "sessions": len(getattr(result, "session_ids", []) or []),
        "guard": getattr(result, "guard", None), "metrics": metrics, "wall_s": round(wall_s, 3),
    }  # fmt: skip


def live_trust(ledger: Ledger, live: LiveSettings) -> tuple[LiveTrust, str | None]:
    """`live.trust()`, less the judge until its verdicts agree with people's; and why, if not.

    The judge's κ with human labels on the same calls (`duels.calibration`) must have its lower
    bound at `live.judge.min_kappa` or above, on at least `live.judge.min_labels` calls.
    """
    return judge_trust(ledger, live.trust(), live.judge)


def live_calls(
    ledger: Ledger, live: LiveSettings, now: float, trust: LiveTrust | None = None
) -> dict[str, list[str]]:
    """The live calls of `live`'s window that may train: `judged` (all), `passed` (of them).

    Chosen by the eligibility query under `trust` (default: `live_trust`), the very rows
    training then reads.
    """
    trust = live_trust(ledger, live)[0] if trust is None else trust
    window = [s.id for s in ledger.sessions(source="live", since=now - live.since)]
    turns = ledger.training_turns(purpose="rl", session_ids=window, live=trust)
    judged = list(dict.fromkeys(t.session_id for t in turns))
    return {
        "judged": judged,
        "passed": [sid for sid in judged if passed(ledger.session(sid).reward_parts)],
    }


def train_stage(cycle: Cycle) -> dict[str, Any]:
    """The candidate: live calls, a warm start, then the contested; each run from the last.

    OPSD on the judged live calls of `live:` (from the incumbent that served them), an SFT warm
    start when the incumbent cannot call tools (demonstrations and simulated passes, no live
    call), filtered SFT on the live calls that passed, then GRPO / OPSD on the contested. Each
    sub-run that finishes is logged, so a resumed stage reuses it instead of training it again.
    """
    TrainConfig, train = load_training()
    c, t = cycle.config, cycle.config.train
    filtered = cycle.results["filter"]
    incumbent = cycle.incumbent()
    parent = None if incumbent == BASE_ADAPTER else incumbent
    warm = t.warm_start == "always" or (
        t.warm_start == "auto"
        and filtered["tool_use"] < t.tool_use_below
        and c.expert_bot is not None
    )
    url = cycle.url()
    runs: list[dict[str, Any]] = []
    earlier = cycle.log.read()  # an interrupted attempt of this stage: what it finished
    finished = {e["algo"]: e["run"] for e in earlier if e["event"] == "train_run_finished"}
    common = dict(base_model=c.model, rank=t.rank, alpha=t.alpha, lr=t.lr, seed=c.seed,
                  out_dir=c.out / "adapters", rubric=c.rubric, opsd_hint=t.opsd_hint,
                  name_prefix=c.adapter_prefix)  # fmt: skip

    def progress(row: dict[str, Any]) -> None:
        cycle.log.write("train_progress", **{k: v for k, v in row.items() if k != "event"})

    def sub_run(algo: str, run: Callable[[], dict[str, Any]]) -> None:
        """Run (or reuse, on a resume) one sub-run; the next starts from its adapter."""
        nonlocal parent
        record = finished.get(algo)
        if record is None:
            record = run()
            cycle.log.write("train_run_finished", algo=algo, run=record)
        else:
            cycle.log.write("train_run_reused", algo=algo, adapter=record.get("adapter"))
        runs.append(record)
        if record.get("adapter"):
            parent = record["adapter"]

    def timed(algo: str, **kwargs: Any) -> dict[str, Any]:
        t0 = time.monotonic()
        result = train(cycle.ledger, **kwargs)
        return _run_record(cycle, algo, result, time.monotonic() - t0)

    trust = NO_LIVE
    if c.live is not None:
        trust, refused = live_trust(cycle.ledger, c.live)
        if refused:
            logger.warning(refused)
            cycle.log.write("judge_refused", reason=refused)
    live = {} if c.live is None else live_calls(cycle.ledger, c.live, time.time(), trust)
    if live:
        cycle.log.write("live_calls", **{k: len(v) for k, v in live.items()})
    if c.live is not None and c.live.opsd_steps and live["judged"]:  # on-policy: first

        def live_opsd() -> dict[str, Any]:
            cycle.require(c.live.opsd_steps * t.step_s, f"{c.live.opsd_steps} live OPSD step(s)")
            return timed("opsd-live", config=TrainConfig(algo="opsd", parent=parent,
                                                         steps=c.live.opsd_steps, **common),
                         server_url=url, progress=progress, live=trust,
                         session_ids=live["judged"])  # fmt: skip

        sub_run("opsd-live", live_opsd)
    if warm:

        def warm_start() -> dict[str, Any]:
            pool = cycle.scenarios("pool")
            episodes = []
            for guarded, repeats in ((False, t.demonstrations), (True, t.guarded_demonstrations)):
                part = pool.model_copy(
                    update={"scenarios": [x for x in pool if x.guarded == guarded]}
                )
                if len(part):
                    demos = cycle.simulate(
                        part, BASE_ADAPTER, repeats=repeats, bot=c.expert_bot, served=False
                    )
                    episodes += demos.episodes
            passed = sum(1 for e in episodes if e.passed)
            watched = {x.id for x in pool if x.guarded}
            guarded_passed = sum(
                1 for e in episodes if e.passed and e.scenario_id in watched
            )
            cycle.log.write(
                "demonstrations", episodes=len(episodes), passed=passed, guarded=guarded_passed
            )
            config = TrainConfig(algo="sft", parent=parent, epochs=t.sft_epochs,
                                 holdout=t.sft_holdout, **common)  # fmt: skip
            steps = sft_steps(passed, config)
            cycle.require(steps * t.step_s, f"the SFT warm start (up to {steps} steps)")
            # the expert's verified calls only: a base that calls no tool passes a refusal by
            # saying anything, and imitating those calls teaches it to ramble
            demos = [e.session_id for e in episodes if e.passed]
            return timed("sft", config=config, server_url=url if t.verify_on_server else None,
                         progress=progress, live=NO_LIVE, session_ids=demos)  # fmt: skip

        sub_run("sft", warm_start)
    if c.live is not None and c.live.sft and live["passed"]:

        def live_sft() -> dict[str, Any]:
            config = TrainConfig(algo="sft", parent=parent, epochs=t.sft_epochs, **common)
            steps = sft_steps(len(live["passed"]), config)
            cycle.require(steps * t.step_s, f"filtered SFT on live calls (up to {steps} steps)")
            return timed("sft-live", config=config,
                         server_url=url if t.verify_on_server else None, progress=progress,
                         live=trust, session_ids=live["passed"])  # fmt: skip

        sub_run("sft-live", live_sft)
    pool = cycle.scenarios("pool")
    if t.distill_steps:

        def distill() -> dict[str, Any]:
            """The teacher at every state the candidate so far reaches on the whole pool."""
            per_step = len(pool) * t.distill_repeats * t.episode_s / c.concurrency + t.step_s
            cycle.require(t.distill_steps * per_step, f"{t.distill_steps} distill step(s)")
            from pipecat_rl.simulator import load_bot
            from pipecat_rl.simulator.options import Rollouts

            rollouts = Rollouts(scenarios=pool, bot=load_bot(c.bot), options=cycle.options())
            config = TrainConfig(
                algo="distill", parent=parent, steps=t.distill_steps,
                group_size=t.distill_repeats, teacher=t.teacher, temperature=None, **common,
            )  # fmt: skip
            return timed("distill", config=config, server_url=url, rollouts=rollouts,
                         progress=progress)  # fmt: skip

        sub_run("distill", distill)
    # a filter result from before `rl_scenarios` was recorded: its contested ids
    chosen = filtered.get("rl_scenarios", filtered["contested"])
    if (t.grpo_steps or t.opsd_steps) and parent is not None:
        # RL's scenarios are those of the policy it starts from, as the gate will sample it (the
        # bot's own temperature), with repeats enough to see a rare failure (`loop.contested`).
        found = [e for e in earlier if e["event"] == "refiltered" and e["policy"] == parent]
        if found:
            chosen = found[-1]["contested"]
        else:
            report = cycle.simulate(pool, parent, repeats=t.refilter_repeats, bot=c.bot)
            chosen = _rl_set(report, pool)
            solved, failed, _ = _split(report)
            cycle.log.write(
                "refiltered", policy=parent, repeats=t.refilter_repeats, contested=chosen,
                solved=len(solved), failed=len(failed),
            )  # fmt: skip
    contested = pool.model_copy(update={"scenarios": [x for x in pool if x.id in chosen]})
    for algo, steps in (("grpo", t.grpo_steps), ("opsd", t.opsd_steps)):
        if steps == 0:
            continue
        if not len(contested):
            cycle.log.write("rl_skipped", algo=algo, reason="no contested scenario in the pool")
            continue

        def rl(algo: str = algo, steps: int = steps) -> dict[str, Any]:
            drawn = min(len(contested), t.scenarios_per_step or len(contested))
            per_step = drawn * t.group_size * t.episode_s / c.concurrency + t.step_s
            cycle.require(steps * per_step, f"{steps} {algo.upper()} step(s)")
            from pipecat_rl.simulator import load_bot
            from pipecat_rl.simulator.options import Rollouts

            rollouts = Rollouts(scenarios=contested, bot=load_bot(c.bot), options=cycle.options())
            t0 = time.monotonic()
            try:
                return timed(algo, config=TrainConfig(algo=algo, parent=parent, steps=steps,
                                                      group_size=t.group_size,
                                                      scenarios_per_step=t.scenarios_per_step,
                                                      temperature=t.temperature, **common),
                             server_url=url, rollouts=rollouts, progress=progress)  # fmt: skip
            except NoTrainingSignalError as e:  # the candidate so far stands; the sub-run is kept
                cycle.log.write("rl_skipped", algo=algo, reason=str(e))
                return {"algo": algo, "adapter": None, "skipped": str(e),
                        "wall_s": round(time.monotonic() - t0, 3)}  # fmt: skip

        sub_run(algo, rl)
    if runs and parent in (None, incumbent):  # every run asked for found no signal
        raise NoTrainingSignalError(
            "the train stage trained nothing: " + "; ".join(r["skipped"] for r in runs)
        )
    if not runs:
        raise TrainingError(
            "the train stage had nothing to run: the incumbent already calls tools (tool use "
            f"{filtered['tool_use']:.0%} of calls) or no expert_bot is set, so there is no warm "
            "start, no live call may train (`live:`), and train.distill_steps, train.grpo_steps "
            "and train.opsd_steps are 0: set one of them"
        )
    return {"candidate": parent, "warm_start": warm, "runs": runs, "rl_scenarios": chosen}


def _pass_rates(cycle: Cycle, data: Any) -> dict[str, Any]:
    """Held-out verifier pass rate per policy over the runs the gate decided on."""
    out: dict[str, Any] = {}
    for role, name in (("candidate", data.candidate), ("incumbent", data.incumbent)):
        ids = [r.session_id for r in data.runs if r.policy == name and r.session_id]
        outcomes = [cycle.ledger.session(i).outcome for i in ids]
        verified = [o for o in outcomes if o in ("pass", "fail")]
        passed = verified.count("pass")
        out[role] = {
            "policy": name, "passed": passed, "verified": len(verified),
            "rate": round(passed / len(verified), 4) if verified else None,
        }  # fmt: skip
    return out


def evaluate_stage(cycle: Cycle) -> dict[str, Any]:
    """Run both policies on the held-out set (same seeds, interleaved) and gate the candidate.

    With `regressions:`, both also run the regression suite, whose check fails when the
    candidate is confirmed worse there (`gate.regressions.suite_tests`).
    """
    from pipecat_rl.gate import Simulated, run_gate
    from pipecat_rl.gate.config import load_gate_config
    from pipecat_rl.simulator import load_bot

    c = cycle.config
    heldout = cycle.scenarios("heldout")  # frozen check
    candidate, incumbent = cycle.results["train"]["candidate"], cycle.incumbent()
    settings = load_gate_config(c.gate.config, **c.gate.overrides)
    # The held-out runs' seeds are salted with the candidate's name: fixed for this cycle (a
    # resumed gate reruns the same calls), new for the next, so the pool cannot grow toward a
    # fixed set of held-out draws.
    salt = int(hashlib.sha256(f"{settings.seed}:{candidate}".encode()).hexdigest()[:8], 16)
    evidence = Simulated(
        scenarios=heldout, bot=load_bot(c.bot), server=cycle.server(), files=c.heldout,
        options=cycle.options(repeats=c.gate.repeats, seed=salt), on_episode=cycle.call_finished,
    )  # fmt: skip
    suite = None
    if c.regressions is not None:  # the same calls' options: both arms, same seeds, text
        suite = Simulated(
            scenarios=cycle.scenarios("regressions"), bot=evidence.bot, server=evidence.server,
            files=c.regressions, options=evidence.options, on_episode=cycle.call_finished,
        )  # fmt: skip
    done = run_gate(cycle.ledger, candidate, incumbent, evidence, settings, c.out / "receipt",
                    suite=suite)  # fmt: skip
    receipt, paths, data = done.receipt, done.paths, done.data
    p, lat, cost = receipt.paired, receipt.latency, receipt.cost
    v2v = lat.v2v_p95
    return {
        "verdict": receipt.verdict, "reason": receipt.reason, "exit_code": receipt.exit_code,
        "candidate": candidate, "incumbent": incumbent, "heldout_seed": salt,
        "receipt": {k: str(v) for k, v in paths.items()},
        "pass_rate": _pass_rates(cycle, data),
        "mean_delta": p.mean_delta, "ci95": None if p.ci95 is None else list(p.ci95),
        "wins": p.wins, "losses": p.losses, "ties": p.ties, "n_scenarios": p.n_scenarios,
        "v2v_p95_ms": None if v2v is None else {
            "candidate": v2v.candidate.estimate, "incumbent": v2v.incumbent.estimate,
            "difference": [v2v.difference.low, v2v.difference.high],
        },
        "cost_per_success_usd": {
            "candidate": cost.candidate.per_success_usd if cost.candidate else None,
            "incumbent": cost.incumbent.per_success_usd if cost.incumbent else None,
        },
        **({} if suite is None else {"regression_suite": _suite_result(receipt)}),
    }  # fmt: skip


def _suite_result(receipt: Any) -> dict[str, Any]:
    """The regression suite's check and counts, as the evaluate stage records them."""
    suite = receipt.regression_suite
    (check,) = [k for k in receipt.checks if k.name == "regression_suite"]
    test = suite.tests[0] if suite.tests else None
    return {
        "status": check.status, "scenarios": len(suite.scenarios),
        "pairs": sum(s.pairs for s in suite.scenarios),
        "lost": test.worse if test else 0, "won": test.better if test else 0,
        "p_value": test.p_value if test else None, "set_id": suite.set_id,
    }  # fmt: skip


def promote_stage(cycle: Cycle) -> dict[str, Any]:
    """Promote a PROMOTE verdict (automatically, or after approval); anything else stays put."""
    from pipecat_rl.gate import promote
    from pipecat_rl.serving.server import VLLMAdmin

    c = cycle.config
    evaluated = cycle.results["evaluate"]
    receipt = Path(evaluated["receipt"]["json"])
    if evaluated["verdict"] != "PROMOTE":
        return {"promoted": False, "reason": f"the gate said {evaluated['verdict']}"}
    if c.promote == "never":
        return {"promoted": False, "reason": "promote: never"}
    if c.promote == "approve":
        return {
            "promoted": False, "awaiting_approval": True,
            "reason": f"awaiting approval: pipecat-rl promote {receipt}",
        }  # fmt: skip
    url = c.bot_llm_url or c.llm_url or cycle.url()
    move = promote(receipt, cycle.ledger, VLLMAdmin(url))
    return {"promoted": True, "reason": "PROMOTE", "move": move.model_dump(mode="json")}


STAGE_FUNCTIONS: dict[str, Callable[[Cycle], dict[str, Any]]] = {
    "snapshot": snapshot,
    "preflight": preflight,
    "filter": filter_pool,
    "train": train_stage,
    "evaluate": evaluate_stage,
    "promote": promote_stage,
}


def run_cycle(config: LoopConfig, emit: Emit | None = None) -> CycleSummary:
    """Run (or resume) the cycle `config` describes."""
    return Cycle(config, emit).run()
