"""The night loop: simulate → filter → train → gate → promote, resumable, recorded as events.

- `config`: `loop.yaml` as a typed `LoopConfig`;
- `cycle`: the stages and `run_cycle`, the one entry point the CLI's `cycle` verb and the side
  service's cycle job both call;
- `drafts`: scenario drafts grown from failed calls, simulated or live, for review.

It runs without the HTTP service: `service/` is one face of it, `pipecat-rl cycle` another.
"""

import importlib
from typing import Any

# Names resolve lazily (PEP 562): reading a loop file imports neither the cycle's stages nor what
# they reach, so CLI verbs and request bodies that only need the config start fast.
_EXPORTS = {
    "LoopConfig": "config",
    "load_loop_config": "config",
    "CycleSummary": "cycle",
    "run_cycle": "cycle",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pipecat_rl.loop' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
