"""Rewards and failure labels of an episode; every part is kept apart so each can be replaced.

reward = terminal verifier on the world (authoritative, 1 or 0) + shaped parts (tool credit: +0.1
per successful tool execution, -0.1 per failed one; a failed call's share of its goal checks that
held; the hard checks it broke) + a Pipecat scenario's judged and measured parts
(`pipecat_metrics`); the rubric (`scoring.rubric`) weighs them. Tool credit counts every tool
execution the recorder saw: the world's tools and the bot's own handlers (Flows functions among
them) alike (`seen_executions`). `reward_parts` and `failure_labels` are plain functions a user can
swap for their own.
"""

import difflib
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from pipecat.services.llm_service import LLMService

from pipecat_rl.ledger import ToolCallRecord
from pipecat_rl.scenarios import Scenario
from pipecat_rl.scenarios.scenario import GUARDED_CHECKS
from pipecat_rl.scoring.outcome import CHECKS_HELD, TOOL_CREDIT, VIOLATIONS
from pipecat_rl.simulator.transport import EndReason, Line
from pipecat_rl.simulator.world import CheckResult, ToolExecution

TOOL_SUCCESS_CREDIT = 0.1
TOOL_FAILURE_CREDIT = -0.1

MISHEARD_SLOT = "misheard_slot"
TOOL_ERROR = "tool_error"
DEAD_LOOP = "dead_loop"
UNAUTHORISED_WRITE = "unauthorised_write"
PREMATURE_HANGUP = "premature_hangup"
TIMEOUT = "timeout"
RECOVERED = "recovered"
"""Not a failure: a tool failed (often an injected fault) and a later call of it succeeded."""

FAILURE_LABELS = (
    MISHEARD_SLOT, TOOL_ERROR, DEAD_LOOP, UNAUTHORISED_WRITE, PREMATURE_HANGUP, TIMEOUT,
)  # fmt: skip


@dataclass(frozen=True)
class EpisodeEvidence:
    """Everything the reward and the labels are computed from."""

    scenario: Scenario
    executions: Sequence[ToolExecution]
    checks: Sequence[CheckResult]
    transcript: Sequence[Line]
    end_reason: EndReason | None
    judged: dict[str, float] = field(default_factory=dict)


def verifier_score(checks: Sequence[CheckResult]) -> float | None:
    """1.0 when every check passes, 0.0 when any fails; None when the scenario has none."""
    if not checks:
        return None
    return 1.0 if all(c.passed for c in checks) else 0.0


CANCELLED = "cancelled"
"""The recorder's error for a call the bot cancelled: it did not happen, and earns nothing."""

_FAILED_RESULTS = (
    LLMService.FUNCTION_CALL_ERROR_MESSAGE_TEMPLATE.split("{function_name}")[-1],
    LLMService.MISSING_FUNCTION_CALL_MESSAGE_TEMPLATE.split("{function_name}")[-1],
)
"""How Pipecat settles a call whose handler raised, or that has no handler."""


def _result_error(result: object) -> str | None:
    """The error a handler's result reports (`{"error": ...}`, or Pipecat's failure text)."""
    if isinstance(result, dict) and result.get("error"):
        return str(result["error"])
    if isinstance(result, str) and result.endswith(_FAILED_RESULTS):
        return result
    return None


def seen_executions(
    recorded: Sequence[ToolCallRecord], world: Sequence[ToolExecution]
) -> list[ToolExecution]:
    """Every tool execution the recorder saw, in time order, cancelled calls left out.

    A world tool's outcome is the world's own (injected faults included); a bot handler's call
    failed when the recorder saw an error or its result reports one. World executions the
    recorder did not see (no recorder in this build) are kept, so nothing is lost.
    """
    by_id = {e.call_id: e for e in world if e.call_id}
    out: list[ToolExecution] = []
    for r in recorded:
        if r.state_diff and "world" in r.state_diff:
            continue  # the simulator's own copy of a world execution
        if r.call_id in by_id:
            out.append(by_id.pop(r.call_id))
        elif r.error != CANCELLED:
            error = r.error or _result_error(r.result)
            out.append(
                ToolExecution(
                    name=r.name,
                    arguments=dict(r.arguments),
                    started_at=r.started_at,
                    call_id=r.call_id,
                    result=r.result,
                    error=error,
                    duration_ms=r.duration_ms or 0.0,
                )
            )
    out.extend(e for e in world if e.call_id in by_id or not e.call_id)
    return sorted(out, key=lambda e: e.started_at)


def broken_hard_checks(checks: Sequence[CheckResult]) -> list[CheckResult]:
    """The hard checks (a write or transfer the scenario forbids) that did not hold."""
    return [c for c in checks if c.check.startswith(GUARDED_CHECKS) and not c.passed]


def tool_credit(executions: Sequence[ToolExecution]) -> float:
    """+0.1 per successful tool execution, -0.1 per failed one."""
    return round(sum(TOOL_SUCCESS_CREDIT if e.ok else TOOL_FAILURE_CREDIT for e in executions), 6)


def reward_parts(evidence: EpisodeEvidence) -> dict[str, float]:
    """The reward's parts: `verifier`, `checks_held`, `violations`, `tool_credit`, Pipecat's.

    The first three only where the scenario has checks.

    Pipecat's parts (`evidence.judged`) come named: `judge:success`, `judge:<m>`, `metric:<m>`.
    """
    parts: dict[str, float] = {}
    checks = evidence.checks
    verifier = verifier_score(checks)
    if verifier is not None:
        parts["verifier"] = verifier
        goals = [c for c in checks if not c.check.startswith(GUARDED_CHECKS)]
        held = sum(c.passed for c in goals) / len(goals) if goals and not verifier else 0.0
        parts[CHECKS_HELD] = round(held, 6)
        parts[VIOLATIONS] = float(len(broken_hard_checks(checks)))
    parts[TOOL_CREDIT] = tool_credit(evidence.executions)
    parts.update(evidence.judged)
    return parts


MISHEARD_RECOVERED = "misheard_recovered"
"""Not a failure: a tool got a misheard slot, and a later call of it got the fact right."""

_DIGITS = {"zero": "0", "oh": "0", "one": "1", "two": "2", "three": "3", "four": "4",
           "five": "5", "six": "6", "seven": "7", "eight": "8", "nine": "9"}  # fmt: skip
_DATE_FORMATS = ("%Y-%m-%d", "%B %d %Y", "%d %B %Y", "%b %d %Y", "%d %b %Y", "%m/%d/%Y")


def _date(text: str) -> str | None:
    cleaned = re.sub(r"(\d+)(st|nd|rd|th)\b", r"\1", text.replace(",", " "))
    cleaned = " ".join(cleaned.split())
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(cleaned, fmt).date().isoformat()
        except ValueError:
            continue
    return None


def _norm(value: object) -> str:
    """A slot value as heard, normalised: spoken digits, spelled names and dates compare equal.

    "nine one one" and "911", "M-A-R-I-A" and "Maria", "March 12th, 1984" and "1984-03-12".
    """
    text = str(value).strip()
    date = _date(text)
    if date is not None:
        return date.replace("-", "")
    words = re.split(r"([\s\-.,()]+)", text.lower())
    return "".join(_DIGITS.get(w, w) for w in words if not re.fullmatch(r"[\s\-.,()]*", w))


def _misheard(value: object, fact: object) -> bool:
    """A value that is close to a fact without being it (one digit or letter off, say)."""
    got, want = _norm(value), _norm(fact)
    if not got or not want or got == want or len(want) < 3:
        return False
    return difflib.SequenceMatcher(None, got, want).ratio() >= 0.75


def _argument_values(arguments: dict) -> list[object]:
    out: list[object] = []
    for value in arguments.values():
        if isinstance(value, dict):
            out.extend(_argument_values(value))
        elif isinstance(value, list):
            out.extend(value)
        else:
            out.append(value)
    return out


def failure_labels(evidence: EpisodeEvidence) -> list[str]:
    """The episode's labels, in `FAILURE_LABELS` order, then `recovered` when it applies.

    `misheard_slot`: a tool got a value close to a scenario fact but not it, or a caller line
    said a fact the agent did not hear (so a mishearing that left the agent unable to act at
    all counts as one, not as the timeout it ends in).
    """
    labels: set[str] = set()
    facts = [v for v in evidence.scenario.facts.values() if not isinstance(v, (dict, list))]
    for execution in evidence.executions:
        if any(_misheard(v, f) for v in _argument_values(execution.arguments) for f in facts):
            labels.add(MISHEARD_SLOT)
    not_heard = _facts_not_heard(evidence.transcript, facts)
    if not_heard:
        labels.add(MISHEARD_SLOT)
    failed = [e for e in evidence.executions if not e.ok]
    if failed:
        labels.add(TOOL_ERROR)
    repeats = Counter((e.name, json.dumps(e.arguments, sort_keys=True)) for e in failed)
    if any(n >= 2 for n in repeats.values()):
        labels.add(DEAD_LOOP)
    if broken_hard_checks(evidence.checks):
        labels.add(UNAUTHORISED_WRITE)
    verified = verifier_score(evidence.checks)
    if evidence.end_reason == "agent_hung_up" and verified == 0.0:
        labels.add(PREMATURE_HANGUP)
    if evidence.end_reason in ("silence", "max_duration", "max_turns"):
        labels.add(TIMEOUT)
    ordered = [label for label in FAILURE_LABELS if label in labels]
    if MISHEARD_SLOT in labels and (
        _misheard_then_right(evidence.executions, facts)
        or _heard_later_right(evidence.executions, not_heard)
    ):
        ordered.append(MISHEARD_RECOVERED)
    for i, execution in enumerate(evidence.executions):
        if not execution.ok and any(
            later.ok and later.name == execution.name for later in evidence.executions[i + 1 :]
        ):
            ordered.append(RECOVERED)
            break
    return ordered


def _facts_not_heard(transcript: Sequence[Line], facts: list[object]) -> list[tuple[float, object]]:
    """(when, fact) for each caller line that said a fact the agent did not hear as said.

    The perceptual side of a misheard slot, whether or not a tool call followed: the caller's
    line (as written) holds the fact, and what the agent's STT made of it (`heard`; the text
    itself in text mode without ASR noise) does not, after normalising (digits, spelling).
    """
    out = []
    for line in transcript:
        if line.speaker != "caller":
            continue
        said, heard = _norm(line.text), _norm(line.heard)
        for fact in facts:
            want = _norm(fact)
            if len(want) >= 3 and want in said and want not in heard:
                out.append((line.at, fact))
    return out


def _heard_later_right(
    executions: Sequence[ToolExecution], not_heard: list[tuple[float, object]]
) -> bool:
    """Whether a fact the agent misheard reached a tool right after it was misheard."""
    return any(
        execution.started_at > at
        and _norm(fact) in {_norm(v) for v in _argument_values(execution.arguments)}
        for at, fact in not_heard
        for execution in executions
    )


def _misheard_then_right(executions: Sequence[ToolExecution], facts: list[object]) -> bool:
    """Whether a call with a misheard slot is followed by a call of that tool with the fact."""
    for i, execution in enumerate(executions):
        misheard = [
            f for v in _argument_values(execution.arguments) for f in facts if _misheard(v, f)
        ]
        for later in executions[i + 1 :]:
            values = {_norm(v) for v in _argument_values(later.arguments)}
            if later.name == execution.name and any(_norm(f) in values for f in misheard):
                return True
    return False
