"""The package's layers point down only, and no module imports itself round a cycle.

Read from the source with ``ast`` (every import, including those inside functions), so the rule holds
for lazy imports too. Layers, bottom up: models, tables, data and small utilities; inference; attack,
defense and diagnostics; eval (metrics, scoring, judge); runs (orchestration, records, reports); the
package root (the public API); the command-line binaries (``atp_jax.cli``). A module may import its own layer
or any below it.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "atp_jax"

LAYERS = {
    "models": 0,
    "tables": 0,
    "data": 0,
    "version": 0,
    "plotting": 0,
    "stats": 0,
    "distributed": 0,
    "compilation": 0,
    "sharding": 0,
    "http_client": 0,
    "jsonl": 0,
    "inference": 1,
    "attack": 2,
    "defense": 2,
    "diagnostics": 2,
    "eval": 3,
    "runs": 4,
    "train": 4,
    "__init__": 5,
    "cli": 6,
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST):
    """Every node but those under ``if TYPE_CHECKING:`` (annotations only: never imported at run time)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("atp_jax")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("atp_jax"):
            # "from atp_jax.attack import registry" imports the submodule when it is one.
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                sub = PACKAGE.parent / Path(*candidate.split("."))
                found.add(candidate if sub.with_suffix(".py").is_file() or sub.is_dir() else node.module)
    return found


def _layer(module: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "__init__"
    assert key in LAYERS, f"{module}: no layer assigned; add atp_jax/{key} to LAYERS in this test"
    return LAYERS[key]


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
        for module, targets in graph.items()
        for target in sorted(targets)
        if _layer(target) > _layer(module)
    ]


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    state, stack, cycles = {}, [], []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in graph:
                continue
            if state.get(target) == "open":
                cycles.append(" -> ".join(stack[stack.index(target) :] + [target]))
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module)
    return cycles


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The imports between the package's folders and top-level modules (``tables`` → ``data``), own ones left out."""
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        own = _package(module)
        packages.setdefault(own, set()).update(_package(t) for t in targets if _package(t) != own)
    return {f"atp_jax.{p}": {f"atp_jax.{t}" for t in targets} for p, targets in packages.items()}


def test_no_import_points_up():
    upward = _upward(_graph())
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def test_no_import_cycle():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_cycle_between_packages():
    """Two folders of one layer may not lean on each other (``tables`` ↔ ``data``), even through lazy imports."""
    cycles = _cycles(_package_graph(_graph()))
    assert not cycles, "import cycles between packages:\n" + "\n".join(cycles)


def test_the_checks_catch_what_they_look_for(tmp_path):
    """An eval module importing runs, and a two-module cycle, are both reported; a lazy import is read."""
    assert _upward({"atp_jax.eval.metrics": {"atp_jax.runs.report", "atp_jax.tables.normalize"}}) == [
        "atp_jax.eval.metrics (layer 3) imports atp_jax.runs.report (layer 4)"
    ]
    assert _cycles({"atp_jax.a": {"atp_jax.b"}, "atp_jax.b": {"atp_jax.a"}}) == ["atp_jax.a -> atp_jax.b -> atp_jax.a"]
    lazy = tmp_path / "lazy.py"
    lazy.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import atp_jax.eval\n"
        "def f():\n    from atp_jax.runs import report\n"
    )
    assert _imports(lazy) == {"atp_jax.runs.report"}  # the annotation-only import is not a dependency
    between = {"atp_jax.tables.prompt": {"atp_jax.data.registry"}, "atp_jax.data.registry": {"atp_jax.tables.x"}}
    assert _cycles(_package_graph(between)) == ["atp_jax.tables -> atp_jax.data -> atp_jax.tables"]
