"""A throwaway Ray cluster on loopback for the executor tests: a head and node processes.

Each node is a `ray start` in a process group of its own, so a test kills exactly the node it
started (`kill`), and teardown stops the groups it started, never Ray processes by name. (Ray's
workers run in groups of their own and exit when their node's raylet is gone.)
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pipecat_rl.serving.server import free_port

RAY = str(Path(sys.executable).with_name("ray"))
NODE_FLAGS = (
    "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--object-store-memory", "100000000",
    "--disable-usage-stats",
)  # fmt: skip
AUTH_OFF = {"RAY_AUTH_MODE": "disabled"}
"""Loopback only: no token (Ray would otherwise enable one if a token file is lying around)."""
START_TIMEOUT_S = 180.0
STOP_GRACE_S = 3.0


@dataclass
class Cluster:
    """A head on a loopback port and the node processes added to it."""

    address: str
    temp_dir: Path
    groups: list[int] = field(default_factory=list)
    """The process group of each node (the head's first), as started."""

    def add_node(self, env: dict[str, str] | None = None) -> int:
        """Start one more node (1 CPU), with `env` over this process's; returns its group."""
        return self._start(["--address", self.address], env)

    def _start(self, flags: list[str], env: dict[str, str] | None) -> int:
        process = subprocess.Popen(
            [RAY, "start", *flags, *NODE_FLAGS],
            env={**os.environ, **AUTH_OFF, **(env or {})},
            process_group=0,  # its own group (to kill it), in this session and its CPU priority
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.groups.append(process.pid)
        out, _ = process.communicate(timeout=START_TIMEOUT_S)  # returns once the node is up
        if process.returncode != 0:
            raise RuntimeError(f"ray start failed ({process.returncode}):\n{out[-3000:]}")
        return process.pid

    def kill(self, group: int) -> None:
        """Kill one node at once (SIGKILL to its group): a machine lost mid-run."""
        _signal(group, signal.SIGKILL)

    def stop(self) -> None:
        """Stop every node started here: SIGTERM to its group, then SIGKILL what is left."""
        for group in reversed(self.groups):
            _signal(group, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(alive(g) for g in self.groups):
            time.sleep(0.2)  # waiting for processes to exit, not synchronising a test
        for group in self.groups:
            _signal(group, signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def alive(group: int) -> bool:
    """Whether any process of `group` still runs (a zombie left unreaped does not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(pgrp) == group and state != "Z":
            return True
    return False


def _signal(group: int, sig: signal.Signals) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


@contextmanager
def ray_head() -> Iterator[Cluster]:
    """A Ray head (1 CPU, 100 MB object store, no dashboard) on a free loopback port."""
    # Ray's socket paths live under its temp dir and must stay short: not pytest's tmp_path.
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    port = free_port()
    cluster = Cluster(address=f"127.0.0.1:{port}", temp_dir=temp_dir)
    try:
        cluster._start(
            ["--head", "--port", str(port), "--include-dashboard=false",
             "--ray-client-server-port", str(free_port()), "--temp-dir", str(temp_dir)],
            None,
        )  # fmt: skip
        yield cluster
    finally:
        cluster.stop()
