"""The short loop: `train(ledger, config)` turns the ledger's eligible calls into a new adapter.

1. Load the base model and the parent's LoRA (or a fresh one).
2. The logprob guard: re-score recorded completions of the starting policy; fail before any update
   if the trainer does not see what the server sampled.
3. Rows (`rows`), then the algorithm: SFT on passed sessions and demonstrations; GRPO on groups of
   episodes (online: simulated per step under the current adapter; offline: from the ledger);
   OPSD on judged turns with a hinted teacher; DPO on people's picks in duels (`dpo`); RFT
   (online only) SFT on the current adapter's own passed rollouts, the baseline RL must beat;
   distill (online only) a teacher's answer at each state the current adapter reached (`distill`).
4. Save under a never-reused name; with a server, hot-load it and verify it is served; register it
   with its lineage, data, metrics and guard.

Online (GRPO / OPSD / RFT / distill with `rollouts`), every step samples under the current
version, re-runs the guard on those very turns, updates, and publishes the next version, which
must move the canary off its parent's. Only the newest two versions of the run stay loaded (the
parent, which the next step's canary compares with, and the new one), so `--max-loras 2`
suffices.
"""

import contextlib
import functools
import json
import random
import shutil
import statistics
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

from pipecat_rl.errors import (
    GuardError,
    NotMovedError,
    NoTrainingSignalError,
    ServingError,
    TrainingError,
)
from pipecat_rl.ledger import BASE_ADAPTER, Ledger, LiveTrust, SessionRecord, TurnRecord
from pipecat_rl.ledger.eligibility import DEFAULT_LIVE_TRUST
from pipecat_rl.scoring.outcome import passed
from pipecat_rl.serving.server import VLLMAdmin
from pipecat_rl.simulator.options import Rollouts
from pipecat_rl.training import registry
from pipecat_rl.training.config import ONLINE_ALGOS, ROLLOUT_ONLY, TrainConfig, TrainResult
from pipecat_rl.training.distill import (
    LogprobTeacher,
    ReplyTeacher,
    load_teacher,
    logprob_update,
    reply_sequences,
)
from pipecat_rl.training.dpo import dpo_pairs, train_dpo
from pipecat_rl.training.grpo import Groups, build_groups, dynamic_sampling, grpo_update
from pipecat_rl.training.guard import run_guard
from pipecat_rl.training.opsd import opsd_row, opsd_update, session_hint
from pipecat_rl.training.policy import Policy, load_policy, resolve_base, save_adapter
from pipecat_rl.training.rows import TrainableTurn, TrainingSequence, build_sequences
from pipecat_rl.training.sft import optimizer_for, train_sft

if TYPE_CHECKING:  # it imports Pipecat; training must not until it simulates
    from pipecat_rl.scenarios import ScenarioSet

Progress = Callable[[dict[str, Any]], None]
"""Called with every step's metrics (and `step`, `total_steps`)."""


class MetricsLog:
    """One JSON line per step (TRL's names), forwarded to the progress callback."""

    def __init__(self, path: Path, progress: Progress | None):
        self.path = path
        self.progress = progress
        self.rows: list[dict[str, Any]] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def __call__(self, metrics: dict[str, Any]) -> None:
        """Append one step's metrics and report them."""
        row = {"time": round(time.time(), 3), **metrics}
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        if self.progress is not None:
            self.progress(row)


def _parent_path(ledger: Ledger, parent: str | None) -> Path | None:
    if parent is None or parent == BASE_ADAPTER:
        return None
    return Path(ledger.adapter(parent).path)


def _base_names(base_dir: Path) -> set[str]:
    return {BASE_ADAPTER, base_dir.name}


def _names_of(base_dir: Path, adapter: str | None) -> set[str]:
    """Names the turns of `adapter` (None: the base over `base_dir`) are recorded under."""
    return _base_names(base_dir) if adapter in (None, BASE_ADAPTER) else {str(adapter)}


def recent_policies(ledger: Ledger, base_dir: Path, config: TrainConfig) -> set[str]:
    """The starting policy and up to `max_off_policy_steps` of its ancestors.

    Turns they sampled may train (importance-corrected); turns of older adapters are dropped.
    """
    names = _names_of(base_dir, config.parent)
    current = config.parent
    for _ in range(config.max_off_policy_steps):
        if current in (None, BASE_ADAPTER):
            break
        current = ledger.adapter(current).parent
        names |= _names_of(base_dir, current)
    return names


def _probe_turn(server_url: str, name: str, policy: Policy) -> TurnRecord:
    """A fresh completion sampled from the server under `name`, recorded as the tee records."""
    prompt = registry._canary_ids(policy.tokenizer)
    served = registry.served_canary(server_url, name, prompt, tokens=16)
    return TurnRecord(
        session_id="guard-probe",
        index=0,
        adapter=name,
        created_at=time.time(),
        request={"model": name, "messages": registry.CANARY_MESSAGES, "temperature": 0.0},
        prompt_token_ids=prompt,
        completion_token_ids=served["token_ids"],
        logprobs=served["logprobs"],
        token_exact=True,
    )


def guard_turns(ledger: Ledger, policy: Policy, config: TrainConfig) -> list[TurnRecord]:
    """Recorded turns of the starting policy, newest last (any session: the guard never trains)."""
    names = _names_of(policy.base_dir, config.parent)
    turns: list[TurnRecord] = []
    for session in ledger.sessions(limit=200):
        turns += [t for t in ledger.turns(session.id) if t.adapter in names]
        if sum(t.trainable for t in turns) >= config.guard_turns:
            break
    return list(reversed(turns))


def guard(
    ledger: Ledger, policy: Policy, config: TrainConfig, server_url: str | None
) -> dict[str, Any]:
    """The guard over recorded turns; with none and a server, over a fresh probe of it."""
    turns = guard_turns(ledger, policy, config)
    if not any(t.trainable for t in turns) and server_url is not None:
        start = config.parent or BASE_ADAPTER
        logger.info(f"guard: no recorded turns of {start}; probing the server instead")
        result = run_guard(
            policy, [_probe_turn(server_url, start, policy)], config,
            base_names=list(_base_names(policy.base_dir)),
        )  # fmt: skip
        return {**result, "source": "probe"}
    result = run_guard(policy, turns, config, base_names=list(_base_names(policy.base_dir)))
    return {**result, "source": "ledger"}


def step_guard(
    policy: Policy, turns: list[TurnRecord], current: str, config: TrainConfig, step: int,
    last_version: str | None,
) -> dict[str, Any]:  # fmt: skip
    """The guard on the turns this online step sampled under `current`, before they train.

    The policy holds `current`'s weights here, so a version the server samples differently from
    the trainer fails the step that would learn from it. The run then stops: `last_version`
    (None: the run registered none yet) stays its newest registered version.
    """
    own = [t for t in turns if t.adapter in _names_of(policy.base_dir, current)]
    try:
        result = run_guard(policy, own, config, base_names=list(_base_names(policy.base_dir)))
    except GuardError as e:
        kept = last_version or "none (the run registered no version)"
        raise GuardError(
            f"step {step} of {config.steps}, on turns sampled by {current}: {e}; the run stops, "
            f"its last registered version is {kept}",
            {**e.result, "step": step, "adapter": current, "last_version": last_version},
        ) from e
    return {**result, "source": "rollouts", "step": step, "adapter": current}


def guard_fields(result: dict[str, Any]) -> dict[str, Any]:
    """The guard's numbers as step-log fields (`guard/...`), beside each step's metrics."""
    keys = ("passed", "mean_abs_diff", "max_abs_diff", "compared_tokens", "source")
    return {f"guard/{k}": result.get(k) for k in keys}


# -- rows per algorithm ----------------------------------------------------------------------

HELDOUT_OVERLAP = "heldout_overlap_removed"
"""The report's count of sessions removed for held-out overlap (`Ledger.training_selection`)."""


def passed_sessions(sessions: Iterable[SessionRecord]) -> set[str]:
    """The ids of the `sessions` that passed (`scoring.passed`; unverified ones did not)."""
    return {s.id for s in sessions if passed(s.reward_parts) is True}


def passed_sequences(
    turns: Sequence[TurnRecord], sessions: Mapping[str, SessionRecord], tokenizer: Any,
    config: TrainConfig,
) -> tuple[list[TrainingSequence], dict[str, Any]]:  # fmt: skip
    """Sequences of the `turns` whose session passed (`scoring.passed`): what SFT and RFT imitate.

    Sampled turns train on their recorded ids; demonstrations are rendered with `tokenizer`.
    """
    passed_ids = passed_sessions(sessions.values())
    rows = [TrainableTurn.from_turn(t, tokenizer) for t in turns if t.session_id in passed_ids]
    sequences, stats = build_sequences(rows, max_len=config.max_seq_len)
    info = {
        "eligible_sessions": len(sessions),
        "passed_sessions": len(passed_ids),
        "demonstration_turns": sum(r.demonstration for r in rows),
        "sequences": stats.sequences,
        "merged_turns": stats.merged,
        "split_turns": stats.split,
        "dropped_turns": stats.dropped,
    }
    return sequences, info


ROLLOUTS = "rollouts"
"""An online step's count of simulated episodes, eligible to train or not."""
ROLLOUTS_HELDOUT = "rollouts_heldout"
"""An online step's count of episodes recorded as held out (a held-out scenario never trains)."""
FIRST_ROUND_PASS_RATE = "first_round_pass_rate"
"""The prefix of an online step's per-scenario pass rates (`first_round_pass_rates`)."""


def sft_rows(
    ledger: Ledger, policy: Policy, config: TrainConfig,
    live: LiveTrust = DEFAULT_LIVE_TRUST, session_ids: Sequence[str] | None = None,
) -> tuple[list, list[str], dict]:  # fmt: skip
    """Sequences of every eligible turn (demonstrations included) of a session that passed.

    `info["heldout_overlap_removed"]`: the sessions the training query removed because their
    calls replay a held-out call ("rows removed for held-out overlap").
    """
    selection = ledger.training_selection(purpose="sft", session_ids=session_ids, live=live)
    turns = selection.turns
    sessions = {sid: ledger.session(sid) for sid in dict.fromkeys(t.session_id for t in turns)}
    sequences, info = passed_sequences(turns, sessions, policy.tokenizer, config)
    used = sorted({s.session_id for s in sequences})
    return sequences, used, {**info, HELDOUT_OVERLAP: selection.removed}


def rl_rows(
    ledger: Ledger, names: set[str], session_ids: Sequence[str] | None, config: TrainConfig,
    live: LiveTrust = DEFAULT_LIVE_TRUST,
) -> tuple[list[TurnRecord], list[SessionRecord], int, int]:  # fmt: skip
    """Sampled turns by one of `names` (older adapters' turns dropped), and their sessions.

    Also how many off-policy turns were dropped, and how many sessions the training query
    removed for held-out overlap ("rows removed for held-out overlap").
    """
    selection = ledger.training_selection(purpose="rl", session_ids=session_ids, live=live)
    turns = selection.turns
    fresh = [t for t in turns if t.adapter in names]
    sessions = [ledger.session(sid) for sid in dict.fromkeys(t.session_id for t in fresh)]
    return fresh, sessions, len(turns) - len(fresh), selection.removed


# -- the algorithms ----------------------------------------------------------------------------


def grpo_signal(
    turns: list[TurnRecord], sessions: list[SessionRecord], dropped_old: int,
    sampling: dict[str, Any], config: TrainConfig,
) -> tuple[Groups, dict[str, Any]]:  # fmt: skip
    """A GRPO step's groups and what they hold for its log.

    It needs no model, so an offline run counts them before torch and the model load.

    Raises:
        NoTrainingSignalError: every group's rewards are equal (or there is no group).
    """
    rows = [TrainableTurn.from_turn(t) for t in turns]
    sequences, seq_stats = build_sequences(rows, max_len=config.max_seq_len)
    groups = build_groups(sessions, sequences, config)
    signal = {
        "reward": round(statistics.fmean(groups.rewards), 6) if groups.rewards else None,
        "reward_std": round(statistics.pstdev(groups.rewards), 6) if groups.rewards else None,
        "frac_reward_zero_std": groups.frac_reward_zero_std,
        "frac_reward_zero_std/outcome": groups.frac_zero_std_outcome,
        "frac_reward_zero_std/shaped": groups.frac_zero_std_shaped,
        "groups": groups.groups,
        "sequences": len(groups.sequences),
        "merged_turns": seq_stats.merged,
        "split_turns": seq_stats.split,
        "dropped_off_policy_turns": dropped_old,
        **sampling,
    }
    if not groups.sequences:
        resampled = (
            f" after {sampling['resample_rounds']} resample round(s) of "
            f"max_resample_rounds={config.max_resample_rounds}"
            if "resample_rounds" in sampling
            else ""
        )
        raise NoTrainingSignalError(
            f"no training signal: {groups.zero_std_groups} of {groups.groups} groups have equal "
            f"rewards{resampled} (frac_reward_zero_std={groups.frac_reward_zero_std}; "
            f"outcome-only {groups.frac_zero_std_outcome}, shaped {groups.frac_zero_std_shaped});"
            " warm-start with --algo sft, raise --group-size or the temperature"
        )
    return groups, signal


def _grpo_update(
    policy: Policy,
    optimizer: Any,
    turns: list[TurnRecord],
    sessions: list[SessionRecord],
    config: TrainConfig,
    step: int,
    log: Progress,
    dropped_old: int,
    sampling: dict[str, Any],
) -> dict[str, Any]:
    groups, signal = grpo_signal(turns, sessions, dropped_old, sampling, config)

    def on_step(metrics: dict[str, Any]) -> None:
        log({"step": step, "total_steps": config.steps, **signal, **metrics})

    return {
        **signal,
        **grpo_update(policy, optimizer, groups.sequences, config, step=step, on_step=on_step),
    }


def _opsd_update(
    student: Policy,
    teacher: Any,
    optimizer: Any,
    turns: list[TurnRecord],
    sessions: list[SessionRecord],
    config: TrainConfig,
    step: int,
    log: Progress,
) -> dict[str, Any]:
    by_session = {s.id: s for s in sessions}
    rows = []
    for t in turns:
        session = by_session[t.session_id]
        if config.rubric.outcome_score(session.reward_parts) is None:
            continue  # only judged turns have a hint worth distilling
        hint = session_hint(session, ledger_turns(turns, t.session_id), t.index)
        if hint:
            rows.append(opsd_row(t, student.tokenizer, hint, config.opsd_hint))
    if not rows:
        raise NoTrainingSignalError(
            "OPSD has no judged turns with a hint (caller's next line, failed checks, labels or "
            "a scorer's explanation) sampled by the starting policy; simulate under it first"
        )
    return opsd_update(
        student, teacher, optimizer, rows, config,
        on_step=lambda metrics: log({"step": step, "total_steps": config.steps, **metrics}),
    )  # fmt: skip


def ledger_turns(turns: list[TurnRecord], session_id: str) -> list[TurnRecord]:
    """The turns of one session among `turns`."""
    return [t for t in turns if t.session_id == session_id]


RESAMPLE_SEED_STRIDE = 10**12
"""Seeds of a step's resample rounds lie this far apart, away from every step's first round."""


def step_scenarios(scenarios: "ScenarioSet", config: TrainConfig, step: int) -> "ScenarioSet":
    """The scenarios online step `step` rolls out: `scenarios_per_step` of them, or all.

    Drawn afresh each step, so over a run every scenario comes up, and by `config.seed` and the
    step, so a rerun draws the same ones.
    """
    k = config.scenarios_per_step
    if k is None or k >= len(scenarios):
        return scenarios
    drawn = set(random.Random(f"{config.seed}:{step}").sample(range(len(scenarios)), k))
    kept = [s for i, s in enumerate(scenarios) if i in drawn]
    return scenarios.model_copy(update={"scenarios": kept})


def first_round_pass_rates(sessions: Iterable[SessionRecord]) -> dict[str, float]:
    """`first_round_pass_rate/<scenario>`: the share of a step's first-round rollouts that passed.

    Before any group is redrawn, so the rate is the current version's own at the training
    temperature: the run's training curve, scenario by scenario (unverified calls not counted).
    """
    runs: dict[str, list[bool]] = {}
    for session in sessions:
        verdict = passed(session.reward_parts)
        if verdict is not None:
            runs.setdefault(session.scenario_id or session.id, []).append(verdict)
    return {
        f"{FIRST_ROUND_PASS_RATE}/{scenario}": round(sum(v) / len(v), 6)
        for scenario, v in sorted(runs.items())
    }


def _simulate(
    ledger: Ledger, rollouts: Rollouts, server_url: str, adapter: str, config: TrainConfig,
    step: int, resample: int = 0, groups: frozenset[str] | None = None,
) -> list[str]:  # fmt: skip
    """Run step `step`'s episodes; resample round `resample` > 0 runs the scenarios of `groups`."""
    from pipecat_rl.simulator import Server, run

    scenarios = step_scenarios(rollouts.scenarios, config, step)
    if groups is not None:  # a group is its scenario's content (`grpo.group_key`)
        kept = [s for s in scenarios if s.content_hash() in groups]
        scenarios = scenarios.model_copy(update={"scenarios": kept})
    options = rollouts.options.model_copy(
        update={
            "seed": config.seed * 1000 + step + RESAMPLE_SEED_STRIDE * resample,
            "repeats": config.group_size, "temperature": config.temperature,
        }
    )  # fmt: skip
    report = run(
        scenarios, rollouts.bot, options, ledger, policies=[adapter],
        server=Server(url=server_url),
    )  # fmt: skip
    return [e.session_id for e in report.episodes if e.session_id]


def _step_rows(
    ledger: Ledger, rollouts: Rollouts | None, server_url: str | None, current: str,
    config: TrainConfig, step: int, names: set[str], live: LiveTrust = DEFAULT_LIVE_TRUST,
    session_ids: Sequence[str] | None = None,
) -> tuple[list[TurnRecord], list[SessionRecord], int, dict[str, Any]]:  # fmt: skip
    """A step's trainable turns, their sessions, the off-policy turns dropped, how they were drawn.

    Offline (no `rollouts`): from the ledger. Online: simulated under `current`; GRPO's with
    dynamic sampling (`grpo.dynamic_sampling`), whose metrics come back for the step's log.
    """
    if rollouts is None:
        turns, sessions, dropped, removed = rl_rows(ledger, names, session_ids, config, live)
        return turns, sessions, dropped, {HELDOUT_OVERLAP: removed}
    removed = simulated = held = 0
    first: dict[str, float] = {}

    def draw(resample: int, groups: frozenset[str] | None):
        nonlocal removed, simulated, held, first
        ids = _simulate(ledger, rollouts, server_url, current, config, step, resample, groups)
        turns, sessions, dropped, more = rl_rows(ledger, names, ids, config, live)
        removed += more
        simulated += len(ids)
        recorded = [ledger.session(i) for i in ids]
        held += sum(s.split == "heldout" for s in recorded)  # as recorded
        if not resample:  # every rollout of the round, whether it may train or not
            first = first_round_pass_rates(recorded)
        return turns, sessions, dropped

    def counts() -> dict[str, Any]:
        return {HELDOUT_OVERLAP: removed, ROLLOUTS: simulated, ROLLOUTS_HELDOUT: held, **first}

    if config.algo != "grpo":
        turns, sessions, dropped = draw(0, None)
        return turns, sessions, dropped, counts()
    sampled = dynamic_sampling(draw, config)
    metrics = {**sampled.metrics(), **counts()}
    return sampled.turns, sampled.sessions, sampled.dropped_off_policy, metrics


def canary_moved(
    server_url: str, name: str, parent: str, policy: Policy, config: TrainConfig
) -> dict[str, Any]:
    """How far `name`'s served canary is from its `parent`'s (both served now), beyond noise.

    The parent's canary is scored before and after the version's: their difference is the
    server's noise on unchanged weights, and the version moved only when it differs by more than
    `canary_noise_k` times that (and `canary_min_delta`), or its greedy ids part
    (`registry.canary_move`). A server still sampling the parent under the new name differs by
    noise alone, so the next step's turns would not be the new version's. The rule asks the
    weights to move past the noise, not by a fixed amount: the learning rate is left to learning.

    Raises:
        NotMovedError: the version did not move.
    """
    prompt = registry._canary_ids(policy.tokenizer)
    before = registry.served_canary(server_url, parent, prompt)
    new = registry.served_canary(server_url, name, prompt)
    after = registry.served_canary(server_url, parent, prompt)
    move = registry.canary_move(
        new, before, after, k=config.canary_noise_k, floor=config.canary_min_delta
    )
    result = {"parent": parent, **{k: v for k, v in move.items() if k != "moved"}}
    if move["moved"]:
        return result
    if move["noise"] is None:
        why = "the parent's own canary changed its first token between two requests"
    else:
        ids = "wander on the parent itself" if move["noise_ids_differ"] else "equal"
        why = (
            f"greedy ids {ids}, logprobs within {move['max_abs_diff']} <= {move['threshold']:g}: "
            f"{config.canary_noise_k:g} x the noise of re-scoring the parent ({move['noise']:g}), "
            f"at least {config.canary_min_delta:g}"
        )
    raise NotMovedError(
        f"{name} did not move: its canary is its parent {parent}'s ({why}), so the canary "
        "cannot show which of them the server samples",
        result,
    )


def unload_versions(server_url: str, names: Sequence[str]) -> list[str]:
    """Unload `names` from the server; those it no longer lists are skipped. Returns unloaded.

    vLLM keeps what it cannot hold in its LoRA slots in a least-recently-used cache: an evicted
    adapter stays listed and is reloaded from its folder on its next request, so a superseded
    version served nothing only once unloaded, and unloading it never needs it resident.
    """
    admin = VLLMAdmin(server_url)
    served = set(admin.models())
    gone = [n for n in names if n in served]
    for name in gone:
        admin.unload_adapter(name)
    if gone:
        logger.info(f"unloaded superseded version(s) {', '.join(gone)}")
    return gone


def _publish(
    ledger: Ledger, policy: Policy, config: TrainConfig, out_dir: Path, parent: str | None,
    run_id: str, session_ids: list[str], metrics: dict, guard_result: dict,
    server_url: str | None, compare_to: str | None,
) -> tuple[str, Path, dict | None]:  # fmt: skip
    """Save the weights under a new name; with a server, load and verify them; then register.

    A version the server does not serve as trained (the canary), or that did not move off
    `compare_to` (its served parent, online), is unloaded and never registered: the ledger's
    newest version is then the last one that was. One that did not move leaves no folder, so
    the next attempt takes its version number.
    """
    name = registry.next_name(ledger, out_dir, config.name_prefix, config.algo)
    folder = out_dir / name
    save_adapter(policy, folder)
    canary = None
    if server_url is not None:
        try:
            canary = registry.load_and_verify(server_url, name, folder, policy)
            if compare_to is not None:
                canary["moved"] = canary_moved(server_url, name, compare_to, policy, config)
        except (TrainingError, ServingError) as e:
            with contextlib.suppress(ServingError):
                unload_versions(server_url, [name])
            if isinstance(e, NotMovedError):
                shutil.rmtree(folder, ignore_errors=True)
            raise
    registry.register(
        ledger, name=name, folder=folder, base_model=str(policy.base_dir), parent=parent,
        run_id=run_id, algo=config.algo, config=config.model_dump(mode="json"),
        session_ids=session_ids, metrics=metrics, guard=guard_result,
    )  # fmt: skip
    return name, folder, canary


def train(
    ledger: Ledger,
    config: TrainConfig,
    *,
    server_url: str | None = None,
    rollouts: Rollouts | None = None,
    progress: Progress | None = None,
    live: LiveTrust = DEFAULT_LIVE_TRUST,
    session_ids: Sequence[str] | None = None,
) -> TrainResult:
    """Train one adapter from the ledger (GRPO / OPSD / RFT online with `rollouts` and a server).

    `live` says which live calls may train (the eligibility query's `LiveTrust`); offline,
    `session_ids` keeps the run to those sessions (None: every eligible one).
    """
    run_id = f"run-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    out_dir = Path(config.out_dir or registry.default_out_dir()).expanduser()
    log = MetricsLog(out_dir / "runs" / f"{run_id}.metrics.jsonl", progress)
    online = rollouts is not None and config.algo in ONLINE_ALGOS  # SFT, DPO: the ledger's
    if config.algo in ROLLOUT_ONLY and not online:
        raise TrainingError(
            f"{config.algo} {ROLLOUT_ONLY[config.algo]}: give it scenarios and a bot to roll out "
            "(`rollouts`; on the CLI --scenarios and --bot)"
        )
    if online and server_url is None:
        raise TrainingError("online training simulates under each new version: give a server URL")
    offline_rows = None  # offline RL: the ledger's rows, the same each step, read before torch
    if config.algo in ONLINE_ALGOS and not online:
        names = recent_policies(ledger, resolve_base(config.base_model), config)
        offline_rows = _step_rows(ledger, None, None, "", config, 1, names, live, session_ids)
        if config.algo == "grpo":  # its groups need no model: no signal is said at once
            grpo_signal(*offline_rows, config)
    policy = load_policy(config, _parent_path(ledger, config.parent))
    distiller = load_teacher(config, policy.tokenizer) if config.algo == "distill" else None
    guard_result = guard(ledger, policy, config, server_url)
    logger.info(f"guard passed: {guard_result}")
    parent = config.parent if config.parent != BASE_ADAPTER else None
    summary: dict[str, Any]
    loaded: list[str] = []  # versions this run loaded, oldest first (never the run's start)
    published: tuple[str, Path, dict | None, dict[str, Any]] | None = None  # online: the newest
    stopped: int | None = None  # online: the step whose version never moved
    why_stopped = ""
    current = config.parent or BASE_ADAPTER
    if config.algo == "sft":
        sequences, used, info = sft_rows(ledger, policy, config, live, session_ids)
        summary = {**info, **train_sft(policy, sequences, config, on_step=log)}
    elif config.algo == "dpo":
        pairs, kept_out = dpo_pairs(ledger)
        used = sorted({p.session_id for p in pairs})
        counted = {f"duel_votes_kept_out/{reason}": n for reason, n in kept_out.items()}
        summary = {**counted, **train_dpo(policy, pairs, config, on_step=log)}
    else:
        # RFT's rounds are SFT runs, each with its own optimiser and schedule (`train_sft`)
        optimizer = None if config.algo == "rft" else optimizer_for(policy, config.learning_rate())
        teacher = distiller
        if config.algo == "opsd":
            teacher = load_policy(config, _parent_path(ledger, config.parent), trainable=False)
            teacher.model.requires_grad_(False)
        names = recent_policies(ledger, policy.base_dir, config)
        used_set: set[str] = set()
        for step in range(1, config.steps + 1):
            turns, sessions, dropped, sampling = offline_rows or _step_rows(
                ledger, rollouts, server_url, current, config, step, names, live, session_ids
            )
            if online and not turns:
                raise NoTrainingSignalError(_none_may_train(step, config, current, sampling))
            if online:
                guard_result = step_guard(
                    policy, turns, current, config, step, loaded[-1] if loaded else None
                )
            used_set.update(_learned_from(config, sessions))

            update = functools.partial(
                _update, policy, optimizer, teacher, (turns, sessions, dropped, sampling), config,
                step, _adding(log, guard_fields(guard_result)),
            )  # fmt: skip
            summary = update(0)
            if not online:
                continue
            version = _publish_moved(
                ledger, policy, config, out_dir, parent, run_id, sorted(used_set), summary,
                guard_result, server_url, current, update, step, log,
            )  # fmt: skip
            if isinstance(version, str):
                stopped, why_stopped = step, version
                break
            name, folder, canary, summary = version
            _served(log, step, config, name, canary, server_url, loaded)
            policy.parent = parent = current = name  # the guard scores its turns as ours
            names = {name}  # each online step trains on its own fresh episodes only
            published = (name, folder, canary, summary)
            used = sorted(used_set)  # online: the sessions the newest version learned from
        if not online:
            used = sorted(used_set)
    if online:
        if published is None:
            raise NoTrainingSignalError(
                f"no version moved off {current}: step {stopped}'s update {why_stopped}; raise "
                "the learning rate or the optimiser steps per batch (mini_batches, ppo_epochs, "
                "move_retries)"
            )
        name, folder, canary, summary = published
        if stopped is not None:
            summary = {**summary, "stopped_at_step": stopped}
    else:
        name, folder, canary = _publish(
            ledger, policy, config, out_dir, parent, run_id, used, summary, guard_result,
            server_url, compare_to=None,
        )  # fmt: skip
    metrics = {**summary, **({"canary": canary} if canary else {})}
    return TrainResult(
        adapter=name, path=folder, metrics_path=log.path, session_ids=used, guard=guard_result,
        metrics=metrics, parent=config.parent, algo=config.algo, loaded=server_url is not None,
    )  # fmt: skip


def _none_may_train(step: int, config: TrainConfig, current: str, counts: dict[str, Any]) -> str:
    """Why online step `step` has nothing to train: its rollouts' counts, held-out ones first."""
    simulated, held = counts.get(ROLLOUTS, 0), counts.get(ROLLOUTS_HELDOUT, 0)
    why = (
        f"none of the {simulated} rollouts step {step} of {config.steps} ran under {current} "
        "may train"
    )
    if held:
        why += (
            f": {held} are of held-out scenarios, which never train (roll out pool scenarios; "
            "the gate evaluates on held-out ones)"
        )
    return (
        f"{why}; a rollout trains only if its session is eligible (not held out, excluded or a "
        "harness failure: `pipecat-rl ledger stats` counts why) and has a turn sampled "
        f"token-exactly, not cut by max_tokens ({counts.get(HELDOUT_OVERLAP, 0)} removed for "
        "held-out overlap)"
    )


def _learned_from(config: TrainConfig, sessions: Sequence[SessionRecord]) -> set[str]:
    """The sessions a step's update learns from: RFT's passed rollouts; all, for the others."""
    return passed_sessions(sessions) if config.algo == "rft" else {s.id for s in sessions}


def _rft_update(
    policy: Policy, turns: list[TurnRecord], sessions: list[SessionRecord], config: TrainConfig,
    step: int, log: Progress, sampling: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """Step `step` of RFT: SFT on its rollouts that passed, on the ids the server recorded.

    The step's own count is the log's `step`; SFT's optimiser steps are `sft_step`.

    Raises:
        NoTrainingSignalError: no rollout that may train passed (or none left a row).
    """
    sequences, info = passed_sequences(turns, {s.id: s for s in sessions}, policy.tokenizer, config)
    counts = {
        **sampling,
        "pass_rate": round(info["passed_sessions"] / len(sessions), 6) if sessions else None,
    }
    if not sequences:
        dropped = info["dropped_turns"]
        raise NoTrainingSignalError(
            f"RFT has nothing to imitate at step {step} of {config.steps}: "
            f"{info['passed_sessions']} of the {len(sessions)} rollouts that may train passed"
            + (f" ({dropped} turn(s) over max_seq_len={config.max_seq_len})" if dropped else "")
            + "; warm-start with --algo sft, raise --group-size or the temperature, or roll out "
            "pool scenarios the policy sometimes passes"
        )

    def on_step(metrics: dict[str, Any]) -> None:
        sft = {f"sft_{k}": metrics[k] for k in ("step", "total_steps") if k in metrics}
        log({**metrics, **sft, "step": step, "total_steps": config.steps, **counts})

    return {**info, **counts, **train_sft(policy, sequences, config, on_step=on_step)}


def _distill_update(
    policy: Policy, optimizer: Any, teacher: ReplyTeacher | LogprobTeacher,
    turns: list[TurnRecord], config: TrainConfig, step: int, log: Progress,
    sampling: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """Step `step` of distill: the teacher at each turn the step sampled, then the update.

    A reply teacher's labels (every step's so far) train by SFT, a round as RFT's; a logprob
    teacher's scores by reverse KL on the step's own samples.
    """
    counts = {
        k: v for k, v in sampling.items()
        if k in (HELDOUT_OVERLAP, ROLLOUTS) or k.startswith(f"{FIRST_ROUND_PASS_RATE}/")
    }  # fmt: skip

    def on_step(metrics: dict[str, Any]) -> None:
        sft = {f"sft_{k}": metrics[k] for k in ("step", "total_steps") if k in metrics}
        log({**metrics, **sft, "step": step, "total_steps": config.steps, **counts})

    if isinstance(teacher, ReplyTeacher):
        sequences, labelled = reply_sequences(teacher, turns, policy.tokenizer)
        counts.update(labelled)
        return {**counts, **train_sft(policy, sequences, config, on_step=on_step)}
    return {**counts, **logprob_update(policy, optimizer, teacher, turns, config, on_step=on_step)}


def _update(
    policy: Policy, optimizer: Any, teacher: Policy | ReplyTeacher | LogprobTeacher | None,
    batch: tuple[list[TurnRecord], list[SessionRecord], int, dict[str, Any]], config: TrainConfig,
    step: int, log: Progress, retry: int,
) -> dict[str, Any]:  # fmt: skip
    """One pass over step `step`'s batch; `retry` > 0: once more, its version had not moved."""
    turns, sessions, dropped, sampling = batch
    if retry:
        log = _adding(log, {"move_retry": retry})
    if config.algo == "rft":
        return _rft_update(policy, turns, sessions, config, step, log, sampling)
    if isinstance(teacher, ReplyTeacher | LogprobTeacher):
        return _distill_update(policy, optimizer, teacher, turns, config, step, log, sampling)
    if config.algo == "grpo":
        kls: list[float] = []

        def logged(metrics: dict[str, Any]) -> None:
            if metrics.get("kl") is not None:
                kls.append(metrics["kl"])
            log(metrics)

        summary = _grpo_update(
            policy, optimizer, turns, sessions, config, step, logged, dropped, sampling
        )
        return {**summary, "kl/max": max(kls, default=0.0)}
    summary = _opsd_update(policy, teacher.model, optimizer, turns, sessions, config, step, log)
    return {**summary, **{k: v for k, v in sampling.items() if k == HELDOUT_OVERLAP}}


def _publish_moved(
    ledger: Ledger, policy: Policy, config: TrainConfig, out_dir: Path, parent: str | None,
    run_id: str, session_ids: list[str], summary: dict[str, Any], guard_result: dict,
    server_url: str, current: str, update: Callable[[int], dict[str, Any]], step: int,
    log: Progress,
) -> tuple[str, Path, dict | None, dict[str, Any]] | str:  # fmt: skip
    """Online step `step`'s version, published once it moved off `current`; why not, if never.

    An update too small for the canary to tell from its parent is not a broken run: the batch
    gets another pass (the clip bounds how far), up to `move_retries`, unless a pass overfits it
    (GRPO's KL to the sampler over `retry_max_kl`). Returns the version's name, folder, canary
    and the metrics of its last pass.
    """
    for retry in range(config.move_retries + 1):
        if retry:
            summary = update(retry)
            kl = summary.get("kl/max")
            if kl is not None and kl > config.retry_max_kl:
                logger.warning(
                    f"step {step}: pass {retry + 1} over its batch took the KL to the sampler to "
                    f"{kl:g} > retry_max_kl={config.retry_max_kl:g} (it overfits the batch); the "
                    "run ends at its last version that moved"
                )
                log({
                    "step": step, "total_steps": config.steps, "overfit": True,
                    "move_retry": retry, "kl/max": kl,
                })  # fmt: skip
                return f"overfit its batch on pass {retry + 1} (KL to the sampler {kl:g})"
        try:
            name, folder, canary = _publish(
                ledger, policy, config, out_dir, parent, run_id, session_ids, summary,
                guard_result, server_url, compare_to=current,
            )  # fmt: skip
            return name, folder, canary, summary
        except NotMovedError as e:
            left = config.move_retries - retry
            logger.warning(f"step {step}: {e}; {left} more pass(es) over its batch")
            log({
                "step": step, "total_steps": config.steps, "not_moved": True,
                "move_retry": retry, **canary_fields(e.moved),
            })  # fmt: skip
    logger.warning(
        f"step {step} of {config.steps}: no version moved off {current} after "
        f"{config.move_retries + 1} pass(es); the run ends at its last version that moved"
    )
    return (
        f"left the canary within the server's noise of it ({config.canary_noise_k:g} x the "
        f"noise of re-scoring it, at least {config.canary_min_delta:g}) after "
        f"{config.move_retries + 1} pass(es) over its batch"
    )


def canary_fields(moved: Mapping[str, Any]) -> dict[str, Any]:
    """A canary comparison (`canary_moved`) as step-log fields: the move, the noise, the bar."""
    return {
        "canary/moved_max_abs_diff": moved.get("max_abs_diff"),
        "canary/ids_differ": moved.get("ids_differ"),
        "canary/noise": moved.get("noise"),
        "canary/moved_threshold": moved.get("threshold"),
    }


def _adding(log: Progress, fields: dict[str, Any]) -> Progress:
    """`log`, with `fields` added to every row (the step's guard beside its metrics)."""
    return lambda metrics: log({**metrics, **fields})


def _served(
    log: Progress, step: int, config: TrainConfig, name: str, canary: dict | None,
    server_url: str, loaded: list[str],
) -> None:  # fmt: skip
    """Online step `step` now serves `name`: unload the run's versions older than its parent.

    `loaded` (the run's versions on the server, oldest first) keeps the last two; the version's
    row (its canary, what was unloaded) goes into the step log.
    """
    loaded.append(name)
    unloaded = unload_versions(server_url, loaded[:-2])
    del loaded[:-2]
    log({
        "step": step, "total_steps": config.steps, "version": name,
        "canary/max_abs_diff": (canary or {}).get("max_abs_diff"),
        **canary_fields((canary or {}).get("moved") or {}),
        "unloaded": unloaded,
    })  # fmt: skip
