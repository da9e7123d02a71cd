"""The ledger: one SQLite file holding every session, turn, tool call, latency, score and adapter.

Or one PostgreSQL database (`Ledger("postgresql://...")`, the extra `pipecat-rl[postgres]`) that
many bot processes write at once: the same parts and SQL, the differences all in `dialect`.

Records (`records`) are frozen pydantic models; a session's outcome is one type
(`scoring.outcome`, re-exported here as `SessionOutcome`). The store (`store`) is one `Ledger`
over parts, one per group of tables (`sessions`, `scores`, `adapters`, `receipts`, `queue`), whose
schema (`schema`) is versioned and migrated forward on open; what may
train is defined once (`eligibility`), live calls by the scorers it trusts (`LiveTrust`), and
why live calls are kept out is counted by the same rules (`live_exclusions`).
"""

from pipecat_rl.ledger.eligibility import LiveExclusions, LiveTrust, live_exclusions
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
from pipecat_rl.ledger.scores import PostedScore, ScoreIn
from pipecat_rl.ledger.store import (
    BUSY_TIMEOUT_S,
    DEFAULT_LEDGER_NAME,
    LEDGER_ENV,
    Ledger,
    NotInLedgerError,
    ledger_file_missing,
    resolve_ledger_path,
)
from pipecat_rl.scoring.outcome import SessionOutcome

__all__ = [
    "BASE_ADAPTER",
    "BUSY_TIMEOUT_S",
    "DEFAULT_LEDGER_NAME",
    "LEDGER_ENV",
    "AdapterRecord",
    "LatencyRecord",
    "Ledger",
    "LiveExclusions",
    "LivePointer",
    "LiveTrust",
    "NotInLedgerError",
    "PostedScore",
    "ScoreIn",
    "ScoreRecord",
    "SessionOutcome",
    "SessionRecord",
    "Source",
    "Split",
    "ToolCallRecord",
    "TurnRecord",
    "ledger_file_missing",
    "live_exclusions",
    "resolve_ledger_path",
]
