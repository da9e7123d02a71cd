"""Queue duels: moments of recorded calls, and two policies' replies sampled from each.

A moment is one recorded turn that holds its prompt ids (token-exact): the call up to there,
exactly as the model saw it. Both policies are asked for their reply to those very ids on the
same server, with the same seed, so the only difference a person sees is the policy.
"""

import random
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from loguru import logger

from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import Ledger, NotInLedgerError, TurnRecord
from pipecat_rl.ledger.duels import DuelRecord, DuelReply
from pipecat_rl.serving.server import VLLMAdmin


class Sampler(Protocol):
    """One policy's reply to prompt ids (the server's, or a test's own model)."""

    def __call__(self, policy: str, prompt_ids: list[int], seed: int) -> DuelReply:
        """Sample `policy`'s reply to `prompt_ids` with `seed`."""


class ServerSampler:
    """Replies from an OpenAI-compatible vLLM server: `/v1/completions` on the prompt's ids.

    vLLM takes a prompt as token ids and returns the sampled ids and their logprobs
    (`return_token_ids`), so nothing is re-tokenised on either side.
    """

    def __init__(self, url: str, *, temperature: float = 1.0, max_tokens: int = 64):
        self.admin = VLLMAdmin(url, timeout=120.0)
        self.temperature = temperature
        self.max_tokens = max_tokens

    def check(self, policies: Sequence[str]) -> None:
        """Refuse policies the server does not serve, before anything is sampled.

        Raises:
            ConfigError: a policy the server does not list.
        """
        served = set(self.admin.models())
        missing = [p for p in policies if p not in served]
        if missing:
            raise ConfigError(
                f"--policies: {', '.join(missing)} not served by {self.admin.root} (it serves "
                f"{', '.join(sorted(served))}); load an adapter with `pipecat-rl llm "
                "load-adapter NAME PATH`"
            )

    def __call__(self, policy: str, prompt_ids: list[int], seed: int) -> DuelReply:
        """Sample `policy`'s reply to `prompt_ids` with `seed`."""
        choice = self.admin.sample(
            policy, prompt_ids, max_tokens=self.max_tokens, temperature=self.temperature,
            seed=seed,
        )  # fmt: skip
        return DuelReply(
            policy=policy, token_ids=choice["token_ids"], text=choice["text"],
            logprobs=choice["logprobs"]["token_logprobs"], temperature=self.temperature,
        )  # fmt: skip


def _moment(turn: TurnRecord) -> bool:
    return bool(turn.token_exact and turn.prompt_token_ids and not turn.demonstration)


def find_moments(ledger: Ledger, sources: Sequence[str]) -> list[TurnRecord]:
    """The recorded turns of `sources` that hold their prompt ids, in call and turn order.

    Each source is a session id, or a scenario file or folder: the sessions recorded from
    those scenarios (by content hash, wherever the file sits now).

    Raises:
        ConfigError: a source that is neither, or sources with no such turn.
    """
    from pipecat_rl.scenarios.loading import load_scenarios

    session_ids: list[str] = []
    for source in sources:
        if Path(source).exists():
            hashes = {s.content_hash() for s in load_scenarios([source])}
            found = [s.id for s in ledger.sessions() if s.scenario_hash in hashes]
            if not found:
                raise ConfigError(
                    f"--from {source}: no session of its {len(hashes)} scenario(s) in the ledger "
                    f"{ledger.path}; simulate them first (`pipecat-rl simulate {source}`)"
                )
            session_ids += sorted(found)
            continue
        try:
            session_ids.append(ledger.session(source).id)
        except NotInLedgerError:
            raise ConfigError(
                f"--from {source!r}: neither a scenario file or folder nor a session of the "
                f"ledger {ledger.path} (`pipecat-rl ledger sessions` lists them)"
            ) from None
    moments = [t for sid in dict.fromkeys(session_ids) for t in ledger.turns(sid) if _moment(t)]
    if not moments:
        raise ConfigError(
            f"--from: the {len(set(session_ids))} session(s) hold no turn with its prompt ids "
            "(recorded through vLLM, token-exact): there is no moment to duel on"
        )
    return moments


def make_duels(
    ledger: Ledger, moments: Sequence[TurnRecord], policies: tuple[str, str], sampler: Sampler,
    *, n: int, seed: int = 0, rater: str | None = None,
) -> list[DuelRecord]:  # fmt: skip
    """Sample both policies at up to `n` moments (drawn with `seed`) and queue the duels.

    Both replies of a duel share the moment's prompt ids and the sampling seed. `rater`
    queues them for one rater (None: for anyone). Returns the duels, in the ledger now.
    """
    if policies[0] == policies[1]:
        raise ConfigError(f"--policies: {policies[0]} twice; a duel compares two policies")
    rng = random.Random(seed)
    chosen = rng.sample(list(moments), min(n, len(moments)))
    if len(chosen) < n:
        logger.warning(f"only {len(chosen)} moments to duel on, fewer than --n {n}")
    duels = []
    for turn in chosen:
        prompt = list(turn.prompt_token_ids or ())
        draw = rng.randrange(2**31)
        a, b = (sampler(p, prompt, draw) for p in policies)
        duels.append(
            DuelRecord(
                id=f"duel-{uuid.uuid4().hex[:12]}", session_id=turn.session_id,
                turn_index=turn.index, prompt_token_ids=prompt,
                context=list(turn.request.get("messages") or []), reply_a=a, reply_b=b,
                rater=rater, created_at=time.time(),
            )
        )  # fmt: skip
    ledger.add_duels(duels)
    return duels
