"""Declared seams: no package of zonebus uses a private name (`_name`) of another package.

Every call from an extension into the core, or from one package into another, goes through a public name
(`zonebus/server/hooks.py` lists what the core offers). The check reads the source with `ast`; the package of
a module is its top-level folder under `zonebus/` (a top-level module such as `node.py` is a package of its
own). A private name belongs to the packages that define it: a `def`/`class` of that name, an assignment to
`self._name` / `cls._name`, or a module- or class-level assignment. Flagged:

- `from zonebus.<other package>... import _name`;
- `obj._name` (read, write or call; `obj` anything but `self`/`cls`, `super()` included), or
  `getattr(obj, "_name")` (also setattr, hasattr, delattr), where `_name` is defined in another package and
  not in the accessing one (the check has no types: a name that both define counts as the accessing
  package's own).

Private names of third-party libraries (pyspark's `_jvm`, nats-py's `_server_info`) are not zonebus's seams
and are not checked.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "zonebus"

REFLECTION = ("getattr", "setattr", "hasattr", "delattr")  # `getattr(obj, "_name")` is a reach-in all the same

# (module path relative to zonebus/, "obj._name" as written): uses that are allowed, each with its reason.
ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class PrivateUse:
    module: str  # path relative to zonebus/
    line: int
    text: str  # as written: "server._cid", "from zonebus.x import _y"
    name: str


def package_of(module: str) -> str:
    parts = Path(module).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and len(name) > 1


def defined_private_names(tree: ast.Module) -> set[str]:
    """The private names a module defines (see the module's docstring)."""
    names: set[str] = set()
    scopes: list[list[ast.stmt]] = [tree.body]
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                scopes.append(node.body)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
    for body in scopes:  # module- and class-level assignments
        for stmt in body:
            targets: list[ast.expr] = []
            if isinstance(stmt, ast.Assign):
                targets = list(stmt.targets)
            elif isinstance(stmt, ast.AnnAssign):
                targets = [stmt.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names.add(leaf.id)
    return {name for name in names if is_private(name)}


def private_uses(tree: ast.Module, module: str) -> list[PrivateUse]:
    """Private names a module reaches on other objects, and private names it imports from zonebus."""
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            uses.append(PrivateUse(module, node.lineno, f"{ast.unparse(node.value)}.{node.attr}", node.attr))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in REFLECTION \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and is_private(node.args[1].value):
            obj = node.args[0]
            if isinstance(obj, ast.Name) and obj.id in ("self", "cls"):
                continue
            uses.append(PrivateUse(module, node.lineno, ast.unparse(node), node.args[1].value))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "zonebus":
            for alias in node.names:
                if is_private(alias.name):
                    uses.append(PrivateUse(module, node.lineno, f"from {node.module} import {alias.name}", alias.name))
    return uses


def imported_package(text: str) -> str | None:
    """For `from zonebus.<pkg>.x import _y`: `<pkg>` (or the top-level module's name)."""
    if not text.startswith("from zonebus."):
        return None
    return text.removeprefix("from zonebus.").split(" ")[0].split(".")[0]


@functools.cache
def cross_package_uses() -> tuple[PrivateUse, ...]:
    trees = {str(path.relative_to(PACKAGE_ROOT)): ast.parse(path.read_text(), str(path))
             for path in sorted(PACKAGE_ROOT.rglob("*.py"))}
    defined_in_module = {module: defined_private_names(tree) for module, tree in trees.items()}
    owners: dict[str, set[str]] = defaultdict(set)
    for module, names in defined_in_module.items():
        for name in names:
            owners[name].add(package_of(module))
    found = []
    for module, tree in trees.items():
        package = package_of(module)
        for use in private_uses(tree, module):
            source = imported_package(use.text)
            if source is not None:
                if source != package:
                    found.append(use)
                continue
            defined_by = owners.get(use.name, set())
            if package in defined_by:
                continue  # (taken for the package's own: a name that several packages define is not told apart)
            if defined_by:
                found.append(use)
    return tuple(found)


def test_the_checker_finds_a_reach_in(tmp_path: Path) -> None:
    """The rules on a small tree: an import and an attribute across packages are flagged, a package's own
    private names and self's are not."""
    core = ast.parse("class Server:\n    def __init__(self):\n        self._cid = 0\n        self._cid += 1\n")
    ext = ast.parse("from zonebus.server.x import _helper\n\ndef wire(server):\n    server._cid = 5\n"
                    "    getattr(server, '_cid')\n    getattr(self, '_own')\n")
    own = ast.parse("class Snap:\n    _task = None\n\ndef f(snap):\n    return snap._task\n")
    assert defined_private_names(core) == {"_cid"}
    assert [u.text for u in private_uses(ext, "workers/w.py")] == ["from zonebus.server.x import _helper",
                                                                      "server._cid", "getattr(server, '_cid')"]
    assert imported_package("from zonebus.server.x import _helper") == "server"
    assert defined_private_names(own) == {"_task"}
    assert package_of("node.py") == "node" and package_of("server/server.py") == "server"


@pytest.mark.timeout(60)
def test_no_private_name_of_another_package_is_used() -> None:
    found = [use for use in cross_package_uses() if (use.module, use.text) not in ALLOWED]
    listing = "\n".join(f"zonebus/{u.module}:{u.line}: {u.text}" for u in found)
    assert not found, f"private names of another package (declare a public interface instead):\n{listing}"


def test_every_allowed_use_still_exists() -> None:
    present = {(use.module, use.text) for use in cross_package_uses()}
    assert not set(ALLOWED) - present, "allow-list entries that no longer occur: remove them"
