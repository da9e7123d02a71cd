"""Production failures as regression tests: each scored-failed live call, forked where it failed.

`auto_turn` is `ledger fork --at auto`: the reply where a recorded call went wrong, as the fork
that hands exactly that reply to the candidate. The first of these that applies decides:

1. **a turn a score's explanation names**: every score of the call short of full marks (the
   deciding `success` among them) is read for "turn N" ("bot turn N", "agent turn N", "turn #N"),
   N counted as Pipecat's judge counts bot turns, and so as `pipecat-rl judge` writes them: the
   agent's N-th reply that said something, from 1. The smallest N named wins (the earliest
   point that went wrong); an N past the call's replies is ignored.
2. **the first failed check's tool call**: the earliest tool call that returned an error, or
   whose world change touched a table that a failed verify check reads (a simulated call's
   checks; a live call has none).
3. **else the call's last reply**: nothing points inside the call, so it went wrong where it
   ended without doing its job, and the candidate answers that reply again.

A reply is every LLM call that answers one caller line (a call after tool results continues the
reply before it: `ledger.transcript.after_tool_results`), and the fork forces each turn before
the reply's first call, so the candidate answers the whole reply, its tool calls included. A
failure in the agent's first reply leaves no recorded turn to force: no fork (the call's own
scenario is that test).

`fork_failed` forks every live call scored `fail` within a window (`--failed --since 24h`), each
at its `auto_turn` (or one given K). A call that cannot be forked is listed with the reason,
never dropped in silence: a failure in its first reply, a text-only turn before K (not
token-exact), no scenario and no `persona` file, a scenario or pack that is gone or changed.

A regression fork never trains (the held-out rule, which the training query enforces):

- it is written `split: heldout` whatever its call's split was (`as_regression`), and
  `keep_from_training` records its content hash as held out in the ledger at once: every
  session of it (the gate's, a `simulate` of the file) is a held-out session, which never
  trains and takes no score (`eligibility.HELDOUT_SESSION`), and the file is refused in a pool
  (by the loader in a `pool/` folder, by the cycle's snapshot anywhere in `pool:`);
- the call it was forked from is excluded from training (`excluded_from_training`), so the
  suite measures how a policy answers that moment, never whether it learned that very call.

The cycle gates on such a folder as a fixed suite (`loop.yaml`'s `regressions:`): the candidate
must not be confirmed worse than the incumbent there (`gate.regressions.suite_tests`).
"""

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipecat_rl.errors import ScenarioError
from pipecat_rl.ledger import Ledger, ScoreRecord, SessionRecord, ToolCallRecord, TurnRecord
from pipecat_rl.ledger.records import SIMULATOR_SCORE_SOURCE
from pipecat_rl.ledger.transcript import after_tool_results, call_owner
from pipecat_rl.scenarios.forking import Fork, fork_call
from pipecat_rl.scenarios.loading import load_scenario_file, load_scenarios
from pipecat_rl.scenarios.scenario import HELDOUT, Scenario
from pipecat_rl.scoring.outcome import SessionOutcome

NAMED_TURN = re.compile(r"\b(?:bot\s+|agent\s+)?turn\s*#?\s*(\d+)\b", re.IGNORECASE)
"""How an explanation names a turn: "turn 3", "bot turn 3", "Turn #3"."""

_CHECK_TABLE = re.compile(r"^(?:exists|not_exists|count|unchanged) (\S+)")
"""The table a verify check reads, from its description (`simulator.world.World.verify`)."""

AUTO = "auto"
"""`--at auto`: each call at the reply `auto_turn` finds."""


@dataclass(frozen=True)
class AutoTurn:
    """Where a failed call is forked, and why there."""

    at: int
    """The turns forced: the reply that went wrong starts at turn `at` + 1."""
    why: str


@dataclass(frozen=True)
class RegressionFork:
    """A failed call's fork, held out, and why it was forked where it was."""

    fork: Fork
    why: str

    @property
    def scenario(self) -> Scenario:
        """The fork as the regression suite holds it (`as_regression`)."""
        return as_regression(self.fork.scenario)


@dataclass(frozen=True)
class Skipped:
    """A failed call that was not forked, and why (what to do instead)."""

    session: str
    reason: str


@dataclass(frozen=True)
class FailedForks:
    """What `fork_failed` made of a window's failed calls."""

    forks: list[RegressionFork]
    skipped: list[Skipped]


def _said(turn: TurnRecord) -> str:
    """What the agent said in the turn, as the caller heard it (a judge's bot turn)."""
    said = turn.spoken_text if turn.spoken_text is not None else turn.generated_text
    return said.strip()


def _excerpt(text: str, chars: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _named_turn(scores: Sequence[ScoreRecord], turns: Sequence[TurnRecord]) -> tuple[int, str]:
    """The earliest reply a failing score's explanation names: (position, why), or (-1, "")."""
    replies = [i for i, t in enumerate(turns) if _said(t)]
    best: tuple[int, str] | None = None
    for score in scores:
        if score.value >= 1 or not score.explanation or score.source == SIMULATOR_SCORE_SOURCE:
            continue
        for match in NAMED_TURN.finditer(score.explanation):
            n = int(match.group(1))
            if 1 <= n <= len(replies) and (best is None or n < best[0]):
                best = (n, f"{score.source}'s {score.name} ({score.value:g})")
    if best is None:
        return -1, ""
    n, who = best
    position = replies[n - 1]
    said = _excerpt(_said(turns[position]))
    return position, f"{who} names turn {n}, the agent's reply {said!r} (turn {position + 1})"


def _failed_check(
    session: SessionRecord, turns: Sequence[TurnRecord], calls: Sequence[ToolCallRecord]
) -> tuple[int, str]:
    """The earliest tool call a failed check points to: (its turn's position, why), or (-1, "")."""
    tables: dict[str, str] = {}
    for check in session.metadata.get("checks") or []:
        if isinstance(check, dict) and not check.get("passed"):
            match = _CHECK_TABLE.match(str(check.get("check", "")))
            if match is not None:
                tables.setdefault(match.group(1), str(check["check"]))
    owner = call_owner(turns)
    position = {t.index: i for i, t in enumerate(turns)}
    found: list[tuple[int, str]] = []
    for call in calls:
        index = owner(call)
        if index is None:
            continue
        at = position[index]
        if call.error is not None:
            found.append((at, f"the tool call {call.name} in turn {at + 1} returned an error "
                              f"({_excerpt(call.error)})"))  # fmt: skip
        world = (call.state_diff or {}).get("world") if isinstance(call.state_diff, dict) else None
        touched = sorted(set(world or {}) & set(tables))
        if touched:
            found.append((at, f"the tool call {call.name} in turn {at + 1} changed "
                              f"{touched[0]}, which the failed check '{tables[touched[0]]}' "
                              "reads"))  # fmt: skip
    return min(found, key=lambda f: f[0]) if found else (-1, "")


def auto_turn(ledger: Ledger, session_id: str) -> AutoTurn:
    """Where `--at auto` forks the call (see the module docstring).

    Raises:
        NotInLedgerError: no such session.
        ScenarioError: the call recorded no agent turn, or went wrong in its first reply (no
            recorded turn to force).
    """
    session = ledger.session(session_id)
    turns = ledger.turns(session_id)
    if not turns:
        raise ScenarioError(f"session {session_id} recorded no agent turn to fork")
    position, why = _named_turn(ledger.scores(session_id), turns)
    if position < 0:
        position, why = _failed_check(session, turns, ledger.tool_calls(session_id))
    if position < 0:
        position = len(turns) - 1
        why = f"nothing points inside the call: its last reply (turn {position + 1})"
    start = position
    while start > 0 and after_tool_results(turns[start]):
        start -= 1  # the reply's first LLM call: the candidate answers all of it
    if start == 0:
        raise ScenarioError(
            f"session {session_id}: {why}, in the agent's first reply: there is no recorded "
            "turn to force before it, so the call's own scenario is that test"
        )
    if start < position:
        why += f"; the reply starts at turn {start + 1}"
    return AutoTurn(at=start, why=why)


def as_regression(scenario: Scenario) -> Scenario:
    """A fork as a regression test: held out whatever its call was (it never trains)."""
    return scenario.model_copy(update={"split": HELDOUT})


def failed_live_calls(ledger: Ledger, since: float) -> list[SessionRecord]:
    """Live calls started at `since` or later whose verdict is `fail`, oldest first."""
    calls = ledger.sessions(source="live", since=since)
    return [s for s in reversed(calls) if s.outcome == SessionOutcome.FAIL]


def fork_failed(
    ledger: Ledger,
    since: float,
    at: int | None = None,
    *,
    scenarios: Sequence[Path] = (),
    persona: Path | None = None,
) -> FailedForks:
    """Fork every live call scored `fail` since `since`, at `auto_turn` (or at `at`).

    A call with a scenario continues as its scenario; one without, as `persona` (a scenario
    file for the caller). Nothing is written: see `keep_from_training` and the CLI.

    Raises:
        ScenarioError: `scenarios` or `persona` cannot be loaded (before any call is forked).
    """
    if scenarios:
        load_scenarios(list(scenarios))  # a bad folder is one error, not one skip per call
    if persona is not None:
        load_scenario_file(persona)
    forks, skipped = [], []
    for session in failed_live_calls(ledger, since):
        try:
            chosen = auto_turn(ledger, session.id) if at is None else AutoTurn(at, f"--at {at}")
            made = fork_call(
                ledger, session.id, chosen.at, scenarios=scenarios,
                persona=persona if session.scenario_id is None else None,
            )  # fmt: skip
        except ScenarioError as e:
            skipped.append(Skipped(session.id, str(e)))
            continue
        forks.append(RegressionFork(made, chosen.why))
    return FailedForks(forks, skipped)


def keep_from_training(ledger: Ledger, forks: Sequence[RegressionFork]) -> int:
    """Record the forks' hashes as held out and exclude their calls from training.

    Returns how many calls were newly excluded (see the module docstring for why both).
    """
    ledger.record_heldout_hashes((f.scenario.content_hash(), f.scenario.id, None) for f in forks)
    excluded = 0
    for f in forks:
        session = ledger.session(f.fork.scenario.fork.session)
        if not session.excluded_from_training:
            ledger.update_session(session.id, excluded_from_training=True)
            excluded += 1
    return excluded
