"""Zero-line recording: `PIPECAT_SETUP_FILES=$(pipecat-rl setup-file) python bot.py`.

Pipecat imports this file and calls `setup_pipeline_worker(worker)` for every PipelineWorker the
process builds, before its processors start. Inside a `record_session()` context (the simulator, the
gate) the session labels come from the context; otherwise the call is a live one, recorded into
the ledger named by `PIPECAT_RL_LEDGER` (else ./pipecat-rl.db), with consent taken from
`PIPECAT_RL_CONSENT` (default 1) and names to redact from `PIPECAT_RL_REDACT_NAMES`.

`simulator/setup_file.py` is the simulator's own setup file: both are files Pipecat loads by
path, one per role, and a simulated episode loads both (it adapts the bot, this records it).
"""

import os
from pathlib import Path

from loguru import logger

from pipecat_rl.recording.recorder import install
from pipecat_rl.recording.redaction import Redactor
from pipecat_rl.recording.session import SessionInfo, current_recording


def setup_file_path() -> Path:
    """Path of this file, for `PIPECAT_SETUP_FILES`."""
    return Path(__file__).resolve()


async def setup_pipeline_worker(worker) -> None:  # noqa: ANN001 - Pipecat's hook signature
    """Install the recorder on `worker`; never raises into the bot."""
    try:
        if current_recording() is not None:
            await install(worker)
            return
        names = [n for n in os.environ.get("PIPECAT_RL_REDACT_NAMES", "").split(",") if n.strip()]
        redact = names or os.environ.get("PIPECAT_RL_REDACT", "0") == "1"
        await install(
            worker,
            session=SessionInfo(consent=os.environ.get("PIPECAT_RL_CONSENT", "1") == "1"),
            redactor=Redactor(names=[n.strip() for n in names]) if redact else None,
        )
    except Exception as e:
        logger.error(f"pipecat-rl: recorder not installed, this call is not recorded: {e}")


async def setup_worker_runner(runner) -> None:  # noqa: ANN001 - Pipecat's hook signature
    """Nothing to do per runner (defined so that Pipecat does not warn it is missing)."""
