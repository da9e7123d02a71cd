"""The ledger: one SQLite file holding every session, turn, tool call, latency, score and adapter.

Records (`records`) are frozen pydantic models; the store (`store`) maps them onto tables whose
schema (`schema`) is versioned and migrated forward on open.
"""

from pipecat_rl.ledger.records import (
    BASE_ADAPTER,
    AdapterRecord,
    LatencyRecord,
    LivePointer,
    ScoreRecord,
    SessionRecord,
    Source,
    Split,
    ToolCallRecord,
    TurnRecord,
)
from pipecat_rl.ledger.store import (
    BUSY_TIMEOUT_S,
    DEFAULT_LEDGER_NAME,
    LEDGER_ENV,
    Ledger,
    NotInLedgerError,
    resolve_ledger_path,
)

__all__ = [
    "BASE_ADAPTER",
    "BUSY_TIMEOUT_S",
    "DEFAULT_LEDGER_NAME",
    "LEDGER_ENV",
    "AdapterRecord",
    "LatencyRecord",
    "Ledger",
    "LivePointer",
    "NotInLedgerError",
    "ScoreRecord",
    "SessionRecord",
    "Source",
    "Split",
    "ToolCallRecord",
    "TurnRecord",
    "resolve_ledger_path",
]
