"""The package's structure: no import circle, no module over 500 lines, no private name taken from
another package. Read from the source with `ast` (nothing is imported), so a lazy import inside a
function counts like one at the top: it closes the same circle, only later.

Modules are named as Python names them: `modelc/tune/__init__.py` is `modelc.tune`, and a relative
import in it is relative to that package. `from pkg import sub` imports the module `pkg.sub` when
there is one, else the name `sub` defined by `pkg/__init__.py`.
"""
import ast
import pathlib

import networkx as nx

ROOT = pathlib.Path(__file__).resolve().parents[1] / "modelc"
MAX_LINES = 500


def _modules() -> dict:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def package_of(module: str) -> str:
    """The package a module belongs to (a package's `__init__` belongs to the package itself)."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def imports(module: str):
    """(line, source, name, local) for each modelc import of a module: the module it runs, the name
    it takes from it (None when it takes the module itself) and the local name it binds (None for
    `import modelc.x`, which binds `modelc`)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "modelc":
                    yield node.lineno, a.name, None, a.asname
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_of(module).split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "modelc":
                continue
            for a in node.names:
                sub = f"{source}.{a.name}"
                local = a.asname or a.name
                yield (node.lineno, sub, None, local) if sub in MODULES else (node.lineno, source, a.name, local)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT.parent)}:{line}"


def test_no_import_circle():
    graph = nx.DiGraph()
    for module in MODULES:
        graph.add_node(module)
        for _, source, _, _ in imports(module):
            if source in MODULES and source != module:
                graph.add_edge(module, source)
    circles = []
    for scc in nx.strongly_connected_components(graph):
        if len(scc) > 1:
            cycle = [a for a, _ in nx.find_cycle(graph.subgraph(scc))]
            circles.append(" -> ".join(cycle + cycle[:1]) + f" (circle of {', '.join(sorted(scc))})")
    assert not circles, "import circles:\n  " + "\n  ".join(circles)


def test_no_module_over_500_lines():
    long = [f"{MODULES[m].relative_to(ROOT.parent)}: {n} lines" for m in MODULES
            if (n := len(MODULES[m].read_text(encoding="utf-8").splitlines())) > MAX_LINES]
    assert not long, f"modules over {MAX_LINES} lines:\n  " + "\n  ".join(long)


def test_no_private_name_from_another_package():
    """`from ..ops.tensor import _taps` in kernels/ (or `tensor._taps` after `from ..ops import
    tensor`) reaches into another package's private helpers: what is shared should be public."""
    found = []
    for module in MODULES:
        aliases = {}                 # local name -> a modelc module of another package
        for line, source, name, local in imports(module):
            if source not in MODULES or package_of(source) == package_of(module):
                continue
            if name is not None and _private(name):
                found.append(f"{_where(module, line)}: {module} imports {name} from {source}")
            elif name is None and local is not None:
                aliases[local] = source
        for node in ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in aliases and _private(node.attr)):
                found.append(f"{_where(module, node.lineno)}: {module} uses {node.attr} "
                             f"of {aliases[node.value.id]}")
    assert not found, "private names taken from another package:\n  " + "\n  ".join(sorted(set(found)))
