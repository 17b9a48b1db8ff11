"""Selecting what `sub` replaces: a pattern to the matched nodes, in tree order."""

from __future__ import annotations

from typing import Any

from .._ir import CALL_KINDS, Equation, Mox
from ..errors import YaxRewriteError, where

Node = Equation | Mox


def matches(pattern: Any, mox: Mox) -> list[Node]:
    """The nodes an XPath string, a node or a list of nodes selects; only
    call nodes and equations can be replaced."""
    from .._xpath import query

    if isinstance(pattern, str):
        found = query(pattern, mox)
        if not isinstance(found, list):
            raise YaxRewriteError(
                f"The pattern `{pattern}` returned a {type(found).__name__}, not nodes. "
                "Use a location path such as `//module_call[@type=\"Dense\"]`."
            )
    elif isinstance(pattern, (Mox, Equation)):
        found = [pattern]
    elif isinstance(pattern, (list, tuple)):
        found = list(pattern)
    else:
        raise YaxRewriteError(
            f"`pattern` must be an XPath string, a node or a list of nodes, but got `{type(pattern).__name__}`."
        )
    for n in found:
        if not isinstance(n, (Mox, Equation)) or (isinstance(n, Mox) and n.kind not in CALL_KINDS):
            what = f"a `{n.kind}` node" if isinstance(n, Mox) else f"`{n!r}`"
            raise YaxRewriteError(
                f"`sub` replaces module calls, activations and equations, but the pattern matched {what}. "
                "Narrow the pattern, e.g. `//module_call[...]`."
            )
    return found


def locate(mox: Mox, targets: list[Node]) -> tuple[list[Node], set[int]]:
    """Targets in tree order, outermost only, and the ids of those inside
    nested computations (scan, vmap, remat and jit bodies)."""
    ids = {id(t) for t in targets}
    order: list[Node] = []
    nested: set[int] = set()

    def walk(node: Mox, inside: bool) -> None:
        for c in node.children:
            if id(c) in ids:
                order.append(c)
                if inside:
                    nested.add(id(c))
                continue
            if isinstance(c, Equation):
                for _, s in c.subs:
                    walk(s, True)
            else:
                walk(c, inside)

    walk(mox, False)
    if len({id(t) for t in order}) != len(ids):
        inner = ids - {id(t) for t in order}
        outside = [t for t in targets if id(t) in inner and not any(t is n for n in mox.walk())]
        if outside:
            raise YaxRewriteError(f"{where(outside[0]).capitalize()} is not part of this MoX. Query the MoX you rewrite.")
    return order, nested
