"""The bodies of `/sessions/{call_id}/scores`: a score as a webhook posts it, and its effect.

`Ledger.post_score` does the work; these models only carry it over HTTP.
"""

from pydantic import BaseModel, ConfigDict, Field

from pipecat_rl.ledger import PostedScore, ScoreIn, ScoreRecord
from pipecat_rl.ledger.scores import MAX_EXPLANATION_CHARS


class ScoreRequest(ScoreIn):
    """One score for one call: `metric`, `value` (0..1, or "pass" / "fail"), `source`, and why.

    Posting the same (metric, source) again replaces the first: a retried webhook never
    duplicates. A `success` from the highest-ranked source (a person, then a platform, then the
    judge) decides whether a live call passed.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"metric": "success", "value": "fail", "source": "coval",
                 "explanation": "The agent booked Tuesday; the caller asked for Thursday.",
                 "external_id": "eval-8c1f"},
            ]
        }
    )  # fmt: skip


class ScoreView(BaseModel):
    """A score as stored."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    metric: str
    value: float
    source: str
    explanation: str | None
    external_id: str | None
    received_at: float | None

    @classmethod
    def of(cls, score: ScoreRecord) -> "ScoreView":
        """The view of a stored score."""
        return cls(
            metric=score.name, value=score.value, source=score.source,
            explanation=score.explanation, external_id=score.external_id,
            received_at=score.received_at,
        )  # fmt: skip


class ScorePosted(BaseModel):
    """What posting a score did: stored or replaced, the explanation cut or not, the verdict."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    session_id: str
    score: ScoreView
    created: bool
    """False when it replaced this source's earlier score of this metric (status 200, not 201)."""
    explanation_chars: int | None
    """The explanation's length as posted (None: none was given)."""
    explanation_truncated: bool = Field(
        description=f"Whether the explanation was cut to its first {MAX_EXPLANATION_CHARS} "
        "characters (the rest is not stored)."
    )
    outcome: str | None
    """The session's outcome now (`pass` / `fail` once a live call's `success` is in)."""
    decided_by: str | None
    """The source whose `success` decides the call (None: none yet, or a simulated episode,
    whose verdict is the simulator's)."""

    @classmethod
    def of(cls, session_id: str, posted: PostedScore) -> "ScorePosted":
        """The view of what `Ledger.post_score` returned."""
        return cls(
            session_id=session_id, score=ScoreView.of(posted.score), created=posted.created,
            explanation_chars=posted.explanation_chars, explanation_truncated=posted.truncated,
            outcome=None if posted.outcome is None else str(posted.outcome),
            decided_by=posted.decided_by,
        )  # fmt: skip
