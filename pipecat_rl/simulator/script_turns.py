"""Pipecat's scripted scenarios (`turns:`): a scripted caller, and its checks scored.

The turns are read when the file loads, by Pipecat's own parser (`scenarios.turns`). The caller
says turn 1 as soon as it connects and each later turn once the agent has answered the one
before (a greeting the agent gives before hearing turn 1 is nobody's answer); after the agent
answers the last turn, it hangs up. A turn 1 without `user:` only waits, as Pipecat's harness
plays it: the caller says nothing until the agent has spoken, that greeting is the turn's
reply, and the caller's first line is turn 2 (a bot that never greets leaves the call silent
until `max_silence_s` ends it). A turn's checks are matched against what the agent said and
the tools it called between that turn and the next, in text mode and in audio mode alike:

- `response` / `llm_response` / `tts_response`: the agent's reply (`text_contains`,
  `text_excludes`, `eval:` judged by Pipecat's judge, `absent`);
- `function_call` / `function_call_stopped`: the turn's calls (`calls:` or the `name:`/`args:`
  shorthand, any order, a call without a name matching any; `eval:` judged per call;
  `args: {cancelled: ...}` for stopped calls);
- `llm_started`, `bot_started_speaking`, `bot_stopped_speaking`: the agent replied;
  `user_transcription`: the caller's line as the agent heard it (its STT's words in audio
  mode, the ASR-noise model's in text mode), as Pipecat matches the bot's transcription;
  `user_started_speaking`, `user_stopped_speaking`: the caller's line (a turn that only waits
  has none).

As Pipecat's harness does:

- `within_ms` is the event's latency budget from the turn's send: a reply, a call or a first
  text that arrives later does not count, so the check fails (with `absent: true`, only what
  arrives within the budget counts against it). A reply arrives when its text is complete (its
  first text, for `llm_started` and `bot_started_speaking`); a call when it starts.
- `stop_on_failure` (default true) ends the scenario at its first failed turn: the caller
  hangs up instead of saying the next turn once a check of what it heard fails (the reply, its
  timing, the caller's own line), and the later turns are reported not run. A check decided
  only after the call (a tool call, seen whole by the recorder, or a judged `eval:`) ends the
  scenario in the score the same way, though the caller went on. `stop_on_failure: false`
  drives and scores every turn.

Each check is a reward part `metric:turn<T>.<N>.<event>` (1 or 0), and `judge:success` is 1
only when every check passed, as Pipecat passes a scripted run (an `eval:` check with no judge
to ask, or one the judge could not answer in time, is left unscored with the reason, and so is
`judge:success` unless another check failed). Expectations are matched against the whole turn,
so their order within it is not checked.
"""

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipecat.evals.persona import END_CALL_FUNCTION

from pipecat_rl.scenarios import Scenario
from pipecat_rl.scenarios.turns import (
    CALL_EVENTS,
    SPOKE_EVENTS,
    USER_EVENTS,
    Expectation,
    Turn,
    opens_waiting,
    spoken,
)
from pipecat_rl.simulator.judge import Endpoint, Judge, ToolCallSeen
from pipecat_rl.simulator.options import DEFAULT_JUDGE_TIMEOUT_S
from pipecat_rl.simulator.pipecat_metrics import SUCCESS_PART
from pipecat_rl.simulator.scripted import ScriptedReply
from pipecat_rl.simulator.transport import Line, LocalTransportPair

_FIRST_TEXT_EVENTS = frozenset({"llm_started", "bot_started_speaking"})


def opening_line(scenario: Scenario) -> str | None:
    """What the scripted caller says on connecting: turn 1, or nothing when turn 1 waits."""
    turns = scenario.parsed_turns or []
    return None if opens_waiting(turns) else spoken(turns)[0].user


def _line_of(turns: Sequence[Turn], t: int) -> int:
    """The caller line (1-based) turn `t` says; 0 for an opening turn that only waits."""
    return t - 1 if opens_waiting(turns) else t


@dataclass(frozen=True)
class TurnEvidence:
    """What happened in one turn: the caller's line, the agent's replies, the calls made."""

    said: bool
    """Whether the turn was reached: its line said, or it is an opening that only waits."""
    user: str
    """What the turn says ("" for one that only waits)."""
    heard: str
    """What the agent heard of it: its STT's words (audio), the noise model's (text)."""
    begin: float | None
    """When the caller said the turn (wall clock, as `Line.at`); None if it said nothing."""
    replies: list[Line]
    calls: list[ToolCallSeen]


def turn_evidence(
    turns: Sequence[Turn], t: int, transcript: Sequence[Line], calls: Sequence[ToolCallSeen]
) -> TurnEvidence:
    """The evidence of turn `t` (1-based): from its caller line to the next one.

    An opening turn that only waits has the agent's greeting and the calls before the caller's
    first line.
    """
    lines = [line for line in transcript if line.speaker == "caller"]
    k = _line_of(turns, t)
    said = lines[k - 1] if 0 < k <= len(lines) else None
    start = float("-inf") if k == 0 else said.at if said else None
    end = lines[k].at if k < len(lines) else float("inf")
    return TurnEvidence(
        said=k == 0 or said is not None,
        user=turns[t - 1].user or "",
        heard=said.heard if said else "",
        begin=said.at if said else None,
        replies=[line for line in transcript if line.speaker == "agent" and line.answers == k],
        calls=[c for c in calls if start is not None and start <= c.at < end],
    )


class TurnsCaller:
    """The policy of a scripted caller: the next turn once the agent has answered the last.

    With `stop_on_failure` it hangs up instead, once a turn fails a check of what it heard.
    """

    def __init__(self, scenario: Scenario, pair: LocalTransportPair):
        self._turns = list(scenario.parsed_turns or [])
        self._lines = [str(turn.user) for turn in spoken(self._turns)]
        self._waits = int(opens_waiting(self._turns))
        self._stop = scenario.stops_on_failure
        self._pair = pair

    def __call__(self, messages: list[dict]) -> ScriptedReply:
        """Say the next turn, wait (say nothing), or hang up (the last turn answered, or failed)."""
        del messages
        said = self._pair.caller_turns
        answered = any(
            line.speaker == "agent" and line.answers == said for line in self._pair.transcript
        )
        if not answered:
            return ScriptedReply()
        if said >= len(self._lines):
            return ScriptedReply(tool_calls=[(END_CALL_FUNCTION, {"success": True})])
        last = said + self._waits  # the turn just answered (0: none yet)
        if self._stop and last and self._failed(last):
            return ScriptedReply(tool_calls=[(END_CALL_FUNCTION, {"success": False})])
        return ScriptedReply(text=self._lines[said])

    def _failed(self, t: int) -> bool:
        evidence = turn_evidence(self._turns, t, self._pair.transcript, [])
        return any(decide(e, evidence, calls_known=False)[0] is False
                   for e in self._turns[t - 1].expect)  # fmt: skip


@dataclass(frozen=True)
class TurnCheck:
    """One expectation of one turn, scored."""

    part: str
    passed: bool | None
    """None when an `eval:` check had no judge to ask, or the judge could not answer it."""
    reason: str


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def _calls_match(e: Expectation, calls: Sequence[ToolCallSeen]) -> list[ToolCallSeen] | None:
    """The calls matching every entry of `e.calls` (each once), or None when one is missing."""
    used: list[ToolCallSeen] = []
    for spec in e.calls or []:
        found = next(
            (
                c
                for c in calls
                if c not in used
                and (spec.name is None or c.name == spec.name)
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


def _arrived(line: Line, event: str, begin: float) -> float:
    """When a reply line arrived for `event`: its first text, or its whole text."""
    if event in _FIRST_TEXT_EVENTS and line.latency_ms is not None:
        return begin + line.latency_ms / 1000.0
    return line.at


def _within_budget(e: Expectation, ev: TurnEvidence) -> tuple[str, list[ToolCallSeen]]:
    """The reply and the calls that arrived within `e.within_ms` of the send (all, if unset)."""
    replies, calls = ev.replies, ev.calls
    if e.within_ms is not None and ev.begin is not None:
        deadline = ev.begin + e.within_ms / 1000.0
        replies = [line for line in replies if _arrived(line, e.event, ev.begin) <= deadline]
        calls = [c for c in calls if c.at <= deadline]
    return " ".join(line.text for line in replies), calls


def decide(
    e: Expectation, ev: TurnEvidence, *, calls_known: bool = True
) -> tuple[bool | None, str, list[ToolCallSeen]]:
    """An expectation decided without a judge: passed, why, and the calls it matched.

    Passed is None when it cannot be decided from `ev`: a call check while the calls are not
    known (`calls_known=False`, the caller's view during the call). An `eval:` still has to be
    asked of the judge when this passes.
    """
    if not ev.said:
        return False, "the call ended before this turn was said", []
    reply, calls = _within_budget(e, ev)
    budget = f" within {e.within_ms} ms" if e.within_ms is not None else ""
    if e.event in USER_EVENTS:
        if not ev.user:
            return e.absent, "the caller says nothing in this turn (it waits for the agent)", []
        if e.event != "user_transcription":
            ok = e.text_contains is None or _norm(e.text_contains) in _norm(ev.user)
            return ok != e.absent, f"the caller said {ev.user!r}", []
        heard = _norm(ev.heard)
        ok = (e.text_contains is None or _norm(e.text_contains) in heard) and (
            e.text_excludes is None or _norm(e.text_excludes) not in heard
        )
        return ok != e.absent, f"the agent heard {ev.heard!r} (the caller said {ev.user!r})", []
    if e.event in CALL_EVENTS:
        if not calls_known:
            return None, "decided after the call", []
        stopped = e.event == "function_call_stopped"
        pool = [c for c in calls if c.cancelled == stopped]
        if e.absent:
            return not pool, f"{len(pool)} call(s) in the turn{budget}", []
        matched = _calls_match(e, calls if stopped else pool) if e.calls else pool[:1] or None
        if not matched:
            return False, f"calls made{budget}: {', '.join(c.name for c in calls) or 'none'}", []
        return True, f"calls made: {', '.join(c.name for c in matched)}", matched
    if e.absent:
        return not reply, ("the agent replied" if reply else "no reply") + budget, []
    if not reply:
        return False, f"the agent did not reply{budget}", []
    if e.event in SPOKE_EVENTS:
        return True, "the agent replied", []
    if e.text_contains is not None and _norm(e.text_contains) not in _norm(reply):
        return False, f"the reply{budget} does not contain {e.text_contains!r}: {reply!r}", []
    if e.text_excludes is not None and _norm(e.text_excludes) in _norm(reply):
        return False, f"the reply contains {e.text_excludes!r}: {reply!r}", []
    return True, f"the reply: {reply!r}", []


class _TurnJudge:
    """Pipecat's judge, told the conversation up to the turn being checked."""

    def __init__(self, endpoint: Endpoint | None, timeout_s: float):
        self._endpoint = endpoint
        self._timeout_s = timeout_s
        self._judge: Judge | None = None
        self._told = 0

    @property
    def available(self) -> bool:
        return self._endpoint is not None

    async def ask(
        self, conversation: list[dict], criterion: str, call: Any = None
    ) -> tuple[str, str | None]:
        """The judge's verdict, and why it is no answer when the judge could not give one."""
        assert self._endpoint is not None  # callers check `available`
        if self._judge is None:
            self._judge = Judge(self._endpoint, self._timeout_s)
        judge = self._judge.eval
        for message in conversation[self._told :]:
            if message["role"] == "user":
                judge.add_user_message(message["content"])
            elif message["role"] == "assistant":
                judge.add_assistant_message(message["content"])
            else:
                judge.add_tool_call(f"{message['name']}({message['arguments']})")
        self._told = len(conversation)
        if call is not None:
            verdict = await judge.evaluate_call(call.name, call.arguments, criterion)
        else:
            verdict = await judge.evaluate(criterion)
        return verdict.verdict, self._judge.unanswered(verdict)

    async def close(self) -> None:
        if self._judge is not None:
            await self._judge.close()


def _until_line(transcript: Sequence[Line], k: int) -> list[dict]:
    """The conversation up to caller line `k` and the agent's answer, as the judge reads it."""
    out, said = [], 0
    for line in transcript:
        if line.speaker == "caller":
            said += 1
            if said <= k:
                out.append({"role": "user", "content": line.text})
        elif (line.answers or 0) <= k:
            out.append({"role": "assistant", "content": line.text})
    return out


async def _check(
    e: Expectation, ev: TurnEvidence, conversation: list[dict], judge: _TurnJudge
) -> tuple[bool | None, str]:
    """An expectation decided, asking the judge for its `eval:` once the rest of it passed."""
    passed, reason, matched = decide(e, ev)
    if not passed or not e.eval:
        return passed, reason
    if not judge.available:
        return None, "no judge to ask (no served model and no --judge-llm-url)"
    if e.event in CALL_EVENTS:
        for call in matched:
            verdict, unanswered = await judge.ask(conversation, e.eval, call)
            if unanswered:
                return None, f"unscored: {unanswered}"
            if verdict != "yes":
                return False, f"the judge said {verdict} for {call.name}: {e.eval}"
        return True, reason
    verdict, unanswered = await judge.ask(conversation, e.eval)
    if unanswered:
        return None, f"unscored: {unanswered}"
    if verdict != "yes":
        return False, f"the judge said {verdict}: {e.eval}"
    return True, reason


async def score_turns(
    scenario: Scenario,
    transcript: Sequence[Line],
    calls: Sequence[ToolCallSeen],
    judge: Endpoint | None,
    judge_timeout_s: float = DEFAULT_JUDGE_TIMEOUT_S,
) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """Every check of every turn run as a reward part, and `judge:success` (all passed)."""
    turns = scenario.parsed_turns or []
    turn_judge = _TurnJudge(judge, judge_timeout_s)
    checks: list[TurnCheck] = []
    not_run: list[TurnCheck] = []
    failed_turn: int | None = None
    try:
        for t, turn in enumerate(turns, 1):
            parts = [f"metric:turn{t}.{i}.{e.event}" for i, e in enumerate(turn.expect, 1)]
            if failed_turn is not None:
                reason = f"not run: turn {failed_turn} failed (stop_on_failure)"
                not_run += [TurnCheck(part=p, passed=None, reason=reason) for p in parts]
                continue
            ev = turn_evidence(turns, t, transcript, calls)
            conversation = _until_line(transcript, _line_of(turns, t))
            for part, e in zip(parts, turn.expect, strict=True):
                passed, reason = await _check(e, ev, conversation, turn_judge)
                checks.append(TurnCheck(part=part, passed=passed, reason=reason))
            if scenario.stops_on_failure and any(c.passed is False for c in checks):
                failed_turn = t
    finally:
        await turn_judge.close()
    scored = [c for c in checks if c.passed is not None]
    parts = {c.part: 1.0 if c.passed else 0.0 for c in scored}
    if len(scored) == len(checks) or not all(c.passed for c in scored):
        parts = {SUCCESS_PART: 1.0 if all(c.passed for c in scored) else 0.0, **parts}
    details = {c.part: {"passed": c.passed, "reason": c.reason} for c in checks + not_run}
    details[SUCCESS_PART] = {
        "failed_checks": [c.part for c in scored if not c.passed],
        "unjudged_checks": [c.part for c in checks if c.passed is None],
        "not_run_checks": [c.part for c in not_run],
    }
    return parts, details
