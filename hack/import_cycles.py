"""Report import circles between tessera's production modules; exit 1 when there is one.

`python -m hack.import_cycles [package ...]` (default: driver kubeletplugin controller) reads
every module's source with `ast`, so nothing is imported or executed. An edge A -> B is any
`import B` or `from B import x` in A, wherever it stands: at the top, inside a function (an import
moved into a function to dodge a circle is still a circle in the design) or under
`if TYPE_CHECKING:` (a type-only circle still ties the two modules together). `from P import x`
counts as an edge to the module P.x when there is one, else to P. Only imports of the scanned
packages are followed; the standard library and third-party packages are not part of any circle.

It also reports imports against the direction the packages depend on (kubeletplugin and
controller import driver, never the other way, and never each other). The `lint` target of the
Makefile runs it, so that a new circle or a backwards import fails the build.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PACKAGES = ("driver", "kubeletplugin", "controller")
# top-level package -> the scanned packages it must not import
FORBIDDEN = {
    "driver": {"kubeletplugin", "controller"},
    "kubeletplugin": {"controller"},
    "controller": {"kubeletplugin"},
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def find_modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of the packages, by dotted name."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            modules[module_name(path, root)] = path
    return modules


def _resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names (relative imports resolved against `module`)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The scanned modules that `module` imports, anywhere in its source."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve_from(module, is_package, node)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in known:
                    found.add(submodule)
                elif source in known:
                    found.add(source)
    found.discard(module)
    return found


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    modules = find_modules(root, packages)
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit on deep graphs): components of 2 or more modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop(0)
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def one_cycle(graph: dict[str, set[str]], component: Sequence[str]) -> list[str]:
    """A shortest circle through the component's first module, as a path that ends where it starts."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    return [start]


def backwards_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports against the packages' direction (FORBIDDEN), as (importer, imported)."""
    return sorted(
        (source, target)
        for source, targets in graph.items()
        for target in targets
        if target.split(".")[0] in FORBIDDEN.get(source.split(".")[0], set())
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", default=list(DEFAULT_PACKAGES))
    args = parser.parse_args(argv)
    out = sys.stdout
    graph = import_graph(ROOT, args.packages)
    components = strongly_connected(graph)
    for component in components:
        out.write(f"import circle among {len(component)} modules: {', '.join(component)}\n")
        out.write(f"  e.g. {' -> '.join(one_cycle(graph, component))}\n")
    backwards = backwards_imports(graph)
    for source, target in backwards:
        out.write(f"backwards import: {source} imports {target}\n")
    if components or backwards:
        return 1
    edges = sum(len(targets) for targets in graph.values())
    out.write(f"no import circle: {len(graph)} modules, {edges} imports ({', '.join(args.packages)})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
