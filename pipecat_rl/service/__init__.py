"""The side service and the night loop: simulate → train → gate → promote, beside the bot.

- `settings`, `security`: configuration, the bearer token, the bind rule, path confinement;
- `models`: request and response bodies;
- `jobs`: the durable job queue's worker, one function per job kind, cooperative cancelling;
- `routers`: one per resource (jobs, adapters, receipts, live, sessions);
- `scores`: the bodies of a call's scores (`/sessions/{call_id}/scores`);
- `drafts`: scenario drafts grown from failed calls, simulated or live, for review;
- `app`: the FastAPI app; `docs`: its documentation pages, served offline;
- `cycle`: the night loop's stages, resumable and recorded as JSONL events.
"""

from pipecat_rl.service.settings import ServiceSettings

__all__ = ["ServiceSettings"]
