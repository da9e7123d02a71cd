"""The ledger's duels part: one moment of a recorded call, two replies to it, and people's picks.

A duel is the prompt ids of one recorded turn (the call up to that moment, exactly as the model
saw it) and two replies sampled from that very prompt by two policies, each kept token-exact
(ids, text, logprobs) so DPO trains on exactly what a person was shown. A vote is one rater's
pick: `a`, `b`, `tie` or `both_bad`, with an optional note; voting again replaces the rater's
own vote and never another's. Each rater's queue is the duels they have not voted on (those
queued for anyone, and those queued for them).

Which voted duels may train is the eligibility rules' (`trainable_votes`): never one whose
call is held out, a gate run, excluded, not consented or (live) unredacted, nor one whose call
replays a held-out call (decontamination, as for every training row).
"""

import hashlib
import json
import time
from abc import abstractmethod
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipecat_rl.errors import NotInLedgerError, NoTrainingSignalError
from pipecat_rl.ledger.core import LedgerCore
from pipecat_rl.ledger.eligibility import SCORE_SOURCE, SESSION_RULES, UNREDACTED_TURN
from pipecat_rl.ledger.tables import dumps

if TYPE_CHECKING:
    from pipecat_rl.ledger.records import TurnRecord
    from pipecat_rl.scenarios.decontaminate import Overlap

Choice = Literal["a", "b", "tie", "both_bad"]
"""A rater's pick: one reply, a tie, or neither (`both_bad`)."""

DECISIVE: tuple[Choice, ...] = ("a", "b")
"""The picks DPO trains on; a tie or `both_bad` says nothing about which reply is better."""

MAX_NOTE_CHARS = 2000
"""A note is a line for whoever reads the duels, not a document."""


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DuelReply(_Record):
    """One policy's reply to the duel's prompt, exactly as the server sampled it."""

    policy: str
    """The adapter (or `base`) that sampled it."""
    token_ids: list[int] = Field(min_length=1)
    text: str
    logprobs: list[float] | None = None
    """One per sampled id, as the server returned them."""
    temperature: float = 1.0


class DuelRecord(_Record):
    """A call up to one moment and two continuations of the agent's next turn."""

    id: str
    session_id: str
    turn_index: int
    """The recorded turn whose prompt is the moment (its reply is what both policies redo)."""
    prompt_token_ids: list[int] = Field(min_length=1)
    context: list[dict[str, Any]] = Field(default_factory=list)
    """The conversation up to the moment, as the request's messages (what a person reads)."""
    reply_a: DuelReply
    reply_b: DuelReply
    rater: str | None = None
    """The one rater it is queued for; None: anyone's."""
    created_at: float

    def left_for(self, rater: str) -> Literal["a", "b"]:
        """Which reply `rater` sees on the left: random per (duel, rater), the same on reload."""
        digest = hashlib.sha256(f"{self.id}\x00{rater}".encode()).digest()
        return "a" if digest[0] & 1 else "b"


class DuelVote(_Record):
    """One rater's pick of one duel."""

    duel_id: str
    rater: str
    choice: Choice
    note: str | None = Field(default=None, max_length=MAX_NOTE_CHARS)
    shown_left: Literal["a", "b"]
    """Which reply the rater saw on the left (what was shown, for reading the votes back)."""
    voted_at: float

    @field_validator("rater")
    @classmethod
    def _rater(cls, value: str) -> str:
        return rater_name(value)


def rater_name(value: str) -> str:
    """`value` if it is a rater's id (a scorer's name: lowercase, short, no spaces).

    Raises:
        ValueError: it is not.
    """
    if not SCORE_SOURCE.match(value):
        raise ValueError(
            f"rater {value!r} is not a rater id: lowercase letters, digits, '.', '_' or '-', up "
            "to 32 characters, e.g. alice or qa-team-2"
        )
    return value


DUEL_COLUMNS = (
    "id, session_id, turn_index, prompt_token_ids, context, reply_a, reply_b, rater, created_at"
)
"""The `duels` table's columns, in the order every read and write names them."""
VOTE_COLUMNS = "duel_id, rater, choice, note, shown_left, voted_at"
"""The `duel_votes` table's columns, likewise."""

DUEL_SESSION_RULES = (
    *(r.sql for r in SESSION_RULES if r.reason in ("held_out", "excluded", "not_consented")),
    f"(s.source != 'live' OR NOT {UNREDACTED_TURN})",
)
"""What a duel's call must be for its votes to train (alias `s`): the eligibility rules that
concern the call's content and consent, not its outcome (a vote is the label, not the verdict)."""


def _duel(row: tuple) -> DuelRecord:
    id_, session_id, turn_index, prompt, context, a, b, rater, created = row
    return DuelRecord(
        id=id_, session_id=session_id, turn_index=turn_index, prompt_token_ids=json.loads(prompt),
        context=json.loads(context), reply_a=json.loads(a), reply_b=json.loads(b), rater=rater,
        created_at=created,
    )  # fmt: skip


def _vote(row: tuple) -> DuelVote:
    return DuelVote(**dict(zip(VOTE_COLUMNS.split(", "), row, strict=True)))


class Duels(LedgerCore):
    """Duels queued from recorded moments, and the votes people cast on them."""

    @abstractmethod
    def turns(self, session_id: str) -> list["TurnRecord"]:
        """A session's turns (the sessions part's)."""

    @abstractmethod
    def _heldout_overlap(self, turns: list["TurnRecord"]) -> "dict[str, Overlap]":
        """The sessions of `turns` whose calls replay a held-out call (the sessions part's)."""

    def add_duels(self, duels: list[DuelRecord]) -> None:
        """Queue `duels` in one transaction.

        Raises:
            NotInLedgerError: a duel's session is not in the ledger (nothing is written).
        """
        with self._write() as conn:
            for d in duels:
                if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (d.session_id,)).fetchone():
                    conn.execute(
                        f"INSERT INTO duels ({DUEL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (d.id, d.session_id, d.turn_index, dumps(d.prompt_token_ids),
                         dumps(d.context), d.reply_a.model_dump_json(),
                         d.reply_b.model_dump_json(), d.rater, d.created_at),
                    )  # fmt: skip
                    continue
                raise NotInLedgerError(
                    f"duel {d.id}: no session {d.session_id!r} in the ledger {self.path}"
                )

    def duel(self, duel_id: str) -> DuelRecord:
        """One duel by id.

        Raises:
            NotInLedgerError: no duel has this id.
        """
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {DUEL_COLUMNS} FROM duels WHERE id = ?", (duel_id,)
            ).fetchone()
        if row is None:
            raise NotInLedgerError(f"no duel {duel_id!r} in the ledger {self.path}")
        return _duel(row)

    def duels(self) -> list[DuelRecord]:
        """Every duel, oldest first."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {DUEL_COLUMNS} FROM duels ORDER BY created_at, id"
            ).fetchall()
        return [_duel(r) for r in rows]

    def duel_queue(self, rater: str) -> list[DuelRecord]:
        """The duels `rater` has still to vote on (queued for anyone or for them), oldest first."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {DUEL_COLUMNS} FROM duels d WHERE (d.rater IS NULL OR d.rater = ?) "
                "AND NOT EXISTS (SELECT 1 FROM duel_votes v WHERE v.duel_id = d.id "
                "AND v.rater = ?) ORDER BY d.created_at, d.id",
                (rater, rater),
            ).fetchall()
        return [_duel(r) for r in rows]

    def vote(self, duel_id: str, rater: str, choice: Choice, note: str | None = None) -> DuelVote:
        """Store `rater`'s pick of a duel, replacing their earlier one.

        Raises:
            NotInLedgerError: no duel has this id, or it is queued for another rater.
            ValueError: `rater` is no rater id, or the note is too long.
        """
        duel = self.duel(duel_id)
        if duel.rater is not None and duel.rater != rater:
            raise NotInLedgerError(f"duel {duel_id!r} is queued for another rater, not {rater!r}")
        record = DuelVote(
            duel_id=duel_id, rater=rater, choice=choice, note=note or None,
            shown_left=duel.left_for(rater), voted_at=time.time(),
        )  # fmt: skip
        with self._write() as conn:
            conn.execute(
                f"INSERT INTO duel_votes ({VOTE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (duel_id, rater) DO UPDATE SET choice = excluded.choice, "
                "note = excluded.note, shown_left = excluded.shown_left, "
                "voted_at = excluded.voted_at",
                tuple(record.model_dump().values()),
            )
        return record

    def votes(self, duel_id: str | None = None) -> list[DuelVote]:
        """Every vote (of one duel, if given), in the order cast."""
        sql = f"SELECT {VOTE_COLUMNS} FROM duel_votes"
        params: tuple = ()
        if duel_id is not None:
            sql, params = sql + " WHERE duel_id = ?", (duel_id,)
        with self._read() as conn:
            rows = conn.execute(sql + " ORDER BY voted_at, duel_id, rater", params).fetchall()
        return [_vote(r) for r in rows]

    def trainable_votes(self) -> "DuelSelection":
        """The votes whose duels may train, and how many each rule kept out.

        A vote trains only if it picks a reply (ties and `both_bad` are counted, never trained)
        and its duel's call passes `DUEL_SESSION_RULES` and decontamination.
        """
        where = " AND ".join(f"({r})" for r in DUEL_SESSION_RULES)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {', '.join('v.' + c for c in VOTE_COLUMNS.split(', '))}, d.session_id, "
                f"CASE WHEN {where} THEN 1 ELSE 0 END "
                "FROM duel_votes v JOIN duels d ON d.id = v.duel_id "
                "JOIN sessions s ON s.id = d.session_id ORDER BY v.voted_at, v.duel_id, v.rater"
            ).fetchall()
        votes = [(_vote(r[:-2]), r[-2], bool(r[-1])) for r in rows]
        sessions = sorted({sid for v, sid, ok in votes if ok and v.choice in DECISIVE})
        overlap = self._heldout_overlap([t for sid in sessions for t in self.turns(sid)])
        kept: list[DuelVote] = []
        counts = {"tie": 0, "both_bad": 0, "call_not_trainable": 0, "heldout_overlap": 0}
        for v, sid, ok in votes:
            if v.choice not in DECISIVE:
                counts[v.choice] += 1
            elif not ok:
                counts["call_not_trainable"] += 1
            elif sid in overlap:
                counts["heldout_overlap"] += 1
            else:
                kept.append(v)
        return DuelSelection(votes=kept, kept_out=counts)


class DuelSelection(BaseModel):
    """The decisive votes that may train, and the votes kept out, per reason."""

    model_config = ConfigDict(frozen=True)

    votes: list[DuelVote]
    kept_out: dict[str, int]
    """`tie`, `both_bad` (never trained), `held_out` (the call may not train: held out, a gate
    run, excluded, not consented or unredacted), `heldout_overlap` (its call replays a held-out
    call)."""

    def require(self) -> None:
        """Refuse a DPO run with no vote to train on, saying per reason why.

        Raises:
            NoTrainingSignalError: no vote picks a reply of a duel that may train.
        """
        if self.votes:
            return
        said = ", ".join(f"{n} {reason}" for reason, n in self.kept_out.items() if n)
        raise NoTrainingSignalError(
            f"DPO has no pairs: no vote picks one reply of a duel that may train "
            f"({said or 'no votes'}); queue duels (`pipecat-rl duels make`) and have people "
            "pick at the service's /duels"
        )
