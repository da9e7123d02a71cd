"""Scenario matrices: one template file expands into a scenario per combination of axis values.

A hand-written scenario tests one thing once; a matrix tests a task under every caller style,
fault schedule and patient of a table. A file with `template:` and `axes:` expands, in the
order written (axes as declared, values as listed), into one scenario mapping per combination,
each validated by `Scenario` exactly as a hand-written file is (so each has its own content
hash and verifier) and named `<template name>[axis=value,axis=value]` (`scenario_id`; parsed
back by `axes_of`):

```yaml
template:                     # scenario fields, as in a hand-written file
  name: clinic                # the ids' stem (default: the file's stem)
  persona: "{patient.name}, a patient of the clinic."
  world: {pack: ../world.py, state: {...}}
axes:                         # axis -> value -> what that value contributes
  style:
    polite: {persona: "Polite.", vars: {hello: "Good morning."}}
    terse: {persona: "Says little.", level: 1, vars: {hello: "Hi."}}
  fault:
    none: {}
    slow: {level: 1, faults: [{tool: find_slots, kind: timeout, on_call: 1}]}
  patient: !include patients.yaml   # a table: a list of rows, each named by its `id:`
exclude: [{style: terse, fault: slow}]      # partial assignments to skip
include_only: [{patient: [maria, tom]}]     # or: keep only matching ones
max_scenarios: 200            # refuse a bigger expansion (default 1000, at most 10000)
```

What a value contributes joins the template's:

- `persona`, `goal`, `success`: appended to the template's text, space-joined, axis by axis;
- lists (`verify`, `faults`, `metrics`, `script.rules`, a table's rows under `world.state`):
  concatenated, the template's first, then each axis's in declared order (a scripted caller
  tries its rules in that order: the first that matches speaks);
- mappings (`facts`, `world`, `channel`, `script`, ...): merged key by key;
- anything else (`max_turns`, a fact, `channel.mode`): a value overrides the template's, and
  two values that set it differently contradict (an error naming both, unless `exclude:`
  skips that combination);
- `level:` (an integer, 0 or more): a combination's difficulty is the sum of its values';
- `vars:` (name -> string or number): `{axis.var}` in any string of the merged scenario is
  replaced by that axis's value's var; a string that is exactly one placeholder takes the
  var's type, so `where: {patient_id: "{patient.patient_id}"}` stays an integer. An unknown
  placeholder is an error.

A table axis is a list of rows (mappings of scalars), each named by its `id` column, or
`{table: <rows, or a mapping name -> row>, key: <the naming column>}`: a row's columns are its
vars, a `level` column its level; a row contributes nothing else (the template's placeholders
put its columns where they go).

A combination's level is not in its id or in `Scenario` (which has no place for it):
`scenario_level` reads it back from the scenario's own file (`source_path`), expanded again
and cached by the file's size and modification time, so it holds in any process that has the
file, whatever was loaded before. Errors (`ScenarioError`) name the file, the line where there
is one, and the axis.
"""

import functools
import itertools
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipecat_rl.errors import ScenarioError
from pipecat_rl.scenarios.scenario import Scenario

DEFAULT_MAX_SCENARIOS = 1000
"""How many scenarios a template file may expand to unless it says `max_scenarios:`."""
MAX_SCENARIOS_LIMIT = 10_000
"""The most `max_scenarios:` may allow: past it a matrix is a typo, not an experiment."""
MAX_COMBINATIONS = 1_000_000
"""The most combinations walked to apply `exclude:` / `include_only:` (before filtering)."""

FILE_KEYS = ("template", "axes", "exclude", "include_only", "max_scenarios")
TEXT_FIELDS = ("persona", "goal", "success")
VALUE_KEYS = ("level", "vars")
"""Keys of a value that are not scenario fields."""
_NOT_CONTRIBUTED = {"name", "split", "source_path", "parsed_turns", "turns"}
_CONTRIBUTED = frozenset(Scenario.model_fields) - _NOT_CONTRIBUTED
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_-]*)\.([A-Za-z_][A-Za-z0-9_-]*)\}")
_ID = re.compile(r"^(?P<template>[^\[\]]+)\[(?P<axes>[^\[\]]*)\]$")

Line = Callable[[tuple], "int | None"]


@dataclass(frozen=True)
class Expanded:
    """One combination of a template file, before `Scenario` validates it."""

    name: str
    """Its scenario id: `<template>[axis=value,...]`."""
    raw: dict[str, Any]
    """The scenario mapping (placeholders filled; `split:` as the template wrote it). Parts
    without placeholders are shared with the template and the other combinations: read it,
    never change it."""
    axes: dict[str, str]
    """Axis -> value, in declared order."""
    level: int
    """The sum of its values' `level:`."""


@dataclass(frozen=True)
class _Value:
    axis: str
    name: str
    contribution: dict[str, Any]
    level: int = 0
    vars: dict[str, Any] = field(default_factory=dict)
    loc: tuple = ()

    @property
    def label(self) -> str:
        return f"{self.axis}={self.name}"


def is_template(data: Any) -> bool:
    """Whether a file's top level is a template (`template:` or `axes:`), not a scenario."""
    return isinstance(data, dict) and ("template" in data or "axes" in data)


def scenario_id(template: str, axes: dict[str, str]) -> str:
    """The id of one combination: `template[axis=value,axis=value]` (the format is a contract)."""
    return f"{template}[{','.join(f'{a}={v}' for a, v in axes.items())}]"


def split_id(scenario_id: str) -> tuple[str, dict[str, str]] | None:
    """A combination's template name and axes from its id; None for any other id."""
    found = _ID.match(scenario_id)
    if not found:
        return None
    axes: dict[str, str] = {}
    for part in found["axes"].split(","):
        axis, eq, value = part.partition("=")
        if not eq or not _NAME.match(axis) or not _NAME.match(value) or axis in axes:
            return None
        axes[axis] = value
    return found["template"], axes


def axes_of(scenario_id: str) -> dict[str, str] | None:
    """Axis -> value of an expanded scenario's id (`clinic[style=terse,task=book]`), else None."""
    parsed = split_id(scenario_id)
    return None if parsed is None else parsed[1]


def expand(path: Path, data: dict[str, Any], line: Line | None = None) -> list[Expanded]:
    """The combinations of the template file `path` (its parsed `data`), in declared order.

    `line(loc)` is the 1-based line of a key path in the file, where known (`loading`'s).

    Raises:
        ScenarioError: a bad axis, value, exclusion, placeholder or contradiction, or more
            combinations than `max_scenarios` (naming the file, the line and the axis).
    """
    return _Matrix(Path(path), line or (lambda loc: None)).expand(data)


def expand_file(path: str | Path) -> list[Expanded]:
    """Read and expand one template file (`[]` for a file that is not a template).

    Raises:
        ScenarioError: as `expand`, or the file cannot be read.
    """
    from pipecat_rl.scenarios.loading import _line, _parse  # it imports this module

    path = Path(path).resolve()
    data, node = _parse(path)
    if not is_template(data):
        return []
    return expand(path, data, lambda loc: _line(node, loc))


def scenario_level(scenario: Scenario) -> int | None:
    """The difficulty of an expanded scenario (the sum of its values' `level:`); None otherwise.

    Read from the scenario's file (`source_path`), expanded again and cached by its size and
    modification time: None when the scenario came from no template, or the file no longer
    holds it. A table the file `!include`s is read again only once the file itself changes
    (or in a new process).

    Raises:
        ScenarioError: the file no longer expands.
    """
    if scenario.source_path is None or axes_of(scenario.name) is None:
        return None
    path = Path(scenario.source_path)
    try:
        stat = path.stat()
    except OSError:
        return None
    return _levels(path, stat.st_mtime_ns, stat.st_size).get(scenario.name)


@functools.lru_cache(maxsize=64)
def _levels(path: Path, mtime_ns: int, size: int) -> dict[str, int]:
    return {e.name: e.level for e in expand_file(path)}


class _Matrix:
    """One template file being expanded: its path and lines, for errors."""

    def __init__(self, path: Path, line: Line):
        self.path = path
        self.line = line
        self._memo: dict[int, tuple[Any, bool]] = {}

    def error(self, loc: tuple, reason: str, field: tuple | None = None) -> ScenarioError:
        """The error at key path `loc` of the file (its line), shown as `field` (default `loc`)."""
        at = self.line(loc)
        where = ".".join(str(k) for k in (loc if field is None else field)) or "(top level)"
        return ScenarioError(f"{self.path}:{f' line {at}:' if at else ''} {where}: {reason}")

    # -- reading the file --------------------------------------------------------------------

    def expand(self, data: dict[str, Any]) -> list[Expanded]:
        for key in data:
            if key not in FILE_KEYS:
                raise self.error(
                    (key,),
                    f"unknown key in a template file (it has {', '.join(FILE_KEYS)}; "
                    "scenario fields go under `template:`)",
                )
        template = self._template(data.get("template"))
        axes = self._axes(data.get("axes"))
        include = self._assignments(data, "include_only", axes)
        exclude = self._assignments(data, "exclude", axes)
        cap = self._cap(data.get("max_scenarios", DEFAULT_MAX_SCENARIOS))
        sizes = " x ".join(f"{a} {len(v)}" for a, v in axes.items())
        total = math.prod(len(v) for v in axes.values())
        if total > MAX_COMBINATIONS:
            raise self.error(
                ("axes",),
                f"{total:,} combinations ({sizes}), over the limit of "
                f"{MAX_COMBINATIONS:,}; split the file or drop values",
            )
        kept = [
            combo
            for combo in itertools.product(*axes.values())
            if (not include or any(_matches(rule, combo) for rule in include))
            and not any(_matches(rule, combo) for rule in exclude)
        ]
        if len(kept) > cap:
            raise self.error(
                ("max_scenarios",) if "max_scenarios" in data else ("axes",),
                f"the axes expand to {len(kept):,} scenarios ({sizes}"
                f"{', after exclude/include_only' if include or exclude else ''}), over "
                f"max_scenarios {cap:,}; narrow them with `exclude:` / `include_only:`, or raise "
                f"`max_scenarios:` (at most {MAX_SCENARIOS_LIMIT:,})",
            )
        if not kept:
            raise self.error(
                ("include_only",) if include else ("exclude",),
                "every combination of the axes is excluded: nothing to expand",
            )
        name = template.pop("name", None) or self.path.stem
        return [self._combination(name, template, combo) for combo in kept]

    def _template(self, template: Any) -> dict[str, Any]:
        if template is None:
            raise self.error(
                ("template",), "a file with `axes:` needs a `template:` mapping of scenario fields"
            )
        if not isinstance(template, dict):
            raise self.error(("template",), "must be a mapping of scenario fields")
        if "turns" in template:
            raise self.error(
                ("template", "turns"),
                "a template expands simulated scenarios "
                "(persona, goal, success); write a scripted one by hand",
            )
        name = template.get("name")
        if name is not None and (
            not isinstance(name, str) or not name.strip() or re.search(r"[\[\],=]", name)
        ):
            raise self.error(("template", "name"), "must be a non-empty string without [ ] , =")
        return {**template, **({"name": name.strip()} if name else {})}

    def _axes(self, axes: Any) -> dict[str, list[_Value]]:
        if not isinstance(axes, dict) or not axes:
            raise self.error(
                ("axes",),
                "a template file needs `axes:`, a mapping of axis name "
                "-> values (at least one axis)",
            )
        read = {}
        for axis, spec in axes.items():
            loc = ("axes", axis)
            if not isinstance(axis, str) or not _VAR.match(axis):
                raise self.error(loc, "an axis name is letters, digits, _ and - (a letter first)")
            if isinstance(spec, list) or (isinstance(spec, dict) and "table" in spec):
                values = self._table(axis, spec)
            elif isinstance(spec, dict):
                values = [self._value(axis, name, given) for name, given in spec.items()]
            else:
                raise self.error(
                    loc,
                    f"axis {axis!r}: must be a mapping of value name -> what "
                    "it contributes, or a table of rows",
                )
            if not values:
                raise self.error(loc, f"axis {axis!r} is empty: give it at least one value")
            read[axis] = values
        return read

    def _value_name(self, axis: str, name: Any, loc: tuple) -> str:
        if isinstance(name, int) and not isinstance(name, bool):
            name = str(name)
        if not isinstance(name, str) or not _NAME.match(name):
            raise self.error(
                loc,
                f"axis {axis!r}: value name {name!r}: use letters, digits and "
                f"_ . + - (it becomes part of the scenario id){_hint(name)}",
            )
        return name

    def _value(self, axis: str, name: Any, given: Any) -> _Value:
        loc = ("axes", axis, str(name))
        name = self._value_name(axis, name, loc)
        given = {} if given is None else given
        if not isinstance(given, dict):
            raise self.error(
                loc,
                f"axis {axis!r}: value {name!r} must be a mapping of what it "
                "contributes (scenario fields, level, vars)",
            )
        for key in given:
            if key not in _CONTRIBUTED and key not in VALUE_KEYS:
                why = "set by the expansion" if key in _NOT_CONTRIBUTED else "not a scenario field"
                raise self.error(
                    (*loc, key),
                    f"axis {axis!r}: value {name!r}: {key!r} is {why} "
                    "(a value contributes scenario fields, `level:` and `vars:`)",
                )
        level = self._level(axis, name, given.get("level", 0), (*loc, "level"))
        variables = given.get("vars") or {}
        if not isinstance(variables, dict):
            raise self.error(
                (*loc, "vars"),
                f"axis {axis!r}: value {name!r}: `vars:` must be a "
                "mapping of name -> string or number",
            )
        for var, value in variables.items():
            self._check_var(axis, name, var, value, (*loc, "vars", var))
        contribution = {k: v for k, v in given.items() if k not in VALUE_KEYS}
        return _Value(axis, name, contribution, level, dict(variables), loc)

    def _table(self, axis: str, spec: Any) -> list[_Value]:
        loc: tuple = ("axes", axis)
        key = "id"
        if isinstance(spec, dict):
            extra = set(spec) - {"table", "key"}
            if extra:
                raise self.error(
                    (*loc, sorted(extra)[0]),
                    f"axis {axis!r}: a table axis has `table:` and `key:` only",
                )
            key = spec.get("key", "id")
            if not isinstance(key, str):
                raise self.error((*loc, "key"), f"axis {axis!r}: `key:` names a column")
            spec, loc = spec["table"], (*loc, "table")
        if isinstance(spec, dict):
            rows = [(name, row, (*loc, str(name))) for name, row in spec.items()]
        elif isinstance(spec, list):
            rows = []
            for i, row in enumerate(spec):
                if not isinstance(row, dict) or key not in row:
                    raise self.error(
                        (*loc, i),
                        f"axis {axis!r}: row {i + 1} needs the column {key!r} (it names the value)",
                    )
                rows.append((row[key], row, (*loc, i)))
        else:
            raise self.error(
                loc, f"axis {axis!r}: a table is a list of rows or a mapping of name -> row"
            )
        values, seen = [], set()
        for name, row, at in rows:
            name = self._value_name(axis, name, at)
            if name in seen:
                raise self.error(at, f"axis {axis!r}: two rows are named {name!r}")
            seen.add(name)
            if not isinstance(row, dict):
                raise self.error(at, f"axis {axis!r}: row {name!r} must be a mapping of columns")
            for column, value in row.items():
                if column != "level":
                    self._check_var(axis, name, column, value, (*at, column))
            level = self._level(axis, name, row.get("level", 0), (*at, "level"))
            variables = {c: v for c, v in row.items() if c != "level"}
            values.append(_Value(axis, name, {}, level, variables, at))
        return values

    def _check_var(self, axis: str, value: str, var: Any, given: Any, loc: tuple) -> None:
        if not isinstance(var, str) or not _VAR.match(var):
            raise self.error(
                loc,
                f"axis {axis!r}: value {value!r}: var name {var!r}: use "
                f"letters, digits, _ and - (a letter first){_hint(var)}",
            )
        if not isinstance(given, str | int | float | bool):
            raise self.error(
                loc, f"axis {axis!r}: value {value!r}: var {var!r} must be a string or a number"
            )

    def _level(self, axis: str, value: str, level: Any, loc: tuple) -> int:
        if not isinstance(level, int) or isinstance(level, bool) or level < 0:
            raise self.error(
                loc, f"axis {axis!r}: value {value!r}: `level:` must be an integer, 0 or more"
            )
        return level

    def _assignments(
        self, data: dict[str, Any], key: str, axes: dict[str, list[_Value]]
    ) -> list[dict[str, set[str]]]:
        given = data.get(key)
        if given is None:
            return []
        if not isinstance(given, list):
            raise self.error((key,), "must be a list of partial assignments ({axis: value, ...})")
        rules = []
        for i, rule in enumerate(given):
            if not isinstance(rule, dict) or not rule:
                raise self.error((key, i), "must be a mapping of axis -> value (or a list)")
            read = {}
            for axis, wanted in rule.items():
                loc = (key, i, axis)
                if axis not in axes:
                    raise self.error(loc, f"unknown axis {axis!r} (the axes: {', '.join(axes)})")
                names = [v.name for v in axes[axis]]
                listed = wanted if isinstance(wanted, list) else [wanted]
                if not listed:
                    raise self.error(loc, f"axis {axis!r}: name at least one value")
                picked = set()
                for value in listed:
                    value = str(value) if type(value) is int else value
                    if value not in names:
                        raise self.error(
                            loc,
                            f"axis {axis!r} has no value {value!r} (its "
                            f"values: {', '.join(names)})",
                        )
                    picked.add(value)
                read[axis] = picked
            rules.append(read)
        return rules

    def _cap(self, cap: Any) -> int:
        if not isinstance(cap, int) or isinstance(cap, bool) or not 1 <= cap <= MAX_SCENARIOS_LIMIT:
            raise self.error(
                ("max_scenarios",), f"must be an integer from 1 to {MAX_SCENARIOS_LIMIT:,}"
            )
        return cap

    # -- one combination ---------------------------------------------------------------------

    def _combination(
        self, template_name: str, template: dict[str, Any], combo: tuple[_Value, ...]
    ) -> Expanded:
        axes = {v.axis: v.name for v in combo}
        name = scenario_id(template_name, axes)
        merged: dict[str, Any] = {}
        owners: dict[tuple, _Value] = {}
        for value in combo:
            merged = self._add(merged, value.contribution, value, owners, (), name)
        raw = _overlay(template, merged, ())
        variables = {v.axis: v.vars for v in combo}
        raw = {**self._fill(raw, variables, combo, (), name), "name": name}
        return Expanded(name, raw, axes, sum(v.level for v in combo))

    def _add(
        self, into: dict, given: dict, value: _Value, owners: dict, path: tuple, name: str
    ) -> dict:
        """The values' contributions so far with one more (strict: no contradiction)."""
        out = dict(into)
        for key, new in given.items():
            at = (*path, key)
            if key not in out:
                out[key] = new
                owners.update(dict.fromkeys(_leaves(new, at), value))
                continue
            old = out[key]
            if not path and key in TEXT_FIELDS and isinstance(old, str) and isinstance(new, str):
                out[key] = _joined(old, new)
            elif isinstance(old, dict) and isinstance(new, dict):
                out[key] = self._add(old, new, value, owners, at, name)
            elif isinstance(old, list) and isinstance(new, list):
                out[key] = old + new
            elif at == ("script", "intents"):
                out[key] = _as_list(old) + _as_list(new)
            elif old != new:
                first = owners.get(at)
                other = f"{first.label}" if first else "another value"
                raise self.error(
                    (*value.loc, *at),
                    f"axis {value.axis!r}: {value.label} contradicts {other} in {name}: both "
                    f"set {'.'.join(map(str, at))} ({old!r} vs {new!r}); exclude the "
                    "combination (`exclude:`) or set it in one place",
                )
        return out

    def _fill(
        self, data: Any, variables: dict, combo: tuple[_Value, ...], at: tuple, name: str
    ) -> Any:
        """`data` with every `{axis.var}` replaced (a lone placeholder keeps the var's type).

        A part without placeholders is returned as it is, shared by every combination.
        """
        if not self._placeheld(data):
            return data
        if isinstance(data, dict):
            return {k: self._fill(v, variables, combo, (*at, k), name) for k, v in data.items()}
        if isinstance(data, list):
            return [self._fill(v, variables, combo, (*at, i), name) for i, v in enumerate(data)]

        def var(found: re.Match) -> Any:
            axis, key = found[1], found[2]
            if axis not in variables:
                raise self.error(
                    ("template", *at),
                    f"unknown placeholder {found[0]} in {name}: no axis {axis!r} (the axes: "
                    f"{', '.join(variables)})",
                    at,
                )
            if key not in variables[axis]:
                value = next(v for v in combo if v.axis == axis)
                known = ", ".join(variables[axis]) or "none"
                raise self.error(
                    ("template", *at),
                    f"unknown placeholder {found[0]} in {name}: axis {axis!r}: {value.label} "
                    f"has no var {key!r} (its vars: {known})",
                    at,
                )
            return variables[axis][key]

        whole = _PLACEHOLDER.fullmatch(data)
        if whole:
            return var(whole)
        return _PLACEHOLDER.sub(lambda m: str(var(m)), data)

    def _placeheld(self, data: Any) -> bool:
        """Whether `data` holds a placeholder (memoised per container: intents are big)."""
        if isinstance(data, str):
            return _PLACEHOLDER.search(data) is not None
        if not isinstance(data, dict | list):
            return False
        known = self._memo.get(id(data))
        if known is not None and known[0] is data:  # the object is kept: its id is not reused
            return known[1]
        found = any(self._placeheld(v) for v in (data.values() if isinstance(data, dict) else data))
        self._memo[id(data)] = (data, found)
        return found


def _hint(name: Any) -> str:
    """Why a name written as a word is not a string: YAML 1.1 reads yes/no/on/off/null."""
    if isinstance(name, bool) or name is None:
        return "; YAML reads yes, no, on, off and null as true/false/null: quote the name"
    return ""


def _matches(rule: dict[str, set[str]], combo: tuple[_Value, ...]) -> bool:
    return all(v.name in rule[v.axis] for v in combo if v.axis in rule)


def _overlay(base: dict, given: dict, path: tuple) -> dict:
    """The template `base` with the values' merged contribution on top (a value wins a scalar)."""
    out = dict(base)
    for key, new in given.items():
        at = (*path, key)
        old = out.get(key)
        if key not in out:
            out[key] = new
        elif not path and key in TEXT_FIELDS and isinstance(old, str) and isinstance(new, str):
            out[key] = _joined(old, new)
        elif isinstance(old, dict) and isinstance(new, dict):
            out[key] = _overlay(old, new, at)
        elif isinstance(old, list) and isinstance(new, list):
            out[key] = old + new
        elif at == ("script", "intents"):
            out[key] = _as_list(old) + _as_list(new)
        else:
            out[key] = new
    return out


def _joined(*parts: str) -> str:
    return " ".join(p.strip() for p in parts if p.strip())


def _as_list(intents: Any) -> list:
    """`script.intents` as its list form (mappings merged in order: `Script.intents`)."""
    return intents if isinstance(intents, list) else [intents]


def _leaves(value: Any, at: tuple) -> Iterator[tuple]:
    """The key paths of the scalars under `value` (lists are concatenated, never owned)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*at, k))
    elif not isinstance(value, list):
        yield at
