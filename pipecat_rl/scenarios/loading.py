"""Reading scenario files into `Scenario` records: one file, or folders of them.

Files load through `yaml_safe` (Pipecat's `!include`, with limits a hostile file cannot pass),
file-level keys of a `scenarios:` list are defaults, a file with `template:` and `axes:`
expands into one scenario per combination (`matrix`), the split comes from the folder
(`heldout.resolve_split`), and a scripted scenario's turns are read by Pipecat's own parser
(`turns.pipecat_turns`). What the simulator cannot run is skipped with a warning naming the
file (a manifest listing other files, a turn that presses keys); a Pipecat field it reads but
does not honour (`user.speech`, `judge.modality: audio`, a key Pipecat does not know in a turn)
is a warning naming the field, never silence. A turn's `audio:` recording must be a readable
audio file when the scenario loads; only audio mode plays it, so `runnable` drops such a
scenario from a text-mode run with a warning saying so. Errors name the file, the line, the
field and the reason (`ScenarioError`). Nothing here imports the episode machinery.
"""

import difflib
import fnmatch
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from loguru import logger
from pydantic import ValidationError

from pipecat_rl.errors import ConfigError, ScenarioError, UnsupportedScenarioError
from pipecat_rl.scenarios import heldout, matrix
from pipecat_rl.scenarios.scenario import HELDOUT, Scenario, ScenarioSet
from pipecat_rl.scenarios.turns import (
    needs_audio,
    pipecat_turns,
    recordings,
    unknown_keys,
    unsupported,
    untimed,
    with_moves,
)
from pipecat_rl.scenarios.yaml_safe import load_yaml, read_text
from pipecat_rl.strict import UniqueKeyLoader

_PIPECAT_ONLY = {"scenarios"}
_SET_BY_THE_LOADER = ("source_path", "parsed_turns")
_USER_KEYS = {"modality", "speech"}
_JUDGE_KEYS = {"modality", "eval", "transcription"}


class _Loader(UniqueKeyLoader):
    """A safe loader: only plain decimal integers are ints ("0612" stays a string); no key twice."""


_Loader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:int"]
    for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"),
    list("-+0123456789"),
)  # fmt: skip


def _parse(path: Path) -> tuple[Any, yaml.Node | None]:
    """The file's data and its node tree (for line numbers), within `yaml_safe`'s limits."""
    return load_yaml(path, _Loader)


def _line(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the deepest node along `loc` that exists in the YAML tree."""
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if getattr(k, "value", None) == key), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            node = None
        if node is None:
            break
        line = node.start_mark.line + 1
    return line


def _explain(path: Path, node: yaml.Node | None, error: ValidationError, prefix: tuple) -> str:
    problems = []
    items = error.errors()
    # `Persona:` for `persona:` is one mistake, not two: name the spelling, not the gap
    misspelt = {
        (*i["loc"][:-1], str(i["loc"][-1]).lower())
        for i in items
        if i["type"] == "extra_forbidden" and i["loc"] and str(i["loc"][-1]).lower() != i["loc"][-1]
    }
    for item in items:
        loc = tuple(item["loc"])
        if item["type"] == "missing" and loc in misspelt:
            continue
        field = ".".join(str(p) for p in (*prefix, *loc)) or "(top level)"
        line = _line(node, (*prefix, *loc))
        reason = item["msg"]
        if item["type"] == "extra_forbidden":
            lowered = (*loc[:-1], str(loc[-1]).lower()) if loc else loc
            reason = (
                f"unknown field: did you mean '{lowered[-1]}'? (field names are lower case)"
                if lowered in misspelt
                else "unknown field (check its spelling; see pipecat_rl.scenarios.scenario)"
            )
        elif item["type"] == "missing":
            reason = "required field is missing"
        problems.append(f"{path}:{f' line {line}:' if line else ''} {field}: {reason}")
    return "\n".join(problems)


def load_scenario_file(path: str | Path) -> list[Scenario]:
    """Read one scenario file (a single scenario, or Pipecat's `scenarios:` list).

    Raises:
        ScenarioError: naming the file, the line, the field and the reason.
    """
    path = Path(path).resolve()
    data, node = _parse(path)
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: the top level must be a mapping of scenario fields")
    entries: list[tuple[dict, tuple]] = []
    if "scenarios" in data:
        file_name = data.get("name")
        listed = data["scenarios"]
        if not isinstance(file_name, str) or not file_name:
            raise ScenarioError(f"{path}: name: a file with 'scenarios:' needs a 'name:'")
        if not isinstance(listed, list) or not listed:
            raise ScenarioError(f"{path}: scenarios: must be a non-empty list")
        defaults = {k: v for k, v in data.items() if k not in _PIPECAT_ONLY}
        if all(isinstance(entry, str) for entry in listed):
            raise UnsupportedScenarioError(
                f"{path}: lists other files under 'scenarios:' (a manifest); name the files"
            )
        for i, entry in enumerate(listed):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise ScenarioError(f"{path}: scenarios.{i}: must be a mapping with a 'name:'")
            merged = {**defaults, **entry, "name": f"{file_name}/{entry['name']}"}
            entries.append((merged, ("scenarios", i)))
    elif matrix.is_template(data):  # a template x axes: one scenario per combination
        expanded = matrix.expand(path, data, lambda loc: _line(node, loc))
        entries.extend((e.raw, ("template",)) for e in expanded)
    else:
        entries.append((data, ()))
    scenarios = []
    for raw, prefix in entries:
        for key in _SET_BY_THE_LOADER:
            if key in raw:
                line = _line(node, (*prefix, key))
                field = ".".join(str(p) for p in (*prefix, key))
                raise ScenarioError(f"{path}:{f' line {line}:' if line else ''} {field}: "
                                    "unknown field (the loader sets it)")  # fmt: skip
        line = _line(node, (*prefix, "split"))
        raw = {**raw, "split": heldout.resolve_split(path, raw.get("split"), line)}
        raw["source_path"] = path
        try:
            scenarios.append(Scenario.model_validate(raw))
        except ValidationError as e:
            message = _explain(path, node, e, prefix)
            if prefix == ("template",):  # the field may come from an axis value: name which
                message += f"\n(in {raw['name']}: the template with those axis values)"
            raise ScenarioError(message) from e
    if any(s.scripted for s in scenarios):
        scenarios = _with_parsed_turns(path, scenarios)
        for s, (_, prefix) in zip(scenarios, entries, strict=True):
            _check_recordings(path, node, s, prefix)
    for message in dict.fromkeys(m for s in scenarios for m in _not_honoured(s)):
        logger.warning(f"{path}: {message}")
    return scenarios


def _with_parsed_turns(path: Path, scenarios: list[Scenario]) -> list[Scenario]:
    """The scripted scenarios with their turns as Pipecat's parser reads them.

    Raises:
        ScenarioError: Pipecat rejects the file (its message, with the file).
        UnsupportedScenarioError: a scripted scenario has a turn neither mode can run.
    """
    try:
        parsed = pipecat_turns(path)
    except ValueError as e:
        raise ScenarioError(f"{path}: {e}".replace(f"{path}: {path}", str(path))) from e
    out = []
    for s in scenarios:
        if s.scripted:
            try:
                turns = with_moves(parsed[s.name], s.turns or [])
            except ValueError as e:
                raise ScenarioError(f"{path}: {s.name}: {e}") from e
            reason = unsupported(turns)
            if reason:
                raise UnsupportedScenarioError(f"{path}: {s.name}: {reason}")
            s = s.model_copy(update={"parsed_turns": turns})
        out.append(s)
    return out


def _check_recordings(path: Path, node: yaml.Node | None, s: Scenario, prefix: tuple) -> None:
    """A `ScenarioError` for an `audio:` of `s` that is no readable, non-empty audio file.

    A missing recording fails the load, not a call halfway through a run.
    """
    import soundfile

    for t, audio in recordings(s.parsed_turns or []).items():
        loc = (*prefix, "turns", t - 1, "audio")
        line = _line(node, loc)
        where = f"{path}:{f' line {line}:' if line else ''} {'.'.join(map(str, loc))}"
        if not Path(audio).is_file():
            raise ScenarioError(f"{where}: no such audio file: {audio} (`audio:` is relative "
                                "to the scenario file)")  # fmt: skip
        try:
            frames = soundfile.info(audio).frames
        except RuntimeError as e:  # libsndfile's error for a file it cannot read
            raise ScenarioError(
                f"{where}: not an audio file libsndfile can read: {audio} ({e})"
            ) from e
        if frames == 0:
            raise ScenarioError(f"{where}: the recording is empty: {audio}")


def runnable(scenarios: ScenarioSet, mode: Literal["text", "audio"]) -> ScenarioSet:
    """The scenarios a `mode` run can play; each other is skipped with a warning naming why.

    Raises:
        ScenarioError: none of them can run in `mode`.
    """
    if mode == "audio":
        return scenarios
    kept = []
    for s in scenarios:
        reason = needs_audio(s.parsed_turns or [])
        if reason:
            logger.warning(f"skipped {s.source_path}: {s.name}: {reason}")
        else:
            kept.append(s)
    if not kept:
        raise ScenarioError(
            f"no scenario runs in {mode} mode: every one plays recorded turns; run with "
            "--mode audio"
        )
    return scenarios.model_copy(update={"scenarios": kept})


def _not_honoured(s: Scenario) -> list[str]:
    """The Pipecat fields of `s` the simulator reads but does not act on, each explained."""
    found = []
    user, judge = s.user or {}, s.judge or {}
    turns = s.parsed_turns or []
    if recordings(turns):  # `user.modality: audio` is what plays them, with --mode audio
        if user.get("speech") is not None:
            found.append(
                "user.speech: not used: turns without `audio:` are spoken by the channel's TTS "
                "(`channel.tts`, `channel.tts_voice`) with --mode audio"
            )
    elif user.get("modality") == "audio" or user.get("speech") is not None:
        found.append(
            "user.modality / user.speech: not used: the simulated caller is sent as text, or "
            "spoken by the channel's TTS (`channel.tts`, `channel.tts_voice`) with --mode audio"
        )
    found += [
        f"{s.name}: turns.{t}.user: its pauses (`pause_ms:`) are kept in audio mode only: text "
        "mode sends the text without them"
        for t, turn in enumerate(turns)
        if turn.parts is not None and any(isinstance(p, int) for p in turn.parts)
    ]
    if judge.get("modality") == "audio" or judge.get("transcription") is not None:
        found.append(
            "judge.modality / judge.transcription: not used: the judge reads the text the "
            "agent's TTS was given, never a transcription of its audio"
        )
    found += [f"user.{k}: not a Pipecat field; ignored" for k in user if k not in _USER_KEYS]
    found += [f"judge.{k}: not a Pipecat field; ignored" for k in judge if k not in _JUDGE_KEYS]
    found += [
        f"{s.name}: {key}: not checked: the turn only waits, and the start of the call it "
        "would be timed from is not recorded"
        for key in untimed(turns)
    ]
    found += [
        f"{s.name}: {key}: not a field of Pipecat's turns; ignored (check its spelling)"
        for key in unknown_keys(s.turns or [])
    ]
    return found


def _files(target: Path) -> list[Path]:
    if target.is_dir():
        return sorted(p for p in target.rglob("*.y*ml") if p.suffix in (".yaml", ".yml"))
    if target.is_file():
        return [target]
    raise ScenarioError(f"{target}: no such scenario file or folder")


def load_scenarios(targets: list[str | Path]) -> ScenarioSet:
    """Load scenario files and folders (recursively, *.yaml / *.yml) into one set.

    Fragments a file `!include`s (YAML lists, mappings without `persona`/`scenarios`/
    `template`) are skipped; any other file without them is an error or a warning
    (`_skip_fragment`).
    """
    scenarios: list[Scenario] = []
    heldout_files: list[Path] = []
    skipped: list[str] = []
    for target in targets:
        files = _files(Path(target))
        for f in files:
            if Path(target).is_dir() and _is_fragment(f) and _skip_fragment(f, files):
                continue
            try:
                loaded = load_scenario_file(f)
            except UnsupportedScenarioError as e:
                logger.warning(f"skipped {e}")
                skipped.append(str(f))
                continue
            scenarios.extend(loaded)
            if any(s.split == HELDOUT for s in loaded):
                heldout_files.append(f.resolve())
    if not scenarios:
        also = f" (skipped, not runnable here: {', '.join(skipped)})" if skipped else ""
        raise ScenarioError(f"no scenario files found in {', '.join(map(str, targets))}{also}")
    names = [s.name for s in scenarios]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ScenarioError(f"duplicate scenario names: {', '.join(duplicates)}; rename one")
    heldout.check_copies(scenarios)
    held = [s for s in scenarios if s.split == HELDOUT]
    set_id = heldout.heldout_set_id(held, heldout_files) if heldout_files else None
    return ScenarioSet(scenarios=scenarios, heldout_set_id=set_id)


def select_scenarios(
    scenarios: ScenarioSet, names: Sequence[str] = (), patterns: Sequence[str] = ()
) -> ScenarioSet:
    """The scenarios named (an id, or a template's name for all it expands to) or matching a glob.

    With neither, all of them. The held-out set id is kept: a subset runs as held-out as its
    set does.

    Raises:
        ConfigError: a name matches nothing (the closest ids are named), or nothing is left.
    """
    if not names and not patterns:
        return scenarios
    ids = [s.id for s in scenarios]
    for name in names:
        if not any(i == name or i.startswith(f"{name}[") for i in ids):
            close = difflib.get_close_matches(name, ids, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"--scenario {name!r}: no such scenario{hint}")
    kept = [
        s for s in scenarios
        if any(s.id == n or s.id.startswith(f"{n}[") for n in names)
        or any(fnmatch.fnmatchcase(s.id, p) for p in patterns)
    ]  # fmt: skip
    if not kept:
        raise ConfigError(f"--pattern {', '.join(patterns)}: no scenario id matches")
    return scenarios.model_copy(update={"scenarios": kept})


def _is_fragment(path: Path) -> bool:
    try:
        data, _ = _parse(path)
    except ScenarioError:
        return False  # loading it reports the error
    if isinstance(data, list):  # a table of rows a template `!include`s
        return True
    scenario_keys = {"persona", "scenarios", "turns", "template", "axes"}
    return isinstance(data, dict) and not scenario_keys & set(data)


_INCLUDE = re.compile(r"!include\s+[\"']?([^\s\"'#,\[\]{}]+)")  # ends at a flow collection's , ] }
_SCENARIO_KEYS = {
    "name", "persona", "goal", "success", "max_turns", "runs", "scenarios", "verify", "turns",
}  # fmt: skip


def _skip_fragment(path: Path, files: list[Path]) -> bool:
    """Whether a file without `persona:` in a folder is skipped: yes if a scenario includes it.

    One that looks like a scenario (`name:`, `goal:`, `Persona:`...) is loaded so that its
    missing field is reported; any other is skipped with a warning naming it, so a held-out
    folder never shrinks without a word.
    """
    for other in files:
        if other == path:
            continue
        try:
            text = read_text(other)
        except ScenarioError:
            continue
        if any((other.parent / m).resolve() == path.resolve() for m in _INCLUDE.findall(text)):
            return True
    data, _ = _parse(path)
    if {str(k).lower() for k in data} & _SCENARIO_KEYS:
        return False
    logger.warning(
        f"{path}: skipped: not a scenario (no 'persona:', 'turns:' or 'scenarios:') and no "
        "scenario file in the folder includes it"
    )
    return True
