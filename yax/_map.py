"""`map_mox`: rebuild a MoX bottom-up through a function (never in place)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ._check import check_if_enabled
from ._ir import Equation, Mox, holds_mox
from .errors import YaxRewriteError

Node = Equation | Mox


def map_mox(fn: Callable[[Node], Node], mox: Mox, *, before: Callable[[Node], Node] | None = None) -> Mox:
    """Apply ``fn`` to every node below ``mox`` (children first) and to
    ``mox`` itself, returning a new tree; nodes ``fn`` returns unchanged are
    shared with the input, which is never modified.

    Nested computations held by equations (scan bodies) are mapped too.
    ``before``, if given, sees each node as it is in the input, before its
    children are mapped, and may return a replacement to map instead.

    Example:
      >>> import jax.numpy as jnp, yax
      >>> mox = yax.make_mox(lambda x: jnp.sin(x))(jnp.ones(2))
      >>> names = []
      >>> _ = yax.map_mox(lambda n: names.append(getattr(n, "name", "")) or n, mox)
      >>> names
      ['sin', '<lambda>']
    """
    return check_if_enabled(mapped(fn, mox, before=before))


def mapped(fn: Callable[[Node], Node], mox: Mox, *, before: Callable[[Node], Node] | None = None) -> Mox:
    """`map_mox` without its check under ``YAX_ENABLE_CHECKS``: for the rewrite engine, whose
    trees are whole only when it is done (a root before its new variables are its parameters)."""

    # Without recursion (a MoX of any depth maps): a frame per node being mapped holds
    # the node, its children (a call's, or the computations an equation holds as
    # (param, index, child)), how many were entered and what they mapped to.
    def enter(node: Node) -> list[Any]:
        if before is not None:
            node = before(node)
        if isinstance(node, Equation):
            kids: list[tuple[Any, Any, Node]] = []
            for k, v in node.params.items():
                if isinstance(v, Mox):
                    kids.append((k, None, v))
                elif holds_mox(v):
                    kids.extend((k, i, x) for i, x in enumerate(v))
        else:
            kids = [(None, i, c) for i, c in enumerate(node.children)]
        return [node, kids, 0, []]

    stack = [enter(mox)]
    while True:
        frame = stack[-1]
        node, kids, entered, mapped = frame
        if entered < len(kids):
            frame[2] += 1
            stack.append(enter(kids[entered][2]))
            continue
        stack.pop()
        out = fn(_rebuilt(node, kids, mapped))
        if not isinstance(out, (Mox, Equation)) or (not stack and not isinstance(out, Mox)):
            raise YaxRewriteError(
                f"`map_mox` builds a new tree from what `fn` returns for each node, but for "
                f"{getattr(node, 'path', '') or node.kind if isinstance(node, Mox) else node.name!r} "
                f"({'the root' if not stack else 'a ' + type(node).__name__}) it returned "
                f"{type(out).__name__ if out is not None else 'None'}. Return a node ("
                f"{'a `Mox`' if not stack else 'a `Mox` or an `Equation`'}; the node itself to keep it). To visit "
                "nodes without building a tree, iterate `mox.walk()`.")
        if not stack:
            assert isinstance(out, Mox)  # checked above
            return out
        stack[-1][3].append(out)


def _rebuilt(node: Node, kids: list[Any], mapped: list[Any]) -> Node:
    """``node`` with its children replaced by what they mapped to (itself when none changed)."""
    if isinstance(node, Mox):
        children = tuple(mapped)
        if any(a is not b for a, b in zip(children, node.children)):
            node = dataclasses.replace(node, children=children)
        return node
    changed: dict[str, Any] = {}
    for k, v in node.params.items():
        if isinstance(v, Mox):
            nv = next(m for (key, _, _), m in zip(kids, mapped) if key == k)
        elif holds_mox(v):
            nv = tuple(m for (key, _, _), m in zip(kids, mapped) if key == k)
            if all(a is b for a, b in zip(nv, v)):
                nv = v
        else:
            continue
        if nv is not v:
            changed[k] = nv
    if changed:
        # A changed nested computation must be re-traced on eval.
        node = dataclasses.replace(
            node,
            params={**node.params, **changed},
            _jaxprs={k: j for k, j in node._jaxprs.items() if k not in changed},
        )
    return node
