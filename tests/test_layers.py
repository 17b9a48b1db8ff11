"""The layers of docs/architecture.md, as the code has them: the import graph of `yax` and
`yax_widget`, imports inside functions included (those under ``if TYPE_CHECKING:`` are not run and
not counted), holds no circle of more than two files, and the low modules import nothing above them.
"""

from __future__ import annotations

import ast
import functools
import pathlib

import pytest

pytestmark = pytest.mark.core

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _modules(package: str) -> dict[str, pathlib.Path]:
    out = {}
    for p in sorted((ROOT / package).rglob("*.py")):
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _targets(mods: dict[str, pathlib.Path], here: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in mods]
    base = node.module or ""
    if node.level:
        pkg = here if mods[here].name == "__init__.py" else here.rpartition(".")[0]
        parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
            for a in node.names if f"{base}.{a.name}" in mods or base in mods]


@functools.cache
def import_graph(*packages: str) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports, anywhere in its code but under
    ``if TYPE_CHECKING:``."""
    mods = {k: v for p in packages for k, v in _modules(p).items()}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(x) for n in ast.walk(tree)
                       if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
                       for b in n.body for x in ast.walk(b)}
        for n in ast.walk(tree):
            if isinstance(n, ast.Import | ast.ImportFrom) and id(n) not in typing_only:
                graph[m].update(t for t in _targets(mods, m, n) if t != m)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circle_spans_more_than_two_files():
    found = circles(import_graph("yax", "yax_widget"))
    assert all(len(c) <= 2 for c in found), [c for c in found if len(c) > 2]


def test_the_graph_is_read_as_python_runs_it():
    """The reader above finds the imports it must: a function-level one (`_xpath`'s worker), a
    relative one two levels up, and none from under ``TYPE_CHECKING``."""
    g = import_graph("yax", "yax_widget")
    assert "yax._xpath" in g["yax.rewrite.select"] or "yax._xpath" in g["yax.rewrite"]
    assert "yax._record" in g["yax.frontends.linen"]
    assert "yax.rewrite.lora" not in g["yax.frontends._protocol"]  # annotations only
    # a circle of three is seen as one
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("low, above", [
    # the IR holds data: its printers, serialisers and queries register into it (`_ir.delegate`)
    ("yax._ir", {"yax._print", "yax._serial", "yax._summary", "yax._xpath", "yax._view"}),
    # the registry imports no frontend, and frontends are handed make_mox/sub (`engine`)
    ("yax.frontends", {"yax.frontends.linen", "yax.frontends.nnx", "yax.frontends.equinox", "yax._trace"}),
    ("yax.frontends.linen", {"yax._trace", "yax.rewrite"}),
    ("yax.frontends.nnx._state", {"yax._trace", "yax.rewrite.select"}),
    ("yax.frontends.equinox", {"yax._trace", "yax.rewrite"}),
    # what each call computes in is an analysis the views read, apart from the rewrite that changes it
    ("yax._precision", {"yax.rewrite", "yax._xpath", "yax.frontends"}),
    ("yax._view", {"yax.rewrite.precision", "yax.rewrite"}),
])
def test_a_low_module_imports_nothing_above_it(low, above):
    assert not import_graph("yax", "yax_widget")[low] & above


def test_the_benches_import_no_private_module():
    """bench/ uses the public API and the semi-public `yax.internal`/`yax_widget.internal` only:
    a private module's rename breaks no bench."""
    import ast
    import pathlib

    bench = pathlib.Path(__file__).resolve().parents[1] / "bench"
    private = []
    for f in sorted(bench.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for n in names:
                parts = n.split(".")
                if parts[0] in ("yax", "yax_widget") and any(p.startswith("_") for p in parts[1:]):
                    private.append(f"{f.name}: {n}")
    assert not private, private
