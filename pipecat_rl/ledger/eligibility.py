"""What may train, and what is still open: the one definition, as SQL the store runs in its queries.

A session may train only if it is not held out (judged by its scenario's content hash against every
held-out hash the ledger has seen, whatever folder the file sat in or `split:` it declared), not a
gate run, not excluded, consented, ended with an outcome other than a harness failure, and
recorded from the bot's side (not `recorded_from: caller`, a bot called at `--bot-url`). A live
call must also be redacted (none of its turns written without the redactor), decided by a source
the configuration trusts (`LiveTrust.sources`: the source whose `success` is its authoritative
part, `ledger.outcome.deciding_source`), and have ended at least `LiveTrust.settle_s` ago, so
that the scores that arrive late (a person's review after a platform's) are in before it trains.
Each of those is a named rule (`SESSION_RULES`, `live_rules`) and the query is their conjunction,
so `live_exclusions` can say, per reason, why live calls are kept out (`ledger stats`, and
`train`'s refusal when it has no rows) without a second definition.

A turn of such a session may train a policy-gradient row only if it passes every rule of
`SAMPLED_RULES`: token-exact (ids and logprobs from the server), its sampled-id count agrees with
the server's `usage.completion_tokens`, sampled without truncation (top-p < 1 or top-k bias the
importance ratio), and not cut short: not interrupted by the caller, not a stream that ended
without usage (Pipecat always asks for it, so none means the stream was cancelled), not stopped
by `max_tokens` (`finish_reason` "length"). A reply cut short is not the sample its reward judged,
and training it as if complete teaches the cut. The same rules hold for SFT's sampled turns; a
demonstration turn (a scripted expert's) may train SFT only. Each rule has a reason name, and
`Ledger.stats` counts the turns each one keeps out.

A session that passes all of that is still held out if its calls replay a held-out call: the
training query (`Ledger.training_turns`) tests every candidate session's caller lines (and
goal, where its metadata carries one) against the calls of every held-out session in the
ledger (`scenarios.decontaminate`: 8-gram coverage, the whole call as the unit, 0.5 of it),
and drops the sessions that overlap; `TrainingSelection` says which, and the trainer counts
them in its report ("rows removed for held-out overlap").

Token-exactness is the one rule with a Python side (`TurnRecord.trainable`, read by the trainer
on turns it already holds): both sides are rendered from the clauses of `TOKEN_EXACT`, so they
cannot drift apart.

`eligible_session` and the turn clauses use the aliases `s` (sessions) and `t` (turns).
"""

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipecat_rl.scoring.outcome import (
    HUMAN_SOURCE,
    JUDGE_SOURCE,
    RECORDER_OUTCOMES,
    UNTRAINABLE_OUTCOMES,
)

if TYPE_CHECKING:
    from pipecat_rl.ledger.core import LedgerCore
    from pipecat_rl.ledger.records import TurnRecord
    from pipecat_rl.scenarios.decontaminate import Overlap

Purpose = Literal["sft", "rl"]
"""SFT may use demonstrations; RL (GRPO, OPSD) only the policy's own sampled turns."""

SIMULATED_SOURCES = ("simulate", "gate")
"""The sources the simulator writes (a live call is the recorder's alone)."""


def _sql_set(values: Iterable[str]) -> str:
    """A SQL list literal of `values`, in a stable order."""
    return "(" + ", ".join(f"'{v}'" for v in sorted(values)) + ")"


def unfinished_simulation(alias: str = "s") -> str:
    """A simulated session whose result the simulator never wrote (alias `alias`).

    The recorder ends a session when the bot's pipeline stops; the simulator then writes the
    episode's outcome, reward and labels (`Ledger.finish_episode`). A crash between the two
    leaves a simulated session ended with the recorder's outcome and no result: half-written,
    never trained, and closed `interrupted` once its writer is gone (`Ledger.close_dead_sessions`).
    """
    return (
        f"({alias}.source IN {_sql_set(SIMULATED_SOURCES)}"
        f" AND COALESCE({alias}.outcome, '') IN {_sql_set(RECORDER_OUTCOMES)})"  # never NULL
    )


def open_session(alias: str = "s") -> str:
    """A session its writer has not finished: never ended, or an unfinished simulation."""
    return f"({alias}.ended_at IS NULL OR {unfinished_simulation(alias)})"


HELDOUT_SESSION = (
    "(COALESCE(s.split, '') = 'heldout' OR s.heldout_set_id IS NOT NULL"
    " OR COALESCE(s.scenario_hash IN (SELECT scenario_hash FROM heldout_hashes), FALSE))"
)
"""A held-out session (alias `s`): by split, held-out set or any held-out hash ever seen. Its
calls are what decontamination compares training candidates with."""

HELDOUT_OR_GATE = f"({HELDOUT_SESSION} OR s.source = 'gate')"
"""A held-out session or a gate run (alias `s`): it never trains, and takes no score that could."""


@dataclass(frozen=True)
class TrainingSelection:
    """What the training query chose: the turns that may train, and the sessions it removed.

    A session is removed when its call replays a held-out call (`scenarios.decontaminate`).
    """

    turns: list["TurnRecord"]
    heldout_overlap: dict[str, "Overlap"]
    """Session id -> the held-out call it overlaps (its session id) and by how much."""

    @property
    def removed(self) -> int:
        """How many sessions decontamination removed (their turns are not in `turns`)."""
        return len(self.heldout_overlap)


SCORE_SOURCE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,31}$")
"""A scorer's name: lowercase, short, no spaces (`coval`, `pipecat-evals`, `human`, `judge`)."""

DEFAULT_TRUSTED_SOURCES = (HUMAN_SOURCE, "coval", "pipecat-evals", JUDGE_SOURCE)
"""The scorers a live call may train on when the configuration names none."""

DEFAULT_SETTLE_S = 3600.0
"""How long after a live call ends its scores are taken as complete (late reviews come in)."""


class LiveTrust(BaseModel):
    """Which live calls may train: whose verdict counts, and how long scores take to settle."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sources: tuple[str, ...] = DEFAULT_TRUSTED_SOURCES
    """The deciding source of a live call must be one of these (empty: no live call trains)."""
    settle_s: float = Field(default=DEFAULT_SETTLE_S, ge=0, allow_inf_nan=False)
    """A live call trains only once it ended at least this many seconds ago."""

    @field_validator("sources")
    @classmethod
    def _names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [v for v in value if not SCORE_SOURCE.match(v)]
        if bad:
            raise ValueError(
                f"score source(s) {', '.join(map(repr, bad))} are not source names "
                "(lowercase letters, digits, '.', '_' or '-', e.g. coval, human, judge)"
            )
        return value


DEFAULT_LIVE_TRUST = LiveTrust()

_NOW = "((julianday('now') - 2440587.5) * 86400.0)"
"""Unix seconds now, evaluated by SQLite when the query runs."""

DECIDING_SOURCE = "json_extract(s.metadata, '$.verdict.source')"
"""The source whose `success` decides a live call (written by `Ledger.post_score`)."""

UNREDACTED_TURN = "EXISTS (SELECT 1 FROM turns r WHERE r.session_id = s.id AND r.redacted = 0)"
"""A session with a turn the recorder wrote without its redactor (alias `s`)."""


RECORDED_FROM = "json_extract(s.metadata, '$.recorded_from')"
"""Whose side of the call the session holds: `caller` for a bot called where it runs
(`simulate --bot-url`), whose turns, tools and world were never seen; absent: the bot's own."""


@dataclass(frozen=True)
class SessionRule:
    """One rule a session must pass to train, named for why a session fails it."""

    reason: str
    """The name a session kept out by this rule is counted under (`live_exclusions`)."""
    sql: str
    """The condition a session that passes meets (alias `s`)."""


SESSION_RULES: tuple[SessionRule, ...] = (
    SessionRule("held_out", f"NOT {HELDOUT_OR_GATE}"),
    SessionRule("excluded", "s.excluded_from_training = 0"),
    SessionRule("not_consented", "s.consent = 1"),
    SessionRule(
        "untrainable_outcome",
        f"(s.outcome IS NULL OR s.outcome NOT IN {_sql_set(UNTRAINABLE_OUTCOMES)})",
    ),
    SessionRule("in_progress", f"NOT {open_session('s')}"),
    SessionRule("recorded_from_caller", f"COALESCE({RECORDED_FROM}, '') != 'caller'"),
)
"""What every session needs to train, live or simulated (alias `s`)."""


def live_rules(trust: LiveTrust) -> tuple[SessionRule, ...]:
    """What a live call needs on top of `SESSION_RULES` to train under `trust` (alias `s`).

    Each rule fails for one cause only (an unscored call is not also "untrusted"; a call in
    progress is not also "not settled"), so the counts per reason read as causes.
    """
    return (
        SessionRule("unscored", f"{DECIDING_SOURCE} IS NOT NULL"),
        SessionRule(
            "untrusted_source",
            f"({DECIDING_SOURCE} IS NULL OR {DECIDING_SOURCE} IN {_sql_set(trust.sources)})",
        ),
        SessionRule(
            "not_settled",
            f"(s.ended_at IS NULL OR s.ended_at <= {_NOW} - {float(trust.settle_s)!r})",
        ),
        SessionRule("unredacted", f"NOT {UNREDACTED_TURN}"),
    )


def _all(rules: Iterable[SessionRule]) -> str:
    return " AND ".join(f"({r.sql})" for r in rules)


def trusted_live(trust: LiveTrust) -> str:
    """A live call fit to train by `trust` (any other session passes this clause; alias `s`)."""
    return f"(s.source != 'live' OR ({_all(live_rules(trust))}))"


def eligible_session(trust: LiveTrust = DEFAULT_LIVE_TRUST) -> str:
    """A session that may train (alias `s`), live calls judged by `trust`."""
    return f"{_all(SESSION_RULES)} AND {trusted_live(trust)}"


LIVE_REASONS: dict[str, tuple[str, str]] = {
    "held_out": ("held out", "a held-out scenario's call never trains"),
    "excluded": ("excluded", "marked excluded from training"),
    "not_consented": ("not consented", "the caller did not consent (consent=False)"),
    "untrainable_outcome": (
        "did not run to its end",
        "the call ended in an error or its process died mid-call",
    ),
    "in_progress": ("in progress", "still being recorded, it trains once it has ended"),
    "recorded_from_caller": (
        "recorded from the caller's side",
        "a bot called where it runs (`simulate --bot-url`): its turns were never recorded, so "
        "it never trains; simulate the bot with --bot to train on its calls",
    ),
    "unscored": (
        "no score",
        "nobody posted its success: score it (`pipecat-rl ledger score CALL_ID --value pass`, "
        "the service's POST /sessions/CALL_ID/scores, or `pipecat-rl judge`)",
    ),
    "untrusted_source": (
        "decided by an untrusted source",
        "the scorer that decided it is not trusted: add it (--live-sources NAME, "
        "LiveTrust.sources)",
    ),
    "not_settled": (
        "not settled yet",
        "it ended less than the settle time ago (--live-settle, LiveTrust.settle_s, default "
        "1h) so that late scores are in: wait, or lower it",
    ),
    "unredacted": (
        "unredacted",
        "recorded without redaction (RLRecorder(redact=False) or PIPECAT_RL_REDACT=0), and its "
        "token ids spell the caller's PII, so it never trains: record new calls with redaction "
        "on, the recorder's default",
    ),
}
"""Each reason of `SESSION_RULES` and `live_rules`: a short label, and what to do about it."""


class LiveExclusions(BaseModel):
    """Live calls counted by the eligibility query: how many may train, and why the rest may not.

    A call failing several rules counts under each reason it fails, so the reasons may add up
    to more than the calls kept out.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    calls: int
    """The live calls counted."""
    trainable: int
    """Of those, the calls `eligible_session` takes."""
    kept_out: dict[str, int]
    """Reason (`LIVE_REASONS`) -> calls that rule keeps out, every reason in rule order."""

    def describe(self, *, hints: bool = False) -> str:
        """The nonzero reasons, e.g. "2 unredacted, 1 not settled yet"; `hints`: what to do."""
        said = []
        for reason, n in self.kept_out.items():
            if n:
                label, hint = LIVE_REASONS[reason]
                said.append(f"{n} {label}" + (f": {hint}" if hints else ""))
        return ("; " if hints else ", ").join(said)


def live_exclusions(
    ledger: "LedgerCore",
    trust: LiveTrust = DEFAULT_LIVE_TRUST,
    *,
    session_ids: Sequence[str] | None = None,
    outcome: str | None = None,
) -> LiveExclusions:
    """Why the eligibility query keeps live calls out of training, by the rules it is made of.

    `session_ids` keeps the count to those calls (a `--live-since` window); `outcome` to the calls
    with that outcome (`pass`: what SFT would have imitated). Counted in one statement from the
    same `SESSION_RULES` and `live_rules(trust)` that `eligible_session(trust)` joins, so a reason
    is never a second guess at the query: a call is trainable exactly when no reason holds.
    """
    rules = (*SESSION_RULES, *live_rules(trust))
    where, params = ["s.source = 'live'"], []
    if session_ids is not None:
        where.append("s.id IN (SELECT value FROM json_each(?))")
        params.append(json.dumps(list(session_ids)))
    if outcome is not None:
        where.append("s.outcome = ?")
        params.append(outcome)
    fails = [f"NOT COALESCE(({r.sql}), FALSE)" for r in rules]  # NULL keeps out, as in WHERE
    counts = ", ".join(count_where(c) for c in (eligible_session(trust), *fails))
    row = ledger.rows(
        f"SELECT count(*), {counts} FROM sessions s WHERE {' AND '.join(where)}", tuple(params)
    )[0]
    return LiveExclusions(
        calls=row[0],
        trainable=row[1],
        kept_out={r.reason: n for r, n in zip(rules, row[2:], strict=True)},
    )


def count_where(condition: str) -> str:
    """SQL counting the rows where `condition` holds (a boolean is no number in Postgres)."""
    return f"COALESCE(SUM(CASE WHEN {condition} THEN 1 ELSE 0 END), 0)"


@dataclass(frozen=True)
class Clause:
    """One rule of a turn's eligibility, as SQL on the `turns` row and as a check on a record."""

    sql: str
    """The SQL condition, with `t` for the turns table."""
    check: Callable[["TurnRecord"], bool]


TOKEN_EXACT: tuple[Clause, ...] = (
    Clause("t.token_exact = 1", lambda t: t.token_exact),
    Clause(
        "t.prompt_token_ids IS NOT NULL AND json_array_length(t.prompt_token_ids) > 0",
        lambda t: bool(t.prompt_token_ids),
    ),
    Clause(
        "t.completion_token_ids IS NOT NULL AND json_array_length(t.completion_token_ids) > 0",
        lambda t: bool(t.completion_token_ids),
    ),
    Clause(
        "t.logprobs IS NOT NULL AND json_array_length(t.logprobs)"
        " = COALESCE(json_array_length(t.completion_token_ids), 0)",
        lambda t: t.logprobs is not None and len(t.logprobs) == len(t.completion_token_ids or ()),
    ),
)
"""A turn whose ids and logprobs came from the server, one logprob per sampled id."""

TOKEN_EXACT_TURN = " AND ".join(f"({c.sql})" for c in TOKEN_EXACT)
"""`TOKEN_EXACT` as SQL (alias `t`)."""


def token_exact(turn: "TurnRecord") -> bool:
    """`TOKEN_EXACT` on a record: what `TOKEN_EXACT_TURN` selects."""
    return all(c.check(turn) for c in TOKEN_EXACT)


@dataclass(frozen=True)
class TurnRule:
    """One rule a policy-sampled turn must pass to train, named for why a turn fails it."""

    reason: str
    """The name a turn kept out by this rule is counted under (`Ledger.stats`)."""
    sql: str
    """The condition a turn that passes meets (alias `t`)."""


_COMPLETION_TOKENS = "json_extract(t.usage, '$.completion_tokens')"

SAMPLED_RULES: tuple[TurnRule, ...] = (
    TurnRule("not_token_exact", TOKEN_EXACT_TURN),
    TurnRule("usage_less", f"{_COMPLETION_TOKENS} IS NOT NULL"),
    TurnRule(
        "usage_mismatch",
        f"{_COMPLETION_TOKENS} IS NULL"
        f" OR {_COMPLETION_TOKENS} = json_array_length(t.completion_token_ids)",
    ),
    TurnRule(
        "truncated_sampling",
        "COALESCE(json_extract(t.request, '$.top_p'),"
        " json_extract(t.request, '$.extra_body.top_p'), 1.0) >= 1.0"
        " AND COALESCE(json_extract(t.request, '$.top_k'),"
        " json_extract(t.request, '$.extra_body.top_k'), -1) <= 0",
    ),
    TurnRule("interrupted", "t.interrupted = 0"),
    TurnRule("length_cut", "COALESCE(t.finish_reason, '') != 'length'"),
)
"""What a policy-sampled turn needs to train (alias `t`), in the order a reader checks them."""

SAMPLED_TURN = "t.demonstration = 0 AND " + " AND ".join(f"({r.sql})" for r in SAMPLED_RULES)
"""A policy-sampled turn fit for a policy-gradient row (alias `t`)."""


def dropped_by(rule: TurnRule) -> str:
    """SQL: 1 for a policy-sampled turn that `rule` keeps out, else 0.

    A NULL condition keeps a turn out, as it does in a WHERE clause; a turn may fail several rules
    and counts under each.
    """
    kept_out = f"t.demonstration = 0 AND NOT COALESCE(({rule.sql}), FALSE)"
    return f"(CASE WHEN {kept_out} THEN 1 ELSE 0 END)"


DEMONSTRATION_TURN = "t.demonstration = 1 AND t.generated_text IS NOT NULL"
"""A demonstration turn (alias `t`): rendered by the trainer, SFT only."""


def eligible_turn(purpose: Purpose) -> str:
    """The turn clause for `purpose`: RL takes sampled turns; SFT takes demonstrations too."""
    if purpose == "sft":
        return f"(({SAMPLED_TURN}) OR ({DEMONSTRATION_TURN}))"
    return f"({SAMPLED_TURN})"
