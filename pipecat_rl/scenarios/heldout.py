"""Held-out scenarios frozen by content, not by label.

A held-out scenario must never train, wherever its file sits and whatever it declares. Two
defences, each standing without the other:

1. **Identity by meaning** (here and in `identity`): what a scenario is, whatever it is called
   and however it is spelled.
2. **Decontamination at training time** (`decontaminate`, run by the ledger's training query
   `Ledger.training_turns`): a call whose caller said what a held-out call's caller said never
   trains, whatever scenario it claims to come from; the trainer reports how many it removed.

The rules of the first:

- **The scenario hash** (`Scenario.content_hash`) is its identity: the hash of its canonical
  content by meaning (see `identity`: the validated model with its defaults, text in NFKC
  without invisible characters and with whitespace folded, the world pack by its syntax tree,
  the initial rows as the database holds them, checks and patterns in a normal form), never
  its `name` or `split`. Content pulled in by `!include` is part of the parsed fields, so it is
  covered too. A held-out file copied into `pool/`, renamed, reformatted, its `verify`
  reordered or respelled, its pack path spelled another way or its pack's comments changed,
  has the same hash.
- **Near-duplicates are refused too** (`copies_of_heldout`): a pool scenario with a held-out
  scenario's world and checks whose persona, goal and script are alike by
  `identity.NEAR_DUPLICATE_JACCARD` (token-set Jaccard, 0.8) or more is the same test; loaded
  beside the held-out set (`check_copies`, and the cycle's snapshot) it is an error naming both.
- **The split comes from the folder** (`resolve_split`): the nearest ancestor folder named
  `heldout` or `pool` (any case) decides, however deep the file is nested under it. A `split:`
  that contradicts that folder, and a folder whose name looks like a split but is not one
  (`held_out/`, `hold-out/`, `pools/`), are errors naming the file and line.
- **The ledger remembers** every held-out hash it has seen (`heldout_hashes`, written here when a
  held-out scenario is simulated or gated). `session_split` labels a session held-out when its
  hash is there, whatever the file says; training excludes those hashes in its query.
- **One id, one content** (`check_against_ledger`): a scenario whose id was held out with other
  content is an error before any episode runs (rename an edited held-out scenario); a copy or a
  near-duplicate of a held-out scenario loaded beside it outside `heldout/` is an error too
  (`check_copies`), and a scenario sharing only its world, goal and facts is a warning naming
  both.
- **The held-out set id** (`heldout_set_id`) covers the held-out scenarios' hashes (so their
  packs' code), the files' bytes, and the bytes of every file they `!include`.

Hashes made under an earlier schema (schema 1: 16 bare hex digits, of the fields as written;
later ones `s<version>-...`) stay in a ledger and keep meaning what they meant: the sessions
that carry them stay out of training wherever the ledger lists them held out, and their calls
stay in the decontamination's reference set. They no longer equal any hash computed now, so
`check_against_ledger` compares an id only with hashes of the current schema, and a copy of an
old held-out scenario is recognised through the ledger once the held-out set has been simulated
or gated again, which records its current hashes (the next gate run does); until then it is
recognised when it is loaded beside the held-out set (`check_copies`, the cycle's snapshot), and
its calls by the decontamination. Held-out set ids change with the hashes, so a cycle started
before resumes only from its snapshot stage.
"""

import hashlib
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from loguru import logger

from pipecat_rl.errors import ScenarioError
from pipecat_rl.scenarios import identity
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


def similarity(form: dict[str, Any], other: dict[str, Any]) -> float | None:
    """How alike two scenarios' callers are, from their canonical forms; None: not comparable.

    Comparable only with the same world and checks (`identity.frame_key`); then the token-set
    Jaccard of their persona, goal and script (`identity.caller_text`,
    `identity.text_similarity`).
    """
    if identity.frame_key(form) != identity.frame_key(other):
        return None
    return identity.text_similarity(identity.caller_text(form), identity.caller_text(other))


def copies_of_heldout(
    candidates: Iterable[Scenario], held: Sequence[Scenario]
) -> list[tuple[Scenario, Scenario]]:
    """Each candidate that is a held-out scenario, or nearly one, paired with it.

    A copy has a held-out scenario's hash; a near-duplicate has its world and checks and a
    caller alike by `identity.NEAR_DUPLICATE_JACCARD` or more (`similarity`). Both are refused
    where they are found. A candidate that only shares a held-out scenario's world, goal and
    facts (its caller otherwise different) is logged as a warning naming both files, since
    training on it may teach the held-out answer.
    """
    by_hash = {s.content_hash(): s for s in held}
    by_near = {k: s for s in held if (k := s.near_key()) is not None}
    held_forms = [(s, s.canonical()) for s in held]
    copies = []
    for s in candidates:
        twin = by_hash.get(s.content_hash())
        if twin is None:
            form = s.canonical()
            twin = next(
                (
                    h
                    for h, h_form in held_forms
                    if (alike := similarity(form, h_form)) is not None
                    and alike >= identity.NEAR_DUPLICATE_JACCARD
                ),
                None,
            )
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
    """Refuse a non-held-out scenario that is, or nearly is, a held-out one loaded beside it.

    Raises:
        ScenarioError: naming both files (and, for a near-duplicate, how alike they are).
    """
    loaded = list(scenarios)
    held = [s for s in loaded if s.split == HELDOUT]
    copies = copies_of_heldout([s for s in loaded if s.split != HELDOUT], held)
    if not copies:
        return
    s, twin = copies[0]
    if s.content_hash() == twin.content_hash():
        raise ScenarioError(
            f"{s.source_path}: scenario {s.id!r} has the content of the held-out scenario "
            f"{twin.id!r} ({twin.source_path}); a held-out scenario is held out wherever "
            "it sits: remove the copy"
        )
    alike = similarity(s.canonical(), twin.canonical())
    raise ScenarioError(
        f"{s.source_path}: scenario {s.id!r} is a near-duplicate of the held-out scenario "
        f"{twin.id!r} ({twin.source_path}): the same world and checks, and persona, goal and "
        f"script {alike:.0%} alike (token-set Jaccard; {identity.NEAR_DUPLICATE_JACCARD:.0%} or "
        "more is one test); remove it from the pool or make it test something else"
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
