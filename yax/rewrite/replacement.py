"""Tracing a replacement on the node it replaces, and the checks it must pass.

A replacement (a function, a module of any frontend, a root MoX, an
Equation) is traced with `make_mox` on the avals of the node's inputs and
checked: it takes as many arrays as the node has inputs and returns arrays of
the node's output shapes and dtypes (with ``cast``, other dtypes are cast
back). Each site gets its own copy with fresh vars (`fresh`).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import jax

from .. import errors, frontends
from .._ir import Equation, Kind, Mox, Var
from .._print import type_str
from ..errors import YaxRewriteError
from .splice import subst

Node = Equation | Mox


@dataclasses.dataclass
class Traced:
    """A replacement traced for one site."""

    root: Mox                     # the traced replacement; its first ``n_vars`` invars are variables
    n_vars: int = 0
    module: Any = None            # the (filled) module, if the replacement is one
    var_avals: Any = None         # its variables, abstract, in its frontend's layout
    n_state: int = 0              # stateful frontends: the last outvars are the variables' final values
    frontend: str | None = None   # the module's frontend

    @property
    def outvars(self) -> tuple:
        """The replacement's results (without final variable values)."""
        return self.root.outvars[: len(self.root.outvars) - self.n_state]

    @property
    def state_out(self) -> tuple:
        """The variables' final values, in the order of ``var_avals``."""
        return self.root.outvars[len(self.root.outvars) - self.n_state:]


@dataclasses.dataclass
class Site:
    """One node to replace, its replacement, and what checking it produced."""

    node: Node
    repl: Any
    traced: Traced
    casts: tuple = ((), {})


def is_decider(fn: Any) -> bool:
    """Whether ``fn`` is a per-match decider ``f(path, node)``."""
    try:
        names = list(inspect.signature(fn).parameters)[:2]
    except (TypeError, ValueError):
        return False
    return names == ["path", "node"]


def is_module(x: Any) -> bool:
    """Whether ``x`` is a module of some frontend (a replacement with variables)."""
    return frontends.of_replacement(x) is not None


def _avals(atoms: Any) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in atoms]


def _name(repl: Any) -> str:
    return getattr(repl, "__name__", None) or type(repl).__name__


def fresh(root: Mox) -> Mox:
    """A copy of a traced replacement with new vars, so that each site it is
    put in keeps the tree's single-assignment form. Nested computations are
    closed, so they are shared, not copied."""
    m: dict[Var, Var] = {}

    def new(v: Any) -> Any:
        if not isinstance(v, Var):
            return v
        nv = m.get(v)
        if nv is None:
            nv = m[v] = Var(v.shape, v.dtype, v.weak_type)
        return nv

    def ref(atoms: Any) -> tuple:
        return tuple(m.get(a, a) if isinstance(a, Var) else a for a in atoms)

    def block(node: Mox) -> Mox:
        constvars = tuple(new(v) for v in node.constvars)
        invars = tuple(new(v) for v in node.invars)
        children: list[Node] = []
        for c in node.children:
            ins = ref(c.inputs)
            inner = c if isinstance(c, Equation) else block(c)
            children.append(dataclasses.replace(inner, inputs=ins, outputs=tuple(new(v) for v in c.outputs)))
        return dataclasses.replace(node, constvars=constvars, invars=invars, children=tuple(children),
                                   outvars=ref(node.outvars))

    out = block(root)
    return dataclasses.replace(out, inputs=out.invars, outputs=tuple(a for a in out.outvars if isinstance(a, Var)))


def _validate(repl: Any) -> None:
    if isinstance(repl, Mox) and repl.kind != Kind.ROOT:
        raise YaxRewriteError(f"A MoX replacement must be a root from `yax.make_mox`, not a `{repl.kind}` node.")
    if isinstance(repl, Equation) and not all(isinstance(a, Var) for a in repl.inputs):
        raise YaxRewriteError("An equation replacement must take only vars as inputs (no literals).")
    if not callable(repl) and not isinstance(repl, (Mox, Equation)) and not is_module(repl):
        raise YaxRewriteError(
            f"A replacement must be a MoX, an Equation, a Flax module or a function, but got a `{type(repl).__name__}`."
        )


def _trace(repl: Any, module: Any, fe: Any, avals: list) -> Traced:
    from .._trace import make_mox

    if isinstance(repl, Mox):
        return Traced(repl)
    if isinstance(repl, Equation):
        return Traced(Mox(kind=Kind.ROOT, children=(repl,), inputs=repl.inputs, invars=repl.inputs,
                          outvars=repl.outputs, outputs=repl.outputs, name=repl.name))
    if module is not None:
        root, var_avals, n_state = fe.trace_replacement(module, avals)
        return Traced(root, len(jax.tree_util.tree_leaves(var_avals)), module, var_avals, n_state, fe.name)
    return Traced(make_mox(repl)(*avals))


def trace(repl: Any, node: Node, cache: dict[tuple, tuple[Any, Traced]]) -> Traced:
    """The replacement traced on the node's input avals, with fresh vars for
    this site; ``cache`` (one per `sub` call) keeps traces by replacement
    and avals, so 96 equal replacements trace once per shape."""
    _validate(repl)
    avals = _avals(node.inputs)
    fe = frontends.of_replacement(repl)
    module = fe.fill(repl, node) if fe is not None else None
    # A module completed from the node (a clone) is shared by equal ones; others by identity.
    by_id = module is None or module is repl
    key = (id(repl) if by_id else repr(module), tuple((a.shape, str(a.dtype)) for a in avals))
    hit = cache.get(key)
    if hit is not None and (not by_id or hit[0] is repl):
        return dataclasses.replace(hit[1], root=fresh(hit[1].root))
    what = type(module).__name__ if module is not None else _name(repl)
    try:
        t = _trace(repl, module, fe, avals)
    except YaxRewriteError:
        raise
    except Exception as e:
        raise errors.not_traceable(what, node, " ".join(map(type_str, node.inputs)), e,
                                   "A replacement is called with the node's array inputs, positionally.") from None
    cache[key] = (repl, t)
    return dataclasses.replace(t, root=fresh(t.root))


def check(t: Traced, node: Node, repl: Any) -> None:
    """The replacement takes and returns as many arrays as the node."""
    what = _name(repl)
    if len(t.root.invars) - t.n_vars != len(node.inputs):
        raise errors.wrong_count(what, node, "takes", len(t.root.invars) - t.n_vars, len(node.inputs),
                                 " ".join(map(type_str, node.inputs)))
    if len(t.outvars) != len(node.outputs):
        raise errors.wrong_count(what, node, "returns", len(t.outvars), len(node.outputs),
                                 " ".join(map(type_str, node.outputs)))


def fit(t: Traced, node: Node, repl: Any, cast: bool) -> tuple[tuple[Equation, ...], dict[int, Var]]:
    """Check output avals. With ``cast``, also the equations that cast
    outputs back to the node's dtypes, and which output each one replaces."""
    from .._trace import make_mox

    casts: list[tuple[int, Any]] = []
    for i, (a, b) in enumerate(zip(t.outvars, node.outputs)):
        if a.shape == b.shape and a.dtype == b.dtype:
            continue
        if a.shape == b.shape and cast:
            casts.append((i, b.dtype))
            continue
        hint = "Pass `cast=True` to cast outputs back to the node's dtypes." if a.shape == b.shape else ""
        raise errors.does_not_fit(_name(repl), node, i, type_str(a), type_str(b), hint)
    if not casts:
        return (), {}
    src = [t.outvars[i] for i, _ in casts]
    c = make_mox(lambda *ys: [y.astype(d) for y, (_, d) in zip(ys, casts)])(*_avals(src))
    body = subst(c, dict(zip(c.invars, src)))
    return tuple(body.children), {i: v for (i, _), v in zip(casts, c.outvars)}


def checked(node: Node, r: Any, cast: bool, nested: bool, cache: dict) -> Site:
    """``r`` traced on ``node``'s inputs after every check `sub` makes
    before it changes anything; raises `YaxRewriteError`."""
    t = trace(r, node, cache)
    check(t, node, r)
    casts = fit(t, node, r, cast)
    if t.n_vars and nested:
        raise YaxRewriteError(
            f"{errors.where(node).capitalize()} is inside a transformed computation (a scan, vmap, remat or "
            "jit body), where yax cannot add variables yet. Replace it with a function or a module without "
            "variables, or rewrite the model's code for this layer."
        )
    return Site(node, r, t, casts)
