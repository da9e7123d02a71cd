r"""A scenario's identity: its canonical content by meaning, hashed.

Two files that mean the same thing are one scenario, however they spell it, so a held-out
scenario stays held out when it is copied, renamed, reformatted or respelled. A list of
spellings can never be complete, so the canonical form is built from what each field *does*:
the validated model (every pydantic default filled in), the world as the database it builds,
the pack as its syntax tree, patterns as the matcher reads them.

What is identity is what the caller and the world are, and how the call is judged:

- **identity**: `persona`, `goal`, `success`, `facts`, `world` (the pack's code and the initial
  rows), `verify`, `faults`, `channel`, `script` (and its rules' `intent:` and a scenario's
  `intents:`, where present), `turns`, `context`, `stop_on_failure`, `metrics`, the limits
  (`max_turns`, `max_duration_s`, `max_silence_s`) and the modality of the `user:` and `judge:`
  blocks;
- **not identity** (`NOT_IDENTITY`): `name` (the id: renaming a file or its id must not escape
  the held-out rule), `split` (a label: the folder decides), `runs` (how often, not what),
  `simulator` and the services of `user:` / `judge:` (which LLM, TTS or STT plays a part: where
  it runs, not what the scenario is), and where the file sits.

The canonical form (`canonical`) is what is hashed:

- **text** (`normal_text`), in every string: Unicode NFKC (a full-width letter, a ligature, a
  non-breaking space are the plain ones), invisible characters removed (zero-width spaces and
  joiners, the BOM, soft hyphens, bidi marks: Unicode's format characters, variation selectors),
  runs of whitespace folded to one space and the ends stripped;
- **the world pack** is its code's syntax tree (`pack_form`), not its bytes or path: comments,
  blank lines, line endings, an encoding cookie or BOM, quote style and docstrings (unless the
  pack reads `__doc__`) never matter; `clinic/../clinic/world.py`, a module name and a copy of
  the file elsewhere are one pack, and a pack whose code does something else is another. A pack
  that does not parse is its bytes (sha256);
- **the initial rows** are the rows the world's database holds once they are inserted (the
  pack's `CREATE TABLE` statements run in an in-memory SQLite, as the simulator's world does):
  a column's schema default written out or left to the schema, `"1"` or `1` in an INTEGER
  column, rows with their ids in another order, an empty table listed or not, are one state.
  Without a pack found here, or one whose schema or rows do not run, the rows are kept as
  written (rows with an `id` each sorted by it);
- **verify checks** in a normal form: each `where` value typed as its column stores it (SQLite's
  affinity, as the `col IS ?` the verifier runs compares it), `count` with only `min: 1` is
  `exists`, every `unchanged` table in one sorted set, duplicate checks removed, checks sorted;
- **script patterns** (`pattern_form`), which the scripted caller matches case-insensitively
  (`re.IGNORECASE | re.DOTALL`): letters lower-cased outside escapes (`\D` stays `\D`) and
  classes with mixed-case ranges, `(?#...)` comments and a leading `(?i)`/`(?s)` dropped, the
  alternatives of each `a|b` sorted and deduplicated (not in a pattern with backreferences,
  atomic groups, possessive quantifiers or conditionals, where order can matter), and a pattern
  that always matches (`""`, `.*`, `^`) spelled `.*` (in a rule: no pattern). A pattern the
  normaliser cannot read, or whose normal form does not compile, is kept as written;
- **intents** (read where present: a script's `intents:` and its rules' `intent:`): each
  intent's patterns a set of the regexes the intent matcher makes of them
  (`intents.pattern_regex`, which ignores case and punctuation), the intents no rule names left
  out (a pack's shared file brings many), a rule's intents a sorted set;
- **script rules that change nothing** are dropped: a rule that can never fire (after an
  earlier unlimited rule with the same match, or after an unlimited match-anything rule, which
  also makes the `fallback` unreachable); a rule's `times` that cannot bind (on an `end_call`
  rule, or at least `max_turns`) is unlimited; a turn-taking move a rule does not make
  (`barge_in: null`) is left out, so a script written before rules had moves keeps its hash;
- a `channel.asr_noise` of all zero rates is no noise (`null`): its only effect is folding the
  whitespace of the caller's lines, finer than this form sees;
- lists whose order means nothing are sorted: the `verify` checks, the `metrics`, a
  `function_calls` metric's `calls`. Lists whose order is behaviour stay in order: `faults` (the
  first that matches fires, and probabilities draw in turn), `script.rules` (the first match
  wins), `turns`, `context`;
- keys are sorted (JSON).

Two texts are not one scenario because they are alike: near-duplicates (the same world and
checks, persona, goal and script alike by `text_similarity` >= `NEAR_DUPLICATE_JACCARD`) are
refused by `heldout`, not merged here. `near_content` is an older, coarser key (the same world,
goal and facts).
"""

import ast
import functools
import hashlib
import json
import re
import sqlite3
import unicodedata
from typing import Any

from pipecat_rl.scenarios.turns import MOVE_KEYS

NOT_IDENTITY = frozenset({"name", "split", "runs", "simulator", "source_path", "parsed_turns"})
"""Scenario fields that are not part of its identity (see the module docstring)."""

HASH_DIGITS = 16

NEAR_DUPLICATE_JACCARD = 0.8
"""Persona, goal and script this alike (`text_similarity`), with the same world and checks, are
one test: a pool scenario so near a held-out one is refused (`heldout.copies_of_heldout`)."""

# -- text ----------------------------------------------------------------------------------------

_INVISIBLE_EXTRA = frozenset(
    {0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180E, 0x3164, 0xFFA0}
    | set(range(0xFE00, 0xFE10))
    | set(range(0xE0100, 0xE01F0))
)
"""Invisible characters that are not format characters (Cf): the combining grapheme joiner,
Hangul fillers, Khmer inherent vowels, variation selectors."""


def _visible(text: str) -> str:
    return "".join(
        c for c in text if unicodedata.category(c) != "Cf" and ord(c) not in _INVISIBLE_EXTRA
    )


@functools.lru_cache(maxsize=1 << 16)
def normal_text(text: str) -> str:
    """`text` by meaning: NFKC, invisible characters removed, whitespace folded and stripped."""
    if text.isascii():  # NFKC leaves ASCII as it is, and no ASCII character is invisible
        return " ".join(text.split())
    return " ".join(_visible(unicodedata.normalize("NFKC", _visible(text))).split())


def _text(value: Any) -> Any:
    """`value` with every string (and every key) normalised by `normal_text`, recursively."""
    if isinstance(value, str):
        return normal_text(value)
    if isinstance(value, dict):
        return {normal_text(str(k)): _text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_text(v) for v in value]
    return value


_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """The words of `text` by meaning: `normal_text`, case-folded, runs of letters and digits."""
    return _WORD.findall(normal_text(text).casefold())


def text_similarity(a: str, b: str) -> float:
    """Token-set Jaccard of two texts' `words`: shared words over all words (1.0: both empty)."""
    left, right = set(words(a)), set(words(b))
    if not left and not right:
        return 1.0
    return len(left & right) / len(left | right)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _sorted(items: list[Any] | None) -> list[Any]:
    """`items` sorted, duplicates removed."""
    return [json.loads(k) for k in sorted({_json(i) for i in items or []})]


# -- patterns ------------------------------------------------------------------------------------

ALWAYS = ".*"
"""How a pattern that matches every text is spelled in the canonical form."""

_ALWAYS_FORMS = frozenset({"", ".*", ".*?", "^", "$", "(?:)", "(?:.*)"})
_ORDERED = re.compile(r"\\[1-9]|\(\?P=|\(\?>|\(\?\(|[*+?}]\+")
"""Constructs under which the order of alternatives can change what matches."""
_CASE_LOCAL = re.compile(r"\(\?[a-zA-Z]*-[a-zA-Z]*[ix]|\(\?[a-zA-Z]*x")
"""Inline flags that switch case-insensitivity off or turn verbose mode on: kept as written."""
_LEADING_FLAGS = re.compile(r"^\(\?([aiLmsux]+)\)")


def _lower(c: str) -> str:
    low = c.lower()
    return low if len(low) == 1 else c


def _class(p: str, i: int) -> tuple[str, int]:
    """The character class starting at `p[i]` ('['), letters lower-cased where that is safe."""
    j = i + 1
    head = "["
    if j < len(p) and p[j] == "^":
        head, j = "[^", j + 1
    atoms: list[str] = []
    first = True
    while j < len(p) and (p[j] != "]" or first):
        step = 2 if p[j] == "\\" else 1
        atoms.append(p[j : j + step])
        j += step
        first = False
    if j >= len(p):
        raise re.error("not read by the normaliser", p)
    out: list[str] = []
    k = 0
    while k < len(atoms):
        if k + 2 < len(atoms) and atoms[k + 1] == "-":
            lo, hi = atoms[k], atoms[k + 2]
            same_case = (
                len(lo) == len(hi) == 1
                and lo.isascii()
                and hi.isascii()
                and ((lo.isupper() and hi.isupper()) or (lo.islower() and hi.islower()))
            )
            out.append(f"{lo.lower()}-{hi.lower()}" if same_case else f"{lo}-{hi}")
            k += 3
        else:
            atom = atoms[k]
            out.append(atom if atom.startswith("\\") else _lower(atom))
            k += 1
    return head + "".join(out) + "]", j + 1


def _group(p: str, i: int, sortable: bool) -> tuple[str, int]:
    """The group starting at `p[i]` ('('), its inside normalised; `(?#...)` is dropped."""
    rest = p[i:]
    if rest.startswith("(?#"):
        end = p.find(")", i)
        if end < 0:
            raise re.error("not read by the normaliser", p)
        return "", end + 1
    if rest.startswith("(?P="):
        end = p.find(")", i)
        if end < 0:
            raise re.error("not read by the normaliser", p)
        return p[i : end + 1], end + 1
    if rest.startswith(("(?P<", "(?<")) and not rest.startswith(("(?<=", "(?<!")):
        end = p.find(">", i)
        if end < 0:
            raise re.error("not read by the normaliser", p)
        prefix = p[i : end + 1]
    elif rest.startswith(("(?<=", "(?<!")):
        prefix = rest[:4]
    elif rest.startswith(("(?:", "(?=", "(?!", "(?>")):
        prefix = rest[:3]
    elif rest.startswith("(?("):
        end = p.find(")", i + 3)
        if end < 0:
            raise re.error("not read by the normaliser", p)
        prefix, sortable = p[i : end + 1], False  # yes|no branches, not alternatives
    elif (flags := re.match(r"\(\?[a-zA-Z-]*[:)]", rest)) is not None:
        prefix = flags.group(0)
        if prefix.endswith(")"):
            return prefix, i + len(prefix)
    else:
        prefix = "("
    inner, j = _alternation(p, i + len(prefix), sortable)
    if j >= len(p) or p[j] != ")":
        raise re.error("not read by the normaliser", p)
    return prefix + inner + ")", j + 1


def _alternation(p: str, i: int, sortable: bool) -> tuple[str, int]:
    """The alternatives from `p[i]` to the `)` that closes them (or the end), normalised."""
    branches: list[str] = []
    current: list[str] = []
    while i < len(p) and p[i] != ")":
        c = p[i]
        if c == "|":
            branches.append("".join(current))
            current = []
            i += 1
        elif c == "\\":
            current.append(p[i : i + 2])  # an escape keeps its case: \D is not \d
            i += 2
        elif c == "[":
            part, i = _class(p, i)
            current.append(part)
        elif c == "(":
            part, i = _group(p, i, sortable)
            current.append(part)
        else:
            current.append(_lower(c))
            i += 1
    branches.append("".join(current))
    if sortable:
        branches = sorted(set(branches))
    return "|".join(branches), i


def pattern_form(pattern: str) -> str:
    """A script pattern as the case-insensitive matcher reads it (see the module docstring)."""
    text = normal_text(pattern)
    if _CASE_LOCAL.search(text):
        return text
    body = text
    leading = _LEADING_FLAGS.match(body)
    if leading is not None:
        kept = "".join(f for f in leading.group(1) if f not in "is")
        body = (f"(?{kept})" if kept else "") + body[leading.end() :]
    try:
        form, end = _alternation(body, 0, not _ORDERED.search(body))
        if end != len(body):
            raise re.error("not read by the normaliser", body)
        re.compile(form, re.IGNORECASE | re.DOTALL)
    except (re.error, IndexError):  # a pattern it does not read is kept as written
        return text
    return ALWAYS if form in _ALWAYS_FORMS else form


@functools.lru_cache(maxsize=1 << 12)
def _intent_pattern(pattern: str) -> str:
    """An intent's pattern as the intent matcher reads it (`intents.pattern_regex`)."""
    try:
        from pipecat_rl.scenarios.intents import pattern_regex
    except ImportError:  # an older tree without intents: the pattern as text
        return normal_text(pattern)
    try:
        return pattern_regex(normal_text(pattern))
    except ValueError:
        return normal_text(pattern)


def _intents(value: Any, used: set[str] | None) -> Any:
    """An `intents:` mapping (name -> patterns) by meaning.

    Each intent's patterns are a set of the regexes they stand for; with `used`, the intents no
    rule names (they change nothing) are left out.
    """
    if not isinstance(value, dict):
        return value

    def patterns(v: Any) -> Any:
        if isinstance(v, str):
            v = [v]
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            return sorted({_intent_pattern(x) for x in v})
        return v

    return {name: patterns(v) for name, v in value.items() if used is None or name in used}


# -- the world pack ------------------------------------------------------------------------------


def _without_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]


def _ast_form(node: Any) -> Any:
    """A syntax tree as JSON: node names and fields, no positions, comments or string prefixes.

    Empty fields are left out, so the form stays the same across Python versions that add
    optional fields.
    """
    if isinstance(node, ast.AST):
        fields = [
            [name, _ast_form(value)]
            for name, value in ast.iter_fields(node)
            if name not in ("kind", "type_comment") and value is not None and value != []
        ]
        return [type(node).__name__, fields]
    if isinstance(node, list):
        return [_ast_form(v) for v in node]
    return [type(node).__name__, repr(node)]


_CREATE_TABLE = re.compile(r"\bCREATE\s+(?:TEMP\w*\s+)?TABLE\b", re.IGNORECASE)


@functools.lru_cache(maxsize=32)
def _pack(code: bytes) -> tuple[dict[str, str], str | None]:
    """The pack's identity (`pack_form`) and its schema: the `CREATE TABLE` strings, in order."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return {"sha256": hashlib.sha256(code).hexdigest()}, None
    strings = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and _CREATE_TABLE.search(n.value)
    ]
    strings.sort(key=lambda n: (n.lineno, n.col_offset))
    schema = "\n".join(str(n.value) for n in strings) or None
    if b"__doc__" not in code and b"getdoc" not in code:
        _without_docstrings(tree)
    form = hashlib.sha256(_json(_ast_form(tree)).encode()).hexdigest()
    return {"ast": form}, schema


def pack_form(code: bytes) -> dict[str, str]:
    """The pack's identity: the sha256 of its syntax tree (`{"ast": ...}`).

    A pack that does not parse is the sha256 of its bytes (`{"sha256": ...}`).
    """
    return _pack(code)[0]


# -- the world's rows and the checks on them -----------------------------------------------------


def _db_value(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, (dict, list)) else value


def _quoted(name: str) -> str:
    return json.dumps(name)


def _in_memory_only(action: int, *_: Any) -> int:
    """An authorizer: no statement of a pack's schema reaches a file while it is hashed."""
    if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _build(schema: str, state: dict[str, list[dict[str, Any]]]) -> sqlite3.Connection | None:
    """The world's database with `state` inserted as the simulator's world inserts it."""
    db = sqlite3.connect(":memory:")
    db.set_authorizer(_in_memory_only)
    try:
        db.executescript(schema)
        for table, rows in state.items():
            for row in rows:
                names = ", ".join(_quoted(c) for c in row)
                marks = ", ".join("?" for _ in row)
                sql = (
                    f"INSERT INTO {_quoted(table)} ({names}) VALUES ({marks})"
                    if row
                    else f"INSERT INTO {_quoted(table)} DEFAULT VALUES"
                )
                db.execute(sql, [_db_value(v) for v in row.values()])
    except (sqlite3.Error, ValueError, TypeError, OverflowError):
        db.close()
        return None
    return db


def _plain(value: Any) -> Any:
    return value.hex() if isinstance(value, bytes) else value


def _dump(db: sqlite3.Connection) -> dict[str, list[dict[str, Any]]]:
    """Every non-empty table's rows, in their row order (sorted where a table has no rowid)."""
    tables = [
        r[0]
        for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
        if not r[0].startswith("sqlite_")
    ]
    out = {}
    for table in tables:
        try:
            cursor = db.execute(f"SELECT * FROM {_quoted(table)} ORDER BY rowid")
            ordered = True
        except sqlite3.Error:  # WITHOUT ROWID
            cursor = db.execute(f"SELECT * FROM {_quoted(table)}")
            ordered = False
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, map(_plain, r), strict=True)) for r in cursor.fetchall()]
        if rows:
            out[table] = rows if ordered else sorted(rows, key=_json)
    return out


def _typed(db: sqlite3.Connection | None, table: str, where: dict[str, Any]) -> dict[str, Any]:
    """`where`'s values as the column stores them (its affinity), where the world is known."""
    if db is None:
        return where
    declared = {r[1]: r[2] for r in db.execute(f"PRAGMA table_info({_quoted(table)})")}
    out = {}
    for column, value in where.items():
        if column not in declared or isinstance(value, (dict, list)):
            out[column] = value
            continue
        try:
            db.execute(f"CREATE TEMP TABLE _probe (v {declared[column]})")
            db.execute("INSERT INTO _probe VALUES (?)", (value,))
            (out[column],) = db.execute("SELECT v FROM _probe").fetchone()
        except (sqlite3.Error, OverflowError):
            out[column] = value
        finally:
            db.execute("DROP TABLE IF EXISTS temp._probe")
    return out


def _rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if rows and all(isinstance(r, dict) and "id" in r for r in rows):
        return sorted(rows, key=lambda r: _json(r["id"]))
    return rows


def _checks(checks: list[dict[str, Any]], db: sqlite3.Connection | None) -> list[dict[str, Any]]:
    """The verify checks in their normal form (see the module docstring)."""
    out: list[dict[str, Any]] = []
    unchanged: set[str] = set()
    for check in checks:
        given = {k: v for k, v in check.items() if v is not None}
        if "unchanged" in given:
            unchanged.update(given["unchanged"])
            continue
        kind, selector = next(iter(given.items())) if len(given) == 1 else (None, None)
        if kind is None or not isinstance(selector, dict) or "table" not in selector:
            out.append(given)
            continue
        selector = {k: v for k, v in selector.items() if v is not None}
        selector["where"] = _typed(db, selector["table"], selector.get("where") or {})
        bounds = {k: selector[k] for k in ("equals", "min", "max") if k in selector}
        if kind == "count" and bounds == {"min": 1}:
            kind = "exists"
            selector = {"table": selector["table"], "where": selector["where"]}
        out.append({kind: selector})
    if unchanged:
        out.append({"unchanged": sorted(unchanged)})
    return _sorted(out)


@functools.lru_cache(maxsize=256)
def _world_and_checks(schema: str | None, state: str, verify: str) -> str:
    """(state rows, checks) as JSON, by the database `schema` builds (cached: hashed often)."""
    rows, checks = json.loads(state), json.loads(verify)
    db = _build(schema, rows) if schema else None
    try:
        built = _dump(db) if db is not None else {t: _rows(r) for t, r in rows.items() if r}
        return _json([built, _checks(checks, db)])
    finally:
        if db is not None:
            db.close()


# -- script rules --------------------------------------------------------------------------------

_FIRING = frozenset({"say", "end_call", "times", *MOVE_KEYS})
"""A rule's keys that say what it does when it fires; every other key decides whether it does."""


def _rule(rule: dict[str, Any], max_turns: Any) -> dict[str, Any]:
    """One rule by meaning.

    Its pattern normalised (one that matches anything is no pattern), its intents a sorted set,
    a `times` that cannot bind unlimited, the moves it does not make left out.
    """
    rule = {k: v for k, v in rule.items() if not (k in MOVE_KEYS and v is None)}
    if rule.get("when") is not None:
        form = pattern_form(str(rule["when"]))
        rule["when"] = None if form == ALWAYS else form
    if isinstance(rule.get("intent"), list):
        rule["intent"] = sorted(set(rule["intent"])) or None
    times = rule.get("times")
    if isinstance(times, int) and (
        rule.get("end_call") or (isinstance(max_turns, int) and times >= max_turns)
    ):
        rule["times"] = None  # it cannot fire that often
    return rule


def _script(script: Any, max_turns: Any) -> Any:
    """The script by meaning: its rules normalised, and what changes nothing dropped.

    Dropped: rules that can never fire, a fallback never reached, intents no rule names.
    """
    if not isinstance(script, dict):
        return script
    rules: list[Any] = []
    unlimited: set[str] = set()  # the matching parts of earlier rules that never run out
    answers_all = False
    for rule in script.get("rules") or []:
        if not isinstance(rule, dict):
            rules.append(rule)
            continue
        rule = _rule(rule, max_turns)
        matching = {k: v for k, v in rule.items() if k not in _FIRING}
        if _json(matching) in unlimited:
            continue  # an earlier rule that never runs out always answers first
        rules.append(rule)
        if rule.get("times") is None:
            unlimited.add(_json(matching))
            if not any(matching.values()):
                answers_all = True
                break  # it answers every turn: later rules and the fallback never fire
    out = {**script, "rules": rules}
    if answers_all and "fallback" in out:
        out["fallback"] = None
    if "intents" in out:
        used = {n for r in rules if isinstance(r, dict) for n in r.get("intent") or ()}
        out["intents"] = _intents(out["intents"], used)
    return out


# -- the canonical form --------------------------------------------------------------------------


def _modality(block: dict[str, Any] | None) -> str:
    return str((block or {}).get("modality") or "text")


def _channel(channel: Any) -> Any:
    if isinstance(channel, dict) and isinstance(channel.get("asr_noise"), dict):
        if not any(channel["asr_noise"].values()):
            return {**channel, "asr_noise": None}  # all-zero rates: no noise
    return channel


def canonical(content: dict[str, Any], pack_code: bytes | None) -> dict[str, Any]:
    """The canonical form of a scenario's identity fields (a JSON-able dump of them).

    Args:
        content: The validated scenario's fields, dumped as JSON (defaults filled in), without
            `NOT_IDENTITY`.
        pack_code: The world pack's source, or None when the pack names no file found here
            (its name is then what identifies it).
    """
    data = _text(content)
    raw_world = content.get("world") or {}
    world = dict(data.get("world") or {})
    schema = None
    if pack_code is not None:
        world["pack"], schema = _pack(pack_code)
    state, checks = json.loads(
        _world_and_checks(
            schema, _json(raw_world.get("state") or {}), _json(content.get("verify") or [])
        )
    )
    world["state"] = _text(state)
    data["world"] = world
    data["verify"] = _sorted(_text(checks))
    data["metrics"] = _sorted(
        [{**m, "calls": _sorted(m["calls"])} if m.get("calls") else m for m in data["metrics"]]
        if data.get("metrics")
        else []
    )
    data["user"] = _modality(data.get("user"))
    data["judge"] = _modality(data.get("judge"))
    data["channel"] = _channel(data.get("channel"))
    data["script"] = _script(data.get("script"), data.get("max_turns"))
    if "intents" in data:  # a scenario-level mapping, where a tree has one
        data["intents"] = _intents(data["intents"], None)
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


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def caller_text(form: dict[str, Any]) -> str:
    """What a caller is and says, from a canonical form: persona, goal, script or turns.

    Of the script: its opening, each rule's line and what it waits for, the fallback. The
    script's `intents` mapping is left out: a world pack shares one among its scenarios.
    """
    parts = _strings(form.get("persona")) + _strings(form.get("goal"))
    script = form.get("script")
    if isinstance(script, dict):
        parts += _strings(script.get("opening")) + _strings(script.get("fallback"))
        for rule in script.get("rules") or []:
            if isinstance(rule, dict):
                parts += _strings({k: v for k, v in rule.items() if k not in ("end_call", "times")})
    parts += _strings(form.get("turns"))
    return " ".join(parts)


def frame_key(form: dict[str, Any]) -> str:
    """What two near-duplicates share exactly, from a canonical form: the world and the checks."""
    return _json({"world": form.get("world"), "verify": form.get("verify")})


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
