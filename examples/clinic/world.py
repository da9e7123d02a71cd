"""The clinic's world: its schema and tool implementations, as a pipecat-rl world pack.

The same functions back the bot's own tool handlers when it runs live (against `demo_db()`),
and the simulator's per-episode world when it runs under `pipecat-rl simulate`.
"""

import sqlite3
from typing import Any

from pipecat_rl.simulator.world import ToolError, WorldPack

SCHEMA = """
CREATE TABLE patients (id INTEGER PRIMARY KEY, name TEXT NOT NULL, dob TEXT, phone TEXT);
CREATE TABLE slots (
    id INTEGER PRIMARY KEY, day TEXT NOT NULL, time TEXT NOT NULL, dentist TEXT NOT NULL,
    kind TEXT NOT NULL DEFAULT 'routine', free INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE appointments (
    id INTEGER PRIMARY KEY, confirmation TEXT NOT NULL UNIQUE, patient_id INTEGER NOT NULL,
    slot_id INTEGER NOT NULL, reason TEXT, status TEXT NOT NULL DEFAULT 'booked'
);
CREATE TABLE handoffs (id INTEGER PRIMARY KEY, reason TEXT NOT NULL, caller TEXT);
"""


def _norm(name: str) -> str:
    return " ".join(name.lower().replace("-", " ").split())


def lookup_patient(db: sqlite3.Connection, name: str, dob: str | None = None) -> dict[str, Any]:
    """Find a patient by full name (and date of birth, when given)."""
    for row in db.execute("SELECT id, name, dob FROM patients"):
        if _norm(row["name"]) == _norm(name) and (dob is None or row["dob"] == dob):
            return {"patient_id": row["id"], "name": row["name"]}
    raise ToolError(f"no patient named {name!r}")


def find_slots(db: sqlite3.Connection, kind: str = "routine", day: str | None = None) -> list:
    """Free appointment slots of a kind (routine or emergency), optionally on one day."""
    sql = "SELECT id, day, time, dentist FROM slots WHERE free = 1 AND kind = ?"
    args: list[Any] = [kind]
    if day:
        sql += " AND lower(day) = lower(?)"
        args.append(day)
    return [dict(r) for r in db.execute(sql + " ORDER BY id", args)]


def book(db: sqlite3.Connection, patient_id: int, slot_id: int, reason: str = "checkup") -> dict:
    """Book a free slot for a patient; returns the confirmation number."""
    if db.execute("SELECT 1 FROM patients WHERE id = ?", (patient_id,)).fetchone() is None:
        raise ToolError(f"no patient with id {patient_id}")
    slot = db.execute("SELECT free FROM slots WHERE id = ?", (slot_id,)).fetchone()
    if slot is None or not slot["free"]:
        raise ToolError(f"slot {slot_id} is not available")
    confirmation = f"BSD-{patient_id:04d}-{slot_id:05d}"
    db.execute(
        "INSERT INTO appointments (confirmation, patient_id, slot_id, reason) VALUES (?, ?, ?, ?)",
        (confirmation, patient_id, slot_id, reason),
    )
    db.execute("UPDATE slots SET free = 0 WHERE id = ?", (slot_id,))
    return {"confirmation": confirmation}


def cancel(db: sqlite3.Connection, confirmation: str) -> dict:
    """Cancel an appointment by its confirmation number and free its slot."""
    row = db.execute(
        "SELECT id, slot_id FROM appointments WHERE confirmation = ? AND status = 'booked'",
        (confirmation.strip().upper(),),
    ).fetchone()
    if row is None:
        raise ToolError(f"no booked appointment with confirmation {confirmation!r}")
    db.execute("UPDATE appointments SET status = 'cancelled' WHERE id = ?", (row["id"],))
    db.execute("UPDATE slots SET free = 1 WHERE id = ?", (row["slot_id"],))
    return {"cancelled": confirmation}


def transfer(db: sqlite3.Connection, reason: str, caller: str | None = None) -> dict:
    """Hand the call to a human at the front desk."""
    db.execute("INSERT INTO handoffs (reason, caller) VALUES (?, ?)", (reason, caller))
    return {"transferred": True}


PACK = WorldPack(
    schema=SCHEMA,
    tools={
        "lookup_patient": lookup_patient,
        "find_slots": find_slots,
        "book": book,
        "cancel": cancel,
        "transfer": transfer,
    },
)


def demo_db() -> sqlite3.Connection:
    """A small clinic database for running the bot live."""
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.executescript(SCHEMA)
    db.execute("INSERT INTO patients VALUES (1, 'Maria Lopez', '1984-03-12', '0612345678')")
    db.executemany(
        "INSERT INTO slots (id, day, time, dentist, kind) VALUES (?, ?, ?, ?, ?)",
        [
            (1, "Tuesday", "09:00", "Dr. Okafor", "routine"),
            (2, "Today", "16:30", "Dr. Lin", "emergency"),
        ],
    )
    db.commit()
    return db
