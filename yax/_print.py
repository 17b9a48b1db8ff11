"""Jaxpr-like text for a MoX.

The printer walks the tree once, naming vars in order of first appearance
(``a`` … ``z``, ``ba`` …) through a `Names` context, so output is stable and
deterministic: memory addresses are scrubbed from parameter reprs.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ._ir import FN_KINDS, Equation, Kind, Literal, Mox, Symbol, Var, delegate, holds_mox
from ._source import location
from ._vocab import type_str, value_str

_ADDR = re.compile(r" at 0x[0-9a-fA-F]+")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


class Names:
    """Stable short names for vars, assigned on first use."""

    def __init__(self) -> None:
        self.names: dict[Symbol, str] = {}

    def __call__(self, v: Symbol) -> str:
        n = self.names.get(v)
        if n is None:
            i, s = len(self.names), ""
            while True:
                s = _LETTERS[i % 26] + s
                i = i // 26
                if i == 0:
                    break
            n = self.names[v] = s
        return n


# Parameters JAX's own printer leaves out too: placement details of `jit` and
# callables of custom derivatives (shown by name only where useful).
_HIDDEN = {
    "jit": {"compiler_options_kvs", "ctx_mesh", "donated_invars", "in_layouts", "in_shardings",
            "out_layouts", "out_shardings", "keep_unused", "inline"},
}
_HIDDEN["pjit"] = _HIDDEN["jit"]
_HIDDEN_ANY = {"jvp_jaxpr_fun", "jvp_jaxpr_thunk", "fwd_jaxpr_thunk", "bwd", "out_trees", "jvp", "linear"}


def shown_params(eqn: Equation) -> list[tuple[str, Any]]:
    """The (name, value) params worth printing, sorted; nested MoX excluded."""
    hidden = _HIDDEN.get(eqn.name, ())
    out = []
    for k, v in sorted(eqn.params.items()):
        if k in hidden or k in _HIDDEN_ANY or k.startswith("_") or v is None or holds_mox(v):
            continue
        if callable(v) and not isinstance(v, type):
            continue
        out.append((k, v))
    return out


def shown_attrs(node: Mox) -> dict[str, Any]:
    """The module's fields but those its class lists in ``__yax_internal__``: bookkeeping of
    yax's own modules (which weight `LoRA` adapts, and along which axes), not the layer's."""
    hidden = getattr(node.module_type, "__yax_internal__", ())
    return {k: v for k, v in node.attrs.items() if k not in hidden}


def key_attrs(node: Mox) -> dict[str, Any]:
    """The module fields that differ from their defaults: the ones worth showing."""
    if node.module_type is None:
        return dict(node.attrs)
    defaults = node.info.defaults
    out = {}
    for k, v in shown_attrs(node).items():
        if k in defaults:
            d = defaults[k]
            try:
                if v is d or bool(v == d):
                    continue
            except Exception:
                pass
        out[k] = v
    return out


def call_header(node: Mox) -> str:
    """``module_call[path=MLP/Dense_0 type=Dense features=4 params=16]``."""
    parts = [f"path={node.path}"]
    if node.kind not in FN_KINDS:
        parts.append(f"type={node.type}")
        if node.method and node.method != "__call__":
            parts.append(f"method={node.method}")
    parts += [f"{k}={value_str(v)}" for k, v in key_attrs(node).items()]
    if node.num_params:
        parts.append(f"params={node.num_params}")
    return f"{node.kind}[{' '.join(parts)}]"


class _Printer:
    """Prints blocks without recursion, so a MoX of any depth prints: the work
    left is a stack of tasks, and names are given in the order of the text
    (a node's inputs, then its outputs, then its body; a block's results last)."""

    def __init__(self, source: bool = False) -> None:
        self.name = Names()
        self.lines: list[str] = []
        self.at: dict[int, int] = {}  # id(child node) -> its line
        self.heads: dict[int, int] = {}  # id(block: a root, nested computation or call) -> its `{ lambda` line
        self.ends: dict[int, int] = {}  # id(block) -> its `in (...) }` line
        self.source = source  # end each call's and equation's line with the user's `# file.py:line`

    def where(self, node: Equation | Mox) -> str:
        """``  # model.py:12``: where the user's code made ``node`` (``source=True``), or nothing."""
        loc = location(node) if self.source else None
        return f"  # {loc}" if loc is not None else ""

    def atom(self, a: Symbol) -> str:
        if isinstance(a, Literal):
            v = np.asarray(a.val)
            return f"{v.item() if v.ndim == 0 else value_str(a.val)}:{type_str(a)}"
        return self.name(a)

    def binder(self, v: Var) -> str:
        return f"{self.name(v)}:{type_str(v)}"

    def lhs(self, outs: tuple[Any, ...]) -> str:
        return " ".join(self.binder(v) for v in outs) or "()"

    def block(self, mox: Mox, indent: int, head: str = "") -> None:
        self._run([("block", mox, indent, head)])

    def child(self, c: Equation | Mox, indent: int) -> None:
        self._run([("child", c, indent, "")])

    def _run(self, todo: list[tuple[str, Any, int, str]]) -> None:
        # not `_calls.visit`: a block ends with a line written after its insides (the "close" step)
        while todo:
            what, node, indent, head = todo.pop()
            pad = " " * indent
            if what == "close":  # a block's last line: its results, named after its body
                self.ends[id(node)] = len(self.lines)
                self.lines.append(f"{pad}  in ({' '.join(self.atom(a) for a in node.outvars)}) }}")
            elif what == "block":
                consts = " ".join(self.binder(v) for v in node.constvars)
                invars = " ".join(self.binder(v) for v in node.invars)
                self.heads[id(node)] = len(self.lines)
                self.lines.append(f"{pad}{head}{{ lambda {consts}{' ' if consts else ''}; {invars}. let")
                todo.append(("close", node, indent, ""))
                todo.extend(("child", c, indent + 4, "") for c in reversed(node.children))
            elif isinstance(node, Mox):
                self.at[id(node)] = len(self.lines)
                args = " ".join(self.atom(a) for a in node.inputs)
                self.lines.append(f"{pad}{self.lhs(node.outputs)} = {call_header(node)} {args}{self.where(node)}")
                todo.append(("block", node, indent + 2, ""))
            else:
                self.at[id(node)] = len(self.lines)
                simple = [f"{k}={value_str(v)}" for k, v in shown_params(node)]
                params = f"[{' '.join(simple)}]" if simple else ""
                args = " ".join(self.atom(a) for a in node.inputs)
                self.lines.append(f"{pad}{self.lhs(node.outputs)} = {node.name}{params} {args}".rstrip() + self.where(node))
                blocks = []
                for k, v in sorted(node.params.items()):
                    if holds_mox(v):
                        for i, sub in enumerate(v if isinstance(v, tuple) else (v,)):
                            blocks.append(("block", sub, indent + 2, f"{k}[{i}]=" if isinstance(v, tuple) else f"{k}="))
                todo.extend(reversed(blocks))


@delegate("pprint")
def pprint(mox: Mox, *, source: bool = False) -> str:
    """The jaxpr-like text of a MoX: one block per call, headed by its path,
    type and key attributes. With ``source=True``, each call and equation ends
    with where the user's code made it, ``# model.py:12`` (the file's base
    name; ``node.source`` has the whole path), as ``jax.make_jaxpr(f)(x)
    .pretty_print(source_info=True)`` does; a node with no such line gets none.

    Example:
      >>> import jax.numpy as jnp, yax
      >>> print(yax.pprint(yax.make_mox(lambda x: jnp.sin(x) * 2)(jnp.ones(3))))
      { lambda ; a:f32[3]. let
          b:f32[3] = sin a
          c:f32[3] = mul b 2.0:f32[]
        in (c) }
    """
    p = _Printer(source)
    if mox.kind in (Kind.ROOT, Kind.JAXPR):
        p.block(mox, 0)
    else:
        p.child(mox, 0)
    return "\n".join(p.lines)


def window(root: Mox, node: Equation | Mox, radius: int = 4) -> str:
    """The printed lines of ``root`` around ``node``, the node's marked: what a
    splice error shows (as ``jax.core.check_jaxpr`` shows equations around a fault)."""
    return marked(root, node, radius=radius)[0]


def marked(root: Mox, node: Equation | Mox, atoms: tuple[Symbol, ...] = (), *, line: str = "node",
           radius: int = 4) -> tuple[str, list[str]]:
    """`window` around one line of ``node`` (``line``: ``"node"``, its own line, the line
    calling it for a call; ``"head"``, the ``{ lambda`` line of its block; ``"end"``, its
    block's ``in (...)`` line), and ``atoms`` as that text names them (``b``, ``2.0:f32[]``)."""
    p = _Printer()
    p.block(root, 0)
    at = {"node": p.at, "head": p.heads, "end": p.ends}[line]
    i = at.get(id(node))
    names = [p.atom(a) for a in atoms]
    if i is None:
        return "", names
    lo, hi = max(0, i - radius), min(len(p.lines), i + radius + 1)
    lines = [f"{'>>> ' if j == i else '    '}{p.lines[j]}" for j in range(lo, hi)]
    return "\n".join(["    ...", *lines, "    ..."] if lo or hi < len(p.lines) else lines), names
