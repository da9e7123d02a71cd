"""Serving fails closed and dies with its parent; a run stops when its LLM server is gone.

The fast tests use stand-ins (a tiny admin server, a sleeping "engine"); the one marked `slow`
starts the real `pipecat-rl llm serve` beyond loopback with a key, checks what a stranger gets,
then SIGKILLs it and looks for any engine process left.
"""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from pipecat_rl.cli import app
from pipecat_rl.cli.common import EXIT_UNAVAILABLE, EXIT_USAGE
from pipecat_rl.errors import ConfigError, ServingError
from pipecat_rl.serving.server import (
    API_KEY_ENV,
    LOAD_ADAPTER_TIMEOUT_S,
    VLLMAdmin,
    VLLMServer,
    free_port,
    guarded,
)
from tests.robust_helpers import (
    CLINIC,
    ROOT,
    cli_env,
    long_scenario,
    recorded_turns,
    start_fake_vllm,
)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _wait_gone(pids: list[int], limit_s: float = 30) -> list[int]:
    deadline = time.monotonic() + limit_s
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_the_engine_group_dies_with_a_sigkilled_parent(tmp_path):
    """A parent that starts an 'engine' (which forks a worker of its own) is SIGKILLed."""
    pids = tmp_path / "pids"
    engine = (
        "import os, subprocess, sys, time\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{worker.pid}}')\n"
        "time.sleep(600)\n"
    )
    parent = (
        "import subprocess, sys, time\n"
        "from pipecat_rl.serving.server import guarded\n"
        f"command, tie = guarded([sys.executable, '-c', {engine!r}])\n"
        "subprocess.Popen(command, **tie)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", parent], env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    try:
        deadline = time.monotonic() + 30
        while not (pids.exists() and len(pids.read_text().split()) == 2):
            assert time.monotonic() < deadline, "the engine did not start"
            time.sleep(0.05)
        engine_pid, worker_pid = map(int, pids.read_text().split())
        assert _alive(engine_pid) and _alive(worker_pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert _wait_gone([engine_pid, worker_pid]) == []
    finally:
        proc.kill()


def test_guard_runs_the_command_and_passes_its_exit_code():
    command, tie = guarded([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert subprocess.run(command, **tie, timeout=30).returncode == 3


def test_the_server_pid_leads_its_process_group_while_it_runs(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    server = VLLMServer(tmp_path)
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]  # stands in for vLLM
    monkeypatch.setattr(server, "command", lambda: sleeper)

    async def healthy() -> None:
        return None

    monkeypatch.setattr(server, "_wait_healthy", healthy)
    assert server.pid is None
    asyncio.run(server.start())
    pid = server.pid
    assert pid is not None and server.running and os.getpgid(pid) == pid
    asyncio.run(server.stop())
    assert server.pid is None and _wait_gone([pid]) == []


def test_a_bind_beyond_loopback_needs_a_key(tmp_path, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    (tmp_path / "config.json").write_text("{}")
    for host in ("0.0.0.0", "192.168.1.20", "my-host.example"):
        with pytest.raises(ConfigError, match="without an API key"):
            asyncio.run(VLLMServer(tmp_path, host=host, port=8123).start())
    server = VLLMServer(tmp_path, host="0.0.0.0", api_key="s3cret")
    assert "--disable-fastapi-docs" in server.command()
    assert server.environment()["VLLM_API_KEY"] == "s3cret"
    assert "s3cret" not in " ".join(server.command())  # not on a `ps`-visible command line
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert VLLMServer(tmp_path, host="0.0.0.0").api_key == "from-env"
    loopback = VLLMServer(tmp_path)
    assert "--disable-fastapi-docs" not in loopback.command()
    result = CliRunner().invoke(app, ["llm", "serve", "--host", "0.0.0.0", "--api-key", ""])
    assert result.exit_code == EXIT_USAGE and "--api-key" in result.stderr


class _Admin(BaseHTTPRequestHandler):
    """A stand-in for vLLM's model and LoRA routes, demanding a bearer key."""

    served = {"base"}
    posts: list[tuple[str, dict]] = []

    def _authorised(self) -> bool:
        if self.headers.get("Authorization") == "Bearer k":
            return True
        self.send_response(401)
        self.end_headers()
        return False

    def _json(self, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        if self._authorised():
            self._json({"data": [{"id": m, "owned_by": "vllm"} for m in sorted(self.served)]})

    def do_POST(self):  # noqa: N802
        if not self._authorised():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).posts.append((self.path, body))
        if self.path.endswith("/load_lora_adapter"):
            self.served.add(body["lora_name"])
        else:
            self.served.discard(body["lora_name"])
        self._json({})

    def log_message(self, *args):
        pass


@pytest.fixture
def admin_server():
    _Admin.served, _Admin.posts = {"base", "live-v1"}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Admin)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_admin_sends_the_key_and_refuses_to_replace_a_served_name(
    admin_server, tmp_path, monkeypatch
):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with pytest.raises(ServingError, match="API key"):
        VLLMAdmin(admin_server).models()
    monkeypatch.setenv(API_KEY_ENV, "k")  # the one setting reaches the admin client
    admin = VLLMAdmin(admin_server)
    with pytest.raises(ServingError, match="already serves 'live-v1'"):
        admin.load_adapter("live-v1", adapter)
    assert _Admin.posts == []  # nothing was unloaded or loaded
    admin.load_adapter("live-v1", adapter, replace=True)
    assert [p for p, _ in _Admin.posts] == ["/v1/unload_lora_adapter", "/v1/load_lora_adapter"]
    cli = CliRunner()
    url = ["--llm-url", admin_server]
    refused = cli.invoke(app, ["llm", "load-adapter", "live-v1", str(adapter), *url])
    assert refused.exit_code == EXIT_UNAVAILABLE and "--replace" in refused.stderr
    ok = cli.invoke(app, ["llm", "load-adapter", "new-v2", str(adapter), *url, "--json"])
    assert ok.exit_code == 0, ok.output
    assert "new-v2" in json.loads(ok.stdout)["models"]


def test_a_busy_server_is_told_from_a_gone_one_and_an_adapter_load_may_take_long(
    admin_server, tmp_path, monkeypatch
):
    """CI once saw `llm load-adapter` fail "cannot reach the LLM server (timed out)" against a
    server that was up, loading between two engine steps of a busy CPU."""
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        with pytest.raises(ServingError, match="no answer within 1 s.*up but busy"):
            VLLMAdmin(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=1.0).models()
    with pytest.raises(ServingError, match="cannot reach"):
        VLLMAdmin(f"http://127.0.0.1:{free_port()}", timeout=0.5).models()
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    monkeypatch.setenv(API_KEY_ENV, "k")
    waits: dict[str, float] = {}
    sent = httpx.request

    def request(method: str, url: str, **kwargs):
        waits[url.rsplit("/", 1)[-1]] = kwargs["timeout"]
        return sent(method, url, **kwargs)

    monkeypatch.setattr(httpx, "request", request)
    VLLMAdmin(admin_server, timeout=5.0).load_adapter("new-v3", adapter)
    assert waits == {"models": 5.0, "load_lora_adapter": LOAD_ADAPTER_TIMEOUT_S}


def test_a_run_whose_server_dies_stops_launching_episodes(tmp_path):
    port = free_port()
    env = cli_env()
    fake = start_fake_vllm(port, env)
    ledger = tmp_path / "ledger.db"
    try:
        sim = subprocess.Popen(
            [sys.executable, "-c", "from pipecat_rl.cli import main; main()", "simulate",
             str(long_scenario(tmp_path)), "--bot", str(CLINIC / "bot.py"), "--persona",
             "scripted", "--llm-url", f"http://127.0.0.1:{port}/v1", "--repeats", "6", "-c", "1",
             "--ledger", str(ledger), "--json"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while not recorded_turns(ledger):
            assert sim.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        fake.kill()  # the model server dies in the middle of the first episode
        out, err = sim.communicate(timeout=300)
    finally:
        fake.kill()
    assert sim.returncode == EXIT_UNAVAILABLE, err[-3000:]
    assert "stopped answering" in err and "Traceback" not in err
    report = json.loads(out)
    outcomes = [e["outcome"] for e in report["episodes"]]
    assert outcomes.count("not_run") >= 4 and "pass" not in outcomes
    assert report["server_gone"]
    from pipecat_rl.ledger import Ledger

    with Ledger(ledger) as store:
        sessions = store.sessions()
        assert len(sessions) == 6 - outcomes.count("not_run")  # nothing written for those
        assert not store.training_turns()  # the errored episode's turns do not train


@pytest.mark.slow
@pytest.mark.integration
def test_llm_serve_beyond_loopback_refuses_strangers_and_dies_with_sigkill(tmp_path):
    port = free_port("0.0.0.0")
    env = {**os.environ, "PYTHONPATH": str(ROOT), API_KEY_ENV: "k-9"}
    serve = subprocess.Popen(
        [sys.executable, "-c", "from pipecat_rl.cli import main; main()", "llm", "serve",
         "--host", "0.0.0.0", "--port", str(port), "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        info = json.loads(_read_json(serve))
        assert info["url"].endswith(f":{port}/v1")
        engine = _descendants(serve.pid)
        assert engine, "no engine process found under `llm serve`"
        # An address other than loopback, as a stranger on the network would use.
        address = _lan_address() or "127.0.0.1"
        root = f"http://{address}:{port}"
        stranger = httpx.post(
            f"{root}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/tmp"}
        )
        assert stranger.status_code == 401
        assert httpx.get(f"{root}/v1/models").status_code == 401
        assert httpx.get(f"{root}/docs").status_code == 404
        assert httpx.get(f"{root}/openapi.json").status_code == 404
        assert "base" in VLLMAdmin(root, api_key="k-9").models()
        serve.send_signal(signal.SIGKILL)
        serve.wait(10)
        assert _wait_gone(engine, 60) == []
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more
    finally:
        serve.kill()
        for pid in _descendants(serve.pid):
            os.kill(pid, signal.SIGKILL)


def _read_json(proc: subprocess.Popen) -> str:
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("}"):
            return "".join(lines)
    raise AssertionError("`llm serve` exited before it was ready")


def _descendants(pid: int) -> list[int]:
    """Every process started (directly or not) by `pid`, or in the groups those lead."""
    children: dict[int, list[int]] = {}
    groups: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            children.setdefault(int(fields[1]), []).append(int(entry.name))
            groups.setdefault(int(fields[2]), []).append(int(entry.name))
    found, stack = set(), [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    for leader in list(found):
        found.update(groups.get(leader, []))
    return sorted(found)


def _lan_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks a route
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


FAKE_VLLM = r"""
import http.server, os, subprocess, sys, threading, time
port, pids, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(pids, "w").write(f"{os.getpid()} {engine.pid}")
dead = threading.Event()

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code, body = 404, b""
        if self.path == "/health":
            code = 503 if dead.is_set() else 200
        elif self.path == "/v1/models":
            code, body = 200, b'{"data": [{"id": "base"}]}'
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("(APIServer) INFO fake vLLM ready", flush=True)
engine.wait()
dead.set()
print("(EngineCore) ERROR [core.py:1512] EngineCore encountered a fatal error.", flush=True)
print("(EngineCore) ERROR [core.py:1512] RuntimeError: the engine was killed", flush=True)
print("(APIServer) ERROR [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: "
      "EngineCore encountered an issue.", flush=True)
print("(APIServer) INFO shutdown chatter " * 3, flush=True)
if mode == "exits":
    sys.exit(1)
if mode == "closes its port":  # what `llm serve` sat on: no listener, the process still there
    server.shutdown()
    server.server_close()
time.sleep(600)
"""
"""A stand-in for vLLM: an API process on `port` with an 'engine' child whose pids it writes to
`pids`; when the engine dies it logs vLLM's errors, then `/health` answers 503 ("503"), or it
closes its port and lingers ("closes its port"), or it exits ("exits")."""

DEATHS = ["503", "closes its port", "exits"]


def _fake_vllm(server: VLLMServer, pids: Path, mode: str) -> list[str]:
    return [sys.executable, "-c", FAKE_VLLM, str(server.port), str(pids), mode]


def _kill_engine(pids: Path) -> None:
    deadline = time.monotonic() + 30
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        assert time.monotonic() < deadline, "the fake vLLM did not start"
        time.sleep(0.05)
    os.kill(int(pids.read_text().split()[1]), signal.SIGKILL)


@pytest.mark.parametrize("mode", DEATHS)
def test_a_server_whose_engine_dies_raises_with_its_log_tail(tmp_path, monkeypatch, mode):
    (tmp_path / "config.json").write_text("{}")
    server = VLLMServer(tmp_path, log_path=tmp_path / "vllm.log")
    pids = tmp_path / "pids"
    monkeypatch.setattr(server, "command", lambda: _fake_vllm(server, pids, mode))
    with pytest.raises(ServingError, match="not running"):
        server.check_alive()
    asyncio.run(server.start())
    try:
        server.check_alive()  # serving: nothing to say
        _kill_engine(pids)
        killed, error = time.monotonic(), None
        while error is None and time.monotonic() - killed < 20:
            try:
                server.check_alive()
            except ServingError as e:
                error = str(e)
            time.sleep(0.1)
        assert error is not None, "the engine's death went unnoticed"
        assert time.monotonic() - killed < 10  # at once, not after a client's retries
        assert "died" in error and "Last lines of" in error and "shutdown chatter" in error
        assert "First error it logged: RuntimeError: the engine was killed" in error
        with pytest.raises(ServingError, match="died"):  # and every time after
            server.check_alive()
    finally:
        asyncio.run(server.stop())
    assert _wait_gone([int(p) for p in pids.read_text().split()]) == []


def test_llm_serve_exits_with_the_log_tail_when_its_engine_dies(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    pids, port = tmp_path / "pids", free_port()
    serve = (
        "import sys\n"
        "from pipecat_rl.serving.server import VLLMServer\n"
        f"VLLMServer.command = lambda self: [sys.executable, '-c', {FAKE_VLLM!r}, "
        f"str(self.port), {str(pids)!r}, 'closes its port']\n"
        "from pipecat_rl.cli import main\n"
        "main()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", serve, "llm", "serve", "--model", str(tmp_path / "model"),
         "--port", str(port), "--json"],
        env=cli_env(PIPECAT_RL_CACHE=str(tmp_path / "cache")), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert json.loads(_read_json(proc))["models"] == ["base"]  # serving
        _kill_engine(pids)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_UNAVAILABLE, err[-3000:]
    assert "died" in err and "shutdown chatter" in err  # the log's tail
    assert "First error it logged: RuntimeError: the engine was killed" in err
    assert "died" in json.loads(out)["error"]  # --json: the error as a document too
    assert "Traceback" not in err
    assert _wait_gone([int(p) for p in pids.read_text().split()]) == []
