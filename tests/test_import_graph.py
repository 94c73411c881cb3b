"""The import arrows point one way: no cycles between the project's modules, the library below its CLI imports no
sweeps / analysis / reports, and analysis / reports import no torch (read from the source, imports inside
functions and ``if TYPE_CHECKING:`` blocks included: an import for a type hint is an arrow too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("attnres", "sweeps", "analysis", "reports")
HEAVY = ("torch", "lightning", "optuna", "submitit")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """The modules ``name`` imports: project modules by their full name, other packages by their top name."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            # ``from pkg import sub`` imports the submodule pkg.sub where there is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            while target not in MODULES and "." in target:
                target = target.rpartition(".")[0]
            out.add(target if target in MODULES else target.split(".")[0])
    out.discard(name)
    return out


GRAPH = {name: {t for t in imports_of(name) if t in MODULES} for name in MODULES}


def test_the_graph_covers_the_project():
    assert {"attnres.config", "attnres.mixers", "sweeps.grid", "analysis.laws.fit", "reports.build"} <= set(GRAPH)
    assert "attnres.config" in GRAPH["sweeps.grid"]  # the parser sees real arrows


def test_no_import_cycles():
    cycles, state = [], dict.fromkeys(GRAPH, 0)  # 0 unseen, 1 on the stack, 2 done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH[node]):
            if state[nxt] == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif state[nxt] == 0:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(GRAPH):
        if state[name] == 0:
            visit(name, [name])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize(
    "name", sorted(n for n in MODULES if n.startswith("attnres") and not n.startswith("attnres.cli"))
)
def test_the_library_below_its_cli_imports_no_sweeps_analysis_or_reports(name):
    upward = {t for t in imports_of(name) if t.split(".")[0] in ("sweeps", "analysis", "reports")}
    assert not upward, f"{name} imports {sorted(upward)}; only attnres.cli may"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.split(".")[0] in ("analysis", "reports")))
def test_analysis_and_reports_import_no_torch(name):
    seen, todo = set(), [name]
    while todo:  # follow project imports: a torch-importing attnres module counts too
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        found = imports_of(current)
        heavy = found & set(HEAVY)
        assert not heavy, f"{name} imports {sorted(heavy)} (through {current})"
        todo += [t for t in found if t in MODULES]


# analysis/ and reports/ in rooms (issue 49), lowest first: a module imports only its own room and the rooms before it;
# the package's own files (its face, its CLI, the report's builder) stand above every room
ROOMS = {
    "analysis": ("base", "laws", "data", "estimates", "fitting", "tables"),
    "reports": ("base", "document", "figures", "sections"),
}


def room_rank(name: str) -> int:
    package, *rest = name.split(".")
    rooms = ROOMS[package]
    return rooms.index(rest[0]) if len(rest) > 1 and rest[0] in rooms else len(rooms)


def test_every_room_is_a_package():
    for package, rooms in ROOMS.items():
        for room in rooms:
            assert (ROOT / package / room / "__init__.py").is_file(), f"{package}/{room}/ has no __init__.py"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.split(".")[0] in ROOMS))
def test_rooms_import_one_way(name):
    package = name.split(".")[0]
    upward = sorted(t for t in GRAPH[name] if t.split(".")[0] == package and room_rank(t) > room_rank(name))
    assert not upward, f"{name} imports {upward}, from a room above its own ({' < '.join(ROOMS[package])})"
