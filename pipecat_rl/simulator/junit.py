r"""Simulated calls as JUnit XML (`simulate --junit-xml`), and each call as lines a person reads.

CI systems (GitLab, Jenkins, Buildkite, GitHub's test reporters) show JUnit XML as pytest writes
it: `<testsuites>` holding `<testsuite>`s with their counts, one `<testcase>` per test. Each
episode is one test case: `classname` its scenario id, `name` the id and its repeat
(`routine_booking#1`), `time` the episode's duration. What goes inside follows its outcome
(`scoring.SessionOutcome`), so a red build says why without opening the ledger:

- `pass`: nothing;
- `fail`: `<failure>`, its message the part that decided it (`scoring.authoritative_part`) and
  why: the verifier's failed checks with what each found, or the judge's reason, failed metrics
  and a backstop that ended the call; its text every check, the end reason and the labels;
- `error`, `interrupted`: `<error>` with the harness's reason (the call did not run to its end);
- `unverified`, `not_run` (and any other): `<skipped>`, saying why there is no verdict.

Every case that ran carries its session id and transcript in `<system-out>`. One suite per
channel (`--mode text,audio`: two); a suite's `time` is the sum of its calls' durations (they
overlap under `--concurrency`), the root's the run's wall time when given. Characters XML 1.0
forbids (control characters, lone surrogates) are written as `\x1b`-style escapes, so no reason
or transcript line can make a file a consumer refuses. It imports no Pipecat.
"""

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from pipecat_rl.scoring import JUDGED_SUCCESS, VERIFIER, SessionOutcome, authoritative_part

if TYPE_CHECKING:  # the runner imports Pipecat; this module must not
    from pipecat_rl.simulator.runner import EpisodeResult
    from pipecat_rl.simulator.transport import Line
    from pipecat_rl.simulator.world import ToolExecution

SUITE = "pipecat-rl simulate"
"""The test suite's name (with its channel appended when a run has two)."""

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_SHOWN = 300
"""A tool result longer than this is cut in a transcript line (the ledger keeps it whole)."""


def xml_text(text: str) -> str:
    r"""`text` with every character XML 1.0 forbids written as its escape (`\x1b`, `\ud800`)."""
    return _NOT_XML.sub(lambda m: ascii(m.group())[1:-1], text)


def case_name(episode: "EpisodeResult") -> str:
    """The episode as a test: its scenario id and repeat, as the runner's logs name it."""
    return f"{episode.scenario_id}#{episode.repeat}"


def call_lines(episode: "EpisodeResult") -> list[str]:
    """The call as it went: caller and agent lines and tool calls in time order, then its end."""
    said = [(line.at, line_text(line)) for line in episode.transcript]
    tools = [(e.started_at, tool_text(e)) for e in episode.executions]
    lines = [text for _, text in sorted(said + tools, key=lambda pair: pair[0])]
    end = episode.end_reason or "no end"
    return [*lines, f"end: {end} · {episode.outcome} ({episode.duration_s:.1f} s)"]


def line_text(line: "Line") -> str:
    """One line of a call as a transcript shows it: who said what (and what was heard)."""
    return f"{line.speaker}: {line.text}" + _heard(line)


def _heard(line: "Line") -> str:
    """What the agent heard of a caller line, where noise changed it."""
    changed = line.speaker == "caller" and line.heard != line.text
    return f"  [heard: {line.heard}]" if changed else ""


def tool_text(execution: "ToolExecution") -> str:
    """One tool execution as a transcript shows it: its call and result (cut) or error."""
    args = ", ".join(f"{k}={v!r}" for k, v in execution.arguments.items())
    if execution.error is not None:
        return f"tool {execution.name}({args}) error: {execution.error}"
    result = json.dumps(execution.result, default=str, ensure_ascii=False)
    cut = result if len(result) <= _SHOWN else result[:_SHOWN] + "…"
    return f"tool {execution.name}({args}) → {cut}"


def verdict(episode: "EpisodeResult") -> tuple[str, str, str] | None:
    """What the episode is as a test: (`failure`/`error`/`skipped`, message, text); None: passed.

    The message is one line naming why; the text adds what a reader checks next.
    """
    outcome = episode.outcome
    if outcome == SessionOutcome.PASS:
        return None
    if outcome == SessionOutcome.FAIL:
        return ("failure", *_failure(episode))
    if outcome in (SessionOutcome.ERROR, SessionOutcome.INTERRUPTED):
        why = episode.error or f"the call ended {outcome} without a reason"
        return "error", f"{outcome}: {why}", why
    if outcome == SessionOutcome.NOT_RUN:
        why = episode.error or "not run: the run stopped before this call started"
        return "skipped", why, why
    if outcome == SessionOutcome.UNVERIFIED:
        unscored = "; ".join(f"{part}: {why}" for part, why in episode.unscored.items())
        why = "unverified: no verify checks and no judge verdict decide this call"
        return "skipped", why + (f" ({unscored})" if unscored else ""), why
    return "skipped", f"no verdict: outcome {outcome}", f"outcome {outcome}"


def _failure(episode: "EpisodeResult") -> tuple[str, str]:
    part = authoritative_part(episode.reward_parts)
    checks = [f"{'ok' if c.passed else 'FAILED'}: {c.check} ({c.detail})" for c in episode.checks]
    if part == VERIFIER:
        failed = [c for c in episode.checks if not c.passed]
        said = "; ".join(f"{c.check} ({c.detail})" for c in failed) or "no check named"
        message = f"verifier: {len(failed)} of {len(episode.checks)} check(s) failed: {said}"
    elif part == JUDGED_SUCCESS:
        detail = episode.score_details.get(JUDGED_SUCCESS, {})
        bits = [f"judge:success: {detail.get('reason') or 'the judge said the goal was not met'}"]
        if detail.get("ended_by"):
            bits.append(f"the call was ended by {detail['ended_by']}")
        if detail.get("failed_metrics"):
            bits.append(f"metrics below min_score: {', '.join(detail['failed_metrics'])}")
        message = "; ".join(bits)
    else:
        message = "failed, with no deciding part recorded"
    labels = ", ".join(episode.labels) or "none"
    text = [message, *checks, f"end reason: {episode.end_reason}", f"labels: {labels}"]
    return message, "\n".join(text)


def _case(episode: "EpisodeResult") -> ET.Element:
    case = ET.Element(
        "testcase",
        classname=xml_text(episode.scenario_id),
        name=xml_text(case_name(episode)),
        time=f"{episode.duration_s:.3f}",
    )
    found = verdict(episode)
    if found is not None:
        kind, message, text = found
        child = ET.SubElement(case, kind, message=xml_text(message))
        if kind != "skipped":
            child.set("type", str(episode.outcome))
        child.text = xml_text(text)
    if episode.session_id:  # a call that ran: where it is in the ledger, and how it went
        out = ET.SubElement(case, "system-out")
        head = f"session {episode.session_id} (pipecat-rl ledger show {episode.session_id})"
        out.text = xml_text("\n".join([head, *call_lines(episode)]))
    return case


def _counted(element: ET.Element, cases: Sequence[ET.Element], time_s: float) -> None:
    element.set("tests", str(len(cases)))
    for count, tag in (("failures", "failure"), ("errors", "error"), ("skipped", "skipped")):
        element.set(count, str(sum(1 for c in cases if c.find(tag) is not None)))
    element.set("time", f"{time_s:.3f}")


def junit_element(
    episodes: Iterable["EpisodeResult"], *, wall_s: float | None = None
) -> ET.Element:
    """`<testsuites>` with one `<testsuite>` per channel, one `<testcase>` per episode.

    Args:
        episodes: a run's episodes (every channel's, in the order they are to be listed).
        wall_s: the run's wall time, the root's `time` (default: the sum of the calls').
    """
    by_mode: dict[str, list[EpisodeResult]] = {}
    for episode in episodes:
        by_mode.setdefault(episode.mode, []).append(episode)
    root = ET.Element("testsuites", name=SUITE)
    every: list[ET.Element] = []
    for mode, run in by_mode.items():
        name = SUITE if len(by_mode) == 1 else f"{SUITE} ({mode})"
        suite = ET.SubElement(root, "testsuite", name=name)
        cases = [_case(e) for e in run]
        _counted(suite, cases, sum(e.duration_s for e in run))
        suite.extend(cases)
        every += cases
    total = sum(float(s.get("time", 0)) for s in root)
    _counted(root, every, total if wall_s is None else wall_s)
    return root


def junit_xml(episodes: Iterable["EpisodeResult"], *, wall_s: float | None = None) -> str:
    """The JUnit XML document of `junit_element`, declared UTF-8 and indented."""
    root = junit_element(episodes, wall_s=wall_s)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"
