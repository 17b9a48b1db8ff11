"""Splicing a traced replacement into the tree: the new node takes the
replaced node's inputs and outputs, so the rest of the tree is shared, not
copied; and the check that nothing reads a value the splice removed."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, overload

from .._ir import FN_KINDS, Equation, Kind, Mox, Symbol, Var, holds_mox
from .._map import mapped

Node = Equation | Mox


@overload
def subst(node: Mox, m: Mapping[Var, Symbol]) -> Mox: ...
@overload
def subst(node: Equation, m: Mapping[Var, Symbol]) -> Equation: ...
@overload
def subst(node: Node, m: Mapping[Var, Symbol]) -> Node: ...
def subst(node: Node, m: Mapping[Var, Symbol]) -> Node:
    """``node`` with references to the vars in ``m`` replaced (a new tree)."""
    if not m:
        return node

    def one(n: Node) -> Node:
        ins = tuple(m.get(a, a) if isinstance(a, Var) else a for a in n.inputs)
        if isinstance(n, Equation):
            return n if ins == n.inputs else dataclasses.replace(n, inputs=ins)
        outs = tuple(m.get(a, a) if isinstance(a, Var) else a for a in n.outvars)
        if ins == n.inputs and outs == n.outvars:
            return n
        return dataclasses.replace(n, inputs=ins, outvars=outs)

    return mapped(one, node) if isinstance(node, Mox) else one(node)


@overload
def repath(node: Mox, old: str, new: str, scope: tuple[str, ...] | None = None) -> Mox: ...
@overload
def repath(node: Equation, old: str, new: str, scope: tuple[str, ...] | None = None) -> Equation: ...
@overload
def repath(node: Node, old: str, new: str, scope: tuple[str, ...] | None = None) -> Node: ...
def repath(node: Node, old: str, new: str, scope: tuple[str, ...] | None = None) -> Node:
    """``node`` moved from path ``old`` to ``new`` (and module scopes under ``scope``)."""
    def p(path: str) -> str:
        rest = path[len(old) + 1:] if old and (path == old or path.startswith(old + "/")) else path
        return f"{new}/{rest}" if new and rest else new or rest  # `new=""`: moved up to the root

    def one(n: Node) -> Node:
        if isinstance(n, Mox) and n.scope is not None and scope is not None:
            return dataclasses.replace(n, path=p(n.path), info=dataclasses.replace(n.info, scope=scope + n.scope))
        return dataclasses.replace(n, path=p(n.path))

    if isinstance(node, Mox):
        return mapped(one, node)
    if node.subs:  # its nested computations run at its path too (a custom_vjp's); what they compute is unchanged
        node = dataclasses.replace(node, params={
            k: mapped(one, v) if isinstance(v, Mox) else tuple(mapped(one, x) for x in v) if holds_mox(v) else v
            for k, v in node.params.items()})
    return one(node)


def spliced(t: Any, node: Node, casts: tuple[tuple[Equation, ...], dict[int, Var]],
           var_map: dict[Var, Var]) -> Mox:
    """The node that takes ``node``'s place: the replacement's single call
    (a module's ``__call__``, an activation) if it is one, else a
    ``function`` node around the traced body."""
    root, outs = t.root, t.outvars
    ins = tuple(root.invars[t.n_vars:])
    body, cast_out = casts
    body = tuple(repath(e, "", node.path) for e in body)  # the casts back run in the new node, at its path
    scope = getattr(node, "scope", None)
    calls = [c for c in root.children if isinstance(c, Mox)]
    only = calls[0] if len(root.children) == 1 and calls else None
    if only is not None and tuple(only.inputs) == ins and tuple(only.outputs) == tuple(outs):
        new = repath(only, only.path, node.path, scope)
        inner = dict(zip(only.outputs, only.outvars))  # casts read the call's own results
        new = dataclasses.replace(
            new,
            inputs=tuple(node.inputs),
            outputs=tuple(node.outputs),
            name=only.name if only.kind in FN_KINDS else getattr(node, "name", only.name),
            children=new.children + tuple(subst(e, inner) for e in body),
            outvars=tuple(cast_out.get(i, v) for i, v in enumerate(new.outvars)),
            constvars=root.constvars + new.constvars,
            consts=root.consts + new.consts,
        )
    else:
        name = root.name or "function"
        new = Mox(
            kind=Kind.FUNCTION,
            children=tuple(repath(c, "", node.path, scope) for c in root.children) + body,
            inputs=tuple(node.inputs),
            invars=ins,
            outvars=tuple(cast_out.get(i, v) for i, v in enumerate(outs)),
            outputs=tuple(node.outputs),
            constvars=root.constvars,
            consts=root.consts,
            path=node.path,
            name=name,
            info=dataclasses.replace(root.info, method=name),
            ephemeral=True,
        )
    return subst(new, var_map)


def unbound(root: Mox) -> tuple[Node, Var] | None:
    """The first node reading a var that nothing bound before it, in
    evaluation order. Scoping is that of `eval_mox`: one environment for a
    root and the calls in it (a BatchNorm's updated statistics leave its call
    as root outputs), a fresh one for each nested computation."""

    # not `_calls.visit`: scoping binds outputs after what reads them and opens fresh scopes.
    # iterative (any depth): per child, check its inputs, walk into it, then bind its outputs
    todo: list[tuple[str, Any, set[Any]]] = [("enter", root, set())]
    while todo:
        step, node, bound = todo.pop()
        if step == "enter":
            bound.update(node.constvars)
            bound.update(node.invars)
            todo.append(("results", node, bound))
            for c in reversed(node.children):
                todo.append(("bind", c, bound))
                if isinstance(c, Equation):
                    todo.extend(("enter", sub, set()) for _, sub in reversed(c.subs))
                else:
                    todo.append(("enter", c, bound))
                todo.append(("read", c, bound))
        elif step == "bind":
            bound.update(node.outputs)
        else:  # "read" a node's inputs, or the "results" of a computation
            for a in (node.inputs if step == "read" else node.outvars):
                if isinstance(a, Var) and a not in bound:
                    return node, a
    return None
