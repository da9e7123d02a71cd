"""The LLM endpoint a simulation talks to: a given server, or the embedded vLLM started for it.

Either way the adapters the run asks for are served before the first episode: an adapter the
server does not know yet is loaded from the path the ledger registered for it. The server is
asked for its models first, whatever the run needs loaded, so one that does not answer is a
`ServingError` before any call, never a run of calls that each fail.
"""

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

from loguru import logger

from pipecat_rl import defaults
from pipecat_rl.errors import ConfigError
from pipecat_rl.ledger import BASE_ADAPTER, Ledger
from pipecat_rl.ledger.store import NotInLedgerError
from pipecat_rl.serving.server import VLLMAdmin, VLLMServer, openai_base_url


@asynccontextmanager
async def llm_endpoint(
    llm_url: str | None,
    *,
    ledger: Ledger,
    adapters: Iterable[str] = (),
    model: str = defaults.MODEL,
    concurrency: int = defaults.CONCURRENCY,
    reserve_core: bool = False,
) -> AsyncIterator[str]:
    """Yield the `/v1` URL to use, with every name in `adapters` served there.

    `reserve_core`: the embedded server keeps vLLM's scheduler core off the model's threads
    (`VLLMServer`), as audio calls want: their speech models run beside it.
    """
    wanted = sorted({a for a in adapters if a and a != BASE_ADAPTER})
    paths = {}
    for name in wanted:
        try:
            paths[name] = ledger.adapter(name).path
        except NotInLedgerError:
            paths[name] = None  # fine if the server already serves it; checked below
    if llm_url is not None:
        _serve(VLLMAdmin(llm_url), paths)
        yield openai_base_url(llm_url)
        return
    from pipecat_rl.serving.weights import prepare_model

    server = VLLMServer(
        prepare_model(model), max_num_seqs=max(4, concurrency), max_loras=max(2, len(wanted)),
        reserve_core=reserve_core,
    )  # fmt: skip
    async with server:
        _serve(server.admin, paths)
        yield server.url


def _serve(admin: VLLMAdmin, paths: dict[str, str | None]) -> None:
    served = set(admin.models())  # asked even with nothing to load: a dead server stops us here
    for name, path in paths.items():
        if name in served:
            continue
        if path is None:
            raise ConfigError(
                f"adapter {name!r} is neither served by {admin.root} nor registered in the "
                "ledger; load it with `pipecat-rl llm load-adapter` or register it first"
            )
        logger.info(f"Loading adapter {name} from {path}")
        admin.load_adapter(name, path)
