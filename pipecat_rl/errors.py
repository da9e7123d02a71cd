"""The one exception tree of pipecat-rl, split by the boundary where things fail.

```
PipecatRLError
├── ConfigError          a flag, environment variable or config file is wrong
├── LedgerError          the ledger file cannot be opened, migrated or written
│   ├── NotInLedgerError     a session, turn or adapter asked for by id is not there
│   ├── LedgerLockedError    another process held the write lock past every retry
│   └── ScoreRefusedError    a score for a session that may not take one (gate, held out, open)
├── ModelError           a model cannot be found or prepared
├── ServingError         the LLM server would not start, is gone, or refused an admin request
├── ScenarioError        a scenario file is invalid (names file, line, field and reason)
│   └── UnsupportedScenarioError  valid for Pipecat, but not runnable here (skipped, warned)
├── SimulationError      the simulator itself failed (a failed call is data, not this)
├── ToolError            a world tool failed on purpose: reported to the model, never a crash
├── TrainingError        a training run cannot proceed
│   ├── NoTrainingSignalError  the ledger holds nothing this algorithm can learn from
│   ├── NotMovedError        an online version's canary is its parent's (retried, then ends RL)
│   └── GuardError           the trainer and the sampler disagree on logprobs: do not train
├── GateError            the gate cannot decide from what it was given
│   └── GateStopped          its own runs were stopped (a cancelled job): no receipt written
└── BudgetExhausted      a cycle's next stage would overrun its wall-time budget (resumable stop)
```

Outside the tree, on purpose: `JobCancelled`, a `BaseException` as asyncio's `CancelledError` is,
so code that records failures as data (`except Exception`) never swallows a cancelled job.

Every message says what to do next. The CLI maps each branch to one exit code
(`pipecat_rl.cli.common.exit_code_for`). An error raised inside an asyncio task group reaches
its caller wrapped in an `ExceptionGroup` whose own message says nothing a user can act on:
`first_error` is the one place that unwraps it, for the CLI and the service's jobs alike.
"""

import asyncio
from collections.abc import Iterator
from typing import Any


class PipecatRLError(Exception):
    """Root of every error pipecat-rl raises on purpose."""


class ConfigError(PipecatRLError):
    """A flag, environment variable or configuration file is invalid."""


class LedgerError(PipecatRLError):
    """The ledger cannot be opened, migrated or written."""


class NotInLedgerError(LedgerError):
    """A session, turn or adapter asked for by id is not in the ledger (a usage error)."""


class LedgerLockedError(LedgerError):
    """A write waited out the busy timeout and every retry: another process holds the file."""


class ScoreRefusedError(LedgerError):
    """A score posted for a session whose scores may never train (gate, held out) or still open."""


class ModelError(PipecatRLError):
    """A model cannot be located or prepared for serving."""


class ServingError(PipecatRLError):
    """The LLM server failed to start, died, or refused an admin request."""


class ScenarioError(PipecatRLError):
    """A scenario file is invalid."""


class UnsupportedScenarioError(ScenarioError):
    """A scenario file Pipecat accepts that the simulator cannot run (it is skipped)."""


class SimulationError(PipecatRLError):
    """The simulator failed as a harness (not a failed simulated call)."""


class ToolError(PipecatRLError):
    """Raised by a world pack's tool to fail a call; the episode reports it to the agent."""


class TrainingError(PipecatRLError):
    """A training run cannot proceed."""


class NoTrainingSignalError(TrainingError):
    """Nothing to learn from: no rows, no contested group, no judged turn with a hint.

    The user fixes it with data (simulate more, warm-start, raise the group size), not with a
    bug report, so it has an exit code of its own.
    """


class NotMovedError(TrainingError):
    """A new version's canary is its parent's: the canary cannot show which of them is served.

    Online training answers it with more passes over the step's batch, then ends at the last
    version that did move; it names the figures in `moved`.
    """

    def __init__(self, message: str, moved: dict[str, Any] | None = None):
        super().__init__(message)
        self.moved: dict[str, Any] = dict(moved or {})
        """The canary's distance to the parent: `parent`, `max_abs_diff`, `ids_differ`, and
        the bar it had to clear: `noise` (two scorings of the parent), `threshold`."""


class GuardError(TrainingError):
    """The trainer and the sampler disagree (or there was nothing to compare): do not train."""

    def __init__(self, message: str, result: dict[str, Any] | None = None):
        super().__init__(message)
        self.result: dict[str, Any] = dict(result or {})
        """The guard's numbers: differences, thresholds, the cause named in the message."""


class GateError(PipecatRLError):
    """The gate cannot decide from its inputs."""


class GateStopped(GateError):
    """The gate's own runs were stopped before they finished; no receipt was written."""


class BudgetExhausted(PipecatRLError):
    """The next stage would overrun the cycle's wall-time budget; it stopped, resumably."""


class JobCancelled(BaseException):  # noqa: N818 (named as asyncio's CancelledError)
    """Raised inside a running service job at its first checkpoint after it was asked to stop.

    A BaseException, as asyncio's CancelledError is: code that records a failure as data
    (`except Exception` around an episode, a progress callback) must not swallow it.
    """


_CANCELLATIONS = (asyncio.CancelledError, JobCancelled, KeyboardInterrupt)
"""What a task raises because it was stopped, not because something failed."""


def first_error(error: BaseException) -> BaseException:
    """The error to report for `error`: itself, or the one an exception group stands for.

    A task group (asyncio's, nested once per group) wraps what its tasks raised; the first
    failure cancels the other tasks, so the group also holds their cancellations. The one to
    report is the first pipecat-rl error in it, depth first (its message says what to do next);
    else the first that is not a cancellation; else the first of all. Anything that is not a
    group is returned as it is.
    """
    if not isinstance(error, BaseExceptionGroup):
        return error
    leaves = list(_leaves(error))
    ours = next((e for e in leaves if isinstance(e, PipecatRLError)), None)
    if ours is not None:
        return ours
    return next((e for e in leaves if not isinstance(e, _CANCELLATIONS)), leaves[0])


def _leaves(group: BaseExceptionGroup) -> Iterator[BaseException]:
    """Every exception in `group` that is not itself a group, depth first, in order."""
    for inner in group.exceptions:
        if isinstance(inner, BaseExceptionGroup):
            yield from _leaves(inner)
        else:
            yield inner
