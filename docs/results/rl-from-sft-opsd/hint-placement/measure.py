"""Where OPSD's teacher reads its hint: the divergence it gives the student on recorded turns.

    python measure.py LEDGER POLICY SINCE UNTIL [N]

The first N (12) calls POLICY made between SINCE and UNTIL (epoch seconds), every turn of its own
with a hint, rows built as the trainer builds them (`session_hint`, `opsd_row`) with the hint in
the system message (`system`) and before the reply (`turn`); for each placement, the step's
top-k forward and reverse KL as `opsd_step` measures them (lr 0, one optimiser step over all
rows), and the teacher's logprob of the student's own first sampled token beside the student's,
on tool-call turns and spoken turns. Prints JSON.
"""

import json
import statistics
import sys
from pathlib import Path

import torch

from pipecat_rl.ledger import Ledger
from pipecat_rl.training.config import TrainConfig
from pipecat_rl.training.opsd import opsd_row, opsd_step, session_hint
from pipecat_rl.training.policy import load_policy, score
from pipecat_rl.training.sft import optimizer_for


def main() -> dict:
    """Both placements on the same rows, as the module docstring says."""
    path, policy, since, until = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    n = int(sys.argv[5]) if len(sys.argv) > 5 else 12
    with Ledger(path) as ledger:
        calls = [s for s in ledger.sessions(policy=policy, since=since) if s.started_at < until]
        calls = sorted(calls, key=lambda s: s.started_at)[:n]
        recorded = [(s, ledger.turns(s.id)) for s in calls]
        adapter = Path(ledger.adapter(policy).path)
    config = TrainConfig(algo="opsd", parent=policy, mini_batches=1, out_dir=Path("/tmp/unused"))
    student = load_policy(config, adapter)
    teacher = load_policy(config, adapter, trainable=False).model.eval().requires_grad_(False)
    optimizer = optimizer_for(student, 0.0)
    out: dict = {"policy": policy, "calls": len(calls)}
    for where in ("system", "turn"):
        rows, first = [], {"tool_call": [], "spoken": []}
        for session, turns in recorded:
            for turn in turns:
                if not turn.trainable or turn.adapter != policy:
                    continue
                hint = session_hint(session, turns, turn.index)
                if not hint:
                    continue
                row = opsd_row(turn, student.tokenizer, hint, where)
                rows.append(row)
                with torch.no_grad():
                    s = score(teacher, row.student_ids, row.student_mask).logprobs[0].item()
                    t = score(teacher, row.teacher_ids, row.teacher_mask).logprobs[0].item()
                first["tool_call" if turn.tool_calls else "spoken"].append((s, t))
        step = opsd_step(student, teacher, optimizer, rows, config)
        out[where] = {
            "hinted_turns": len(rows),
            "loss_tokens": step["num_tokens"],
            "kl/forward_topk": step["kl/forward_topk"],
            "kl/reverse": step["kl/reverse"],
            "first_token_logprob": {
                kind: {
                    "turns": len(pairs),
                    "student": round(statistics.mean(p[0] for p in pairs), 3),
                    "teacher": round(statistics.mean(p[1] for p in pairs), 3),
                }
                for kind, pairs in first.items()
                if pairs
            },
        }
    return out


if __name__ == "__main__":
    from loguru import logger

    logger.remove()
    print(json.dumps(main(), indent=2))
