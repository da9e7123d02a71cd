"""Who the candidate and incumbent are: adapter lineage and the training guard's state.

Guard states, and what the verdict does with them:

- `passed`: the training run recorded a guard value that passed.
- `failed`: it recorded one that failed. Rejects.
- `missing`: the lineage records a training run but no guard value. Rejects: a guard that is
  absent must not read as one that passed.
- `unavailable`: nothing to read a guard from (an imported adapter, a policy known only from a
  scores file, a name the ledger does not know). Reported; rejects only with `require_guard`.
- `not_applicable`: the base model, which no training run changed.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from pipecat_rl.gate.wording import count, join_and, plain, sentence
from pipecat_rl.ledger import BASE_ADAPTER, Ledger, NotInLedgerError

GuardState = Literal["passed", "failed", "missing", "unavailable", "not_applicable"]

LIVE = "live"
"""The policy name that means "whatever the ledger's live pointer serves now"."""


class Lineage(BaseModel):
    """A policy as the receipt records it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requested: str
    """The name given on the command line (may be `live`)."""
    name: str
    """The resolved policy name the runs were recorded under."""
    kind: Literal["adapter", "base", "unknown"]
    path: str | None = None
    base_model: str | None = None
    parent: str | None = None
    created_at: float | None = None
    training_run_id: str | None = None
    training_sessions: int | None = None
    guard: GuardState
    guard_detail: str


def resolve_policy(ledger: Ledger, requested: str) -> str:
    """The policy name behind `requested`: `live` reads the live pointer, others pass through.

    Before anything was promoted the base model serves, so `live` is `base` then, as `promote`
    and `llm serve --merged live` read it too (`live_note` says which it was).
    """
    if requested != LIVE:
        return requested
    pointer = ledger.live()
    return BASE_ADAPTER if pointer is None else pointer.adapter


def live_note(ledger: Ledger, flag: str, requested: str) -> str | None:
    """What `live`, given to `flag`, stood for in `ledger`, for a person to read; else None."""
    if requested != LIVE:
        return None
    pointer = ledger.live()
    if pointer is None:
        return (
            f"{flag} live: nothing was ever promoted in {ledger.path}, so the base model "
            "serves; gating against base"
        )
    return f"{flag} live: {pointer.adapter}, live in {ledger.path}"


def base_lineage(requested: str) -> Lineage:
    """Lineage of the base model: no adapter record and no training run."""
    return Lineage(
        requested=requested,
        name=BASE_ADAPTER,
        kind="base",
        guard="not_applicable",
        guard_detail="The base model: no training run changed it.",
    )


def unknown_lineage(requested: str, name: str, why: str) -> Lineage:
    """Lineage of a policy the gate has no record of (for example one from a scores file)."""
    if name == BASE_ADAPTER:
        return base_lineage(requested)
    return Lineage(
        requested=requested, name=name, kind="unknown", guard="unavailable",
        guard_detail=sentence(why),
    )


def ledger_lineage(ledger: Ledger, requested: str, name: str) -> Lineage:
    """Lineage of `name` from the ledger's adapter record, with the training guard's state."""
    if name == BASE_ADAPTER:
        return base_lineage(requested)
    try:
        adapter = ledger.adapter(name)
    except NotInLedgerError:
        return unknown_lineage(
            requested, name, f"Guard unavailable: the ledger has no adapter named {name}."
        )
    run = adapter.training_run
    guard, detail = _guard_state(run)
    return Lineage(
        requested=requested,
        name=name,
        kind="adapter",
        path=adapter.path,
        base_model=adapter.base_model,
        parent=adapter.parent,
        created_at=adapter.created_at,
        training_run_id=None if run is None else str(run.get("id")),
        training_sessions=len(adapter.training_data),
        guard=guard,
        guard_detail=detail,
    )


def _guard_state(run: dict[str, Any] | None) -> tuple[GuardState, str]:
    if run is None:
        return "unavailable", "Guard unavailable: imported adapter, no training run to read."
    run_id = run.get("id")
    guard = run.get("guard")
    if not isinstance(guard, dict) or not isinstance(guard.get("passed"), bool):
        return "missing", f"Training run {run_id} recorded no guard value."
    words = guard_words(guard)
    if guard["passed"]:
        return "passed", f"Training run {run_id}: the logprob guard passed.{words}"
    return "failed", f"Training run {run_id}: the logprob guard failed.{words}"


_GUARD_KNOWN = frozenset({
    "passed", "space", "compared_turns", "compared_tokens", "skipped_turns",
    "missing_logprobs_turns", "template_mismatches", "mean_abs_diff", "max_abs_diff",
    "per_adapter", "mean_threshold", "max_threshold", "cause", "source",
})  # fmt: skip
_SOURCES = {
    "ledger": "turns recorded in the ledger",
    "probe": "a fresh probe of the server",
    "rollouts": "the turns an online step sampled",
}


def _value_words(value: Any) -> str:
    """A recorded value in words, never a Python repr."""
    if value is None:
        return "not recorded"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return plain(value)
    if isinstance(value, dict):
        return ", ".join(f"{str(k).replace('_', ' ')} {_value_words(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(_value_words(v) for v in value)
    return str(value)


def guard_words(guard: dict[str, Any]) -> str:
    """The training guard's recorded figures as sentences (each led by a space), never a repr.

    The guard (`training.guard.run_guard`) compares the trainer's logprobs with the sampler's:
    what it compared, the mean and largest absolute differences against their limits, the same
    per adapter that sampled, why it failed, and where the turns came from. Fields it does not
    know are said as "name value".
    """
    out = []
    if guard.get("cause"):
        out.append(sentence(str(guard["cause"])))
    if "compared_tokens" in guard or "compared_turns" in guard:
        space = str(guard.get("space") or "recorded").replace("_", " ")
        counts = [
            count(int(guard[k]), noun, plural)
            for k, noun, plural in (
                ("skipped_turns", "turn skipped", "turns skipped"),
                ("missing_logprobs_turns", "turn without logprobs", "turns without logprobs"),
                ("template_mismatches", "template mismatch", "template mismatches"),
            )
            if isinstance(guard.get(k), int)
        ]  # fmt: skip
        out.append(
            f"It compared {_value_words(guard.get('compared_tokens'))} tokens over "
            f"{_value_words(guard.get('compared_turns'))} turns in the {space} space"
            + (f" ({', '.join(counts)})" if counts else "") + "."
        )  # fmt: skip
    limits = []
    for key, limit, what in (
        ("mean_abs_diff", "mean_threshold", "by {} on average"),
        ("max_abs_diff", "max_threshold", "by at most {}"),
    ):
        if key in guard:
            bound = f" (limit {_value_words(guard[limit])})" if limit in guard else ""
            limits.append(what.format(_value_words(guard[key])) + bound)
    if limits:
        out.append(f"The logprobs differ {join_and(limits)}.")
    adapters = guard.get("per_adapter")
    if isinstance(adapters, dict) and adapters:
        out.append(
            "Per adapter that sampled: "
            + "; ".join(
                f"{name}: {_value_words(v.get('tokens'))} tokens, mean "
                f"{_value_words(v.get('mean'))}, largest {_value_words(v.get('max'))}"
                if isinstance(v, dict)
                else f"{name}: {_value_words(v)}"
                for name, v in adapters.items()
            ) + "."
        )  # fmt: skip
    if guard.get("source"):
        out.append(f"Read from {_SOURCES.get(str(guard['source']), str(guard['source']))}.")
    others = [f"{k.replace('_', ' ')} {_value_words(v)}" for k, v in guard.items()
              if k not in _GUARD_KNOWN]  # fmt: skip
    if others:
        out.append(sentence(", ".join(others)))
    return "".join(f" {s}" for s in out)
