"""Layers: no import cycle between the packages of zonebus, and no package imports one in a layer above its own.

The graph is read from the source with `ast`: every `import` and `from ... import` of a module counts, at module
level, inside functions and under `if TYPE_CHECKING:` alike, relative imports resolved against the module's
package. A package is a top-level folder under `zonebus/`; a top-level module (`node.py`, `options.py`) is a
package of its own, and `zonebus/__init__.py` (the versions) is `zonebus`. `from zonebus import x` counts as an
import of `x` when `x` is a package or top-level module, else of `zonebus`.

`LAYERS` is the declared order, lowest first: a package may import packages of lower layers only, never one of
its own layer or above. A new package gets a row; an edge that goes up means code to move down (a leaf module
both sides can import), not a reordering for convenience.
"""

from __future__ import annotations

import ast
import functools
import itertools
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "zonebus"
ROOT_NAME = "zonebus"

LAYERS: list[tuple[str, ...]] = [
    # the subject grammar, the trie and mappings; the price lists as package data; the versions; which compiled
    # twins run
    ("subjects", "prices", ROOT_NAME, "compiled"),
    # every setting a server runs with (reads subject grammar); shared storage objects and their meter
    ("options", "storage"),
    # wire parsers and URL forms (no I/O); tls files and nkeys; zones and the traffic ledger
    ("protocol", "credentials", "ledger"),
    # the storage engine: message stores and the shared store (on storage/)
    ("store",),
    # the server core: client connections, routing, monitoring, the hooks extensions set
    ("server",),
    # the link layer: base of route and gateway connections, compression, reconnect backoff
    ("link",),
    # routes and gossip, queue policy, the zone relay; cluster metadata on Raft
    ("cluster", "meta"),
    # gateways (use the cluster's routing); leaf nodes; streams and consumers; durable queue groups
    ("gateway", "leaf", "stream", "queue"),
    # the zone router (streams on shared storage, router channels)
    ("zonerouter",),
    # the configuration file reader: text -> options (the runtime above reads options only)
    ("config",),
    # the composition root: one server process wired from its options
    ("node",),
    # worker processes (each builds a node); the PySpark cost jobs; servers on loopback from a config text
    ("workers", "pipeline", "localservers"),
    # the `zonebus` command
    ("cli",),
    # `python -m zonebus`; the test kit (real processes, proxies, fakes: may use any package)
    ("__main__", "testing"),
]


def package_of(module: str) -> str:
    """The package of a module given by its dotted name under zonebus (`server.client`, `node`, ``)."""
    return module.split(".")[0] if module else ROOT_NAME


@functools.cache
def top_level_names() -> frozenset[str]:
    return frozenset(p.name for p in PACKAGE_ROOT.iterdir() if (p / "__init__.py").is_file()) | frozenset(
        p.stem for p in PACKAGE_ROOT.glob("*.py") if p.name != "__init__.py")


def imported_modules(tree: ast.Module, module: str, is_package: bool) -> list[tuple[str, int]]:
    """(dotted name under zonebus, line) of every zonebus import in a module, wherever it sits (function bodies
    and `TYPE_CHECKING` blocks included); relative imports are resolved. `module` is the module's dotted name
    under zonebus (`` for zonebus/__init__.py)."""
    found = []
    here = module.split(".") if module else []
    base = here if is_package else here[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == ROOT_NAME or alias.name.startswith(ROOT_NAME + "."):
                    found.append((alias.name.removeprefix(ROOT_NAME).lstrip("."), node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(parent + ([node.module] if node.module else []))
            elif node.module == ROOT_NAME or (node.module or "").startswith(ROOT_NAME + "."):
                target = node.module.removeprefix(ROOT_NAME).lstrip(".")
            else:
                continue
            if target:
                found.append((target, node.lineno))
            else:  # `from zonebus import x` / `from .. import x` at the top: x is a package, or a name of __init__
                for alias in node.names:
                    found.append((alias.name if alias.name in top_level_names() else "", node.lineno))
    return found


def module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(PACKAGE_ROOT).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join(parts), is_package


@functools.cache
def package_graph() -> dict[str, dict[str, list[str]]]:
    """{package: {imported package: ["path:line", ...]}} over every module of zonebus (no self-edges)."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        module, is_package = module_name(path)
        source = package_of(module)
        graph[source]  # a package that imports nothing is a node all the same
        for target, line in imported_modules(ast.parse(path.read_text(), str(path)), module, is_package):
            imported = package_of(target)
            if imported != source:
                graph[source][imported].append(f"zonebus/{path.relative_to(PACKAGE_ROOT)}:{line}")
    return {pkg: dict(edges) for pkg, edges in graph.items()}


def find_cycle(graph: dict[str, dict[str, list[str]]] | dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def upward_edges(graph: dict[str, dict[str, list[str]]] | dict[str, set[str]],
                 layers: list[tuple[str, ...]]) -> list[tuple[str, str]]:
    """Edges (importer, imported) whose imported package is not in a lower layer than the importer."""
    level = {pkg: i for i, layer in enumerate(layers) for pkg in layer}
    return sorted((src, dst) for src, edges in graph.items() for dst in edges if level[dst] >= level[src])


def test_the_checks_fail_on_a_bad_graph() -> None:
    """The checks can fail: a cycle is found, an edge up or sideways is reported, a relative import and one
    inside a function are read."""
    cyclic = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(cyclic) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    layers = [("a",), ("b", "c"), ("d",)]
    assert upward_edges(cyclic, layers) == [("a", "b"), ("b", "c")]
    tree = ast.parse("from .client import X\nfrom ..link import Y\n\ndef f():\n    from zonebus.cli.main import main\n"
                     "    import zonebus.node\n")
    assert imported_modules(tree, "server.websocket", False) == [
        ("server.client", 1), ("link", 2), ("cli.main", 5), ("node", 6)]


def test_every_package_has_a_layer() -> None:
    declared = [pkg for layer in LAYERS for pkg in layer]
    assert len(declared) == len(set(declared)), "a package declared twice"
    assert set(package_graph()) <= set(declared), f"packages without a layer: {set(package_graph()) - set(declared)}"
    assert set(declared) - set(package_graph()) == set(), "layers name packages that no longer exist"


@pytest.mark.timeout(60)
def test_no_import_cycle_between_packages() -> None:
    graph = package_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle) + "\n" + "\n".join(
        f"{a} -> {b}: {', '.join(graph[a][b])}" for a, b in itertools.pairwise(cycle))


@pytest.mark.timeout(60)
def test_every_import_goes_down_the_layers() -> None:
    graph = package_graph()
    bad = upward_edges(graph, LAYERS)
    assert not bad, "imports of a package in the same layer or above (move the shared code down):\n" + "\n".join(
        f"{a} -> {b}: {', '.join(graph[a][b])}" for a, b in bad)
