"""Zero-line recording: `PIPECAT_SETUP_FILES=$(pipecat-rl setup-file) python bot.py`.

Pipecat imports this file and calls `setup_pipeline_worker(worker)` for every PipelineWorker the
process builds, before its processors start. Inside a `record_session()` context (the simulator, the
gate) the session labels come from the context; otherwise the call is a live one, recorded into
the ledger named by `PIPECAT_RL_LEDGER` (else ./pipecat-rl.db), with consent taken from
`PIPECAT_RL_CONSENT` (default 1), redacted unless `PIPECAT_RL_REDACT=0` (default 1, as the
recorder's `redact=True`), and the names in `PIPECAT_RL_REDACT_NAMES` (comma-separated) redacted
too (`redactor_from_env`).

`simulator/setup_file.py` is the simulator's own setup file: both are files Pipecat loads by
path, one per role, and a simulated episode loads both (it adapts the bot, this records it).
"""

import os
from collections.abc import Mapping
from pathlib import Path

from loguru import logger

from pipecat_rl.recording.recorder import install
from pipecat_rl.recording.redaction import Redactor
from pipecat_rl.recording.session import SessionInfo, current_recording

REDACT_ENV = "PIPECAT_RL_REDACT"
"""1 (default): redact live calls; 0: record them as said (they never train)."""
REDACT_NAMES_ENV = "PIPECAT_RL_REDACT_NAMES"
"""Comma-separated names to redact on top of phone numbers, emails and card numbers."""
CONSENT_ENV = "PIPECAT_RL_CONSENT"
"""1 (default): the callers consented to training on their calls; 0: they did not."""

_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def setup_file_path() -> Path:
    """Path of this file, for `PIPECAT_SETUP_FILES`."""
    return Path(__file__).resolve()


def redactor_from_env(environ: Mapping[str, str] = os.environ) -> Redactor | None:
    """The live call's redactor from `PIPECAT_RL_REDACT` and `PIPECAT_RL_REDACT_NAMES`.

    Anything doubtful redacts: a value of `PIPECAT_RL_REDACT` that is neither on nor off is
    logged and taken as on, and names to redact win over `PIPECAT_RL_REDACT=0` (with a warning),
    since recording PII someone asked to remove cannot be undone.
    """
    names = [n.strip() for n in environ.get(REDACT_NAMES_ENV, "").split(",") if n.strip()]
    value = environ.get(REDACT_ENV, "1").strip().lower()
    redact = value not in _OFF
    if value not in _ON + _OFF:
        logger.error(
            f"pipecat-rl: {REDACT_ENV}={environ[REDACT_ENV]!r} is neither 1 nor 0; redacting "
            "this call (the default)"
        )
    if not redact and names:
        logger.warning(
            f"pipecat-rl: {REDACT_ENV}=0 but {REDACT_NAMES_ENV} names people to remove; "
            f"redacting this call (unset {REDACT_NAMES_ENV} to record calls unredacted)"
        )
        redact = True
    return Redactor(names=names) if redact else None


async def setup_pipeline_worker(worker) -> None:  # noqa: ANN001 - Pipecat's hook signature
    """Install the recorder on `worker`; never raises into the bot."""
    try:
        if current_recording() is not None:
            await install(worker)
            return
        redactor = redactor_from_env()
        await install(
            worker,
            session=SessionInfo(consent=os.environ.get(CONSENT_ENV, "1") == "1"),
            redactor=redactor,
            redact=redactor is not None,
        )
    except Exception as e:
        logger.error(f"pipecat-rl: recorder not installed, this call is not recorded: {e}")


async def setup_worker_runner(runner) -> None:  # noqa: ANN001 - Pipecat's hook signature
    """Nothing to do per runner (defined so that Pipecat does not warn it is missing)."""
