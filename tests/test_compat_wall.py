"""The compat wall: outside `pipecat_rl/compat.py`, no module touches a private Pipecat name.

What counts as touching one (the rule, kept small enough to read):

- importing it: `from pipecat.x import _y`, `import pipecat.x._y`, `from pipecat.x._y import z`;
- reading or writing `obj._name` (or `getattr(obj, "_name")`, `setattr`, `hasattr`) where
  `_name` is a private name Pipecat's installed sources define (`def _name`, `self._name`,
  `cls._name`), on any object but `self` / `cls`;
- on `self` / `cls`, the same names unless the enclosing class defines or assigns them itself,
  or the class derives from no Pipecat class directly and our own code defines the name (a mixin
  reading its facade's `self._read`). So a subclass of a Pipecat class that reads
  `self._input_name` relies on Pipecat's private state, while our own `self._queue` is ours,
  whatever Pipecat calls its own attributes.

What it cannot see: a class that assigns a name Pipecat's base class also keeps (an overwrite
reads as our own attribute), and a Pipecat private reached through one of our own base classes
under a name our code also defines.

Names are collected from the Pipecat that is installed, so an upgrade that adds a private name we
happen to use fails here, by file and line, and the fix is a function in `compat.py`.
"""

import ast
import importlib.util
import re
from functools import cache
from pathlib import Path

import pipecat_rl

PKG = Path(pipecat_rl.__file__).parent
WALL = PKG / "compat.py"
_PRIVATE = re.compile(r"(?:\bdef\s+|\bself\.|\bcls\.)(_[A-Za-z0-9]\w*)")
_REFLECTION = ("getattr", "setattr", "hasattr", "delattr")


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_names(source: str) -> set[str]:
    return {m.group(1) for m in _PRIVATE.finditer(source) if _is_private(m.group(1))}


@cache
def our_private_names() -> frozenset[str]:
    """Every private name a class of pipecat-rl defines or assigns (compat.py aside).

    Definitions only: a read of `self._x` does not make `_x` ours.
    """
    names: set[str] = set()
    for path in PKG.rglob("*.py"):
        if path != WALL:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    names |= {n for n in _own_names(node) if _is_private(n)}
    return frozenset(names)


@cache
def pipecat_private_names() -> frozenset[str]:
    """Every private attribute or method name the installed Pipecat defines (read, not imported)."""
    spec = importlib.util.find_spec("pipecat")
    assert spec is not None and spec.submodule_search_locations, "pipecat-ai is not installed"
    names: set[str] = set()
    for root in spec.submodule_search_locations:
        for path in Path(root).rglob("*.py"):
            names |= _defined_names(path.read_text(errors="replace"))
    return frozenset(names)


def _own_names(cls: ast.ClassDef) -> set[str]:
    """Names a class defines itself: its methods, class attributes, and `self.x = ...` targets."""
    names: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Name):
                    names.add(t.id)
                elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                    if t.value.id in ("self", "cls"):
                        names.add(t.attr)
    return names


def _pipecat_bindings(tree: ast.Module) -> set[str]:
    """Names a module binds to something imported from Pipecat (classes, modules)."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            if (node.module or "").split(".")[0] == "pipecat":
                bound |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "pipecat":
                    bound.add(a.asname or a.name.split(".")[0])
    return bound


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


class _Checker(ast.NodeVisitor):
    def __init__(
        self, where: str, private: frozenset[str], ours: frozenset[str], pipecat: set[str]
    ):
        self.where = where
        self.private = private
        self.ours = ours
        self.pipecat = pipecat
        # the enclosing classes, innermost last: (own names, derives from Pipecat directly)
        self.classes: list[tuple[set[str], bool]] = []
        self.found: list[str] = []

    def _flag(self, node: ast.AST, what: str) -> None:
        self.found.append(f"{self.where}:{getattr(node, 'lineno', 0)}: {what}")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        from_pipecat = any(_root_name(b) in self.pipecat for b in node.bases)
        self.classes.append((_own_names(node), from_pipecat))
        self.generic_visit(node)
        self.classes.pop()

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            parts = alias.name.split(".")
            if parts[0] == "pipecat" and any(_is_private(p) for p in parts):
                self._flag(node, f"import {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        parts = (node.module or "").split(".")
        if node.level == 0 and parts[0] == "pipecat":
            if any(_is_private(p) for p in parts):
                self._flag(node, f"from {node.module} import ...")
            for alias in node.names:
                if _is_private(alias.name):
                    self._flag(node, f"from {node.module} import {alias.name}")
        self.generic_visit(node)

    def _touch(self, node: ast.AST, owner: ast.expr, name: str) -> None:
        if not _is_private(name) or name not in self.private:
            return
        on_self = isinstance(owner, ast.Name) and owner.id in ("self", "cls")
        if on_self and self.classes:
            own, from_pipecat = self.classes[-1]
            if name in own or (not from_pipecat and name in self.ours):
                return  # our own private, even if Pipecat uses the same word
        self._flag(node, f"{ast.unparse(owner)}.{name}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._touch(node, node.value, node.attr)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id in _REFLECTION
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            self._touch(node, node.args[0], node.args[1].value)
        self.generic_visit(node)


def private_pipecat_uses(source: str, where: str = "<snippet>") -> list[str]:
    """Each place in `source` that touches a private Pipecat name, as `where:line: what`."""
    tree = ast.parse(source)
    checker = _Checker(where, pipecat_private_names(), our_private_names(), _pipecat_bindings(tree))
    checker.visit(tree)
    return checker.found


def test_no_module_outside_compat_touches_a_private_pipecat_name():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if path != WALL:
            found += private_pipecat_uses(path.read_text(), str(path.relative_to(PKG.parent)))
    assert found == [], "move these into pipecat_rl/compat.py:\n" + "\n".join(found)


def test_the_names_come_from_the_installed_pipecat():
    names = pipecat_private_names()
    # what compat.py itself relies on must be in the list, or the wall could not see it
    for name in ("_call_event_handler", "_register_event_handler", "_processors", "_client"):
        assert name in names
    assert "__init__" not in names and all(n.startswith("_") for n in names)


def test_a_planted_private_access_is_caught():
    planted = """
from pipecat.transports.base_transport import BaseTransport
from pipecat.utils import _private_helper
import pipecat.audio._impl


class Ours(BaseTransport):
    def __init__(self):
        super().__init__()
        self._queue = []
        self.name = self._input_name  # Pipecat's state, read through self

    async def fire(self, transport):
        self._queue.append(1)  # ours
        await transport._call_event_handler("on_client_connected", "c")
        return getattr(transport, "_register_event_handler", None)
"""
    found = private_pipecat_uses(planted)
    assert found == [
        "<snippet>:3: from pipecat.utils import _private_helper",
        "<snippet>:4: import pipecat.audio._impl",
        "<snippet>:11: self._input_name",
        "<snippet>:15: transport._call_event_handler",
        "<snippet>:16: transport._register_event_handler",
    ]


def test_public_names_and_our_own_privates_pass():
    clean = """
from pipecat.transports.base_transport import BaseTransport


class Ours(BaseTransport):
    def __init__(self):
        super().__init__()
        self._params = {}

    def params(self):
        return self._params, self.input()

    def _helper(self):
        return self._helper


class Mixin:  # a room of our own facade: its privates are defined elsewhere in our code
    def rows(self):
        return self._read("select 1")
"""
    assert "_read" in pipecat_private_names() and "_read" in our_private_names()
    assert private_pipecat_uses(clean) == []
