"""The package's modules import each other one way, down the floors of :data:`FLOORS`.

Every import statement counts, module-level or inside a function (a lazy import that closes a
cycle is still a cycle), and so do ``if TYPE_CHECKING:`` blocks: a type-only arrow up a floor
is still an arrow up. No module imports another module's private (``_``-prefixed) names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lerobot_nodes

PACKAGE_ROOT = Path(lerobot_nodes.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, type_only: bool = True) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if not type_only and isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def package_modules() -> dict[str, Path]:
    """Every module of the package, ``graphs/`` (installed as ``lerobot_nodes.graphs``) included."""
    modules = {_module_name(p): p for p in PACKAGE_ROOT.rglob("*.py")}
    graphs = PACKAGE_ROOT.parents[1] / "graphs"
    if graphs.is_dir():  # a source checkout; an installed package has it inside already
        for path in graphs.glob("*.py"):
            name = "lerobot_nodes.graphs" + ("" if path.stem == "__init__" else f".{path.stem}")
            modules.setdefault(name, path)
    return modules


def import_graph(type_only: bool = True) -> dict[str, set[str]]:
    modules = package_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path)), type_only):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


FLOORS: list[tuple[str, ...]] = [
    ("_version", "errors", "atomic", "home", "config", "heap", "lazy_exports", "arrays"),  # what everything may use
    ("workers",),  # DataLoader worker processes, shared-memory segments
    ("metrics", "batch_mixing"),  # the sink nodes count into, the shared counter table; batch-mixing figures
    ("sources",),  # bytes: local, fsspec, Hub, HTTP
    ("format",),  # LeRobot v3 on disk: meta, data Parquet, depth
    ("mp4",),  # MP4 boxes, indexes, clips, decoding
    ("sidecar", "video_checks", "dataset_doctor"),  # MP4 indexes cached and published; metadata against them; inspect's checks
    ("sample",),  # one sample's frames and rows
    ("fetch", "batch_memory"),  # an episode's byte ranges and budget; a batch's storage
    ("nodes",),  # the torchdata nodes
    ("streaming_graph",),  # one reader's graph of nodes
    ("resume",),  # where readers start again
    ("dataset", "map_style"),  # the datasets
    ("loader",),  # the DataLoader around a dataset
    ("graphs",),  # ready-made compositions
    ("testing",),  # test kit: dataset writer, loopback servers
    ("cli",),  # commands
]
"""Floors, lowest first: a module may import its own floor and the ones below, never one above."""


def floor_of(module: str) -> int:
    if module == "lerobot_nodes":
        return len(FLOORS)  # the package's public names re-export every floor
    top = module.split(".")[1]
    for level, names in enumerate(FLOORS):
        if top in names:
            return level
    raise AssertionError(f"{module} sits on no floor: add its folder to FLOORS in {__file__}")


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{name} (floor {FLOORS[floor_of(name)]}) imports {target} (floor {FLOORS[floor_of(target)]})"
        for name in sorted(graph)
        for target in sorted(graph[name])
        if floor_of(target) > floor_of(name)
    ]


def test_no_import_cycle_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_imports_only_go_down_the_floors():
    arrows = upward_arrows(import_graph())
    assert not arrows, "imports up a floor:\n" + "\n".join(arrows)


def test_the_floor_check_sees_an_upward_arrow():
    assert upward_arrows({"lerobot_nodes.sources.hub": {"lerobot_nodes.cli.console"}})
    assert not upward_arrows({"lerobot_nodes.cli.console": {"lerobot_nodes.sources.hub"}})


def test_no_module_imports_another_modules_private_names():
    modules = package_modules()
    found = []
    for name, path in modules.items():
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("lerobot_nodes")):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private:
                    found.append(f"{name}:{node.lineno} imports {', '.join(private)}")
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    graph = import_graph()
    assert "lerobot_nodes.mp4.plan" in graph["lerobot_nodes.mp4.clip"] or "lerobot_nodes.mp4.mux" in graph[
        "lerobot_nodes.mp4.plan"
    ]
