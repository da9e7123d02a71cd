"""The clinic's scripted expert, except on a node told to die: there the first call it takes
kills its own Ray node (its raylet's process group, then its own worker: SIGKILL) mid-call, as
a lost machine would.

`PIPECAT_RL_TEST_DOOM` names a folder (set only in that node's environment); the first call
claims `killed` in it (written with the session id) and kills the node; no other call does.
"""

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "clinic"))
import expert  # noqa: E402  (the clinic folder first: expert imports its bot beside it)

DOOM_ENV = "PIPECAT_RL_TEST_DOOM"


async def run_bot(transport, runner_args):
    """Die in this call if this node is doomed and nothing has died yet; else the expert."""
    doom = os.environ.get(DOOM_ENV)
    if doom:
        try:
            fd = os.open(Path(doom) / "killed", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.write(fd, runner_args.session_id.encode())
            os.close(fd)
            os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)  # the raylet's group: the node
            os.kill(os.getpid(), signal.SIGKILL)  # and this worker (Ray gives it its own group)
    return await expert.run_bot(transport, runner_args)
