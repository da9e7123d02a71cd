"""The side service: the HTTP face of the loop (`pipecat_rl.loop`), beside the bot.

- `settings`, `security`: configuration, the bearer token, the bind rule, path confinement;
- `bodies`: request and response bodies;
- `jobs`: the durable job queue's worker, one function per job kind, cooperative cancelling;
- `routers`: one per resource (jobs, adapters, receipts, live, sessions);
- `scores`: the bodies of a call's scores (`/sessions/{call_id}/scores`);
- `app`: the FastAPI app; `docs`: its documentation pages, served offline.

The night loop itself (`pipecat_rl.loop`) runs without it; the cycle job calls `run_cycle`.
"""

from pipecat_rl.service.settings import ServiceSettings

__all__ = ["ServiceSettings"]
