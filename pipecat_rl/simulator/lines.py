"""Each line of a simulated call as it is said, for whoever listens (`simulate -v`).

`simulator.run(..., on_line=...)` is the hook: every caller and agent line and every tool
execution of every call this process runs reaches it at once, tagged with its call, so calls
run side by side stay readable. The runner sets the listener for the run (a context variable, so
the episode runner's signature, which Ray also serves, stays as it is) and each episode wires
its transport pair and world to it. Episodes run elsewhere (Ray) send no lines: their
transcript arrives with the episode.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipecat_rl.simulator.junit import line_text, tool_text

if TYPE_CHECKING:
    from pipecat_rl.simulator.transport import Line, LocalTransportPair
    from pipecat_rl.simulator.world import ToolExecution, World


@dataclass(frozen=True)
class CallLine:
    """One line of one call, as it happened: `caller: ...`, `agent: ...` or `tool ...`."""

    scenario_id: str
    repeat: int
    mode: str
    """The channel, `text` or `audio`."""
    text: str

    @property
    def case(self) -> str:
        """The call it belongs to, named as the runner's logs and the JUnit report name it."""
        return f"{self.scenario_id}#{self.repeat}"


LineListener = Callable[[CallLine], None]

_listener: ContextVar[LineListener | None] = ContextVar("pipecat_rl_line_listener", default=None)


@contextmanager
def listening(on_line: LineListener | None) -> Iterator[None]:
    """Send every line of the calls run inside this block to `on_line` (None: to nobody)."""
    token = _listener.set(on_line)
    try:
        yield
    finally:
        _listener.reset(token)


def watch(
    pair: "LocalTransportPair", world: "World | None", scenario_id: str, repeat: int, mode: str
) -> None:
    """Wire one call's pair (and world, for tool executions) to the run's listener, if any."""
    listener = _listener.get()
    if listener is None:
        return

    def said(text: str) -> None:
        listener(CallLine(scenario_id, repeat, mode, text))

    def on_line(line: "Line") -> None:
        said(line_text(line))

    def on_execution(execution: "ToolExecution") -> None:
        said(tool_text(execution))

    pair.on_line = on_line
    if world is not None:
        world.on_execution = on_execution
