"""Selecting what `sub` replaces: a pattern to the matched nodes, in tree
order; where a node sits in the tree (`ancestry`); and what a rewrite of a
node inside a custom derivative rule replaces (`outside_rules`)."""

from __future__ import annotations

from typing import Any

from .. import errors
from .._calls import how, in_place, visit
from .._ir import CALL_KINDS, FN_KINDS, Equation, Mox
from ..errors import YaxRewriteError

Node = Equation | Mox


def matches(pattern: Any, mox: Mox) -> list[Node]:
    """The nodes an XPath string, a node or a list of nodes selects; only
    call nodes and equations can be replaced."""
    from .._xpath import selected

    found = selected(pattern, mox, "sub", YaxRewriteError)
    for n in found:
        if not isinstance(n, (Mox, Equation)) or (isinstance(n, Mox) and n.kind not in CALL_KINDS):
            what = f"a `{n.kind}` node" if isinstance(n, Mox) else f"`{n!r}`"
            raise errors.WrongNodeKind("`sub`", "replaces module calls, activations and equations", what,
                                       "Narrow the pattern, e.g. `//module_call[...]`.", n)
    return found


def locate(mox: Mox, targets: list[Node], tool: str = "sub") -> tuple[list[Node], dict[int, tuple[Any, ...]]]:
    """Targets in tree order, outermost only, and for those inside nested
    computations (scan, remat and jit bodies) their *chain*: the
    ``(equation, parameter)`` pairs leading from the root to them."""
    ids = {id(t) for t in targets}
    order: list[Node] = []
    nested: dict[int, tuple[Any, ...]] = {}
    calls: list[bool] = []  # number -> whether the node is a call's child (a computation is no target)
    cut: set[int] = set()   # the targets met and what is below them: only outermost targets count
    for num, (node, parent, chain) in enumerate(visit(mox)):
        calls.append(isinstance(node, Mox))
        if parent in cut:
            cut.add(num)
        elif parent >= 0 and calls[parent] and id(node) in ids:
            cut.add(num)
            order.append(node)
            if chain:
                nested[id(node)] = chain
    if len({id(t) for t in order}) != len(ids):
        inner = ids - {id(t) for t in order}
        outside = [t for t in targets if id(t) in inner and not any(t is n for n in mox.walk())]
        if outside:
            raise errors.NotInMox(outside[0], tool, hint="Query the MoX you rewrite.")
    return order, nested


def ancestry(start: Mox | Equation, target: Node) -> list[Node] | None:
    """The nodes from ``start`` down to ``target`` (both included): each a
    child of the one before, a call's child or a computation an equation
    holds; ``None`` when ``target`` is not below ``start``. Iterative: any depth."""
    met: list[tuple[Node, int]] = []  # number -> (node, its holder's number)
    for n, parent, _ in visit(start):  # a computation shared by two equations: the first met holds it
        met.append((n, parent))
        if n is target:
            path: list[Node] = []
            k = len(met) - 1
            while k >= 0:
                path.append(met[k][0])
                k = met[k][1]
            return path[::-1]
    return None


def chain_of(path: list[Node]) -> tuple[tuple[Equation, str], ...]:
    """The ``(equation, parameter)`` pairs an `ancestry` passes through."""
    return tuple((n, next(k for k, s in n.subs if s is path[i + 1]))
                 for i, n in enumerate(path[:-1]) if isinstance(n, Equation))


# -- custom derivative rules -------------------------------------------------------------
#
# A `custom_jvp_call`/`custom_vjp_call` holds a computation and, beside it, a rule for its
# derivative (`jax.nn.relu` is one, around a jitted `max`). Replacing something inside the
# computation keeps the old rule around the new computation: the forward pass is the new one,
# `jax.grad` the old one's. So a selected node inside a rule's computation is replaced together
# with the rule where it is the whole computation (the rule computed nothing else), and refused
# otherwise.

def _whole(parent: Node, child: Node) -> bool:
    """Whether ``parent`` computes exactly what ``child`` does, from the same inputs."""
    if isinstance(parent, Equation):  # a jit/remat/custom call of the computation `child`
        return (in_place(how(parent)) or how(parent) == "custom") and len(parent.subs) == 1
    return (len(parent.children) == 1 and parent.children[0] is child
            and tuple(child.inputs) == tuple(parent.invars) and tuple(child.outputs) == tuple(parent.outvars))


def outside_rules(mox: Mox, node: Node, chain: tuple[Any, ...]) -> tuple[Node, tuple[Any, ...]]:
    """The node a rewrite of ``node`` (reached through ``chain``) replaces:
    ``node`` itself, or, inside a custom derivative rule's computation that
    it is the whole of, the rule's equation (or the activation that is just
    that equation, as ``jax.nn.relu``'s node is), with its chain. Refuses a
    node that is only part of such a computation."""
    k = next((i for i, (e, _) in enumerate(chain) if how(e) == "custom"), None)
    if k is None:
        return node, chain
    rule = chain[k][0]
    outer = dict(chain[k - 1][0].subs)[chain[k - 1][1]] if k else mox
    up = ancestry(outer, rule) or [rule]
    holder = up[-2] if len(up) > 1 and isinstance(up[-2], Mox) and up[-2].kind in CALL_KINDS else None
    path = ancestry(rule, node) or []
    if not path or not all(_whole(a, b) for a, b in zip(path, path[1:])):
        raise errors.InsideCustomRule(node, rule, holder)
    if holder is not None and holder.kind in FN_KINDS and _whole(holder, rule):
        return holder, chain[:k]
    return rule, chain[:k]
