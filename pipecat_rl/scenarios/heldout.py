"""Held-out scenarios frozen by content, not by label.

A held-out scenario must never train, wherever its file sits and whatever it declares. So:

- **The scenario hash** (`Scenario.content_hash`) is its identity: the hash of its canonical
  content (see `identity`: what the caller and the world are, the world pack by its code, text
  whitespace-normalised, order-free lists sorted), never its `name` or `split`. Content pulled
  in by `!include` is part of the parsed fields, so it is covered too. A held-out file copied
  into `pool/`, renamed, reformatted, its `verify` reordered or its pack path spelled another
  way, has the same hash.
- **The split comes from the folder** (`resolve_split`): the nearest ancestor folder named
  `heldout` or `pool` (any case) decides, however deep the file is nested under it. A `split:`
  that contradicts that folder, and a folder whose name looks like a split but is not one
  (`held_out/`, `hold-out/`, `pools/`), are errors naming the file and line.
- **The ledger remembers** every held-out hash it has seen (`heldout_hashes`, written here when a
  held-out scenario is simulated or gated). `session_split` labels a session held-out when its
  hash is there, whatever the file says; training excludes those hashes in its query.
- **One id, one content** (`check_against_ledger`): a scenario whose id was held out with other
  content is an error before any episode runs (rename an edited held-out scenario); a copy of a
  held-out scenario loaded beside it outside `heldout/` is an error too (`check_copies`), and a
  near-duplicate (the same world, goal and facts, the rest different) is a warning naming both.
- **The held-out set id** (`heldout_set_id`) covers the held-out scenarios' hashes (so their
  packs' code), the files' bytes, and the bytes of every file they `!include`.

Hashes made before the canonical form (schema 1: 16 bare hex digits, of the fields as written)
stay in a ledger and keep meaning what they meant: the sessions that carry them stay out of
training wherever the ledger lists them held out. They no longer equal any hash computed now,
so `check_against_ledger` compares an id only with hashes of the current schema, and a copy of
an old held-out scenario is recognised through the ledger once the held-out set has been
simulated or gated again, which records its current hashes (the next gate run does); until then
it is recognised when it is loaded beside the held-out set (`check_copies`, the cycle's
snapshot). Held-out set ids change with the hashes, so a cycle started before resumes only
from its snapshot stage.
"""

import hashlib
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from loguru import logger

from pipecat_rl.errors import ScenarioError
from pipecat_rl.scenarios.identity import hash_version
from pipecat_rl.scenarios.scenario import (
    HELDOUT,
    KNOWN_SPLITS,
    POOL,
    SCENARIO_SCHEMA_VERSION,
    Scenario,
)

if TYPE_CHECKING:
    from pipecat_rl.ledger import Ledger

_LOOKS_LIKE_SPLIT = re.compile(r"^(?:(?:held|hold)[\W_]*out.*|pools?)$", re.IGNORECASE)
"""Folder names a person means as a split but the loader would not read as one."""


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


def heldout_set_id(scenarios: Iterable[Scenario], files: Iterable[Path]) -> str:
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


def copies_of_heldout(
    candidates: Iterable[Scenario], held: Sequence[Scenario]
) -> list[tuple[Scenario, Scenario]]:
    """Each candidate with the content of a held-out scenario, paired with it.

    A candidate that is only a near-duplicate of one (the same world, goal and facts, the rest
    different) is not a copy: it is logged as a warning naming both files, since training on it
    may teach the held-out answer.
    """
    by_hash = {s.content_hash(): s for s in held}
    by_near = {k: s for s in held if (k := s.near_key()) is not None}
    copies = []
    for s in candidates:
        twin = by_hash.get(s.content_hash())
        if twin is not None:
            copies.append((s, twin))
        elif (near := by_near.get(s.near_key())) is not None:
            logger.warning(
                f"{s.source_path}: scenario {s.id!r} has the world, goal and facts of the "
                f"held-out scenario {near.id!r} ({near.source_path}); if it tests the same "
                "thing, remove it from the pool (training on it may teach the held-out answer)"
            )
    return copies


def check_copies(scenarios: Iterable[Scenario]) -> None:
    """Refuse a non-held-out scenario with the content of a held-out one loaded beside it.

    A near-duplicate of one is a warning (`copies_of_heldout`).

    Raises:
        ScenarioError: naming both files.
    """
    loaded = list(scenarios)
    held = [s for s in loaded if s.split == HELDOUT]
    copies = copies_of_heldout([s for s in loaded if s.split != HELDOUT], held)
    if copies:
        s, twin = copies[0]
        raise ScenarioError(
            f"{s.source_path}: scenario {s.id!r} has the content of the held-out scenario "
            f"{twin.id!r} ({twin.source_path}); a held-out scenario is held out wherever "
            "it sits: remove the copy"
        )


def check_against_ledger(ledger: "Ledger", scenarios: Iterable[Scenario]) -> None:
    """Refuse a scenario whose id the ledger knows as held out with different content.

    Only hashes of the current schema are compared (see the module docstring).

    Raises:
        ScenarioError: naming the file, the id and both hashes.
    """
    known = ledger.heldout_hashes()
    by_id: dict[str, list[str]] = {}
    for h, row in known.items():
        if hash_version(h) == SCENARIO_SCHEMA_VERSION:
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
    ledger: "Ledger", scenario: Scenario, heldout_set: str | None
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
