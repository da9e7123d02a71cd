"""Pipecat's scripted scenarios (`turns:`): a scripted caller, its checks scored after the call.

The turns are read when the file loads, by Pipecat's own parser (`scenarios.turns`). The caller
says turn 1 as soon as it connects and each later turn once the agent has answered
the one before (a greeting the agent gives before hearing turn 1 is nobody's answer);
after the agent answers the last turn, it hangs up. A turn's checks are matched against what
the agent said and the tools it called between that turn and the next, in text mode:

- `response` / `llm_response` / `tts_response`: the agent's reply (`text_contains`,
  `text_excludes`, `eval:` judged by Pipecat's judge, `absent`);
- `function_call` / `function_call_stopped`: the turn's calls (`calls:` or the `name:`/`args:`
  shorthand, any order; `eval:` judged per call; `args: {cancelled: ...}` for stopped calls);
- `llm_started`, `bot_started_speaking`, `bot_stopped_speaking`: the agent replied;
  `user_transcription`, `user_started_speaking`, `user_stopped_speaking`: the caller's line.

`send_after`, audio, DTMF, images and markers need the audio harness: a file that uses them is
skipped with a warning; `within_ms` budgets are not enforced (text mode has no real-time pacing),
and `stop_on_failure` does not stop the call (the checks are scored after it). Each check is a
reward part `metric:turn<T>.<N>.<event>` (1 or 0), and `judge:success` is 1 only when every
check passed, as Pipecat passes a scripted run (an `eval:` check with no judge to ask is left
unscored, and so is `judge:success` unless another check failed).
"""

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipecat.classifiers.llm.classifier import LLMClassifier
from pipecat.evals.judge import EvalJudge

from pipecat_rl.scenarios import Scenario
from pipecat_rl.scenarios.turns import CALL_EVENTS, SPOKE_EVENTS, USER_EVENTS, Expectation
from pipecat_rl.simulator.judge import Endpoint, ToolCallSeen, judge_service
from pipecat_rl.simulator.pipecat_metrics import SUCCESS_PART
from pipecat_rl.simulator.scripted import ScriptedReply
from pipecat_rl.simulator.transport import Line, LocalTransportPair


class TurnsCaller:
    """The policy of a scripted caller: the next turn once the agent has answered the last."""

    def __init__(self, scenario: Scenario, pair: LocalTransportPair):
        self._turns = caller_turns(scenario)
        self._pair = pair

    def __call__(self, messages: list[dict]) -> ScriptedReply:
        """Say the next turn, wait (say nothing), or hang up after the last turn is answered."""
        del messages
        said = self._pair.caller_turns
        answered = any(
            line.speaker == "agent" and line.answers == said for line in self._pair.transcript
        )
        if not answered:
            return ScriptedReply()
        if said >= len(self._turns):
            from pipecat.evals.persona import END_CALL_FUNCTION

            return ScriptedReply(tool_calls=[(END_CALL_FUNCTION, {"success": True})])
        return ScriptedReply(text=self._turns[said])


def caller_turns(scenario: Scenario) -> list[str]:
    """What the scripted caller says, turn by turn."""
    return [str(turn.user) for turn in scenario.parsed_turns or []]


@dataclass(frozen=True)
class Check:
    """One expectation of one turn, scored."""

    part: str
    passed: bool | None
    """None when an `eval:` check had no judge to ask (no served model, no --judge-llm-url)."""
    reason: str


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def _calls_match(e: Expectation, calls: Sequence[ToolCallSeen]) -> list[ToolCallSeen] | None:
    """The calls matching every entry of `e.calls` (each once), or None when one is missing."""
    specs = e.calls or []
    used: list[ToolCallSeen] = []
    for spec in specs:
        found = next(
            (
                c
                for c in calls
                if c not in used
                and c.name == spec.name
                and all(
                    (c.cancelled if k == "cancelled" else c.arguments.get(k)) == v
                    for k, v in (spec.args or {}).items()
                )
            ),
            None,
        )
        if found is None:
            return None
        used.append(found)
    return used


class _TurnJudge:
    """Pipecat's judge, told the conversation up to the turn being checked."""

    def __init__(self, endpoint: Endpoint | None):
        self._endpoint = endpoint
        self._judge: EvalJudge | None = None
        self._told = 0

    @property
    def available(self) -> bool:
        return self._endpoint is not None

    async def ask(self, conversation: list[dict], criterion: str, call: Any = None) -> str:
        assert self._endpoint is not None  # callers check `available`
        if self._judge is None:
            self._judge = EvalJudge(LLMClassifier(llm=judge_service(self._endpoint)))
        for message in conversation[self._told :]:
            if message["role"] == "user":
                self._judge.add_user_message(message["content"])
            elif message["role"] == "assistant":
                self._judge.add_assistant_message(message["content"])
            else:
                self._judge.add_tool_call(f"{message['name']}({message['arguments']})")
        self._told = len(conversation)
        if call is not None:
            verdict = await self._judge.evaluate_call(call.name, call.arguments, criterion)
        else:
            verdict = await self._judge.evaluate(criterion)
        return verdict.verdict

    async def close(self) -> None:
        if self._judge is not None:
            await self._judge.close()


def _until_turn(transcript: Sequence[Line], t: int) -> list[dict]:
    """The conversation up to turn `t` and the agent's answer to it, as the judge reads it."""
    out, said = [], 0
    for line in transcript:
        if line.speaker == "caller":
            said += 1
            if said <= t:
                out.append({"role": "user", "content": line.text})
        elif (line.answers or 0) <= t:
            out.append({"role": "assistant", "content": line.text})
    return out


async def score_turns(
    scenario: Scenario,
    transcript: Sequence[Line],
    calls: Sequence[ToolCallSeen],
    judge: Endpoint | None,
) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """Every check of every turn as a reward part, and `judge:success` (all of them passed)."""
    turns = scenario.parsed_turns or []
    starts = [line.at for line in transcript if line.speaker == "caller"]
    turn_judge = _TurnJudge(judge)
    checks: list[Check] = []
    try:
        for t, turn in enumerate(turns, 1):
            replies = [line for line in transcript if line.speaker == "agent" and line.answers == t]
            reply = " ".join(line.text for line in replies)
            begin = starts[t - 1] if t <= len(starts) else None
            end = starts[t] if t < len(starts) else float("inf")
            in_turn = [c for c in calls if begin is not None and begin <= c.at < end]
            conversation = _until_turn(transcript, t)
            for i, e in enumerate(turn.expect, 1):
                part = f"metric:turn{t}.{i}.{e.event}"
                passed, reason = await _check(e, turn.user or "", reply, in_turn, conversation,
                                              turn_judge, said=begin is not None)  # fmt: skip
                checks.append(Check(part=part, passed=passed, reason=reason))
    finally:
        await turn_judge.close()
    scored = [c for c in checks if c.passed is not None]
    parts = {c.part: 1.0 if c.passed else 0.0 for c in scored}
    if len(scored) == len(checks) or not all(c.passed for c in scored):
        parts = {SUCCESS_PART: 1.0 if all(c.passed for c in scored) else 0.0, **parts}
    details = {c.part: {"passed": c.passed, "reason": c.reason} for c in checks}
    details[SUCCESS_PART] = {
        "failed_checks": [c.part for c in scored if not c.passed],
        "unjudged_checks": [c.part for c in checks if c.passed is None],
    }
    return parts, details


async def _check(
    e: Expectation,
    user: str,
    reply: str,
    calls: Sequence[ToolCallSeen],
    conversation: list[dict],
    judge: _TurnJudge,
    *,
    said: bool,
) -> tuple[bool | None, str]:
    if not said:
        return False, "the call ended before this turn was said"
    if e.eval and not judge.available:
        return None, "no judge to ask (no served model and no --judge-llm-url)"
    if e.event in USER_EVENTS:
        ok = e.text_contains is None or _norm(e.text_contains) in _norm(user)
        return ok != bool(e.absent), f"the caller said {user!r}"
    if e.event in CALL_EVENTS:
        stopped = e.event == "function_call_stopped"
        pool = [c for c in calls if c.cancelled == stopped]
        if e.absent:
            return not pool, f"{len(pool)} call(s) in the turn"
        matched = _calls_match(e, calls if stopped else pool) if e.calls else pool[:1] or None
        if not matched:
            return False, f"calls made: {', '.join(c.name for c in calls) or 'none'}"
        if e.eval:
            for call in matched:
                verdict = await judge.ask(conversation, e.eval, call)
                if verdict != "yes":
                    return False, f"the judge said {verdict} for {call.name}: {e.eval}"
        return True, f"calls made: {', '.join(c.name for c in matched)}"
    if e.absent:
        return not reply, "the agent replied" if reply else "no reply"
    if not reply:
        return False, "the agent did not reply"
    if e.event in SPOKE_EVENTS:
        return True, "the agent replied"
    if e.text_contains is not None and _norm(e.text_contains) not in _norm(reply):
        return False, f"the reply does not contain {e.text_contains!r}: {reply!r}"
    if e.text_excludes is not None and _norm(e.text_excludes) in _norm(reply):
        return False, f"the reply contains {e.text_excludes!r}: {reply!r}"
    if e.eval:
        verdict = await judge.ask(conversation, e.eval)
        if verdict != "yes":
            return False, f"the judge said {verdict}: {e.eval}"
    return True, f"the reply: {reply!r}"
