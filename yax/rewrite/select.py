"""Selecting what `sub` replaces: a pattern to the matched nodes, in tree order."""

from __future__ import annotations

from typing import Any

from .._ir import CALL_KINDS, Equation, Mox
from ..errors import YaxRewriteError, where

Node = Equation | Mox


def matches(pattern: Any, mox: Mox) -> list[Node]:
    """The nodes an XPath string, a node or a list of nodes selects; only
    call nodes and equations can be replaced."""
    from .._xpath import selected

    found = selected(pattern, mox, "sub", YaxRewriteError)
    for n in found:
        if not isinstance(n, (Mox, Equation)) or (isinstance(n, Mox) and n.kind not in CALL_KINDS):
            what = f"a `{n.kind}` node" if isinstance(n, Mox) else f"`{n!r}`"
            raise YaxRewriteError(
                f"`sub` replaces module calls, activations and equations, but the pattern matched {what}. "
                "Narrow the pattern, e.g. `//module_call[...]`."
            )
    return found


def locate(mox: Mox, targets: list[Node]) -> tuple[list[Node], dict[int, tuple]]:
    """Targets in tree order, outermost only, and for those inside nested
    computations (scan, remat and jit bodies) their *chain*: the
    ``(equation, parameter)`` pairs leading from the root to them."""
    ids = {id(t) for t in targets}
    order: list[Node] = []
    nested: dict[int, tuple] = {}

    todo: list[tuple[bool, Any, tuple]] = [(False, mox, ())]  # (is a target, node, chain); any depth
    while todo:
        hit, node, chain = todo.pop()
        if hit:
            order.append(node)
            if chain:
                nested[id(node)] = chain
            continue
        items: list[tuple[bool, Any, tuple]] = []
        for c in node.children:
            if id(c) in ids:
                items.append((True, c, chain))
            elif isinstance(c, Equation):
                items.extend((False, s, (*chain, (c, k))) for k, s in c.subs)
            else:
                items.append((False, c, chain))
        todo.extend(reversed(items))  # tree order
    if len({id(t) for t in order}) != len(ids):
        inner = ids - {id(t) for t in order}
        outside = [t for t in targets if id(t) in inner and not any(t is n for n in mox.walk())]
        if outside:
            raise YaxRewriteError(f"{where(outside[0]).capitalize()} is not part of this MoX. Query the MoX you rewrite.")
    return order, nested
