"""The receipt page's forks: for each fork gated, its shared prefix and both continuations.

A fork (`scenarios.fork`) replays a recorded call's first turns before either policy answers, so
both arms heard the same call up to the hand-off: the page shows that prefix once, then what
each policy made of it, side by side. Each fork shows its first paired run (its first seed),
read back from the ledger: the newest session of each policy that replayed that fork with that
seed. Nothing here decides anything; the checks read the paired scores only.
"""

import html
from typing import Any

from pipecat_rl.gate.receipt import GateReceipt, ScenarioRow
from pipecat_rl.ledger import Ledger, SessionRecord
from pipecat_rl.ledger.transcript import conversation


def _replay(ledger: Ledger, row: ScenarioRow, policy: str) -> SessionRecord | None:
    seed = row.seeds[0] if row.seeds else None
    for session in ledger.sessions(scenario_id=row.scenario, policy=policy):
        replayed = isinstance(session.metadata.get("fork"), dict)
        if replayed and (seed is None or session.seed == seed):
            return session
    return None


def _lines(entries: list[dict[str, Any]]) -> str:
    said = []
    for e in entries:
        if e["role"] == "tool_call":
            args = ", ".join(f"{k}={v!r}" for k, v in e["arguments"].items())
            call = html.escape(f"{e['name']}({args})")
            said.append(f"<div><i>tool</i> <code>{call}</code></div>")
        else:
            who = "caller" if e["role"] == "user" else "agent"
            said.append(f"<div><b>{who}:</b> {html.escape(str(e['content']))}</div>")
    return "".join(said) or "<div><i>nothing</i></div>"


def forks_section(r: GateReceipt, ledger: Ledger | None) -> str:
    """One block per fork gated: the prefix, then the candidate's and incumbent's calls."""
    if ledger is None:
        return ""
    blocks = []
    for row in r.scenarios:
        cand = _replay(ledger, row, r.candidate.name)
        inc = _replay(ledger, row, r.incumbent.name)
        if cand is None or inc is None:
            continue
        fork = cand.metadata["fork"]
        at = int(fork["at"])
        shared = conversation(ledger.turns(cand.id)[:at])
        after = [conversation(ledger.turns(s.id))[len(shared) :] for s in (cand, inc)]
        blocks.append(
            f'<h3>{html.escape(row.scenario)}</h3><p class="detail">Call '
            f"{html.escape(str(fork['session']))}, its first {at} agent turn(s) replayed as "
            f"recorded (seed {cand.seed}):</p>{_lines(shared)}"
            f"<table><tr><th>{html.escape(r.candidate.name)} (candidate)</th>"
            f"<th>{html.escape(r.incumbent.name)} (incumbent)</th></tr>"
            f"<tr><td>{_lines(after[0])}</td><td>{_lines(after[1])}</td></tr></table>"
        )
    if not blocks:
        return ""
    return (
        '<h2 id="forks">Forks: one recorded prefix, two continuations</h2><p class="detail">'
        "Descriptive: each fork's first paired run; receipt.json holds every score.</p>"
        + "".join(blocks)
    )
