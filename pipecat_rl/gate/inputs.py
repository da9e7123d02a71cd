"""What the gate decides from: runs of two policies, loaded from any source into one `GateData`.

Sources, one shape:

- a scores file (`--scores FILE.jsonl`), so results from other eval tools can be gated too;
- the ledger (`--from-ledger`): held-out sessions recorded under the two policies;
- the simulator (`pipecat_rl.gate.simulate`), which writes `gate` sessions read back as above.

A scores file has one JSON object per run::

    {"scenario": "reschedule-01", "policy": "policy-v3", "run": 0, "reward": 1.0,
     "v2v_ms": [812.0, 1034.5], "unauthorized_writes": 0}

`run` pairs runs: candidate run r and incumbent run r of a scenario used the same seed. `reward`
is the run's authoritative score in [0, 1]; a line may instead (or also) carry `reward_parts`
(`{"verifier": 0.0, "tool_credit": 0.5}`), and then the gate scores it from its parts exactly as
it scores ledger sessions (`gate_score`): the shaped tool credit never counts. Optional keys:
`seed`, `scenario_hash`, `channel` (`text` or `audio`), `stages_ms` (per-stage samples keyed
`endpointing_ms`, `stt_ms`, `llm_ttft_ms`, `tts_ttfb_ms`), `llm_call_ttft_ms` and `llm_turn_ms`
(each LLM call's time from request to its first token, and to its last), `guarded` (whether the
run carried a check that something must not change),
`writes` (its unauthorised writes: `kind`, `check`, `tool`, `call_id`), `usage`
(`prompt_tokens`, `completion_tokens`, `stt_seconds`, `tts_seconds`), `response_gap_ms` (text
mode: per caller line, the time to the agent's first words, tool rounds included) and
`turn_taking` (the call's `scoring.TurnTaking` record). A tool's own data goes
under `meta` (kept, never read); any other key is refused with the key named (a misspelt
`unauthorised_writes` must not read as "no writes"), and so is a key given twice. Lines of other
policies are skipped and counted.

Every number is bounded: rewards and parts finite in [0, 1], latencies finite in
[0, `MAX_LATENCY_MS`], counts non-negative; `reward` is a number and `passed` / `guarded` are
booleans, never strings; a violation names the file, the line and the field. A file over
`MAX_SCORES_BYTES` is refused before it is read.
"""

import difflib
import hashlib
import itertools
import json
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipecat_rl.errors import ConfigError, GateError
from pipecat_rl.gate.cost import Usage
from pipecat_rl.gate.latency import STAGES
from pipecat_rl.ledger import LatencyRecord, Ledger, SessionRecord, TurnRecord
from pipecat_rl.scenarios.scenario import GUARDED_CHECKS
from pipecat_rl.scoring import (
    SessionOutcome,
    TurnTaking,
    authoritative_part,
    gate_score,
    passed,
    score_passed,
)
from pipecat_rl.scoring.turntaking import METADATA_KEY as TURN_TAKING_KEY
from pipecat_rl.strict import loads_json

UNAUTHORIZED_LABELS = frozenset({"unauthorised_write", "unauthorized_write"})
"""Failure labels that count as one unauthorised write each."""

UNAUTHORIZED_SCORE = "unauthorized_writes"
"""A session score that, when present, is the count of unauthorised writes."""


UNCLASSIFIED = "unclassified"
"""The kind of an unauthorised write known only as a count (a label, a score, a scores line)."""


MAX_LATENCY_MS = 600_000.0
"""Ten minutes: a longer "latency" is a unit mistake (seconds vs microseconds), not a turn."""

Latency = Annotated[float, Field(ge=0, le=MAX_LATENCY_MS)]

MAX_NAME_CHARS = 200
"""Longest scenario, policy, hash or session id a scores line may give: names, not documents (a
megabyte-long name would be printed on every page of the receipt)."""

MAX_SCORES_BYTES = 64 * 2**20
"""Largest scores file read: 64 MiB. The file is read a line at a time and each run kept as one
parsed record, so memory follows the runs kept, bounded by this cap. Real gates hold hundreds
to thousands of lines (24 scenarios x 8 repeats x 2 arms is 384); a bigger file is a mistake,
refused before it is read."""


class UnauthorizedWrite(BaseModel):
    """One write a guarded check says should not have happened, and what made it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = UNCLASSIFIED
    """The guarded tables it changed, joined by `+` (`appointments+slots` for a booking or a
    cancellation, `handoffs` for a transfer), or `unclassified`."""
    check: str | None = None
    """The failed check, as the world reported it (`unchanged appointments`)."""
    tool: str | None = None
    """The tool call that wrote, when the world recorded which one."""
    call_id: str | None = None


class RunResult(BaseModel):
    """One run of one policy on one scenario: a scores-file line, or a ledger session.

    `reward` is the gate score (see `gate_score`); `passed` is the one definition of passing
    (`ledger.outcome`) on the authoritative part; `reward_parts` keeps every part as stored.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    scenario: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    policy: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    run: int = Field(ge=0)
    reward: float = Field(ge=0, le=1, strict=True)
    reward_parts: dict[str, float] = Field(default_factory=dict)
    passed: StrictBool
    v2v_ms: tuple[Latency, ...] = ()
    stages_ms: dict[str, tuple[Latency, ...]] = Field(default_factory=dict)
    unauthorized_writes: int = Field(0, ge=0, le=1_000_000)
    writes: tuple[UnauthorizedWrite, ...] = ()
    """The unauthorised writes one by one (as many as `unauthorized_writes`), when recorded."""
    guarded: StrictBool | None = None
    """Whether the run carried a guarded check; None when not recorded."""
    llm_turn_ms: tuple[Latency, ...] = ()
    """Each LLM call's time from request to its last token."""
    llm_call_ttft_ms: tuple[Latency, ...] = ()
    """Each LLM call's time from request to its first token, text or tool call."""
    occurrence: int = Field(0, ge=0)
    """0 for the first session of this (scenario, policy, run, seed), 1 for the next: a run
    repeated is paired as one more run, never in place of the first."""
    usage: Usage | None = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    scenario_hash: str | None = Field(None, max_length=MAX_NAME_CHARS)
    session_id: str | None = Field(None, max_length=MAX_NAME_CHARS)
    meta: dict[str, Any] | None = None
    """A scoring tool's own data about the run: kept in the file, never read by the gate."""
    # Audio mode: what a caller heard, and the channel the run went down.
    heard_gap_ms: tuple[float, ...] = ()
    """Caller-side heard gaps (audio mode): the figure the P95 checks gate on when present."""
    response_gap_ms: tuple[Latency, ...] = ()
    """Text mode: per caller line, its sending to the agent's first text received (tool rounds
    included when the agent said nothing before them)."""
    turn_taking: TurnTaking | None = None
    """The call's turn-taking, as the simulator measured it (None: not recorded)."""
    channel: Literal["text", "audio"] | None = None
    transport: Literal["local", "webrtc"] | None = None
    """Audio runs: the call's transport. Heard gaps compare only within one (WebRTC adds its
    codec and jitter buffers to what the caller hears)."""

    @model_validator(mode="before")
    @classmethod
    def _score_from_parts(cls, data: Any, info: ValidationInfo) -> Any:
        """A line with `reward_parts` is scored from them; one without, by its `reward`.

        The validation context's `judged` (the config's `judged_metrics`) names extra parts.
        """
        if not isinstance(data, dict) or "passed" in data:
            return data
        parts = data.get("reward_parts")
        if parts:
            if not isinstance(parts, dict):
                raise ValueError("reward_parts must be a mapping of part name: number")
            if authoritative_part(parts) is None:
                raise ValueError(
                    "reward_parts has no authoritative part (verifier or judge:success); the "
                    "gate never decides on tool_credit"
                )
            score = gate_score(parts, (info.context or {}).get("judged", {}))
            return {**data, "reward": score, "passed": passed(parts)}
        reward = data.get("reward")
        if isinstance(reward, int | float) and not isinstance(reward, bool):
            return {**data, "passed": score_passed(float(reward))}
        return data

    @model_validator(mode="after")
    def _writes_counted(self) -> "RunResult":
        if self.writes and len(self.writes) != self.unauthorized_writes:
            if self.unauthorized_writes:
                raise ValueError(
                    f"unauthorized_writes is {self.unauthorized_writes} but writes lists "
                    f"{len(self.writes)}; give one, or make them agree"
                )
            return self.model_copy(update={"unauthorized_writes": len(self.writes)})
        return self

    @field_validator("stages_ms")
    @classmethod
    def _known_stages(cls, value: dict[str, tuple[float, ...]]) -> dict[str, tuple[float, ...]]:
        unknown = sorted(set(value) - set(STAGES))
        if unknown:
            raise ValueError(f"unknown stage(s) {unknown}; known: {list(STAGES)}")
        return value


class Unusable(BaseModel):
    """An arm's sessions the gate could not pair: why each was left out, counted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    harness_errors: int = 0
    """Sessions that ended in a harness error (the call never ran to an outcome)."""
    unverified: int = 0
    """Sessions without an authoritative score (no verifier, no judged success)."""
    unindexed: int = 0
    """Sessions without a scenario or repeat index (not runs of a gate)."""


class InputSource(BaseModel):
    """Where the runs came from, as the receipt records it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["scores", "ledger", "simulate"]
    path: str
    sha256: str | None = None
    """Of the scores file."""
    heldout_set_id: str | None = None
    scenario_hashes: dict[str, str] = Field(default_factory=dict)
    """Scenario id -> content hash, as the runs recorded it."""
    scenario_files: dict[str, str] = Field(default_factory=dict)
    """File -> sha256 of the held-out scenario files named by --scenarios."""
    unusable: dict[str, Unusable] = Field(default_factory=dict)
    """Policy -> its sessions left out, by reason (a scores file has none)."""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class GateData:
    """Everything the gate decides from: the two policies' runs and where they came from."""

    candidate: str
    incumbent: str
    runs: tuple[RunResult, ...]
    source: InputSource


def _distinct(candidate: str, incumbent: str) -> None:
    if candidate == incumbent:
        raise GateError(
            f"candidate and incumbent are both {candidate!r}; gate a new adapter against the live "
            "one (--incumbent live) or the base model (--incumbent base)."
        )


def llm_ttft_samples(run: RunResult) -> tuple[float, ...]:
    """The run's LLM time to first token, per LLM call (`llm_call_ttft_ms`).

    Per call, not per caller turn: a turn's first spoken token waits for every tool round before
    it (the `llm_ttft_ms` stage, which the voice-to-voice figure holds), and a candidate that
    looks things up where the incumbent guesses would read as a slower model. A run with no
    per-call timing (a scores file with `stages_ms` only) is measured by that stage.
    """
    return run.llm_call_ttft_ms or run.stages_ms.get("llm_ttft_ms", ())


def caller_gap_samples(run: RunResult) -> tuple[float, ...]:
    """The run's caller-perceived gaps: per caller line, the wait for the agent's first words.

    The heard gap in audio mode, the response gap in text mode; either way from the caller's
    line to the first words it receives, so a lookup the agent runs in silence counts in full
    and one it announces ("one moment while I check") does not.
    """
    return run.heard_gap_ms or run.response_gap_ms


def _require_both(runs: Sequence[RunResult], candidate: str, incumbent: str, where: str) -> None:
    found = {r.policy for r in runs}
    missing = [p for p in (candidate, incumbent) if p not in found]
    if missing:
        raise GateError(
            f"no runs of {', '.join(map(repr, missing))} in {where}; check the policy names "
            "(--candidate / --incumbent) against the ones recorded there."
        )


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def hash_scenario_files(path: Path) -> dict[str, str]:
    """sha256 of a scenario file, or of every non-hidden file under a folder (relative paths)."""
    if path.is_file():
        return {path.name: sha256_file(path)}
    if not path.is_dir():
        raise ConfigError(f"--scenarios {path} is neither a file nor a folder; check the path.")
    return {
        f.relative_to(path).as_posix(): sha256_file(f)
        for f in sorted(path.rglob("*"))
        if f.is_file() and not any(p.startswith(".") for p in f.relative_to(path).parts)
    }


def load_scores(
    path: Path, candidate: str, incumbent: str, *, judged: Mapping[str, float] | None = None
) -> GateData:
    """Read a scores JSONL file; every bad line is reported with its number and field.

    `judged` is the gate config's `judged_metrics`, for lines that carry `reward_parts`.

    Raises:
        GateError: the file is unreadable, a line is invalid or duplicated, or a policy is absent.
    """
    _distinct(candidate, incumbent)
    digest = hashlib.sha256()
    runs: list[RunResult] = []
    seen: dict[tuple[str, str, int], int] = {}
    others: dict[str, int] = {}
    for lineno, line in _scores_lines(path, digest.update):
        if not line.strip():
            continue
        try:
            data = loads_json(line)
            _known_keys(data)
            run = RunResult.model_validate(data, context={"judged": judged or {}})
        except json.JSONDecodeError as e:
            raise GateError(f"{path}:{lineno}: not a JSON object ({e.msg}).") from e
        except ValidationError as e:
            raise GateError(f"{path}:{lineno}: {_field_error(e)}.") from e
        except ValueError as e:  # `strict`: a key twice or unknown, a number too long
            raise GateError(f"{path}:{lineno}: {e}.") from e
        if run.policy not in (candidate, incumbent):
            others[run.policy] = others.get(run.policy, 0) + 1
            continue
        key = (run.scenario, run.policy, run.run)
        if key in seen:
            raise GateError(
                f"{path}:{lineno}: run {run.run} of {run.policy!r} on {run.scenario!r} repeats "
                f"line {seen[key]}; give each run of a scenario its own `run` index."
            )
        seen[key] = lineno
        runs.append(run)
    _require_both(runs, candidate, incumbent, str(path))
    notes = tuple(
        f"skipped {n} line(s) of policy {name!r} (neither candidate nor incumbent)"
        for name, n in sorted(others.items())
    )
    return GateData(
        candidate=candidate,
        incumbent=incumbent,
        runs=tuple(runs),
        source=InputSource(
            kind="scores",
            path=str(path),
            sha256=digest.hexdigest(),
            scenario_hashes={r.scenario: r.scenario_hash for r in runs if r.scenario_hash},
            notes=notes,
        ),
    )


def _known_keys(data: Any) -> None:
    """Refuse a scores line's unknown keys by name, with the field it most likely meant."""
    if not isinstance(data, dict):
        return  # the model's own error says a line is an object
    for key in data:
        if key not in RunResult.model_fields:
            close = difflib.get_close_matches(str(key), list(RunResult.model_fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else " (a tool's own data: `meta`)"
            raise ValueError(f"unknown key {key!r}{hint}")


def _scores_lines(path: Path, feed: Callable[[bytes], object]) -> Iterator[tuple[int, str]]:
    """The file's numbered lines, read one at a time, each line's bytes given to `feed`.

    At most `MAX_SCORES_BYTES` are read, whatever the file claims its size is (a pipe claims 0).

    Raises:
        GateError: the file is unreadable, over the cap, or a line is not UTF-8.
    """
    cap = f"the {MAX_SCORES_BYTES:,}-byte ({MAX_SCORES_BYTES // 2**20} MiB) cap on scores files"
    over = f"the scores file {path} is over {cap}; split it, or gate fewer runs."
    try:
        with path.open("rb") as f:
            if path.stat().st_size > MAX_SCORES_BYTES:
                raise GateError(over)
            read = 0
            for lineno in itertools.count(1):
                raw = f.readline(MAX_SCORES_BYTES + 1 - read)
                if not raw:
                    return
                read += len(raw)
                if read > MAX_SCORES_BYTES:
                    raise GateError(over)
                feed(raw)
                try:
                    yield lineno, raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise GateError(f"{path}:{lineno}: not UTF-8 text ({e.reason}).") from e
    except OSError as e:
        raise GateError(f"cannot read the scores file {path}: {e}; check the path.") from e


def _field_error(e: ValidationError) -> str:
    """`field: reason` of a run's first validation error."""
    err = e.errors()[0]
    fallback = "reward_parts" if err["type"] == "value_error" else "line"
    field = ".".join(str(p) for p in err["loc"]) or fallback
    return f"{field}: {err['msg']}"


def load_ledger_runs(
    ledger: Ledger,
    candidate: str,
    incumbent: str,
    *,
    heldout_set: str | None = None,
    source: Literal["gate", "simulate"] | None = None,
    judged: Mapping[str, float] | None = None,
    session_ids: Collection[str] | None = None,
) -> GateData:
    """Held-out sessions of the two (already resolved) policies, as runs.

    `session_ids` restricts the runs to those sessions (the gate's own runs of one receipt).

    Every session counts: one that ran a (scenario, repeat, seed) already run is one more run
    (its `occurrence`), never a replacement, so a run cannot be re-rolled away. Harness errors,
    unverified sessions (no authoritative reward part) and sessions without a scenario or repeat
    index cannot be paired: they are counted per policy (`InputSource.unusable`), and the
    verdict says INCONCLUSIVE when too many of an arm's runs are such.

    Raises:
        GateError: several held-out sets are present and none was chosen, or a policy has none.
    """
    _distinct(candidate, incumbent)
    sessions = [
        s
        for policy in (candidate, incumbent)
        for s in ledger.sessions(split="heldout", policy=policy, source=source)
    ]
    if heldout_set is not None:
        sessions = [s for s in sessions if s.heldout_set_id == heldout_set]
    if session_ids is not None:
        wanted = set(session_ids)
        sessions = [s for s in sessions if s.id in wanted]
    set_ids = {s.heldout_set_id for s in sessions}
    if len(set_ids) > 1:
        raise GateError(
            "the ledger holds held-out runs of these policies from several held-out sets "
            f"({', '.join(sorted(repr(i) for i in set_ids))}); choose one with --heldout-set ID."
        )
    counts = {policy: {"harness_errors": 0, "unverified": 0, "unindexed": 0}
              for policy in (candidate, incumbent)}  # fmt: skip
    usable: list[SessionRecord] = []
    for s in sessions:
        reason = _unusable(s)
        if reason is None:
            usable.append(s)
        elif s.policy in counts:
            counts[s.policy][reason] += 1
    seen: dict[tuple[Any, ...], int] = {}
    occurrence: dict[str, int] = {}
    for s in sorted(usable, key=lambda s: s.started_at):  # the first run is occurrence 0
        key = (s.scenario_id, s.scenario_hash, s.policy, s.repeat, s.seed)
        occurrence[s.id] = seen.get(key, 0)
        seen[key] = occurrence[s.id] + 1
    latencies = ledger.latencies_for([s.id for s in usable])
    runs = [
        _session_run(ledger, s, latencies[s.id], judged or {}, occurrence[s.id]) for s in usable
    ]
    _require_both(runs, candidate, incumbent, f"the held-out sessions of {ledger.path}")
    notes = []
    for policy, reasons in counts.items():
        if any(reasons.values()):
            notes.append(
                f"{policy!r}: left out {reasons['harness_errors']} harness error(s), "
                f"{reasons['unverified']} unverified session(s) and {reasons['unindexed']} "
                "without a scenario or repeat index"
            )
    repeated = sum(n - 1 for n in seen.values() if n > 1)
    if repeated:
        notes.append(
            f"{repeated} session(s) ran a (scenario, repeat, seed) already run: each counts as "
            "one more paired run, none replaces another"
        )
    return GateData(
        candidate=candidate,
        incumbent=incumbent,
        runs=tuple(runs),
        source=InputSource(
            kind="ledger",
            path=str(ledger.path),
            heldout_set_id=next(iter(set_ids), heldout_set),
            scenario_hashes={r.scenario: r.scenario_hash for r in runs if r.scenario_hash},
            unusable={policy: Unusable(**reasons) for policy, reasons in counts.items()},
            notes=tuple(notes),
        ),
    )


def _unusable(s: SessionRecord) -> str | None:
    """Why a held-out session cannot be paired (a key of `Unusable`), or None if it can."""
    if s.outcome == SessionOutcome.ERROR:
        return "harness_errors"
    if authoritative_part(s.reward_parts) is None:
        return "unverified"
    if s.scenario_id is None or s.repeat is None or s.policy is None:
        return "unindexed"
    return None


def _transport(metadata: Mapping[str, Any]) -> str | None:
    """An audio session's transport (sessions recorded before it was stored ran locally)."""
    if metadata.get("mode") != "audio":
        return None
    value = metadata.get("transport", "local")
    return value if value in ("local", "webrtc") else None


def _guarded_writes(
    ledger: Ledger, s: SessionRecord
) -> tuple[bool, list[UnauthorizedWrite]] | None:
    """Whether the session carried a guarded check, and each write such a failed check names.

    None when the session recorded no checks. A failed guarded check names a table; each world
    tool call whose state change touched a failed check's table is one write, its kind the
    failed tables it touched (`appointments+slots`); a failed table no recorded call touched is
    one write without a tool.
    """
    checks = s.metadata.get("checks")
    if not isinstance(checks, list) or not checks:
        return None
    guarded = [
        c
        for c in checks
        if isinstance(c, dict) and str(c.get("check", "")).startswith(GUARDED_CHECKS)
    ]
    failed = {
        str(c["check"]).split()[1]: str(c["check"])
        for c in guarded
        if not c.get("passed") and len(str(c["check"]).split()) > 1
    }
    writes: list[UnauthorizedWrite] = []
    touched: set[str] = set()
    for call in ledger.tool_calls(s.id):
        diff = (call.state_diff or {}).get("world") or {}
        tables = sorted(t for t in diff if t in failed)
        if tables:
            touched.update(tables)
            writes.append(UnauthorizedWrite(
                kind="+".join(tables), check="; ".join(failed[t] for t in tables),
                tool=call.name, call_id=call.call_id,
            ))  # fmt: skip
    writes += [
        UnauthorizedWrite(kind=t, check=check) for t, check in failed.items() if t not in touched
    ]
    return bool(guarded), writes


def _call_times(turns: Sequence[TurnRecord], until: str) -> tuple[float, ...]:
    """Each LLM call's ms from its request to `until` (a recorded timestamp), where both exist."""
    return tuple(
        (t.timestamps[until] - t.timestamps["llm_request"]) * 1000
        for t in turns
        if {"llm_request", until} <= t.timestamps.keys()
        and t.timestamps[until] >= t.timestamps["llm_request"]
    )


def _session_run(
    ledger: Ledger,
    s: SessionRecord,
    lats: list[LatencyRecord],
    judged: Mapping[str, float],
    occurrence: int = 0,
) -> RunResult:
    """One held-out session (with reward parts, scenario, policy and repeat) as a run.

    Raises:
        GateError: a stored number is out of bounds (naming the ledger, session and field).
    """
    scores = {score.name: score.value for score in ledger.scores(s.id)}
    checked = _guarded_writes(ledger, s)
    if checked is not None:
        guarded, writes = checked
        count = len(writes)
    else:
        guarded, writes = None, []
        count = scores.get(UNAUTHORIZED_SCORE)
        if count is None:
            count = sum(1 for label in s.failure_labels if label in UNAUTHORIZED_LABELS)
    turns = ledger.turns(s.id)
    usage = dict(
        prompt_tokens=sum(t.usage.get("prompt_tokens", 0) for t in turns),
        completion_tokens=sum(t.usage.get("completion_tokens", 0) for t in turns),
        stt_seconds=(s.ended_at - s.started_at) if s.ended_at is not None else 0.0,
        tts_seconds=sum(
            lat.bot_stopped_at - lat.bot_started_at
            for lat in lats
            if lat.bot_started_at is not None and lat.bot_stopped_at is not None
        ),
    )
    fields = dict(
        scenario=s.scenario_id,
        policy=s.policy,
        run=s.repeat,
        reward_parts=s.reward_parts,
        v2v_ms=tuple(lat.v2v_ms for lat in lats if lat.v2v_ms is not None),
        stages_ms={
            stage: tuple(v for lat in lats if (v := getattr(lat, stage)) is not None)
            for stage in STAGES
        },
        unauthorized_writes=int(count),
        writes=tuple(writes),
        guarded=guarded,
        llm_turn_ms=_call_times(turns, "llm_done"),
        llm_call_ttft_ms=_call_times(turns, "llm_first_token"),
        occurrence=occurrence,
        usage=usage,
        seed=s.seed,
        scenario_hash=s.scenario_hash,
        session_id=s.id,
        heard_gap_ms=tuple(lat.heard_gap_ms for lat in lats if lat.heard_gap_ms is not None),
        response_gap_ms=tuple(
            lat.response_gap_ms for lat in lats if lat.response_gap_ms is not None
        ),
        turn_taking=s.metadata.get(TURN_TAKING_KEY),  # validated below, naming the session
        channel=s.metadata.get("mode") if s.metadata.get("mode") in ("text", "audio") else None,
        transport=_transport(s.metadata),
    )
    try:
        return RunResult.model_validate(fields, context={"judged": judged})
    except ValidationError as e:
        raise GateError(
            f"{ledger.path}: session {s.id}: {_field_error(e)}; exclude the session "
            "(`pipecat-rl ledger`) or fix what wrote it."
        ) from e
