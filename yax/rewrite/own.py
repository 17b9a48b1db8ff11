"""A MoX used as a replacement is its own computation.

A root MoX of a module's ``apply`` (``yax.make_mox(Block().apply)(variables,
x)``) or a module call node cut from another MoX is put in with the very
equations it holds, never re-traced from its module's type: what it computed
when it was traced (an activation patched for the trace, a helper
monkeypatched, a field changed) is what the rewritten model computes.

Its variables are the inputs it reads like a closure: for a root of
``apply``, the leaves of the variables it takes first; for a cut node, those
of the root it was cut from (found among the roots that still live,
`yax._roots`). Each is named by its path inside the module
(``params/Dense_0/kernel``), read off the key path of the root's argument that
holds it: the module's scope followed by the leaf's path, the collection
first where the layout has one (``[0]['params']['Block_0']['Dense_0']['kernel']``
for the module at ``Block_0``; nnx's ``['block']['fc1']['kernel'].value``).

`traced` gives the engine a `Traced` like a module's, whose root takes the
variables first and then the call's inputs, so they are placed like a
module's: by the root's frontend layout where its frontend rebuilds modules
(linen: kept where the model has a leaf of the same name, shape and dtype,
new leaves initialised by the module type's own ``init``, checked to make
exactly the leaves the MoX reads), or else (nnx, whose state a MoX cannot
extend) read from the variables the replaced module already has (`resolve`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import jax

from .. import _roots, errors, frontends
from .._calls import how, visit
from .._ir import CALL_KINDS, Equation, Kind, Literal, Mox, Var
from .._map import mapped
from .._vocab import type_str
from .select import ancestry, chain_of

Node = Equation | Mox
Names = tuple[str, ...]

#: How a computation held by an equation sees that equation's inputs: its
#: parameters are the inputs, in order (a `yax._calls.how` value).
_IN_ORDER = ("inline", "remat", "scan", "custom")


def call_of(repl: Any) -> Mox | None:
    """The call node a MoX replacement stands for: the one module call of a
    root MoX (of ``module.apply``), or a module or method call node cut from
    another MoX; ``None`` for other replacements."""
    if not isinstance(repl, Mox):
        return None
    if repl.kind == Kind.ROOT:
        only = repl.children[0] if len(repl.children) == 1 else None
        return only if isinstance(only, Mox) and only.kind == Kind.MODULE_CALL else None
    if repl.kind in (Kind.MODULE_CALL, Kind.METHOD_CALL) and repl.module_type is not None:
        return repl
    return None


# -- the computation -------------------------------------------------------------------

def _level(call: Mox) -> Iterator[Node]:
    """``call`` and every node evaluated in its environment: its calls (at
    any depth) and their equations, not the computations equations hold
    (those are closed: they read only what the equation passes them)."""
    return (n for n, _, _ in visit(call, nested=False))


def _vars(atoms: Sequence[Any]) -> Iterator[Var]:
    return (a for a in atoms if isinstance(a, Var))


def inside(call: Mox) -> set[Var]:
    """The vars bound inside ``call``: its parameters and what it computes."""
    bound: set[Var] = set()
    for n in _level(call):
        if isinstance(n, Mox):
            bound.update(n.invars)
            bound.update(n.constvars)
        if n is not call:
            bound.update(n.outputs)
    return bound


def free(call: Mox) -> list[Var]:
    """The vars ``call`` reads but does not bind (its module's variables, read
    like a closure), each once."""
    bound = inside(call)
    seen: dict[Var, None] = {}
    for n in _level(call):
        atoms = n.outvars if n is call else (*n.inputs, *(n.outvars if isinstance(n, Mox) else ()))
        for v in _vars(atoms):
            if v not in bound:
                seen.setdefault(v)
    return list(seen)


def _leaked(call: Mox, around: Mox) -> list[Var]:
    """Vars computed inside ``call`` that ``around`` (the computation holding
    it) reads other than through the call's results: side outputs, such as a
    BatchNorm's updated statistics, or an nnx module's updated state."""
    mine = inside(call)
    read: list[Var] = [v for v in _vars(around.outvars) if v in mine]
    cut: set[int] = set()  # ``call`` and what is below it
    for num, (n, parent, _) in enumerate(visit(around, nested=False)):
        if parent in cut or n is call:
            cut.add(num)
        if parent < 0 or num in cut:  # ``around``'s own results are read above
            continue
        read.extend(v for v in _vars(n.inputs) if v in mine)
        if isinstance(n, Mox):
            read.extend(v for v in _vars(n.outvars) if v in mine)
    return read


# -- naming variables ------------------------------------------------------------------

def _names(keypath: Sequence[Any]) -> Names:
    """A key path as names, without the attribute accesses at its end (a
    boxed variable's ``.value``)."""
    keys = list(keypath)
    while keys and isinstance(keys[-1], jax.tree_util.GetAttrKey):
        keys.pop()
    out = []
    for k in keys:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                out.append(str(getattr(k, attr)))
                break
        else:
            out.append(str(k))
    return tuple(out)


def leaves(var_tree: Any) -> list[tuple[Names, Any]]:
    """``(names, aval)`` of a module's variables, in flattening order (the
    order a replacement's root takes them in)."""
    return [(_names(kp), a) for kp, a in jax.tree_util.tree_flatten_with_path(var_tree or {})[0]]


def _held(root: Mox) -> list[tuple[Names, Var]]:
    """The root's traced argument leaves and their names."""
    args = root.sig.args(root.invars) if root.sig.ins.tree is not None else ((*root.invars,), {})
    return [(_names(kp), v) for kp, v in jax.tree_util.tree_flatten_with_path(args)[0] if isinstance(v, Var)]


def _ends(p: Names, tail: Names) -> bool:
    return len(p) >= len(tail) and p[len(p) - len(tail):] == tail


def located(root: Mox, scope: Sequence[str], wanted: list[Names]) -> list[Var | None]:
    """For each variable path ``wanted`` (inside the module at ``scope``),
    the root input holding it, or ``None``. A variable's key path ends with
    the scope and the leaf's path, the collection either there
    (``…['block']['fc1']['kernel']``) or before the scope
    (``…['params']['Block_0']['Dense_0']['kernel']``), or not at all (the bare
    ``params`` collection a Hugging Face wrapper takes). Exact matches are taken first; a root input is
    given to one variable at most, and a variable matching several inputs
    is not located."""
    scope = tuple(str(s) for s in scope)
    held = _held(root)
    found: list[Var | None] = [None] * len(wanted)
    taken: set[Var] = set()
    for exact in (True, False):
        for i, r in enumerate(wanted):
            if found[i] is not None:
                continue
            if exact:
                hits = [v for p, v in held if v not in taken and _ends(p, (*scope, *r))]
            else:  # the collection elsewhere: before the scope, or left out (the bare `params` of a wrapper)
                hits = [v for p, v in held if v not in taken and len(r) > 1 and _ends(p, (*scope, *r[1:]))
                        and (r[0] in p[: len(p) - len(scope) - len(r) + 1] or (r[0] == "params" and r[0] not in p))]
            if len(hits) == 1:
                found[i] = hits[0]
                taken.add(hits[0])
    return found


def _outward(v: Var, chain: tuple[Any, ...], root: Mox) -> tuple[str, Any]:
    """Where the var ``v`` read inside the last computation of ``chain`` comes
    from: ``("input", root var)``, ``("const", value)``, or ``("computed", None)``."""
    for eqn, key in reversed(chain):
        body = dict(eqn.subs)[key]
        if v in body.constvars:
            return "const", body.consts[body.constvars.index(v)]
        if v not in body.invars or how(eqn) not in _IN_ORDER:
            return "computed", None
        a = eqn.inputs[body.invars.index(v)]
        if isinstance(a, Literal):
            return "const", a.val
        v = a
    if v in root.constvars:
        return "const", root.consts[root.constvars.index(v)]
    return ("input", v) if v in root.invars else ("computed", None)


def _relative(call: Mox, scope: tuple[str, ...]) -> Mox:
    """``call`` with its module scopes made relative to ``scope`` (a module at
    its own root), as a module traced on its own has them; the splice puts
    them under the replaced node's."""
    n = len(scope)

    def one(x: Node) -> Node:
        s = getattr(x, "scope", None)
        if isinstance(x, Mox) and s is not None and tuple(s[:n]) == scope:
            return dataclasses.replace(x, info=dataclasses.replace(x.info, scope=tuple(s[n:])))
        return x

    return mapped(one, call) if n else call


# -- the replacement -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Own:
    """A call node made a replacement's root: ``root`` takes the module's
    variables (``names``, in the order of ``leaves(var_tree)``) and then the
    call's inputs, and returns its results."""

    root: Mox
    call: Mox
    names: tuple[Names, ...]
    var_tree: Any


def root_holding(call: Mox, mox: Mox) -> tuple[Mox, tuple[Any, ...]]:
    """The root a cut ``call`` lives in and the chain of equations down to it:
    ``mox`` itself, or a root `make_mox` or `sub` made that still lives."""
    for r in (mox, *(r for r in _roots.live() if r is not mox)):
        path = ancestry(r, call)
        if path is not None:
            return r, chain_of(path)
    raise errors.MoxCutFromUnknown(call)


def own(repl: Mox, mox: Mox) -> Own:
    """The call ``repl`` stands for (`call_of`), as a root of its own that
    takes its module's variables first; refuses a call whose inputs cannot
    all be named (values computed elsewhere, variables bound as constants)
    or that has results besides its outputs."""
    call = call_of(repl)
    assert call is not None
    if repl.kind == Kind.ROOT:
        root, chain = repl, ()
    else:
        root, chain = root_holding(call, mox)
    around = dict(chain[-1][0].subs)[chain[-1][1]] if chain else root
    side = _leaked(call, around)
    if side:
        raise errors.MoxSideResults(call, " ".join(type_str(v) for v in side[:4]))
    tree = call.var_tree or {}
    named = leaves(tree)
    scope = tuple(call.scope or ())
    holders = located(root, scope, [r for r, _ in named])
    inner: dict[Var, int] = {}  # a var the call reads -> the variable it is
    consts: dict[Var, Any] = {}
    for v in free(call):
        kind, x = _outward(v, chain, root)
        if kind == "input" and x in holders:
            inner[v] = holders.index(x)
        elif kind == "const":
            consts[v] = x
        else:
            raise errors.MoxReadsUnnamed(call, type_str(v), "a value computed elsewhere in the MoX it was "
                                           "cut from" if kind == "computed" else "an input that is not one "
                                           "of its module's variables")
    read = set(inner.values())
    unread = {(tuple(a.shape), a.dtype): r for i, (r, a) in enumerate(named) if i not in read}
    baked = [v for v in consts if (tuple(v.shape), v.dtype) in unread]
    if baked:  # its variables were constants when it was traced, not inputs
        like = ", ".join(f"`{'/'.join(unread[(tuple(v.shape), v.dtype)])}`" for v in baked[:3])
        raise errors.MoxReadsUnnamed(
            call, " ".join(type_str(v) for v in baked[:4]),
            f"constants shaped like its variables ({like}), which it does not read as inputs: a module bound "
            "to its variables (`module.bind(variables)`) holds them as constants")
    for v, i in inner.items():
        a = named[i][1]
        if tuple(v.shape) != tuple(a.shape) or v.dtype != a.dtype:
            raise errors.MoxReadsUnnamed(
                call, type_str(v), f"its variable `{'/'.join(named[i][0])}` seen as {type_str(a)} (the module "
                "runs inside a transform that changes its variables' shapes, such as `nn.vmap`)")
    by_leaf = {i: v for v, i in inner.items()}
    var_in = tuple(by_leaf.get(i, Var(a.shape, a.dtype)) for i, (_, a) in enumerate(named))
    ins = tuple(Var(v.shape, v.dtype, v.weak_type) for v in call.invars)
    outs = tuple(Var(a.shape, a.dtype, a.weak_type) for a in call.outputs)
    body = dataclasses.replace(_relative(call, scope), inputs=ins, outputs=outs)
    new_root = Mox(kind=Kind.ROOT, children=(body,), inputs=(*var_in, *ins), invars=(*var_in, *ins),
                   outvars=outs, outputs=outs, constvars=tuple(consts), consts=tuple(consts.values()),
                   name=call.name, frontend=root.frontend)
    return Own(new_root, call, tuple(r for r, _ in named), tree)


# -- values for new variables ----------------------------------------------------------

class _Init:
    """What a MoX replacement offers a variables layout in place of a module:
    the layout calls ``init`` only for leaves the model does not have. A MoX
    holds no values, so they come from the module type's own ``init``
    (rebuilt from the call's fields), checked to make exactly the leaves the
    MoX reads; where it cannot, the rewrite is refused."""

    def __init__(self, module: Any, own_: Own, node: Node, what: str, why: str):
        self.module, self.own, self.node, self.what, self.why = module, own_, node, what, why

    def init(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        call = self.own.call
        if self.module is None:
            raise errors.MoxNoValues(self.what, self.node, self.why)
        method = call.method if call.method not in (None, "__call__") else None
        made = self.module.init(key, *args, **({"method": method} if method else {}), **kwargs)
        got = {"/".join(r): type_str(a) for r, a in leaves(dict(made))}
        want = {"/".join(r): type_str(a) for r, a in leaves(self.own.var_tree)}
        odd = [f"makes `{r}` {got[r]} where the MoX reads {t}" if r in got else f"makes no `{r}` ({t})"
               for r, t in want.items() if got.get(r) != t]
        odd += [f"makes `{r}` {t}, which the MoX does not read" for r, t in got.items() if r not in want]
        if odd:
            raise errors.MoxNoValues(self.what, self.node, f"the own `init` of `{call.type}` {odd[0]}")
        return made


_init_types: dict[str, type] = {}


def initialiser(own_: Own, node: Node, what: str) -> Any:
    """An `_Init` for ``own_`` (``what``, as messages name it) replacing
    ``node``, of a class named like the module (the variables layout names
    a replacement module by its type's name)."""
    call = own_.call
    name = call.type
    cls = _init_types.get(name) or _init_types.setdefault(name, type(name, (_Init,), {"__module__": __name__}))
    try:
        module = frontends.get(call.info.frontend).rebuild(call)
        why = "" if module is not None else f"yax cannot build a new `{call.type}` to initialise them"
    except Exception as e:
        module, why = None, f"yax cannot build a new `{call.type}` from the call's fields ({type(e).__name__}: {e})"
    return cls(module, own_, node, what, why)


def rebuilds(call: Mox) -> bool:
    """Whether the call's frontend places variables by module (it can rebuild
    one: linen), rather than reading them where they are (nnx)."""
    return frontends.get(call.info.frontend).places_by_module


# -- variables read where they are ------------------------------------------------------

def resolve(mox: Mox, node: Node, names: Sequence[Names], invars: Sequence[Var], stack: tuple[int, ...],
            what: str) -> dict[Var, Var]:
    """For a MoX replacement whose frontend keeps variables where they are
    (an nnx state, which a MoX cannot extend): each variable it reads
    (``names``, the traced ``invars``) is the replaced module's variable of
    the same path, shape (with ``stack``'s scan axes in front) and dtype, as
    the root of ``mox`` holds it; refuses any it lacks."""
    scope = getattr(node, "scope", None)
    if scope is None or not isinstance(node, Mox) or node.kind not in CALL_KINDS:
        raise errors.MoxNoPlace(what, node, "/".join(names[0]) if names else "", "which a node that is not a "
                                  "module call cannot have")
    found = located(mox, scope, list(names))
    out: dict[Var, Var] = {}
    for r, tv, v in zip(names, invars, found):
        if v is None or tuple(v.shape) != (*stack, *tv.shape) or v.dtype != tv.dtype:
            there = "which that module does not have" if v is None else f"which that module holds as {type_str(v)}"
            raise errors.MoxNoPlace(what, node, "/".join(r), f"{type_str(tv)}, {there}")
        out[tv] = v
    return out
