"""Graphviz DOT graphs of a MoX: the dataflow between module calls.

`to_dot` draws module calls as boxes, expands calls into clusters down to a
chosen depth, and labels edges with the shapes that flow along them.
Equations are hidden unless asked for; data flowing through a hidden
equation is drawn as an edge from its producers to its consumers. `to_svg`
renders the graph with Graphviz's ``dot`` program.

Every drawn node and cluster carries ``id="yax-N"``, where N is the ``id``
attribute of the same node in the XML view (`yax.to_xml`), so a renderer
can map graph elements back to MoX nodes. With ``fold=True`` a stack of
identical layers (`yax._fold`: the same structure, each taking what the one
before gives) is drawn once, marked ×N, under the first layer's id, with
``class="yax-fold"``; a box that could be opened (a call with calls below
it, drawn closed because of ``depth``) has ``class="yax-more"``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from . import _calls
from ._fold import runs, structure_keys
from ._ir import FN_KINDS, Equation, Kind, Mox, Var
from ._view import calls_below, view
from ._vocab import type_str
from ._xpath import query
from .errors import MissingDependency, NotOneNode, RenderTimeout, YaxRenderError

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


def _span(members: Sequence[Mox]) -> str:
    """The names of a fold's members: ``Block_0–11``, ``0–79``, ``relu``; else ``first … last``."""
    names = [m.name for m in members]
    if len(set(names)) == 1:
        return names[0]
    parts = [re.fullmatch(r"(.*?)(\d+)", n) for n in names]
    if all(parts) and len({p.group(1) for p in parts if p}) == 1:
        nums = [int(p.group(2)) for p in parts if p]
        if nums == list(range(nums[0], nums[0] + len(nums))):
            return f"{names[0]}–{nums[-1]}"
    return f"{names[0]} … {names[-1]}"


class _Graph:
    def __init__(self, ids: dict[int, int], depth: int | None, equations: bool, with_calls: set[int], root: Mox,
                 keys: dict[int, int] | None = None, expand: frozenset[int] = frozenset()):
        self.ids, self.depth, self.equations, self.root = ids, depth, equations, root
        self.with_calls = with_calls  # id of each node with a call below it
        self.keys = keys  # structure keys (`yax._fold`) when folding, else None
        self.expand = expand  # id of each call opened whatever the depth
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
                for src in sorted(self.prod.get(a, frozenset()) - {dst}):  # a fold's members feed one another
                    labels = self.edges.setdefault((src, dst), [])
                    t = type_str(a)
                    if t not in labels:
                        labels.append(t)

    def alias(self, formals: Any, actuals: Any) -> None:
        for f, a in zip(formals, actuals):
            if isinstance(f, Var):
                self.prod[f] = self.sources([a])

    def cluster(self, node: Any, label: str, indent: int, **attrs: str) -> str:
        pad = " " * indent
        self.lines.append(f"{pad}subgraph cluster_{self.count} {{")
        self.count += 1
        vid = self.ids.get(id(node))
        if vid is not None:
            self.lines.append(f"{pad}  id={_q(f'yax-{vid}')};")
        self.lines.extend(f"{pad}  {k}={_q(v)};" for k, v in attrs.items())
        self.lines.append(f"{pad}  label={_q(label)};")
        return pad

    def children(self, parent: Mox, level: int, indent: int) -> None:
        """Draw what is inside ``parent``, without recursion: what is left to
        do is a stack of nodes to draw and of steps to take after a cluster's
        insides (close it, pass its results on)."""
        # not `_calls.visit`: folded runs skip nodes, and a cluster closes after its insides
        todo: list[tuple[Any, ...]] = [("inside", parent, level, indent)]
        while todo:
            task = todo.pop()
            if task[0] == "then":
                task[1](*task[2:])
                continue
            what, node, level, indent = task[0], task[1], task[-2], task[-1]
            if what == "inside":
                todo.extend((*step, level, indent) for step in reversed(self.plan(node)))
            elif what == "fold":
                todo.extend(reversed(self.folded(node, task[2], level, indent)))
            elif isinstance(node, Equation):
                todo.extend(reversed(self.equation(node, level, indent)))
            else:
                todo.extend(reversed(self.call(node, level, indent)))

    def close(self, pad: str) -> None:
        self.lines.append(f"{pad}}}")

    def plan(self, parent: Mox) -> list[tuple[Any, ...]]:
        """What to draw of ``parent``'s children: ``("draw", child)``, or, folding,
        ``("fold", members, span)`` for a stack of identical calls, ``span`` being the
        children from its first member to its last (the equations between them included)."""
        kids = parent.children
        if self.keys is None:
            return [("draw", c) for c in kids]
        pos = {id(c): i for i, c in enumerate(kids)}
        starts: dict[int, list[Mox]] = {}
        for run in runs(parent.calls, self.keys):
            for stack in self.stacks(run, kids, pos):
                if len(stack) > 1:
                    starts[pos[id(stack[0])]] = stack
        out: list[tuple[Any, ...]] = []
        i = 0
        while i < len(kids):
            if i in starts:
                j = pos[id(starts[i][-1])] + 1
                out.append(("fold", starts[i], kids[i:j]))
                i = j
            else:
                out.append(("draw", kids[i]))
                i += 1
        return out

    def stacks(self, run: list[Mox], kids: Sequence[Any], pos: dict[int, int]) -> list[list[Mox]]:
        """A run of identical calls cut where a member does not take what the one before it
        gives (through the equations between them): ``k_proj`` and ``v_proj`` side by side
        are two calls, not a stack of two. Equations between members are folded with them,
        so the run is cut too where one takes data from elsewhere (``k * v`` between ``v``
        and the next projection) or holds calls (folding would hide them)."""
        def vars_(atoms: Any) -> set[Var]:
            return {v for v in atoms if isinstance(v, Var)}

        out = [[run[0]]]
        known = vars_(run[0].inputs) | vars_(run[0].outputs)  # what the stack so far takes and gives
        for a, b in zip(run, run[1:]):
            reach, here, ok = vars_(a.outputs), vars_(b.inputs), True
            for e in kids[pos[id(a)] + 1:pos[id(b)]]:
                ins = vars_(e.inputs)
                ok = ok and id(e) not in self.with_calls and all(v in known or v in here for v in ins)
                if ins & reach:
                    reach |= vars_(e.outputs)
                here |= vars_(e.outputs)
            if ok and vars_(b.inputs) & reach:
                out[-1].append(b)
                known |= here | vars_(b.outputs)  # in place: a run of thousands stays linear
            else:
                out.append([b])
                known = vars_(b.inputs) | vars_(b.outputs)
        return out

    def folded(self, members: list[Mox], span: list[Any], level: int, indent: int) -> list[tuple[Any, ...]]:
        """Draw a stack of identical calls once, as its first member (a box, or a cluster whose
        insides are the tasks returned), marked ×N; what any member or equation of the span
        gives comes from that drawing."""
        first, last, n = members[0], members[-1], len(members)
        names = _span(members)
        if names[:1].isdigit() and "/" in first.path:  # HF's layers/0, layers/1: named by their parent
            names = f"{first.path.rsplit('/', 2)[-2]} {names}"
        tip = f"{n} identical calls, drawn once: {first.path} … {last.path}"
        common = {"class": "yax-fold", "tooltip": tip}
        if self.opens(first, level):
            label = f"{first.path.rsplit('/', 1)[0] + '/' if '/' in first.path else ''}{_span(members)} ×{n}"
            pad = self.cluster(first, f"{label} : {first.type}", indent, **common)
            self.alias(first.invars, first.inputs)
            return [("inside", first, level + 1, indent + 2), ("then", self.close, pad),
                    ("then", self.alias, first.outputs, first.outvars), ("then", self.fold_outputs, members, span)]
        node = self.box(first, f"{names}{'.' + first.method if first.kind == Kind.METHOD_CALL else ''} ×{n}",
                        indent, common, each=True)
        self.feed(node, first.inputs)
        self.produced(first.outputs, node)
        self.fold_outputs(members, span)
        for m in members[1:]:  # what later members take from outside the stack
            self.feed(node, m.inputs)
        return []

    def fold_outputs(self, members: list[Mox], span: list[Any]) -> None:
        """What the members and equations of a fold give is what its drawing of the first gives."""
        first = members[0]
        whole = self.sources(first.outputs)
        for m in members[1:]:
            for mine, theirs in zip(m.outputs, first.outputs):
                self.prod[mine] = self.sources([theirs]) if len(m.outputs) == len(first.outputs) else whole
        for e in span:
            if isinstance(e, Equation):
                for v in e.outputs:
                    self.prod[v] = whole

    def opens(self, c: Mox, level: int) -> bool:
        """Is call ``c`` drawn open, as a cluster of what it calls (else one box)?"""
        within = self.depth is None or level < self.depth or id(c) in self.expand
        return within and self.inner(c)

    def inner(self, c: Mox) -> bool:
        return id(c) in self.with_calls or (self.equations and any(isinstance(x, Equation) for x in c.children))

    def box(self, c: Mox, title: str, indent: int, attrs: dict[str, str], each: bool = False) -> str:
        """A call's box: its title, input → output types, parameter count."""
        shapes = f"{' '.join(map(type_str, c.inputs))} → {' '.join(map(type_str, c.outputs))}"
        if self.inner(c):  # closed by `depth`: a renderer may offer to open it
            attrs = {**attrs, "class": f"{attrs.get('class', '')} yax-more".strip()}
        if c.kind in FN_KINDS:
            return self.new(c, f"{title}\n{shapes}", indent, shape="box", style="rounded,filled",
                            fillcolor="#fff3c4", **attrs)
        # a helper method's parameters are its module's, counted in the module's box
        counted = bool(c.num_params) and c.kind == Kind.MODULE_CALL
        copies = _calls.param_copies(self.root, c) if counted else 1
        params = f"\n{c.num_params:,} params" + (f" ×{copies}" if copies > 1 else "") + (" each" if each else "") \
            if counted else ""
        return self.new(c, f"{title} : {c.type}\n{shapes}{params}", indent,
                        shape="box", style="rounded,filled", fillcolor="#dbe9f6", **attrs)

    def produced(self, outs: Any, n: str) -> None:
        for v in outs:
            self.prod[v] = frozenset({n})

    def call(self, c: Mox, level: int, indent: int) -> list[tuple[Any, ...]]:
        """Draw a call (a box, or a cluster whose insides are the tasks returned)."""
        if self.opens(c, level):
            pad = self.cluster(c, f"{c.path} : {c.type}", indent)
            self.alias(c.invars, c.inputs)
            return [("inside", c, level + 1, indent + 2), ("then", self.close, pad),
                    ("then", self.alias, c.outputs, c.outvars)]
        n = self.box(c, c.name if c.kind != Kind.METHOD_CALL else f"{c.name}.{c.method}", indent, {})
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
        raise NotOneNode("to_dot", str(root), len(found))
    return found[0]


def to_dot(mox: Mox, *, depth: int | None = None, root: str | Mox | None = None,
           equations: bool = False, params: bool = False, fold: bool = False,
           expand: Sequence[str | Mox] = ()) -> str:
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
      fold: draw a stack of identical calls once, marked ×N (``layers 0–79 ×80``):
        consecutive calls with the same structure (`yax._fold`), each taking
        what the one before it gives. The drawing is the first call's (its
        ``yax-N`` id, ``class="yax-fold"``, a tooltip naming the first and
        the last); edges into and out of the stack start and end there. Calls
        side by side (``k_proj``, ``v_proj``) are not a stack. A whole 80-layer
        model then lays out in a fraction of a second at any depth.
      expand: calls (`Mox` nodes, or XPaths selecting them) to open into
        clusters whatever ``depth``; what they call is drawn one level
        further (a box unless it too is listed). Boxes ``depth`` keeps
        closed that could open carry ``class="yax-more"``. Opening a fold's
        first call opens the fold (still drawn once).

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
    opened = frozenset(id(n) for x in expand for n in ([x] if isinstance(x, Mox) else query(x, mox))
                       if isinstance(n, Mox))
    g = _Graph(ids, depth, equations, calls_below(top), mox, structure_keys(mox) if fold else None, opened)
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
        raise MissingDependency(
            "`to_svg`", "the Graphviz `dot` program", "`apt-get install graphviz`, `brew install graphviz` or "
            "`conda install graphviz`", "Or use `yax.to_dot(...)` and render the text elsewhere; the yax widget "
            "renders graphs in the browser without it.", missing="was not found on PATH")
    try:
        done = subprocess.run([exe, "-Tsvg"], input=dot.encode(), capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RenderTimeout(timeout) from None
    if done.returncode != 0:
        raise YaxRenderError(f"Graphviz `dot` failed (exit {done.returncode}): {done.stderr.decode().strip()}")
    return done.stdout.decode()
