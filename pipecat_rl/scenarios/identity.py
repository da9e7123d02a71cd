"""A scenario's identity: its canonical content, hashed.

Two files that say the same thing are one scenario, however they spell it, so a held-out
scenario stays held out when it is copied, renamed or reformatted. What is identity is what the
caller and the world are, and how the call is judged:

- **identity**: `persona`, `goal`, `success`, `facts`, `world` (the pack's code and the initial
  rows), `verify`, `faults`, `channel`, `script`, `turns`, `context`, `stop_on_failure`,
  `metrics`, the limits (`max_turns`, `max_duration_s`, `max_silence_s`) and the modality of
  the `user:` and `judge:` blocks;
- **not identity** (`NOT_IDENTITY`): `name` (the id: renaming a file or its id must not escape
  the held-out rule), `split` (a label: the folder decides), `runs` (how often, not what),
  `simulator` and the services of `user:` / `judge:` (which LLM, TTS or STT plays a part: where
  it runs, not what the scenario is), and where the file sits.

The canonical form (`canonical`) is what is hashed:

- every string has its runs of whitespace collapsed to one space and its ends stripped (one
  extra space in the persona is the same persona);
- lists whose order means nothing are sorted: the `verify` checks, the tables an `unchanged`
  check names, the `metrics`, a `function_calls` metric's `calls`, and a table's rows when every
  row carries an `id` (rows without ids keep their order: it numbers them);
- the world pack is its code (sha256), not its path: `clinic/../clinic/world.py`,
  `clinic/world.py`, a module name and a copy of the file elsewhere are one pack, and an edited
  pack is another;
- keys are sorted (JSON). Lists whose order is behaviour stay in order: `faults` (the first
  that matches fires, and probabilities draw in turn), `script.rules` (the first match wins),
  `turns`, `context` and a table's rows without ids.

`near_content` is the coarser key of a near-duplicate: the same world, goal and facts.
"""

import hashlib
import json
from typing import Any

NOT_IDENTITY = frozenset({"name", "split", "runs", "simulator", "source_path", "parsed_turns"})
"""Scenario fields that are not part of its identity (see the module docstring)."""

HASH_DIGITS = 16


def _text(value: Any) -> Any:
    """`value` with every string's whitespace normalised, recursively."""
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, dict):
        return {k: _text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_text(v) for v in value]
    return value


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _sorted(items: list[Any] | None) -> list[Any]:
    return sorted(items or [], key=_json)


def _rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if rows and all(isinstance(r, dict) and "id" in r for r in rows):
        return sorted(rows, key=lambda r: _json(r["id"]))
    return rows


def _check(check: dict[str, Any]) -> dict[str, Any]:
    return {**check, "unchanged": sorted(check["unchanged"])} if check.get("unchanged") else check


def _metric(metric: dict[str, Any]) -> dict[str, Any]:
    return {**metric, "calls": _sorted(metric["calls"])} if metric.get("calls") else metric


def _modality(block: dict[str, Any] | None) -> str:
    return str((block or {}).get("modality") or "text")


def canonical(content: dict[str, Any], pack_code: bytes | None) -> dict[str, Any]:
    """The canonical form of a scenario's identity fields (a JSON-able dump of them).

    Args:
        content: The scenario's fields, dumped as JSON, without `NOT_IDENTITY`.
        pack_code: The world pack's source, or None when the pack names no file found here
            (its name is then what identifies it).
    """
    data = _text(content)
    world = dict(data.get("world") or {})
    if pack_code is not None:
        world["pack"] = {"sha256": hashlib.sha256(pack_code).hexdigest()}
    world["state"] = {table: _rows(rows) for table, rows in (world.get("state") or {}).items()}
    data["world"] = world
    data["verify"] = _sorted([_check(c) for c in data.get("verify") or []])
    data["metrics"] = _sorted([_metric(m) for m in data.get("metrics") or []])
    data["user"] = _modality(data.get("user"))
    data["judge"] = _modality(data.get("judge"))
    if data.get("turns") is not None:
        data["stop_on_failure"] = data.get("stop_on_failure") is not False  # Pipecat's default
    else:
        data.pop("stop_on_failure", None)
    return data


def near_content(form: dict[str, Any]) -> dict[str, Any] | None:
    """What two near-duplicates share (world, goal and facts), from a canonical form.

    None for a scenario without a goal (a scripted one): its world and facts alone say too
    little to call two scenarios the same test.
    """
    if form.get("goal") is None:
        return None
    return {"world": form.get("world"), "goal": form["goal"], "facts": form.get("facts") or {}}


def digest(form: dict[str, Any], version: int) -> str:
    """`s<version>-<16 hex digits>`: the hash of a canonical form under a schema version."""
    h = hashlib.sha256(f"scenario-v{version}\0".encode() + _json(form).encode())
    return f"s{version}-{h.hexdigest()[:HASH_DIGITS]}"


def hash_version(scenario_hash: str) -> int | None:
    """The schema version a stored hash was made under; None for a hash from before versions."""
    head, _, tail = scenario_hash.partition("-")
    if head[:1] == "s" and head[1:].isdigit() and len(tail) == HASH_DIGITS:
        return int(head[1:])
    return None
