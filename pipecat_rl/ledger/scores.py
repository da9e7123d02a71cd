"""The ledger's scores part: what the platforms, people and judges that score a call post for it.

A team's evaluation platform (Coval, Pipecat's evals, a QA queue) scores each call after it ends,
keyed by its conversation id; the recorder writes the call under that id (`SessionInfo.call_id`),
so a score joins the exact tokens the model produced. `post_score` is the one way in, for the
service's `POST /sessions/{call_id}/scores` and `pipecat-rl ledger score` alike:

- one score per (session, metric, source): posting it again replaces it, so a retried webhook
  never duplicates, and one source never overwrites another's;
- an unknown call id writes nothing (`NotInLedgerError`); a gate run, a held-out session or a call
  still in progress takes no score (`ScoreRefusedError`: scores may train, these never may);
- an explanation longer than `MAX_EXPLANATION_CHARS` is cut there, and the result says so;
- on a live call, the deciding source's `success` becomes its authoritative part and its outcome
  `pass` or `fail` (`ledger.outcome`); a simulated episode keeps the simulator's verdict.

Which live calls then train is the eligibility query's (`eligibility.eligible_session`).
"""

import re
import sqlite3
import time
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipecat_rl.errors import NotInLedgerError, ScoreRefusedError
from pipecat_rl.ledger.core import LedgerCore
from pipecat_rl.ledger.eligibility import (
    DEFAULT_LIVE_TRUST,
    HELDOUT_OR_GATE,
    SCORE_SOURCE,
    LiveTrust,
    count_where,
    eligible_session,
    open_session,
)
from pipecat_rl.ledger.records import SIMULATOR_SCORE_SOURCE, ScoreRecord, SessionRecord
from pipecat_rl.ledger.tables import PUT_SCORE, SCORES, SESSIONS
from pipecat_rl.scoring.outcome import (
    SUCCESS_METRIC,
    SessionOutcome,
    authoritative_score,
    deciding_source,
    outcome,
)

MAX_EXPLANATION_CHARS = 4000
"""An explanation is a hint for a teacher and a line in a draft, not a document: longer is cut."""

METRIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$")
"""A metric's name: what becomes the reward part `judge:<name>` (so never a ':')."""

JUDGED = "judge:"
"""The prefix of the reward parts a live call's deciding source sets."""

_EXTERNAL = f"source != '{SIMULATOR_SCORE_SOURCE}'"


class ScoreIn(BaseModel):
    """One score for one call, as a platform, a person or the judge posts it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: str = Field(description="The metric's name; `success` decides whether the call passed.")
    value: float = Field(
        ge=0, le=1, allow_inf_nan=False,
        description='A score in [0, 1], or "pass" (1) / "fail" (0).',
    )  # fmt: skip
    explanation: str | None = Field(
        default=None,
        description=f"Why (at most {MAX_EXPLANATION_CHARS} characters are kept; longer is cut).",
    )
    source: str = Field(description="Who scored it: coval, pipecat-evals, human, judge, ...")
    external_id: str | None = Field(
        default=None, max_length=200, description="The scorer's own id for this score."
    )

    @field_validator("value", mode="before")
    @classmethod
    def _verdict(cls, value: Any) -> Any:
        verdict = value.strip().lower() if isinstance(value, str) else None
        if verdict in (SessionOutcome.PASS, SessionOutcome.FAIL):
            return 1.0 if verdict == SessionOutcome.PASS else 0.0
        return value

    @field_validator("metric")
    @classmethod
    def _metric(cls, value: str) -> str:
        if not METRIC_NAME.match(value):
            raise ValueError(
                f"metric {value!r} is not a metric name: up to 64 letters, digits, spaces, "
                "'.', '_' or '-', starting with a letter or digit"
            )
        return value

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        if not SCORE_SOURCE.match(value):
            raise ValueError(
                f"source {value!r} is not a source name: lowercase letters, digits, '.', '_' or "
                "'-', e.g. coval, pipecat-evals, human, judge"
            )
        if value == SIMULATOR_SCORE_SOURCE:
            raise ValueError(
                f"source {SIMULATOR_SCORE_SOURCE!r} is the simulator's own; name who scored it"
            )
        return value


@dataclass(frozen=True)
class PostedScore:
    """What `post_score` stored and what it changed."""

    score: ScoreRecord
    """The score as stored (explanation cut if it was too long)."""
    created: bool
    """False when it replaced this source's earlier score of this metric."""
    explanation_chars: int | None
    """The explanation's length as posted; None when none was given."""
    truncated: bool
    """Whether the explanation was cut to `MAX_EXPLANATION_CHARS`."""
    outcome: SessionOutcome | None
    """The session's outcome after the score."""
    decided_by: str | None
    """The source whose `success` is the session's verdict (None: none yet, or a simulation)."""


def _cut(explanation: str | None) -> tuple[str | None, bool]:
    if explanation is None or len(explanation) <= MAX_EXPLANATION_CHARS:
        return explanation, False
    return explanation[:MAX_EXPLANATION_CHARS], True


class Scores(LedgerCore):
    """Scores posted for calls, a live call's verdict from them, and live calls by score state."""

    @abstractmethod
    def _find_session(self, conn: sqlite3.Connection, session_id: str) -> SessionRecord | None:
        """The session, or None (the sessions part's)."""

    @abstractmethod
    def _replace_session(
        self, conn: sqlite3.Connection, current: SessionRecord, changes: dict[str, Any]
    ) -> None:
        """Validate and write changes to a session (the sessions part's)."""

    def post_score(self, session_id: str, score: ScoreIn) -> PostedScore:
        """Store `score` for the session `session_id` and update its verdict, in one transaction.

        Raises:
            NotInLedgerError: no session has this id (nothing is written).
            ScoreRefusedError: the session is a gate run or held out, or has not ended.
        """
        explanation, truncated = _cut(score.explanation)
        with self._write() as conn:
            session = self._find_session(conn, session_id)
            if session is None:
                raise NotInLedgerError(
                    f"no call {session_id!r} in the ledger {self.path}: a score joins the "
                    "session the recorder wrote under the call's id (RLRecorder(call_id=...)); "
                    "`pipecat-rl ledger sessions --source live` lists them"
                )
            self._refuse(conn, session)
            existed = conn.execute(
                "SELECT 1 FROM scores WHERE session_id = ? AND name = ? AND source = ?",
                (session_id, score.metric, score.source),
            ).fetchone()
            record = ScoreRecord(
                session_id=session_id, name=score.metric, value=score.value, source=score.source,
                explanation=explanation, external_id=score.external_id, received_at=time.time(),
            )  # fmt: skip
            conn.execute(PUT_SCORE, SCORES.params(record))
            decided_by = None
            if session.source == "live":
                session, decided_by = self._decide(conn, session)
        return PostedScore(
            score=record,
            created=existed is None,
            explanation_chars=None if score.explanation is None else len(score.explanation),
            truncated=truncated,
            outcome=session.outcome,
            decided_by=decided_by,
        )

    def _refuse(self, conn: sqlite3.Connection, session: SessionRecord) -> None:
        (kept_out,) = conn.execute(
            f"SELECT {HELDOUT_OR_GATE} FROM sessions s WHERE s.id = ?", (session.id,)
        ).fetchone()
        if kept_out:
            kind = "a gate run" if session.source == "gate" else "held out"
            raise ScoreRefusedError(
                f"session {session.id!r} is {kind}: it never trains, so it takes no score that "
                "could; the gate scores its own runs (its receipt holds them)"
            )
        (still_open,) = conn.execute(
            f"SELECT {open_session('s')} FROM sessions s WHERE s.id = ?", (session.id,)
        ).fetchone()
        if still_open:
            raise ScoreRefusedError(
                f"call {session.id!r} has not ended yet (its writer has not finished it); "
                "post its scores after the call ends"
            )

    def _decide(
        self, conn: sqlite3.Connection, session: SessionRecord
    ) -> tuple[SessionRecord, str | None]:
        """A live call's verdict from its scores: the deciding source's metrics become parts."""
        rows = [
            SCORES.record(r)
            for r in conn.execute(
                f"SELECT {SCORES.select()} FROM scores WHERE session_id = ? AND {_EXTERNAL} "
                "ORDER BY id",
                (session.id,),
            )
        ]
        source = deciding_source(r.source for r in rows if r.name == SUCCESS_METRIC)
        if source is None:
            return session, None
        mine = [r for r in rows if r.source == source]
        parts = {k: v for k, v in session.reward_parts.items() if not k.startswith(JUDGED)}
        parts.update({f"{JUDGED}{r.name}": r.value for r in mine})
        success = next(r for r in mine if r.name == SUCCESS_METRIC)
        verdict = outcome(parts)
        changes = {
            "outcome": verdict,
            "reward": authoritative_score(parts),
            "reward_parts": parts,
            "metadata": {
                **session.metadata,
                "verdict": {
                    "source": source, "value": success.value, "outcome": str(verdict),
                    "explanation": success.explanation, "external_id": success.external_id,
                    "at": success.received_at,
                },
            },
        }  # fmt: skip
        self._replace_session(conn, session, changes)
        return session.model_copy(update=changes), source

    def live_score_states(self, trust: LiveTrust = DEFAULT_LIVE_TRUST) -> dict[str, int]:
        """Live calls by score state (see `live_score_states`)."""
        with self._read() as conn:
            return live_score_states(conn, trust)

    def unscored_live_sessions(
        self, *, since: float | None = None, limit: int | None = None
    ) -> list[SessionRecord]:
        """Ended live calls nobody has scored yet, oldest first: what the nightly judge takes.

        Only calls that could train (consented, not excluded): judging the others spends the
        judge's budget on scores nothing reads.
        """
        where = [
            "s.source = 'live'", f"NOT {open_session('s')}",
            "s.consent = 1", "s.excluded_from_training = 0",
            f"NOT EXISTS (SELECT 1 FROM scores x WHERE x.session_id = s.id AND x.{_EXTERNAL})",
        ]  # fmt: skip
        params: list[Any] = []
        if since is not None:
            where.append("s.started_at >= ?")
            params.append(since)
        sql = (
            f"SELECT {SESSIONS.select('s')} FROM sessions s WHERE {' AND '.join(where)}"
            " ORDER BY s.started_at, s.rowid"
        )
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        with self._read() as conn:
            return [SESSIONS.record(r) for r in conn.execute(sql, params)]


def live_score_states(conn: sqlite3.Connection, trust: LiveTrust) -> dict[str, int]:
    """Live calls by score state: `unscored`, `scored` (by anyone), `trainable` (of the scored).

    `trainable` counts by the eligibility query itself (`eligible_session(trust)`), so it is
    what training takes, not a second rule. Runs inside the caller's transaction.
    """
    scored = f"EXISTS (SELECT 1 FROM scores x WHERE x.session_id = s.id AND x.{_EXTERNAL})"
    total, n_scored, trainable = conn.execute(
        f"SELECT count(*), {count_where(scored)}, {count_where(eligible_session(trust))}"
        " FROM sessions s WHERE s.source = 'live'"
    ).fetchone()
    return {"unscored": total - n_scored, "scored": n_scored, "trainable": trainable}
