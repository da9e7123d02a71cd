"""The one exception tree of pipecat-rl, split by the boundary where things fail.

```
PipecatRLError
├── ConfigError          a flag, environment variable or config file is wrong
├── LedgerError          the ledger file cannot be opened, migrated or written
├── ModelError           a model cannot be found or prepared
├── ServingError         the LLM server would not start, or refused an admin request
├── RecordingError       the recorder could not capture a turn (never raised into a pipeline)
├── ScenarioError        a scenario file is invalid (names file, field and reason)
│   └── UnsupportedScenarioError  valid for Pipecat, but not runnable here (skipped, warned)
├── SimulationError      the simulator itself failed (a failed call is data, not this)
├── TrainingError        a training run cannot proceed
└── GateError            the gate cannot decide from what it was given
```

Every message says what to do next.
"""


class PipecatRLError(Exception):
    """Root of every error pipecat-rl raises on purpose."""


class ConfigError(PipecatRLError):
    """A flag, environment variable or configuration file is invalid."""


class LedgerError(PipecatRLError):
    """The ledger cannot be opened, migrated or written."""


class ModelError(PipecatRLError):
    """A model cannot be located or prepared for serving."""


class ServingError(PipecatRLError):
    """The LLM server failed to start, died, or refused an admin request."""


class RecordingError(PipecatRLError):
    """The recorder could not capture something; logged, never raised into a call."""


class ScenarioError(PipecatRLError):
    """A scenario file is invalid."""


class UnsupportedScenarioError(ScenarioError):
    """A scenario file Pipecat accepts that the simulator cannot run (it is skipped)."""


class SimulationError(PipecatRLError):
    """The simulator failed as a harness (not a failed simulated call)."""


class TrainingError(PipecatRLError):
    """A training run cannot proceed."""


class GateError(PipecatRLError):
    """The gate cannot decide from its inputs."""
