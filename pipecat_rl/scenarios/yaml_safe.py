"""The YAML loader scenario files use: Pipecat's `!include`, with limits a hostile file cannot pass.

`pipecat.utils.yaml.include_loader` trusts its documents: a file that includes itself recurses
until Python gives up, a non-UTF-8 file raises `UnicodeDecodeError`, and an alias bomb (a few
lines whose aliases expand to millions of nodes) costs minutes once pydantic walks the tree.
This loader keeps Pipecat's meaning of `!include <path relative to the including file>` and
turns every one of those into a `ScenarioError` naming the file, the line and the limit:

- a file over `MAX_FILE_BYTES`;
- bytes that are not UTF-8;
- an `!include` cycle, or includes nested deeper than `MAX_INCLUDE_DEPTH`;
- more than `MAX_NODES` nodes once aliases are expanded, or an alias that contains itself;
- nesting too deep for the parser;
- a mapping that names one key twice (`strict.UniqueKeyLoader`).
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipecat_rl.errors import ScenarioError
from pipecat_rl.strict import UniqueKeyLoader

MAX_FILE_BYTES = 1_000_000
"""Largest scenario (or included) file read, in bytes."""
MAX_INCLUDE_DEPTH = 8
"""How deep `!include`s may nest."""
MAX_NODES = 100_000
"""Most YAML nodes one document may expand to, its includes and aliases counted."""


@dataclass
class _State:
    """One top-level load: the include chain and the nodes counted so far."""

    chain: list[Path] = field(default_factory=list)
    nodes: int = 0


def read_text(path: Path) -> str:
    """A file's text, refusing oversized files and bytes that are not UTF-8."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ScenarioError(
                f"{path}: the file is {size:,} bytes, over the {MAX_FILE_BYTES:,}-byte limit for "
                "scenario files; split it or trim it"
            )
        raw = path.read_bytes()
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read the file ({e.strerror or e})") from e
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ScenarioError(
            f"{path}: line {line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
            "save the file as UTF-8"
        ) from e


def load_yaml(path: Path, base: type[yaml.SafeLoader] = UniqueKeyLoader) -> tuple[Any, Any]:
    """Load one YAML document with `!include`; returns its data and its node tree (for lines).

    Raises:
        ScenarioError: naming the file, the line and the reason or limit.
    """
    return _load(Path(path).resolve(), base, _State())


def _load(path: Path, base: type[yaml.SafeLoader], state: _State) -> tuple[Any, Any]:
    if path in state.chain:
        loop = " -> ".join(p.name for p in (*state.chain, path))
        raise ScenarioError(f"{state.chain[-1]}: !include loops back to {path} ({loop})")
    if len(state.chain) > MAX_INCLUDE_DEPTH:
        raise ScenarioError(
            f"{state.chain[-1]}: !include nested deeper than {MAX_INCLUDE_DEPTH} files"
        )
    text = read_text(path)
    state.chain.append(path)
    loader = _loader_class(path, base, state)(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            state.nodes += _expanded_size(node, path, state.nodes)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" line {mark.line + 1}:" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ScenarioError(f"{path}:{where} invalid YAML: {problem}") from e
    except RecursionError as e:
        raise ScenarioError(f"{path}: the YAML is nested too deeply to read") from e
    finally:
        loader.dispose()
        state.chain.pop()
    return data, node


def _loader_class(path: Path, base: type[yaml.SafeLoader], state: _State) -> type[yaml.SafeLoader]:
    class _Loader(base):  # type: ignore[valid-type,misc]
        pass

    def include(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise ScenarioError(
                f"{path}: line {node.start_mark.line + 1}: !include expects a file path"
            )
        target = (path.parent / str(loader.construct_scalar(node))).resolve()
        return _load(target, base, state)[0]

    _Loader.add_constructor("!include", include)
    return _Loader


def _expanded_size(root: yaml.Node, path: Path, counted: int) -> int:
    """Nodes in the tree with every alias expanded (memoised: linear in distinct nodes)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise ScenarioError(
                f"{path}: line {node.start_mark.line + 1}: an alias contains itself "
                "(recursive YAML); scenario files must be trees"
            )
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total += sum(size(v) for v in node.value)
        if counted + total > MAX_NODES:
            raise ScenarioError(
                f"{path}: line {node.start_mark.line + 1}: expands to more than {MAX_NODES:,} "
                "YAML nodes once aliases and includes are counted (an alias bomb?); "
                "write the data out or split the file"
            )
        open_nodes.discard(key)
        sizes[key] = total
        return total

    return size(root)
