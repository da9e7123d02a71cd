"""One OPSD optimiser step: rows scored in shared-prefix batches (ours) against one by one.

Production shapes: SmolLM2-135M, LoRA r16 / alpha 32 on the seven projections; 8 rows in the
clinic's shapes: a 541-token shared prefix (system prompt and tool schemas), then each call's own
history (100-380 tokens; pairs of rows are two turns of one call, so they share it too), the
generation header and a 23-token sampled reply (the loss); the teacher's row carries a 40-token
hint before the header. Both arms compute the same top-k forward KL loss and its gradient
(tests/test_train_math.py checks they agree to 1e-5):

- `one_by_one`: student and teacher each score every row whole (`policy.score`), as `opsd_step`
  did before the shared-prefix batches;
- `ours`: `opsd.opsd_step` (`prefix_pairs` + `batch_scores`), the default `batch_sequences` and
  `batch_tokens`.

With `LEDGER POLICY [N [WHERE]]`, the rows are instead the first N (16) hinted turns that POLICY
sampled in that ledger, built as the trainer builds them (`session_hint`, `opsd_row`, in ledger
order, so a call's turns sit together as in a step's mini-batch), the hint in the system message
or before the reply as WHERE says (`system`, the default, or `turn`: `TrainConfig.opsd_hint`).

The arms alternate in every round, in a rotating order, in one process; each arm's time is the
median of `ROUNDS` rounds. lr 0, so every round sees the same weights. Prints JSON.
"""

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from pipecat_rl.training.config import TrainConfig  # noqa: E402
from pipecat_rl.training.loss import forward_topk_kl_loss  # noqa: E402
from pipecat_rl.training.opsd import OPSDRow, opsd_step, prefix_pairs  # noqa: E402
from pipecat_rl.training.policy import load_policy, score  # noqa: E402
from pipecat_rl.training.sft import optimizer_for  # noqa: E402

PREFIX, HEADER, HINT, SAMPLED = 541, 3, 40, 23
HISTORIES = (100, 180, 260, 380)
"""Tokens of each call's own history; two turns a call, the later one 60 tokens further on."""
ROUNDS = 3
RANK, ALPHA = 16, 32


def rows(vocab: int) -> list[OPSDRow]:
    """Random ids in the clinic's shapes (time does not depend on the values)."""
    gen = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(100, vocab, (n,), generator=gen).tolist()

    prefix, header, out = ids(PREFIX), ids(HEADER), []
    for call, history in enumerate(HISTORIES):
        earlier = ids(history + 60)
        for turn, seen in enumerate((history, history + 60)):
            prompt = prefix + earlier[:seen] + header
            hinted = prefix + earlier[:seen] + ids(HINT) + header
            sampled = ids(SAMPLED)
            asked, told = [False] * len(prompt), [False] * len(hinted)
            out.append(OPSDRow(f"call{call}-turn{turn}", prompt + sampled, asked + [True] * SAMPLED,
                               hinted + sampled, told + [True] * SAMPLED))  # fmt: skip
    return out


def recorded_rows(
    ledger_path: str, policy: str, n: int, tokenizer, where: str
) -> list[OPSDRow]:
    """The first `n` hinted turns `policy` sampled in the ledger, as the trainer builds them,
    the hint placed `where` (`TrainConfig.opsd_hint`)."""
    from pipecat_rl.ledger import Ledger
    from pipecat_rl.training.opsd import opsd_row, session_hint

    out: list[OPSDRow] = []
    with Ledger(ledger_path) as ledger:
        for session in ledger.sessions(limit=100_000):
            if session.policy != policy:
                continue
            turns = ledger.turns(session.id)
            for turn in turns:
                sampled = bool(turn.completion_token_ids)
                hint = session_hint(session, turns, turn.index) if sampled else None
                if hint:
                    out.append(opsd_row(turn, tokenizer, hint, where))
                if len(out) == n:
                    return out
    return out


def one_by_one(student, teacher, optimizer, batch: list[OPSDRow], config: TrainConfig) -> None:
    """The step as it was: every row whole, student then teacher, a backward each."""
    n = sum(sum(r.student_mask) for r in batch)
    optimizer.zero_grad(set_to_none=True)
    for r in batch:
        s = score(student.model, r.student_ids, r.student_mask, keep_logits=True)
        with torch.no_grad():
            t = score(teacher, r.teacher_ids, r.teacher_mask, keep_logits=True)
        forward_topk_kl_loss(s.logits, t.logits, num_tokens=n, top_k=config.opsd_top_k).backward()
    optimizer.step()


def timed(run) -> float:
    started = time.monotonic()
    run()
    return time.monotonic() - started


def main() -> dict:
    from loguru import logger

    logger.remove()
    config = TrainConfig(algo="opsd", rank=RANK, alpha=ALPHA)
    student = load_policy(config)
    teacher = load_policy(config, trainable=False).model.eval().requires_grad_(False)
    optimizer = optimizer_for(student, 0.0)
    where = "turn"  # the synthetic rows' hint sits before the reply
    if len(sys.argv) > 2:
        n = int(sys.argv[3]) if len(sys.argv) > 3 else 16
        where = sys.argv[4] if len(sys.argv) > 4 else "system"
        batch = recorded_rows(sys.argv[1], sys.argv[2], n, student.tokenizer, where)
    else:
        batch = rows(student.model.get_base_model().config.vocab_size)
    pairs = prefix_pairs(batch, config)
    whole = sum(len(r.student_ids) + len(r.teacher_ids) for r in batch)
    computed = sum(s.computed_tokens + t.computed_tokens for s, t in pairs)
    load_before = round(os.getloadavg()[0], 2)
    arms = {
        "one_by_one": lambda: one_by_one(student, teacher, optimizer, batch, config),
        "ours": lambda: opsd_step(student, teacher, optimizer, batch, config),
    }
    for run in arms.values():  # warm-up
        run()
    times: dict[str, list[float]] = {name: [] for name in arms}
    names = list(arms)
    for r in range(ROUNDS):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(timed(arms[name]))
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {
        "model": str(student.base_dir.name),
        "threads": torch.get_num_threads(),
        "load_average_1m": {"before": load_before, "after": round(os.getloadavg()[0], 2)},
        "rows": len(batch) if len(sys.argv) < 3 else f"{len(batch)} recorded under {sys.argv[2]}",
        "hint": where,
        "loss_tokens": sum(sum(r.student_mask) for r in batch),
        "tokens_scored": {"one_by_one": whole, "ours": computed},
        "forward_batches": len(pairs),
        "rounds": ROUNDS,
        "arms": {
            name: {"median_s": round(s, 2), "all_s": [round(t, 2) for t in times[name]]}
            for name, s in medians.items()
        },
        "speedup": round(medians["one_by_one"] / medians["ours"], 2),
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
