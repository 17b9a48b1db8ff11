"""`map_mox`: rebuild a MoX bottom-up through a function (never in place)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ._ir import Equation, Mox, holds_mox

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

    def go(node: Node) -> Node:
        if before is not None:
            node = before(node)
        if isinstance(node, Equation):
            changed = {}
            for k, v in node.params.items():
                if isinstance(v, Mox):
                    nv = go(v)
                elif holds_mox(v):
                    nv = tuple(go(x) for x in v)
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
            return fn(node)
        children = tuple(go(c) for c in node.children)
        if any(a is not b for a, b in zip(children, node.children)):
            node = dataclasses.replace(node, children=children)
        return fn(node)

    return go(mox)
