"""Where pipecat-rl keeps files: one cache folder for prepared models and vLLM's own cache."""

import os
from pathlib import Path


def cache_dir() -> Path:
    """The project cache: `PIPECAT_RL_CACHE`, else `$XDG_CACHE_HOME/pipecat-rl`, else ~/.cache."""
    explicit = os.environ.get("PIPECAT_RL_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "pipecat-rl"
