"""What may train: the one definition, as SQL the store runs in its queries.

A session may train only if it is not held out (judged by its scenario's content hash against every
held-out hash the ledger has seen, whatever folder the file sat in or `split:` it declared), not a
gate run, not excluded, consented, and ended with an outcome other than a harness failure. A turn
of such a session may train a policy-gradient row only if it is token-exact (ids and logprobs from
the server), its sampled-id count agrees with the server's `usage.completion_tokens`, and it was
sampled without truncation (top-p < 1 or top-k bias the importance ratio). A demonstration turn
(a scripted expert's) may train SFT only.

`ELIGIBLE_SESSION` and the turn clauses use the aliases `s` (sessions) and `t` (turns).
"""

from typing import Literal

Purpose = Literal["sft", "rl"]
"""SFT may use demonstrations; RL (GRPO, OPSD) only the policy's own sampled turns."""

NOT_TRAINABLE_OUTCOMES = ("error", "interrupted", "not_run")
"""Outcomes of sessions that never train: the harness failed, the call was cut, nothing ran."""

RECORDER_OUTCOMES = ("completed", "cancelled")
"""What the recorder writes when a call's pipeline ends; a live call keeps it as its outcome."""

SIMULATED_SOURCES = ("simulate", "gate")


def unfinished_simulation(alias: str = "s") -> str:
    """A simulated session whose result the simulator never wrote (alias `alias`).

    The recorder ends a session when the bot's pipeline stops; the simulator then writes the
    episode's outcome, reward and labels. A crash between the two leaves a simulated session
    ended with the recorder's outcome and no reward: half-written, never trained; the
    ledger's reconcile and the service's restart close it as `interrupted`.
    """
    return (
        f"({alias}.source IN {SIMULATED_SOURCES!r}"
        f" AND COALESCE({alias}.outcome, '') IN {RECORDER_OUTCOMES!r})"  # never NULL: NOT-able
    )


ELIGIBLE_SESSION = (
    "(s.split IS NULL OR s.split = 'pool') AND s.heldout_set_id IS NULL"
    " AND (s.scenario_hash IS NULL"
    " OR s.scenario_hash NOT IN (SELECT scenario_hash FROM heldout_hashes))"
    " AND s.source != 'gate' AND s.excluded_from_training = 0 AND s.consent = 1"
    " AND s.ended_at IS NOT NULL"
    f" AND (s.outcome IS NULL OR s.outcome NOT IN {NOT_TRAINABLE_OUTCOMES!r})"
    f" AND NOT {unfinished_simulation('s')}"
)
"""A session that may train (alias `s`)."""

TOKEN_EXACT_TURN = (
    "t.token_exact = 1 AND t.prompt_token_ids IS NOT NULL AND t.completion_token_ids IS NOT NULL"
    " AND t.logprobs IS NOT NULL AND json_array_length(t.prompt_token_ids) > 0"
    " AND json_array_length(t.completion_token_ids) > 0"
    " AND json_array_length(t.logprobs) = json_array_length(t.completion_token_ids)"
)
"""A turn whose ids and logprobs came from the server (alias `t`)."""

SAMPLED_TURN = (
    f"{TOKEN_EXACT_TURN} AND t.demonstration = 0"
    " AND (json_extract(t.usage, '$.completion_tokens') IS NULL"
    " OR json_extract(t.usage, '$.completion_tokens') = json_array_length(t.completion_token_ids))"
    " AND COALESCE(json_extract(t.request, '$.top_p'),"
    " json_extract(t.request, '$.extra_body.top_p'), 1.0) >= 1.0"
    " AND COALESCE(json_extract(t.request, '$.top_k'),"
    " json_extract(t.request, '$.extra_body.top_k'), -1) <= 0"
)
"""A policy-sampled turn fit for a policy-gradient row (alias `t`)."""

DEMONSTRATION_TURN = "t.demonstration = 1 AND t.generated_text IS NOT NULL"
"""A demonstration turn (alias `t`): rendered by the trainer, SFT only."""


def eligible_turn(purpose: Purpose) -> str:
    """The turn clause for `purpose`: RL takes sampled turns; SFT takes demonstrations too."""
    if purpose == "sft":
        return f"(({SAMPLED_TURN}) OR ({DEMONSTRATION_TURN}))"
    return f"({SAMPLED_TURN})"
