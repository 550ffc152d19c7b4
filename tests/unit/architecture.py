"""The project's shape, read from its source with ``ast``: which module imports which, and how
long each class and function is. What tests/unit/test_architecture.py and test_sizes.py check.

Every import counts, wherever it is written: at the top, inside a function (a lazy import
is still a dependency), under ``if TYPE_CHECKING:`` (a type that needs the other module is
a dependency of the design even when not of the run), relative or absolute.
"""

from __future__ import annotations

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("sandbox", "kernel")


def module_files(root: pathlib.Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, pathlib.Path]:
    """Dotted module name -> its file, for every module of ``packages`` under ``root``."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(module: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """The modules of ``modules`` that ``module`` imports (a name imported from a package
    counts as its submodule when there is one, else as the package)."""

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(known(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                targets.add(submodule if submodule in modules else known(source))
    targets.discard(None)
    targets.discard(module)
    return targets


def import_graph(root: pathlib.Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    modules = module_files(root, packages)
    return {module: _imported(module, path, modules) for module, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules, as a path that comes back to its
    start (``[a, b, a]``); empty when the imports point one way."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_a_circle_in(group, graph) for group in groups]


def _a_circle_in(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the group's first module back to itself, within the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    following.append(w)
        frontier = following
    raise AssertionError(f"no circle through {start} in {sorted(group)}")


def layer_breaches(graph: dict[str, set[str]], forbidden: dict[str, tuple[str, ...]]) -> list[str]:
    """Each import from a layer into one it must not import, as ``module -> module``.
    ``forbidden`` maps a package (``sandbox.core``) to the packages its modules may not import
    (a module is in a package when its dotted name is the package's or starts with it and a dot)."""

    def within(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    return sorted(f"{module} -> {target}"
                  for layer, banned in forbidden.items()
                  for module, targets in graph.items() if within(module, layer)
                  for target in targets if any(within(target, b) for b in banned))


def oversized(limit_class: int, limit_function: int, root: pathlib.Path = REPO,
              packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Each class longer than ``limit_class`` lines and function longer than ``limit_function``,
    as ``path:line kind name (N lines)``."""
    found = []
    for path in module_files(root, packages).values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                kind, limit = "class", limit_class
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                kind, limit = "function", limit_function
            else:
                continue
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found.append(f"{path.relative_to(root)}:{node.lineno} {kind} {node.name} ({lines} lines)")
    return found
