"""A throwaway PostgreSQL cluster on a loopback port, for the Postgres ledger's tests and benchmark.

initdb refuses root, so under root the cluster belongs to `nobody`, in a folder of its own.
"""

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_BIN_DIRS = ("/usr/local/bin", *sorted(map(str, Path("/usr/lib/postgresql").glob("*/bin"))))


def server_binaries() -> tuple[str, str] | None:
    """initdb and pg_ctl, or None where the server is not installed."""
    found = []
    for name in ("initdb", "pg_ctl"):
        path = next(
            (str(Path(d) / name) for d in _BIN_DIRS if os.access(Path(d) / name, os.X_OK)),
            shutil.which(name),
        )
        if path is None:
            return None
        found.append(path)
    return found[0], found[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def throwaway_cluster(initdb: str, pg_ctl: str) -> Iterator[str]:
    """Start a cluster (trust auth, C locale, no fsync); yield its URL; stop and remove it."""
    folder = Path(tempfile.mkdtemp(prefix="pipecat-rl-pg-"))
    user = pwd.getpwnam("nobody") if os.geteuid() == 0 else None
    if user is not None:
        os.chown(folder, user.pw_uid, user.pw_gid)

    def as_owner() -> None:
        if user is not None:
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)

    def run(*args: str) -> None:
        done = subprocess.run(args, preexec_fn=as_owner, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {done.stdout}{done.stderr}")

    port, data = _free_port(), folder / "data"
    try:
        run(initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "--locale=C", "-E", "UTF8",
            "--no-sync")  # fmt: skip
        options = (
            f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=200"
        )
        run(pg_ctl, "-D", str(data), "-o", options, "-l", str(folder / "log"), "-w", "start")
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            run(pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
