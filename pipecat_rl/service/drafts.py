"""Pool growth: a scenario file drafted from each explained failure, marked for review.

An explained failure is a verified call that failed with failure labels (misheard slot, dead
loop, tool error, ...). Its draft is the scenario it failed, renamed, with a header that says
where it came from and what went wrong, written to a drafts folder outside the pool: nothing
trains on it until a person reviews it and moves it into the pool. Drafts never go under the
held-out folder: the held-out set never grows.
"""

import hashlib
import os
import re
from pathlib import Path

from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import Ledger

_NAME = re.compile(r"^name:\s*(\S.*)$", re.MULTILINE)


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
    if drafts_dir.resolve().is_relative_to(heldout.resolve()):
        raise ConfigError(
            f"drafts go to {drafts_dir}, inside the held-out folder {heldout}; the held-out set "
            "never grows: point `drafts` elsewhere"
        )
    by_id = {s.id: s for s in scenarios}
    written: list[Path] = []
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for sid in session_ids:
        session = ledger.session(sid)
        labels = tuple(sorted(set(session.failure_labels) - {"recovered"}))
        scenario = by_id.get(session.scenario_id or "")
        if session.outcome != "fail" or not labels or scenario is None:
            continue
        if (scenario.id, labels) in seen or scenario.source_path is None:
            continue
        seen.add((scenario.id, labels))
        written.append(_write_draft(scenario, session, labels, drafts_dir))
    return written


def _write_draft(scenario, session, labels: tuple[str, ...], drafts_dir: Path) -> Path:
    tag = hashlib.sha256(f"{scenario.id}:{labels}".encode()).hexdigest()[:6]
    name = f"{scenario.id}_draft_{tag}"
    path = drafts_dir / f"{name}.yaml"
    if path.exists():
        return path
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
    lines = [
        "# DRAFT FOR REVIEW: grown from a failed call; nothing trains on it until a person",
        "# reviews it and moves it into the pool folder.",
        f"# from session {session.id} (policy {session.policy}, scenario {scenario.id})",
        f"# failure labels: {', '.join(labels)}",
    ]
    transcript = (session.metadata or {}).get("transcript") or []
    lines.append("# the call, as it went:")
    for turn in transcript[:10]:
        said = " ".join(str(turn.get("text", "")).split())[:160]
        lines.append(f"#   {turn.get('speaker', '?')}: {said}")
    drafts_dir.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n" + text, encoding="utf-8")
    return path
