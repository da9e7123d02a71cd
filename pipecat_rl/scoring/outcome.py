"""How a session ended, as one type, and the one definition of its authoritative score.

A session's outcome (`SessionOutcome`) is written by three hands, and its values say whose:

- the recorder, when a call's pipeline stops: `completed`, `cancelled` (a live call keeps it);
- the simulator's verdict on an episode: `pass`, `fail`, `unverified` (nothing could decide);
  and a live call's verdict once a scorer posts its `success` (`pass`, `fail`; see below);
- the harness, when the call did not run to its end: `error`, `interrupted` (its process was
  gone before it finished), `not_run` (never started). These never train and never pair.

Every part of a reward is stored (see `simulator.rewards`), but only one decides whether a call
succeeded, and `simulate`, the gate and training all read it from here:

1. `verifier`: the terminal checks on the world's final state, where the scenario has any;
2. else `judge:success`: the scenario's `success` criterion as the judge decided it (Pipecat's
   own eval outcome, for scenarios with no world to verify);
3. else nothing: the session is unverified and has no authoritative score.

`tool_credit` (+0.1 per successful tool execution, -0.1 per failed one), `checks_held` (a failed
call's share of its goal checks that held) and `violations` (hard checks broken) are shaping for
training only: a call that fails its verifier with five successful lookups has not passed, and
the gate never pairs a sum that shaping can inflate.

A live call has no world to verify: its authoritative part is `judge:success`, taken from the
scores posted for it (`ledger.scores`). Each scorer (`source`: a person, an evaluation platform,
the nightly judge) posts named metrics; the one that decides is the highest-ranked source that
posted `success` (`deciding_source`: people, then platforms, then our own LLM judge). Its
`success` becomes `judge:success` and its other metrics `judge:<metric>` (judged parts, weighted
by the rubric), and the call's outcome moves from `completed` to `pass` or `fail`. Whether that
source is trusted enough to train on is the eligibility query's to say, not the verdict's.
"""

import math
from collections.abc import Iterable, Mapping
from enum import StrEnum


class SessionOutcome(StrEnum):
    """A session's outcome; each value is the string the ledger stores."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    PASS = "pass"
    FAIL = "fail"
    UNVERIFIED = "unverified"
    ERROR = "error"
    INTERRUPTED = "interrupted"
    NOT_RUN = "not_run"


RECORDER_OUTCOMES = frozenset({SessionOutcome.COMPLETED, SessionOutcome.CANCELLED})
"""What the recorder writes when a call's pipeline ends; a live call keeps it as its outcome."""

VERDICTS = frozenset({SessionOutcome.PASS, SessionOutcome.FAIL, SessionOutcome.UNVERIFIED})
"""What the simulator writes on an episode it ran to its end."""

UNTRAINABLE_OUTCOMES = frozenset(
    {SessionOutcome.ERROR, SessionOutcome.INTERRUPTED, SessionOutcome.NOT_RUN}
)
"""The harness's outcomes: the call did not run to its end, so it never trains and never pairs."""

VERIFIER = "verifier"
"""The reward part written by the world's verifier (1.0 every check passed, 0.0 any failed)."""
JUDGED_SUCCESS = "judge:success"
"""The reward part written by the judge for the scenario's `success` criterion (0..1)."""
TOOL_CREDIT = "tool_credit"
"""Shaped (training signal only, never a pass and never a gate score): +0.1 per successful tool
execution, -0.1 per failed one. The rubric pays its positive side only to a call that passed."""
CHECKS_HELD = "checks_held"
"""Shaped partial credit: a failed call's share of the verifier's goal checks that held (every
check but the hard ones, which hold by doing nothing; 0 on a pass, which earns the outcome
itself), so a group whose every run fails still orders its runs by how close each came."""
VIOLATIONS = "violations"
"""Shaped, weighed negative: how many hard checks (`unchanged`, `not_exists`: a write or transfer
the scenario forbids) the call broke."""
SHAPED_PARTS: tuple[str, ...] = (TOOL_CREDIT, CHECKS_HELD, VIOLATIONS)
"""The parts the simulator writes for training only."""

AUTHORITATIVE_PARTS: tuple[str, ...] = (VERIFIER, JUDGED_SUCCESS)
"""The parts that can be authoritative, in order of precedence."""

PASS_SCORE = 0.5
"""An authoritative score at or above this passed. Both authoritative parts are verdicts (0 or 1);
a fractional judged score passes from its midpoint."""


def authoritative_part(parts: Mapping[str, float]) -> str | None:
    """The name of the part that decides this session, or None when it is unverified."""
    return next((name for name in AUTHORITATIVE_PARTS if name in parts), None)


def authoritative_score(parts: Mapping[str, float]) -> float | None:
    """The deciding part's value in [0, 1], or None when the session is unverified.

    Raises:
        ValueError: the deciding part is not a finite number in [0, 1] (it names the part).
    """
    name = authoritative_part(parts)
    if name is None:
        return None
    value = parts[name]
    if not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value <= 1:
        raise ValueError(f"reward part {name!r} is {value!r}; it must be a number in [0, 1]")
    return float(value)


def score_passed(score: float) -> bool:
    """Whether an authoritative score (already chosen, e.g. a scores file's `reward`) passed."""
    return score >= PASS_SCORE


def passed(parts: Mapping[str, float]) -> bool | None:
    """Whether the session passed by its authoritative part; None when it is unverified."""
    score = authoritative_score(parts)
    return None if score is None else score_passed(score)


def outcome_passed(stored: str) -> bool | None:
    """Whether a session with this stored outcome passed; None where no verdict was reached.

    Only `pass` and `fail` are verdicts: a call that was unverified, errored, interrupted, never
    ran, or is a live call not yet scored has no pass to count, in any table or statistic.
    """
    if stored == SessionOutcome.PASS:
        return True
    if stored == SessionOutcome.FAIL:
        return False
    return None


def outcome(parts: Mapping[str, float]) -> SessionOutcome:
    """`pass`, `fail` or `unverified`, by `passed` (a harness error is the caller's to set)."""
    result = passed(parts)
    if result is None:
        return SessionOutcome.UNVERIFIED
    return SessionOutcome.PASS if result else SessionOutcome.FAIL


SUCCESS_METRIC = "success"
"""The metric a scorer posts for whether a live call succeeded (Pipecat evals' `success`)."""

HUMAN_SOURCE = "human"
"""A person's score: it outranks every platform and judge."""
JUDGE_SOURCE = "judge"
"""`pipecat-rl judge`, an LLM over the transcript: it ranks below every other source."""


def source_rank(source: str) -> tuple[int, str]:
    """How far a scorer's word counts, lowest first: people, platforms (by name), our judge."""
    return (0 if source == HUMAN_SOURCE else 2 if source == JUDGE_SOURCE else 1, source)


def deciding_source(sources: Iterable[str]) -> str | None:
    """Of the sources that posted `success` for a call, the one whose verdict stands."""
    return min(sources, key=source_rank, default=None)
