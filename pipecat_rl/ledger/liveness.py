"""Whether a session's writer still runs: the identity a session records, and the check on it.

Every session a recorder or the simulator starts names the process writing it (`writer_identity`:
pid, host, and the process's start time, so a pid the kernel reused reads as another process).
Only the writer ends its sessions while it runs; once it is gone, nobody will, and the ledger's
closer marks them `interrupted` (`Ledger.close_dead_sessions`).
"""

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def process_started(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, Linux), or None if it is not running.

    With the pid, this names a process uniquely: a pid reused by another process differs here.
    Where there is no /proc, a running process reads 0 (alive, start unknown).
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return 0
        return 0
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def writer_identity() -> dict[str, Any]:
    """This process as a session's writer: pid, host and the process's start time."""
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "started": process_started(pid)}


def writer_gone(writer: Mapping[str, Any] | None) -> bool:
    """Whether `writer` (a session's `metadata["writer"]`) is known to run no more.

    Known only on the writer's own host, for a recorded pid: gone when no process has that pid,
    or the one that has it started at another time. No writer recorded, or another host, is
    never "gone": this process cannot tell, so it leaves the session to whoever can.
    """
    if not writer or writer.get("host") != socket.gethostname():
        return False
    pid = writer.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool):
        return False
    started = process_started(pid)
    return started is None or started != writer.get("started")
