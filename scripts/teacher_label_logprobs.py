"""How far a distill step moved its student towards the teacher, at the states it corrected.

A reply teacher's corrections are trained by SFT; whether the step moved the policy where it
differs is read here, not guessed from the gate: at each of a run's rolled-out turns where the
scripted teacher says something else, the summed logprob of the teacher's reply and of the
student's own sampled reply, under each adapter given (the parent, then the candidate). A
margin (teacher minus student) that rises is learning in the right direction; one still far
below zero says sampling will keep the student's reply.

It also scores states where the teacher agreed, up to AGREED_SAMPLE (default 40) of each
decision (the tools the reply calls; none: it talks), spread evenly: the logprob of that shared
reply under each adapter, on average and per decision. A step that learns a correction as a
habit (round 3: the emergency slot for every caller) shows here as agreed replies that lost
their probability, in a minute, before any gate; per decision, because a drift at the one
decision the correction must be told from (routine slot requests, round 5) hides in an average
over every task's states.

    python scripts/teacher_label_logprobs.py LEDGER TRAIN_JSON TEACHER ADAPTER_DIR [...]
    (TRAIN_JSON: `pipecat-rl train --json`'s output, whose session_ids are the rollouts)
"""

import json
import os
import sys
from pathlib import Path

import torch

from pipecat_rl.ledger import Ledger
from pipecat_rl.training import TrainConfig
from pipecat_rl.training.distill import _decision, load_teacher
from pipecat_rl.training.policy import load_policy, score
from pipecat_rl.training.rows import TrainableTurn, turn_sequence


def _logprob(model, turn, tokenizer) -> float:
    seq = turn_sequence(TrainableTurn.from_turn(turn, tokenizer))
    with torch.no_grad():
        return float(score(model, seq.input_ids, seq.loss_mask).raw_logprobs.sum())


def main(ledger: str, train_json: Path, teacher_spec: str, adapters: list[Path]) -> dict:
    """Per corrected turn and adapter: the teacher's and the student's reply logprobs."""
    config = TrainConfig(algo="distill", teacher=teacher_spec, threads=1)
    sessions = json.loads(train_json.read_text())["session_ids"]
    policies = {a.name: load_policy(config, a, trainable=False) for a in adapters}
    tokenizer = next(iter(policies.values())).tokenizer
    teacher = load_teacher(config, tokenizer)
    rows, agreed = [], []
    with Ledger(ledger) as store:
        for sid in sessions:
            scenario = store.session(sid).scenario_id
            for turn in store.turns(sid):
                if not turn.completion_token_ids:
                    continue
                if (label := teacher.label(turn)) is None:
                    if (sid, turn.index) in teacher.agreed:
                        label = teacher.labels[(sid, turn.index)]
                        agreed.append((scenario, "+".join(_decision(label)) or "talk", turn))
                    continue
                row = {"session": sid, "turn": turn.index, "scenario": scenario}
                for name, policy in policies.items():
                    t = _logprob(policy.model, label, tokenizer)
                    s = _logprob(policy.model, turn, tokenizer)
                    row[name] = {"teacher": round(t, 3), "student": round(s, 3),
                                 "margin": round(t - s, 3)}  # fmt: skip
                rows.append(row)
    mean = {
        n: round(sum(r[n]["margin"] for r in rows) / len(rows), 3) if rows else None
        for n in policies
    }
    room = int(os.environ.get("AGREED_SAMPLE", "40"))
    groups: dict[str, list] = {}
    for state in agreed:
        groups.setdefault(state[1], []).append(state)
    spread = [
        state for states in groups.values() if room > 0
        for state in states[:: max(1, -(-len(states) // room))]
    ]  # fmt: skip
    kept = [
        {"session": t.session_id, "turn": t.index, "scenario": sc, "decision": d,
         **{n: round(_logprob(p.model, t, tokenizer), 3) for n, p in policies.items()}}
        for sc, d, t in spread
    ]  # fmt: skip

    def means(rows: list[dict]) -> dict:
        return {
            n: round(sum(r[n] for r in rows) / len(rows), 3) if rows else None for n in policies
        }

    by_decision = {
        d: {"states": len(groups[d]), "scored": len(r), "mean_logprob": means(r)}
        for d in groups if (r := [k for k in kept if k["decision"] == d])
    }  # fmt: skip
    return {
        "corrections": len(rows), "mean_margin": mean, "rows": rows,
        "agreed": {"states": len(agreed), "scored": len(kept), "mean_logprob": means(kept),
                   "by_decision": by_decision, "rows": kept},
    }  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) < 5:
        raise SystemExit(__doc__)
    result = main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], [Path(a) for a in sys.argv[4:]])
    print(json.dumps(result, indent=2))
