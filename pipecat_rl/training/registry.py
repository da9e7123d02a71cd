"""The adapter registry: never-reused versioned names, folders with metadata, verified loading.

vLLM reuses a stale prefix cache when an adapter name is reloaded, so every adapter gets a new
name (`<prefix>-<algo>-v<N>-<suffix>`, N above every version the ledger or the folder has seen).
Its folder holds the peft files and `pipecat-rl-adapter.json` (parent, base model, algorithm,
config, session ids, metrics, guard, created). Loading goes through `/v1/load_lora_adapter` and is
verified twice: the name is listed by `/v1/models`, and a canary prompt's served logprobs match
the trainer's. Every adapter written or loaded is registered in the ledger's adapters table with
the guard where the gate reads it (`training_run.guard`).
"""

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

from pipecat_rl.errors import TrainingError
from pipecat_rl.ledger import AdapterRecord, Ledger
from pipecat_rl.paths import cache_dir
from pipecat_rl.serving.server import VLLMAdmin

METADATA = "pipecat-rl-adapter.json"
"""The metadata file in every adapter folder."""

CANARY_MESSAGES = [
    {"role": "system", "content": "You are a helpful receptionist."},
    {"role": "user", "content": "Hello, I would like to book an appointment, please."},
]
"""The canary prompt: a short chat every served model can render."""

CANARY_THRESHOLD = 0.05
"""Max |served - trainer| logprob over the canary's tokens (fp32 on both sides agrees to ~1e-3):
whether the server serves the weights the trainer saved. Whether a version moved off its parent
is a test against the server's measured noise instead (`canary_move`)."""

_VERSION = re.compile(r"-v(\d+)(?:-|$)")


def default_out_dir() -> Path:
    """Where adapters are written by default."""
    return cache_dir() / "adapters"


def next_name(ledger: Ledger, out_dir: Path, prefix: str, algo: str) -> str:
    """A name no adapter in the ledger or in `out_dir` has ever had, with a rising version."""
    seen = [a.name for a in ledger.adapters()]
    if out_dir.is_dir():
        seen += [p.name for p in out_dir.iterdir()]
    versions = [int(m.group(1)) for name in seen if (m := _VERSION.search(name))]
    version = max(versions, default=0) + 1
    return f"{prefix}-{algo}-v{version}-{uuid.uuid4().hex[:6]}"


def write_metadata(folder: Path, metadata: dict[str, Any]) -> None:
    """Write the adapter's metadata beside its peft files."""
    (folder / METADATA).write_text(json.dumps(metadata, indent=2, default=str))


def register(
    ledger: Ledger,
    *,
    name: str,
    folder: Path,
    base_model: str,
    parent: str | None,
    run_id: str,
    algo: str,
    config: dict[str, Any],
    session_ids: list[str],
    metrics: dict[str, Any],
    guard: dict[str, Any],
) -> AdapterRecord:
    """Register a trained adapter with its lineage, data, metrics and guard; write its metadata."""
    record = AdapterRecord(
        name=name,
        path=str(folder.resolve()),
        base_model=base_model,
        parent=parent,
        created_at=time.time(),
        training_run={"id": run_id, "algo": algo, "guard": guard},
        training_data=session_ids,
        config=config,
        metrics=metrics,
    )
    write_metadata(folder, record.model_dump(mode="json"))
    ledger.register_adapter(record)
    return record


def _canary_ids(tokenizer: Any) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        CANARY_MESSAGES, add_generation_prompt=True, tokenize=True
    )
    return list(rendered["input_ids"] if not isinstance(rendered, list) else rendered)


def served_canary(base_url: str, name: str, prompt_ids: list[int], tokens: int = 8) -> dict:
    """Sample the canary greedily from the server under `name`: sampled ids and their logprobs."""
    choice = VLLMAdmin(base_url, timeout=60.0).sample(
        name, prompt_ids, max_tokens=tokens, temperature=0.0
    )
    return {"token_ids": choice["token_ids"], "logprobs": choice["logprobs"]["token_logprobs"]}


def load_and_verify(base_url: str, name: str, folder: Path, policy: Any) -> dict[str, Any]:
    """Hot-load `folder` as `name`, then check /v1/models lists it and the canary agrees.

    Returns the canary's numbers. Raises TrainingError if the server serves something else.
    """
    import torch

    from pipecat_rl.training.policy import score

    admin = VLLMAdmin(base_url)
    admin.load_adapter(name, folder)
    if name not in admin.models():
        raise TrainingError(f"the server at {admin.root} accepted {name} but does not list it")
    prompt = _canary_ids(policy.tokenizer)
    served = served_canary(base_url, name, prompt)
    ids = [*prompt, *served["token_ids"]]
    mask = [False] * len(prompt) + [True] * len(served["token_ids"])
    was_training = policy.model.training
    policy.model.eval()
    with torch.no_grad():
        mine = score(policy.model, ids, mask).logprobs.tolist()
    policy.model.train(was_training)
    diffs = [abs(a - b) for a, b in zip(mine, served["logprobs"], strict=True)]
    result = {
        "tokens": len(diffs),
        "max_abs_diff": round(max(diffs), 6) if diffs else None,
        "passed": bool(diffs) and max(diffs) <= CANARY_THRESHOLD,
    }
    if not result["passed"]:
        raise TrainingError(
            f"canary for {name}: served logprobs differ from the trainer's by up to "
            f"{result['max_abs_diff']} (threshold {CANARY_THRESHOLD}); the server is not serving "
            "these weights (stale adapter cache, or another base model)"
        )
    return result


def canary_difference(a: dict, b: dict) -> tuple[float | None, bool]:
    """Two served canaries' largest |logprob difference|, and whether their greedy ids part.

    Only over the ids they share from the start (None: none): past a parting, the logprobs are
    of other tokens.
    """
    shared = 0
    for x, y in zip(a["token_ids"], b["token_ids"], strict=False):
        if x != y:
            break
        shared += 1
    pairs = zip(a["logprobs"][:shared], b["logprobs"][:shared], strict=True)
    diffs = [abs(x - y) for x, y in pairs]
    return (round(max(diffs), 9) if diffs else None), a["token_ids"] != b["token_ids"]


def canary_move(
    new: dict, parent: dict, parent_again: dict, *, k: float, floor: float
) -> dict[str, Any]:
    """Whether a version's served canary moved off its parent's, against the server's own noise.

    `parent` and `parent_again` are the same weights scored twice: how far they differ is the
    noise of re-scoring (batching, kernel order). The version moved when its logprobs differ
    from the parent's by more than `k` times that noise and at least `floor` (a server that
    repeats itself exactly must not make a 1e-9 change count), or its greedy ids part from the
    parent's where the parent's own two agree (ids that wander on unchanged weights show
    nothing). A parent whose two canaries share no token has no measurable noise: not moved.
    """
    noise, noisy_ids = canary_difference(parent, parent_again)
    delta, ids_differ = canary_difference(new, parent)
    threshold = None if noise is None else round(max(k * noise, floor), 9)
    beyond = threshold is not None and delta is not None and delta > threshold
    moved = (ids_differ and not noisy_ids) or beyond
    return {
        "max_abs_diff": delta, "ids_differ": ids_differ, "noise": noise,
        "noise_ids_differ": noisy_ids, "threshold": threshold, "moved": moved,
    }  # fmt: skip
