"""The ledger's SQL schema as a list of forward migrations, versioned in `PRAGMA user_version`.

Migration N takes a file from version N-1 to N. The current version is `len(MIGRATIONS)`. Add a
migration by appending to the list; never edit one that has shipped, since files in the field
already carry its effect.
"""

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Migration:
    """One step forward: a description for error messages and the function that applies it.

    `apply` runs inside the migration's transaction; it must use `conn.execute` (not
    `executescript`, which would commit half-way).
    """

    description: str
    apply: Callable[[sqlite3.Connection], None]


def _statements(*sql: str) -> Callable[[sqlite3.Connection], None]:
    """A migration body that executes the given statements in order."""

    def apply(conn: sqlite3.Connection) -> None:
        for statement in sql:
            conn.execute(statement)

    return apply


_V1 = _statements(
    """
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        source TEXT NOT NULL,
        started_at REAL NOT NULL,
        ended_at REAL,
        scenario_id TEXT,
        scenario_hash TEXT,
        split TEXT,
        heldout_set_id TEXT,
        policy TEXT,
        seed INTEGER,
        repeat INTEGER,
        outcome TEXT,
        reward REAL,
        reward_parts TEXT NOT NULL DEFAULT '{}',
        failure_labels TEXT NOT NULL DEFAULT '[]',
        excluded_from_training INTEGER NOT NULL DEFAULT 0,
        consent INTEGER NOT NULL DEFAULT 1,
        metadata TEXT NOT NULL DEFAULT '{}'
    )
    """,
    "CREATE INDEX sessions_started ON sessions (started_at)",
    "CREATE INDEX sessions_scenario ON sessions (scenario_id)",
    "CREATE INDEX sessions_policy ON sessions (policy)",
    """
    CREATE TABLE turns (
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        turn_index INTEGER NOT NULL,
        adapter TEXT,
        created_at REAL NOT NULL,
        request TEXT NOT NULL,
        prompt_token_ids TEXT,
        completion_token_ids TEXT,
        logprobs TEXT,
        token_exact INTEGER NOT NULL DEFAULT 0,
        generated_text TEXT NOT NULL DEFAULT '',
        spoken_text TEXT,
        interrupted INTEGER NOT NULL DEFAULT 0,
        finish_reason TEXT,
        usage TEXT NOT NULL DEFAULT '{}',
        tool_calls TEXT NOT NULL DEFAULT '[]',
        timestamps TEXT NOT NULL DEFAULT '{}',
        redacted INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (session_id, turn_index)
    )
    """,
    """
    CREATE TABLE tool_calls (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        turn_index INTEGER,
        call_id TEXT,
        name TEXT NOT NULL,
        arguments TEXT NOT NULL,
        result TEXT,
        error TEXT,
        started_at REAL NOT NULL,
        duration_ms REAL,
        state_diff TEXT
    )
    """,
    "CREATE INDEX tool_calls_session ON tool_calls (session_id)",
    """
    CREATE TABLE latencies (
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        user_turn INTEGER NOT NULL,
        user_stopped_at REAL,
        stt_final_at REAL,
        llm_request_at REAL,
        llm_first_token_at REAL,
        tts_first_audio_at REAL,
        bot_started_at REAL,
        bot_stopped_at REAL,
        heard_gap_ms REAL,
        endpointing_ms REAL,
        stt_ms REAL,
        llm_ttft_ms REAL,
        tts_ttfb_ms REAL,
        v2v_ms REAL,
        interrupted INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (session_id, user_turn)
    )
    """,
    """
    CREATE TABLE scores (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        value REAL NOT NULL,
        detail TEXT NOT NULL DEFAULT '{}',
        UNIQUE (session_id, name)
    )
    """,
    """
    CREATE TABLE adapters (
        name TEXT PRIMARY KEY,
        path TEXT NOT NULL,
        base_model TEXT NOT NULL,
        parent TEXT,
        created_at REAL NOT NULL,
        training_run TEXT,
        training_data TEXT NOT NULL DEFAULT '[]',
        config TEXT NOT NULL DEFAULT '{}',
        metrics TEXT NOT NULL DEFAULT '{}'
    )
    """,
    """
    CREATE TABLE live_pointer (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        adapter TEXT NOT NULL,
        moved_at REAL NOT NULL,
        receipt TEXT,
        previous TEXT
    )
    """,
)

_V2 = _statements(
    # The recorder (from frames) and the simulator (from the world) both write a tool call under
    # the model's call id; they merge into one row found through this index.
    "CREATE INDEX tool_calls_by_call_id ON tool_calls (session_id, call_id)",
)

_V3 = _statements(
    # Every held-out scenario hash ever seen: a session whose scenario hash is here never trains,
    # whatever folder its file sat in or whatever `split:` it declared.
    """
    CREATE TABLE heldout_hashes (
        scenario_hash TEXT PRIMARY KEY,
        scenario_id TEXT NOT NULL,
        heldout_set_id TEXT,
        first_seen_at REAL NOT NULL
    )
    """,
    # One row per receipt the gate wrote: promotion checks a receipt against this, never trusts
    # the file alone.
    """
    CREATE TABLE gate_receipts (
        receipt_sha256 TEXT PRIMARY KEY,
        receipt_id TEXT NOT NULL,
        verdict TEXT NOT NULL,
        candidate TEXT NOT NULL,
        incumbent TEXT NOT NULL,
        heldout_set_id TEXT,
        path TEXT,
        created_at REAL NOT NULL
    )
    """,
)

_TRAINING = _statements(
    # Turns of a scripted expert are demonstrations (SFT only, never RL).
    "ALTER TABLE turns ADD COLUMN demonstration INTEGER NOT NULL DEFAULT 0",
)

_SERVICE = _statements(
    # The side service's durable job queue: one row per submitted job, run one at a time in
    # submission order; a job found `running` when the service starts was interrupted.
    """
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        state TEXT NOT NULL,
        params TEXT NOT NULL DEFAULT '{}',
        result TEXT,
        error TEXT,
        submitted_at REAL NOT NULL,
        started_at REAL,
        ended_at REAL,
        attempts INTEGER NOT NULL DEFAULT 0
    )
    """,
    "CREATE INDEX jobs_state ON jobs (state, submitted_at)",
    # Each job's progress, in order: what GET /jobs/{id}/events streams.
    """
    CREATE TABLE job_events (
        job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        at REAL NOT NULL,
        event TEXT NOT NULL,
        data TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (job_id, seq)
    )
    """,
)

_AUDIO_CHANNEL = _statements(
    # The caller-side response gap of a text-mode call (caller line sent -> first agent text),
    # kept apart from `heard_gap_ms` (audio) and `v2v_ms` (voice to voice): a text call
    # has no voice-to-voice evidence.
    "ALTER TABLE latencies ADD COLUMN response_gap_ms REAL",
)

_SCORE_SOURCES = _statements(
    # Scores come from several hands (the simulator, an evaluation platform, a person, the
    # nightly judge): one row per (session, name, source), so a retried webhook replaces its
    # own score and never another source's. SQLite cannot change a UNIQUE constraint in place,
    # so the table is rebuilt; the scores already there were the simulator's.
    """
    CREATE TABLE scores_by_source (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        value REAL NOT NULL,
        detail TEXT NOT NULL DEFAULT '{}',
        source TEXT NOT NULL DEFAULT 'simulator',
        explanation TEXT,
        external_id TEXT,
        received_at REAL,
        UNIQUE (session_id, name, source)
    )
    """,
    "INSERT INTO scores_by_source (id, session_id, name, value, detail) "
    "SELECT id, session_id, name, value, detail FROM scores",
    "DROP TABLE scores",
    "ALTER TABLE scores_by_source RENAME TO scores",
    "CREATE INDEX scores_source ON scores (source, session_id)",
)

_DUELS = _statements(
    # People in the loop: a duel is one moment of a recorded call (its prompt ids) and two
    # replies sampled from it by two policies, token-exact; a vote is one rater's pick of it.
    """
    CREATE TABLE duels (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        turn_index INTEGER NOT NULL,
        prompt_token_ids TEXT NOT NULL,
        context TEXT NOT NULL DEFAULT '[]',
        reply_a TEXT NOT NULL,
        reply_b TEXT NOT NULL,
        rater TEXT,
        created_at REAL NOT NULL
    )
    """,
    "CREATE INDEX duels_session ON duels (session_id)",
    """
    CREATE TABLE duel_votes (
        duel_id TEXT NOT NULL REFERENCES duels (id) ON DELETE CASCADE,
        rater TEXT NOT NULL,
        choice TEXT NOT NULL,
        note TEXT,
        shown_left TEXT NOT NULL,
        voted_at REAL NOT NULL,
        PRIMARY KEY (duel_id, rater)
    )
    """,
)

MIGRATIONS: list[Migration] = [
    Migration("create sessions, turns, tool_calls, latencies, scores, adapters, live_pointer", _V1),
    Migration("index tool calls by (session, call id)", _V2),
    Migration("held-out scenario hashes and gate receipts", _V3),
    Migration("turns: demonstration flag (training)", _TRAINING),
    Migration("the side service's job queue and job events", _SERVICE),
    Migration("text-mode caller-side response gap on latencies", _AUDIO_CHANNEL),
    Migration("scores: one per (session, name, source), explanation, external id", _SCORE_SOURCES),
    Migration("preference duels on a call's moment, and the raters' votes", _DUELS),
]
"""Forward migrations; entry N-1 takes a file from version N-1 to N."""


def current_version() -> int:
    """The schema version this install writes (read at call time so tests can extend the list)."""
    return len(MIGRATIONS)
