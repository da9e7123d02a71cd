"""Pool growth: a scenario file drafted from each explained failure, marked for review.

An explained failure is a call that failed and says why: a verified simulated call with failure
labels (misheard slot, dead loop, tool error, ...), or a live call whose deciding scorer failed
it with an explanation. A simulated failure's draft is the scenario it failed, renamed; a live
failure's is written from the call itself: a persona and goal from what the caller said, the
caller's lines as its script, the values the agent's tool calls carried as its facts, and no
world (the reviewer adds the pack it needs). Both carry a header that says where they came from,
what went wrong and how the call went, are written to a drafts folder outside the pool (nothing
trains on one until a person reviews it and moves it into the pool), and never go under the
held-out folder: the held-out set never grows. What a live draft keeps of the call is redacted
as the recorder redacts (`processors.redaction.Redactor`).
"""

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import yaml

from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import Ledger, SessionRecord
from pipecat_rl.ledger.transcript import conversation
from pipecat_rl.recording.redaction import Redactor
from pipecat_rl.scoring import SessionOutcome

_NAME = re.compile(r"^name:\s*(\S.*)$", re.MULTILINE)
_SHOWN_LINES = 10
"""How many lines of the call a draft's header shows."""


def _outside_heldout(drafts_dir: Path, heldout: Path | None) -> None:
    if heldout is not None and drafts_dir.resolve().is_relative_to(heldout.resolve()):
        raise ConfigError(
            f"drafts go to {drafts_dir}, inside the held-out folder {heldout}; the held-out set "
            "never grows: point `drafts` elsewhere"
        )


def draft_from_failures(
    ledger: Ledger,
    session_ids: list[str],
    scenarios,
    drafts_dir: Path,
    *,
    heldout: Path,
) -> list[Path]:
    """Write one draft per (scenario, labels) among the failed, labelled sessions given.

    Returns the drafts written (an existing draft is kept as it is, not duplicated).

    Raises:
        ConfigError: `drafts_dir` lies inside the held-out folder.
    """
    _outside_heldout(drafts_dir, heldout)
    by_id = {s.id: s for s in scenarios}
    written: list[Path] = []
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for sid in session_ids:
        session = ledger.session(sid)
        labels = tuple(sorted(set(session.failure_labels) - {"recovered"}))
        scenario = by_id.get(session.scenario_id or "")
        if session.outcome != SessionOutcome.FAIL or not labels or scenario is None:
            continue
        if (scenario.id, labels) in seen or scenario.source_path is None:
            continue
        seen.add((scenario.id, labels))
        written.append(_write_draft(scenario, session, labels, drafts_dir))
    return written


def _header(session: SessionRecord, source: str, why: list[str], said: list[tuple[str, str]]):
    """The review banner, where the draft came from, what went wrong, and the call as it went."""
    lines = [
        "# DRAFT FOR REVIEW: grown from a failed call; nothing trains on it until a person",
        "# reviews it and moves it into the pool folder.",
        f"# from session {session.id} (policy {session.policy}, {source})",
        *(f"# {line}" for line in why),
        "# the call, as it went:",
    ]
    for speaker, text in said[:_SHOWN_LINES]:
        lines.append(f"#   {speaker}: {' '.join(str(text).split())[:160]}")
    return lines


def _write(path: Path, header: list[str], body: str) -> Path:
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(header) + "\n" + body, encoding="utf-8")
    return path


def _write_draft(scenario, session, labels: tuple[str, ...], drafts_dir: Path) -> Path:
    tag = hashlib.sha256(f"{scenario.id}:{labels}".encode()).hexdigest()[:6]
    name = f"{scenario.id}_draft_{tag}"
    text = Path(scenario.source_path).read_text(encoding="utf-8")
    text = _NAME.sub(f"name: {name}", text, count=1)
    # An `!include ../world.yaml` is relative to the pool folder: point it back there.
    pool_dir = Path(scenario.source_path).parent.resolve()
    text = re.sub(
        r"!include\s+(\S+)",
        lambda m: (
            "!include " + os.path.relpath((pool_dir / m.group(1)).resolve(), drafts_dir.resolve())
        ),
        text,
    )
    said = [
        (turn.get("speaker", "?"), turn.get("text", ""))
        for turn in (session.metadata or {}).get("transcript") or []
    ]
    header = _header(
        session, f"scenario {scenario.id}", [f"failure labels: {', '.join(labels)}"], said
    )
    return _write(drafts_dir / f"{name}.yaml", header, text)


# -- live calls --------------------------------------------------------------------------------


def draft_from_live_failures(
    ledger: Ledger,
    drafts_dir: Path,
    *,
    since: float | None = None,
    heldout: Path | None = None,
    redactor: Redactor | None = None,
) -> list[Path]:
    """Write one draft per live call started since `since` that failed with an explanation.

    A call fails with an explanation when its deciding scorer's `success` failed it and said
    why (`metadata.verdict`, written by `Ledger.post_score`). Returns the drafts written or
    already there (one per call, kept as it is once written).

    Raises:
        ConfigError: `drafts_dir` lies inside the held-out folder.
    """
    _outside_heldout(drafts_dir, heldout)
    redactor = redactor or Redactor()
    written = []
    for session in reversed(ledger.sessions(source="live", since=since)):
        verdict = session.metadata.get("verdict") or {}
        if session.outcome != SessionOutcome.FAIL or not verdict.get("explanation"):
            continue
        call = redactor.value(conversation(ledger.turns(session.id)))
        if not any(m["role"] == "user" for m in call):
            continue
        written.append(_write_live_draft(session, verdict, call, redactor, drafts_dir))
    return written


def live_scenario(session_id: str, call: list[dict[str, Any]], explanation: str) -> dict:
    """A scenario for review from one live call: the caller's lines are its script."""
    said = [m["content"] for m in call if m["role"] == "user"]
    facts: dict[str, Any] = {}
    for m in call:
        if m["role"] == "tool_call":
            facts.update(m["arguments"])  # what the agent heard the caller give it
    rules = [{"when": ".*", "say": line, "times": 1} for line in said]
    rules[-1]["end_call"] = True
    return {
        "name": f"live_{re.sub(r'[^A-Za-z0-9_-]+', '_', session_id)}_draft",
        "persona": f"The caller of live call {session_id}, saying what they said on it.",
        "goal": f"What the caller asked for on the call, which opened: {said[0]!r}",
        "success": f"REVIEW: what the agent had to do. The call failed: {explanation}",
        "max_turns": max(len(said) + 2, 4),
        "facts": facts,
        "script": {"rules": rules},
    }


def _write_live_draft(
    session: SessionRecord,
    verdict: dict[str, Any],
    call: list[dict[str, Any]],
    redactor: Redactor,
    drafts_dir: Path,
) -> Path:
    explanation = redactor.text(" ".join(str(verdict["explanation"]).split()))
    body = live_scenario(session.id, call, explanation)
    said = [("caller" if m["role"] == "user" else "agent", m["content"])
            for m in call if m["role"] in ("user", "assistant")]  # fmt: skip
    why = [
        f"failed by {verdict.get('source')}: {explanation[:400]}",
        "a live call has no world: add the `world:` (and `verify:`) its tools need",
    ]
    header = _header(session, "live call", why, said)
    text = yaml.safe_dump(body, sort_keys=False, allow_unicode=True, width=100)
    return _write(drafts_dir / f"{body['name']}.yaml", header, text)
