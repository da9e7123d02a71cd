"""How the side service is configured: where its data lives, who may call it, what it drives."""

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from pipecat_rl import defaults
from pipecat_rl.ledger.store import LedgerLocation

TOKEN_ENV = "PIPECAT_RL_SERVICE_TOKEN"
"""Environment variable holding the bearer token (used when --token is not given)."""

DEFAULT_MAX_BODY_BYTES = 64 * 1024
"""Job requests are small JSON documents; anything bigger is refused before it is parsed."""


class ServiceSettings(BaseModel):
    """One service instance: its data directory, ledger, token and the bot's vLLM."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    data_dir: Path
    """Every path a request names must resolve inside this folder."""
    ledger: LedgerLocation
    """The ledger holding sessions, adapters, the live pointer and the job queue: a SQLite file
    or a postgresql:// URL (one the bots record into too)."""
    token: str | None = None
    """Bearer token; None only on a loopback address."""
    host: str = "127.0.0.1"
    port: int = 8765
    llm_url: str | None = None
    """The bot's vLLM: promotions load adapters here before the pointer moves."""
    model: str = defaults.MODEL
    """The base model (a packaged name or an HF folder): what train jobs train on, and what an
    embedded vLLM serves when a job needs one and `llm_url` is not set (with `llm_url`, the
    model it serves)."""
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0)
    poll_s: float = Field(default=0.2, gt=0)
    """How often the worker and event streams look at the ledger for news."""


def resolve_token(explicit: str | None) -> str | None:
    """--token, else $PIPECAT_RL_SERVICE_TOKEN, else None (empty strings count as unset)."""
    return explicit or os.environ.get(TOKEN_ENV) or None
