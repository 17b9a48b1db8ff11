"""Graphviz DOT graphs of a MoX: the dataflow between module calls.

`to_dot` draws module calls as boxes, expands calls into clusters down to a
chosen depth, and labels edges with the shapes that flow along them.
Equations are hidden unless asked for; data flowing through a hidden
equation is drawn as an edge from its producers to its consumers. `to_svg`
renders the graph with Graphviz's ``dot`` program.

Every drawn node and cluster carries ``id="yax-N"``, where N is the ``id``
attribute of the same node in the XML view (`yax.to_xml`), so a renderer
can map graph elements back to MoX nodes.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from . import _calls
from ._ir import FN_KINDS, Equation, Kind, Mox, Var
from ._view import calls_below, view
from ._vocab import type_str
from ._xpath import query
from .errors import YaxDependencyError, YaxQueryError, YaxRenderError

Producers = frozenset[str]


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _group(path: str) -> str:
    """``[0][0]['params']['Dense_0']['kernel']`` → ``args[0]['params']``."""
    parts: list[str] = []
    i = 0
    while i < len(path) and len(parts) < 3:
        j = path.index("]", i) + 1 if "]" in path[i:] else len(path)
        parts.append(path[i:j])
        i = j
    head = {"[0]": "args", "[1]": "kwargs"}.get(parts[0], parts[0]) if parts else "in"
    return head + "".join(parts[1:])


class _Graph:
    def __init__(self, ids: dict[int, int], depth: int | None, equations: bool, with_calls: set[int], root: Mox):
        self.ids, self.depth, self.equations, self.root = ids, depth, equations, root
        self.with_calls = with_calls  # id of each node with a call below it
        self.lines: list[str] = []
        self.prod: dict[Var, Producers] = {}
        self.edges: dict[tuple[str, str], list[str]] = {}
        self.count = 0

    def new(self, node: Any, label: str, indent: int, **attrs: str) -> str:
        name = f"n{self.count}"
        self.count += 1
        vid = self.ids.get(id(node))
        if vid is not None:
            attrs["id"] = f"yax-{vid}"
        attrs["label"] = label
        body = ", ".join(f"{k}={_q(v)}" for k, v in attrs.items())
        self.lines.append(f"{' ' * indent}{name} [{body}];")
        return name

    def sources(self, atoms: Any) -> Producers:
        out: set[str] = set()
        for a in atoms:
            if isinstance(a, Var):
                out |= self.prod.get(a, frozenset())
        return frozenset(out)

    def feed(self, dst: str, atoms: Any) -> None:
        for a in atoms:
            if isinstance(a, Var):
                for src in sorted(self.prod.get(a, ())):
                    labels = self.edges.setdefault((src, dst), [])
                    t = type_str(a)
                    if t not in labels:
                        labels.append(t)

    def alias(self, formals: Any, actuals: Any) -> None:
        for f, a in zip(formals, actuals):
            if isinstance(f, Var):
                self.prod[f] = self.sources([a])

    def cluster(self, node: Any, label: str, indent: int) -> str:
        pad = " " * indent
        self.lines.append(f"{pad}subgraph cluster_{self.count} {{")
        self.count += 1
        vid = self.ids.get(id(node))
        if vid is not None:
            self.lines.append(f"{pad}  id={_q(f'yax-{vid}')};")
        self.lines.append(f"{pad}  label={_q(label)};")
        return pad

    def children(self, parent: Mox, level: int, indent: int) -> None:
        """Draw what is inside ``parent``, without recursion: what is left to
        do is a stack of nodes to draw and of steps to take after a cluster's
        insides (close it, pass its results on)."""
        todo: list[tuple[Any, ...]] = [("inside", parent, level, indent)]
        while todo:
            task = todo.pop()
            if task[0] == "then":
                task[1](*task[2:])
                continue
            what, node, level, indent = task
            if what == "inside":
                todo.extend(("draw", c, level, indent) for c in reversed(node.children))
            elif isinstance(node, Equation):
                todo.extend(reversed(self.equation(node, level, indent)))
            else:
                todo.extend(reversed(self.call(node, level, indent)))

    def close(self, pad: str) -> None:
        self.lines.append(f"{pad}}}")

    def produced(self, outs: Any, n: str) -> None:
        for v in outs:
            self.prod[v] = frozenset({n})

    def call(self, c: Mox, level: int, indent: int) -> list[tuple[Any, ...]]:
        """Draw a call (a box, or a cluster whose insides are the tasks returned)."""
        within = self.depth is None or level < self.depth
        inner = id(c) in self.with_calls or (self.equations and any(isinstance(x, Equation) for x in c.children))
        if within and inner:
            pad = self.cluster(c, f"{c.path} : {c.type}", indent)
            self.alias(c.invars, c.inputs)
            return [("inside", c, level + 1, indent + 2), ("then", self.close, pad),
                    ("then", self.alias, c.outputs, c.outvars)]
        shapes = f"{' '.join(map(type_str, c.inputs))} → {' '.join(map(type_str, c.outputs))}"
        if c.kind in FN_KINDS:
            n = self.new(c, f"{c.name}\n{shapes}", indent, shape="box", style="rounded,filled", fillcolor="#fff3c4")
        else:
            title = c.name if c.kind == Kind.MODULE_CALL else f"{c.name}.{c.method}"
            # a helper method's parameters are its module's, counted in the module's box
            copies = _calls.param_copies(self.root, c) if c.num_params and c.kind == Kind.MODULE_CALL else 1
            params = f"\n{c.num_params:,} params" + (f" ×{copies}" if copies > 1 else "") \
                if c.num_params and c.kind == Kind.MODULE_CALL else ""
            n = self.new(c, f"{title} : {c.type}\n{shapes}{params}", indent,
                         shape="box", style="rounded,filled", fillcolor="#dbe9f6")
        self.feed(n, c.inputs)
        self.produced(c.outputs, n)
        return []

    def equation(self, e: Equation, level: int, indent: int) -> list[tuple[Any, ...]]:
        """Draw an equation (hidden, a small node, or a cluster of its nested
        computations, whose insides are the tasks returned)."""
        if id(e) in self.with_calls:
            label = f"{e.name} ×{e.params['length']}" if isinstance(e.params.get("length"), int) else e.name
            pad = self.cluster(None, label, indent)  # the id goes to the node inside
            n = self.new(e, label, indent + 2, shape="ellipse", fontsize="10")
            later: list[tuple[Any, ...]] = []
            for _, sub in e.subs:
                k = len(sub.invars)
                later += [("then", self.alias, sub.invars, e.inputs[len(e.inputs) - k:] if k <= len(e.inputs) else ()),
                          ("inside", sub, level, indent + 2), ("then", self.feed, n, sub.outvars)]
            return [*later, ("then", self.close, pad), ("then", self.produced, e.outputs, n)]
        if self.equations:
            n = self.new(e, e.name, indent, shape="ellipse", fontsize="10")
            self.feed(n, e.inputs)
        else:
            srcs = self.sources(e.inputs)
            if len(srcs) < 2:  # hidden: data flows straight through it
                for v in e.outputs:
                    self.prod[v] = srcs
                return []
            # where data from several calls joins (a residual add, q @ k), a small node
            n = self.new(e, e.name, indent, shape="ellipse", fontsize="9", style="dashed")
            self.feed(n, e.inputs)
        self.produced(e.outputs, n)
        return []


def _select(mox: Mox, root: Any) -> Mox:
    if root is None:
        return mox
    if isinstance(root, Mox):
        return root
    found = [n for n in query(root, mox) if isinstance(n, Mox)] if isinstance(root, str) else []
    if len(found) != 1:
        what = f"{len(found)} nodes" if found else "no module call"
        raise YaxQueryError(
            f"`to_dot` expected `root` to select exactly one module call, but `{root}` selected {what}. "
            'Narrow the query, e.g. `(//module_call[@type="Block"])[1]`.'
        )
    return found[0]


def to_dot(mox: Mox, *, depth: int | None = None, root: str | Mox | None = None,
           equations: bool = False, params: bool = False) -> str:
    """A graphviz DOT graph of the dataflow between module calls.

    Args:
      mox: the MoX to draw.
      depth: how many levels of module calls to open into clusters; calls
        below are drawn as one box each (``None``: open every level; ``0``:
        only the calls directly inside ``root``).
      root: an XPath selecting one module call (or a `Mox` node) to draw
        instead of the whole model.
      equations: also draw the equations inside opened calls (else data
        flowing through them is drawn as direct edges).
      params: also draw edges from parameter inputs (``['params']`` leaves);
        off by default, since every layer has some.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Sequential([nn.Dense(4), nn.relu]); x = jnp.ones((1, 3))
      >>> dot = yax.to_dot(yax.make_mox(m.apply)(m.init(jax.random.key(0), x), x))
      >>> print(dot.splitlines()[0]); "layers_0 : Dense" in dot
      digraph yax {
      True
    """
    top = _select(mox, root)
    ids = view(mox).ids
    g = _Graph(ids, depth, equations, calls_below(top), mox)
    ins = g.cluster(None, "inputs", 2)  # inputs, grouped per argument at the root
    groups: dict[str, list[Var]] = {}
    for i, v in enumerate(top.invars):
        key = _group(top.in_paths[i]) if top.in_paths and i < len(top.in_paths) else f"in {i}"
        groups.setdefault(key, []).append(v)
    for key, vs in groups.items():
        if not params and "['params']" in key:
            continue
        label = key if len(vs) > 1 else f"{key}\n{type_str(vs[0])}"
        n = g.new(None, label, 4, shape="box", style="filled", fillcolor="#eeeeee")
        for v in vs:
            g.prod[v] = frozenset({n})
    g.lines.append(f"{ins}}}")
    g.children(top, 0, 2)
    for i, a in enumerate(top.outvars):
        n = g.new(None, f"out {i}\n{type_str(a)}", 2, shape="box", style="filled", fillcolor="#eeeeee")
        g.feed(n, [a])
    head = [
        "digraph yax {",
        f"  label={_q(f'{top.path or top.name or top.kind} : {top.type}')};",
        "  labelloc=t; rankdir=TB; compound=true;",
        '  node [fontname="Helvetica", fontsize=11];',
        '  edge [fontname="Helvetica", fontsize=9, color="#666666"];',
        '  graph [fontname="Helvetica", fontsize=11, style=rounded, color="#999999"];',
    ]
    edges = [f"  {s} -> {d} [label={_q(', '.join(ls[:3]) + (' …' if len(ls) > 3 else ''))}];"
             for (s, d), ls in g.edges.items()]
    return "\n".join(head + g.lines + edges + ["}"]) + "\n"


def to_svg(mox: Mox, *, timeout: float = 60.0, **kwargs: Any) -> str:
    """`to_dot` rendered to SVG text by Graphviz's ``dot`` program.

    ``dot`` runs as a subprocess with a time limit (a whole large model with
    ``equations=True`` can take Graphviz many minutes), so it cannot hang
    the kernel. Keyword arguments are those of `to_dot`.

    Raises:
      YaxDependencyError: the ``dot`` program is not installed.
      YaxRenderError: ``dot`` failed or took longer than ``timeout`` seconds.
    """
    dot = to_dot(mox, **kwargs)
    exe = shutil.which("dot")
    if exe is None:
        raise YaxDependencyError(
            "Rendering SVG needs the Graphviz `dot` program, which was not found on PATH. "
            "Install Graphviz (`apt-get install graphviz`, `brew install graphviz` or `conda install "
            "graphviz`), or use `yax.to_dot(...)` and render the text elsewhere; the yax widget renders "
            "graphs in the browser without it."
        )
    try:
        done = subprocess.run([exe, "-Tsvg"], input=dot.encode(), capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise YaxRenderError(
            f"Graphviz took longer than {timeout:g} s to lay out the graph and was stopped. Draw less "
            "of it: pass `depth=1`, a `root` XPath selecting one module, or `equations=False`; or raise "
            "`timeout`."
        ) from None
    if done.returncode != 0:
        raise YaxRenderError(f"Graphviz `dot` failed (exit {done.returncode}): {done.stderr.decode().strip()}")
    return done.stdout.decode()
