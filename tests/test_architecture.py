"""The house's shape, as docs/design.md draws it: rooms a newcomer can name, arrows
that only go down, no circles. Read from the source with `ast`, so a new import
that breaks the shape fails here, not in a reviewer's head.

Only imports that run when a module is imported count: those inside functions or
under `if TYPE_CHECKING:` are how a room names a type from a room above without
depending on it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "gpu", "kernels", "swarm", "agents")

# Lowest first: a room may import only rooms before it in this list (and itself).
RUNTIME_ROOMS = [
    "runtime.errors",
    "runtime.events",
    "runtime.scheduling",
    "runtime.actors",
    "runtime.owner",
    "runtime.tools",
    "runtime.toolcalls",
    "runtime.agent",
    "runtime",
]
# What each package may not import: the runtime knows no engine and no command
# line, the engine no swarm. Ready-made agents are written as a user writes
# theirs, on the public `swarm` API and its coding toolkit (swarm.coding); the
# command line runs them.
FORBIDDEN = {
    "kernels": ("runtime", "gpu", "swarm", "agents"),
    "runtime": ("gpu", "swarm", "agents"),
    "gpu": ("swarm", "agents"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(path: Path) -> set[str]:
    """Modules imported when this one is: module-level statements only."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If):
                guard = ast.unparse(node.test)
                if "TYPE_CHECKING" not in guard:
                    visit(node.body)
                    visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(ast.parse(path.read_text()).body)
    return found


def graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "sample_project" not in p.parts]
    modules = {module_name(p): p for p in files}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        # `from pkg import name` names a module or a name in pkg: keep what is a module
        edges[name] = {m for m in top_level_imports(path) if m in modules and m != name}
    return edges


def room(module: str) -> str:
    for candidate in sorted(RUNTIME_ROOMS, key=len, reverse=True):
        if module == candidate or module.startswith(candidate + "."):
            return candidate
    raise AssertionError(f"{module} is in no room of runtime")


def test_no_module_imports_itself_round_a_circle() -> None:
    edges = graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                circle = stack[stack.index(nxt) :] + [nxt]
                raise AssertionError("import circle: " + " -> ".join(circle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_packages_import_only_packages_below_them() -> None:
    for module, imports in graph().items():
        package = module.split(".")[0]
        for target in imports:
            assert not target.startswith(FORBIDDEN.get(package, ())), f"{module} imports {target}, a package above it"
            if package == "agents" and target.startswith("swarm"):
                assert target == "swarm" or target.startswith("swarm.coding"), (
                    f"{module} imports {target}: ready-made agents use the public `swarm` API (and its coding toolkit) only"
                )


def test_runtime_rooms_import_only_rooms_below_them() -> None:
    for module, imports in graph().items():
        if not module.startswith("runtime"):
            continue
        for target in imports:
            if target.startswith("runtime"):
                assert RUNTIME_ROOMS.index(room(target)) <= RUNTIME_ROOMS.index(room(module)), (
                    f"{module} ({room(module)}) imports {target} ({room(target)}), a room above it"
                )
