"""Held-out scenarios frozen by content, not by label.

A held-out scenario must never train, wherever its file sits and whatever it declares. So:

- **The scenario hash** (`scenario_hash`) is its identity: the canonical content of every field
  except `split` (a label, not content) and `name` (an id, not content), plus the world pack's
  code. Content pulled in by `!include` is part of the parsed fields, so it is covered too. A
  held-out file copied into `pool/`, or renamed, has the same hash.
- **The split comes from the folder** (`resolve_split`): the nearest ancestor folder named
  `heldout` or `pool` (any case) decides, however deep the file is nested under it. A `split:`
  that contradicts that folder, and a folder whose name looks like a split but is not one
  (`held_out/`, `hold-out/`, `pools/`), are errors naming the file and line.
- **The ledger remembers** every held-out hash it has seen (`heldout_hashes`, written here when a
  held-out scenario is simulated or gated). `session_split` labels a session held-out when its
  hash is there, whatever the file says; training excludes those hashes in its query.
- **One id, one content** (`check_against_ledger`): a scenario whose id was held out with other
  content is an error before any episode runs (rename an edited held-out scenario); a copy of a
  held-out scenario loaded beside it outside `heldout/` is an error too (`check_copies`).
- **The held-out set id** (`heldout_set_id`) covers the held-out scenarios' hashes (so their
  packs' code), the files' bytes, and the bytes of every file they `!include`.
"""

import hashlib
import importlib.util
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from pipecat_rl.errors import ScenarioError

if TYPE_CHECKING:
    from pipecat_rl.ledger import Ledger
    from pipecat_rl.simulator.scenario import Scenario

HELDOUT = "heldout"
POOL = "pool"
KNOWN_SPLITS = (POOL, HELDOUT)

_LOOKS_LIKE_SPLIT = re.compile(r"^(?:(?:held|hold)[\W_]*out.*|pools?)$", re.IGNORECASE)
"""Folder names a person means as a split but the loader would not read as one."""

_HASH_EXCLUDES = {"split", "name", "source_path"}


def folder_split(path: Path) -> str | None:
    """The split named by the nearest ancestor folder of `path` that names one, else None.

    Raises:
        ScenarioError: a nearer folder looks like a split name but is not one (`held_out/`).
    """
    for part in reversed(Path(path).parent.parts):
        if part.lower() in KNOWN_SPLITS:
            return part.lower()
        if _LOOKS_LIKE_SPLIT.match(part):
            raise ScenarioError(
                f"{path}: the folder {part!r} looks like a split but is not one; name it "
                f"{HELDOUT}/ or {POOL}/ (the split is read from the nearest such folder)"
            )
    return None


def resolve_split(path: Path, declared: Any, line: int | None = None) -> Any:
    """The scenario's split: its folder's, or what it declares where no folder names one.

    Raises:
        ScenarioError: the declared `split:` contradicts the folder (file, line and field named).
    """
    folder = folder_split(path)
    if declared is None:
        return folder or POOL
    if folder is not None and declared != folder:
        where = f" line {line}:" if line else ""
        raise ScenarioError(
            f"{path}:{where} split: {declared!r} contradicts its folder {folder}/; move the file "
            f"or remove the `split:` line (a scenario's split is its folder's)"
        )
    return declared


def pack_code(scenario: "Scenario") -> bytes:
    """The world pack's source: the `.py` file it names, or the named module's file."""
    path = scenario.pack_path
    if path is None and scenario.world.pack:
        try:
            spec = importlib.util.find_spec(scenario.world.pack)
        except (ImportError, ValueError):
            spec = None
        origin = getattr(spec, "origin", None)
        path = Path(origin) if origin and origin.endswith(".py") else None
    if path is not None and path.is_file():
        return path.read_bytes()
    return b""


def scenario_hash(scenario: "Scenario", schema_version: int) -> str:
    """The scenario's content identity (see the module docstring): 16 hex digits."""
    content = scenario.model_dump(mode="json", exclude=_HASH_EXCLUDES)
    digest = hashlib.sha256(f"scenario-v{schema_version}\0".encode())
    digest.update(json.dumps(content, sort_keys=True).encode())
    digest.update(b"\0pack\0" + pack_code(scenario))
    return digest.hexdigest()[:16]


def included_files(path: Path) -> list[Path]:
    """Every file `path` pulls in with `!include`, transitively.

    Paths resolve as Pipecat's loader resolves them: against the top document's folder.
    """
    found: list[Path] = []
    pending = [Path(path).resolve()]
    seen = set(pending)
    base = pending[0].parent
    while pending:
        current = pending.pop()
        try:
            node = yaml.compose(current.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # loading the scenario reports it
        for target in _include_targets(node):
            included = (base / target).resolve()
            if included not in seen:
                seen.add(included)
                found.append(included)
                pending.append(included)
    return found


def _include_targets(node: yaml.Node | None) -> Iterable[str]:
    stack = [node] if node is not None else []
    while stack:
        current = stack.pop()
        if isinstance(current, yaml.ScalarNode) and current.tag == "!include":
            yield str(current.value)
        elif isinstance(current, yaml.MappingNode):
            stack.extend(v for pair in current.value for v in pair)
        elif isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)


def heldout_set_id(scenarios: Iterable["Scenario"], files: Iterable[Path]) -> str:
    """`heldout-<hash>`: the frozen identity of a held-out set.

    Covers the held-out scenarios' ids and hashes (so their packs' code), their files' bytes,
    and the bytes of everything those files `!include`.
    """
    digest = hashlib.sha256()
    for s in sorted(scenarios, key=lambda s: s.id):
        digest.update(f"{s.id}\0{s.content_hash()}\0".encode())
    paths = {Path(f).resolve() for f in files}
    for f in list(paths):
        paths.update(included_files(f))
    for f in sorted(paths):
        digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return f"heldout-{digest.hexdigest()[:16]}"


def check_copies(scenarios: Iterable["Scenario"]) -> None:
    """Refuse a non-held-out scenario with the content of a held-out one loaded beside it.

    Raises:
        ScenarioError: naming both files.
    """
    loaded = list(scenarios)
    held = {s.content_hash(): s for s in loaded if s.split == HELDOUT}
    for s in loaded:
        twin = held.get(s.content_hash()) if s.split != HELDOUT else None
        if twin is not None:
            raise ScenarioError(
                f"{s.source_path}: scenario {s.id!r} has the content of the held-out scenario "
                f"{twin.id!r} ({twin.source_path}); a held-out scenario is held out wherever "
                "it sits: remove the copy"
            )


def check_against_ledger(ledger: "Ledger", scenarios: Iterable["Scenario"]) -> None:
    """Refuse a scenario whose id the ledger knows as held out with different content.

    Raises:
        ScenarioError: naming the file, the id and both hashes.
    """
    known = ledger.heldout_hashes()
    by_id: dict[str, list[str]] = {}
    for h, row in known.items():
        by_id.setdefault(row["scenario_id"], []).append(h)
    for s in scenarios:
        h = s.content_hash()
        if h not in known and s.id in by_id:
            raise ScenarioError(
                f"{s.source_path}: name: scenario {s.id!r} was held out with other content "
                f"(hash {', '.join(by_id[s.id])}, now {h}); one id must keep one content: give "
                "the edited scenario a new name"
            )


def session_split(
    ledger: "Ledger", scenario: "Scenario", heldout_set: str | None
) -> tuple[str, str | None]:
    """The split and held-out set a session of `scenario` is recorded under.

    A held-out scenario's hash is recorded in the ledger; a scenario whose hash the ledger has
    seen held out is held out, whatever its file says.
    """
    h = scenario.content_hash()
    if scenario.split == HELDOUT:
        ledger.record_heldout_hashes([(h, scenario.id, heldout_set)])
        return HELDOUT, heldout_set
    row = ledger.heldout_hashes().get(h)
    if row is not None:
        return HELDOUT, row["heldout_set_id"]
    return scenario.split, None
