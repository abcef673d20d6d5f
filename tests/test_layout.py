"""The package's layers, read from its import graph (every import: function-level ones and those
under `TYPE_CHECKING` included, since a type-only import ties two modules as much as any): no
module imports from a later layer, nothing outside `probekit.engines` imports an engine's own
modules, and no import circle."""

from __future__ import annotations

import ast
from pathlib import Path

import probekit

PACKAGE = Path(probekit.__file__).parent
LAYERS = [
    {"core", "datasets"},
    {"stats"},
    {"engines"},
    {"reporting"},
    {"mechanism"},
    {"studies"},
    {"run"},
    {"cli"},
]
"""probekit's subpackages, lowest first: a module imports only from its own layer or earlier
ones (`testing` holds oracles for tests and may import anything; nothing imports it)."""
ENGINE_LAYERS = ("probekit.engines.hf", "probekit.engines.vllm")
"""The engines' own modules, a layer of their own inside `engines`: only `probekit.engines` (its
registry and loaders, another engine) imports them; everything above talks to the engine
protocol (`probekit.engines.base`) and loads an engine by name (`load_engine`)."""
TOP_LEVEL = {"__init__.py"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The probekit modules `path` imports: `from package import name` is an import of the
    submodule `package.name` when there is one, else of the package."""
    tree = ast.parse(path.read_text())
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("probekit"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            if base.startswith("probekit"):
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if sub in modules else base)
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        edges[name] = {m for m in imports(path, set(modules)) if m in modules and m != name}
    return edges


def layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None
    for index, names in enumerate(LAYERS):
        if parts[1] in names:
            return index
    return None


def test_the_top_of_the_package_is_its_public_api():
    assert {p.name for p in PACKAGE.glob("*.py")} == TOP_LEVEL
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert subpackages == set().union(*LAYERS) | {"testing"}


def test_no_module_imports_from_a_later_layer():
    upward = []
    for module, targets in graph().items():
        mine = layer(module)
        if mine is None or module.startswith("probekit.testing"):
            continue
        for target in targets:
            theirs = layer(target)
            if target.startswith("probekit.testing") or (theirs is not None and theirs > mine):
                upward.append(f"{module} -> {target}")
    assert not upward, "imports from a later layer:\n" + "\n".join(sorted(upward))


def in_engine_layer(module: str) -> bool:
    return any(module == name or module.startswith(f"{name}.") for name in ENGINE_LAYERS)


def test_only_the_engines_package_imports_an_engine():
    through = [
        f"{module} -> {target}"
        for module, targets in graph().items()
        if not module.startswith(("probekit.engines.", "probekit.testing"))
        and module != "probekit.engines"
        for target in targets
        if in_engine_layer(target)
    ]
    assert not through, "imports of an engine from outside probekit.engines:\n" + "\n".join(
        sorted(through)
    )


def test_the_import_graph_has_no_circle():
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert not circles, f"import circles: {circles}"
