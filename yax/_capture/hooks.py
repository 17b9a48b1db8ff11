"""Evaluation with hooks: the `Hooks` that watch (or replace) values as calls and
equations finish, and how they reach inside ``jit``, ``remat`` and ``scan`` bodies."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._eval import Hooks, bind, run
from .._ir import Equation, Mox
from .._vocab import type_str
from ..errors import PatchDoesNotFit
from .plan import Plan, Target


class Watch(Hooks):
    """Captures or patches the targets at one level of nesting (the root, or
    one step of a scan body); ``got[key]`` holds ``{"in": [...], "out": [...]}``."""

    def __init__(self, plan: Plan, mode: str, inputs: bool, patches: dict[str, list[Any]], repl: Any, arg: Any,
                 step: tuple[Any, ...]):
        self.plan, self.mode, self.inputs = plan, mode, inputs
        self.patches, self.repl, self.arg, self.step = patches, repl, arg, step
        self.got: dict[str, dict[str, list[Any]]] = {}

    def child(self, patches: dict[str, list[Any]], step: tuple[Any, ...]) -> Watch:
        return Watch(self.plan, self.mode, self.inputs, patches, self.repl, self.arg, step)

    def enter(self, call: Mox, values: list[Any]) -> None:
        t = self.plan.targets.get(id(call))
        if t is not None and self.inputs:
            self.got.setdefault(t.key, {})["in"] = list(values)

    def leave(self, call: Mox, values: list[Any]) -> list[Any]:
        t = self.plan.targets.get(id(call))
        return values if t is None else self._done(t, values)

    def equation(self, eqn: Equation, values: list[Any]) -> list[Any]:
        how = self.plan.descend.get(id(eqn))
        outs = bind(eqn, values) if how is None else _DESCEND[how](self, eqn, values)
        t = self.plan.targets.get(id(eqn))
        if t is None:
            return outs
        if self.inputs:
            self.got.setdefault(t.key, {})["in"] = list(values)
        return self._done(t, outs)

    def _done(self, t: Target, values: list[Any]) -> list[Any]:
        if self.mode == "capture":
            self.got.setdefault(t.key, {})["out"] = list(values)
            return values
        if self.mode == "grad":  # `capture(grad_of=)`: the value, and a zero delta added for its cotangent
            self.got.setdefault(t.key, {})["out"] = list(values)
            deltas = self.patches[t.key]
            return [v if d is None else v + d for v, d in zip(values, deltas)]
        if self.mode == "arrays":
            new = self.patches.get(t.key)
            return values if new is None else list(new)
        return _replaced(t, self.repl, values, self.arg, self.step)


def _inline(w: Hooks, eqn: Equation, values: list[Any]) -> list[Any]:
    (_, body), = eqn.subs
    return run(body, values, hooks=w)


def _remat(w: Watch, eqn: Equation, values: list[Any]) -> list[Any]:
    (_, body), = eqn.subs
    inner = {k: v for k, v in w.patches.items() if k in _inside_remat(w.plan, eqn)}

    def f(vals: list[Any], patches: dict[str, Any]) -> tuple[Any, ...]:
        child = w.child(patches, w.step)
        return run(body, vals, hooks=child), child.got

    p = eqn.params
    outs: list[Any]
    outs, got = jax.checkpoint(f, prevent_cse=p.get("prevent_cse", True), policy=p.get("policy"))(list(values), inner)
    w.got.update(got)
    return outs


def _inside_remat(plan: Plan, eqn: Equation) -> set[str]:
    ids = {id(n) for n in eqn.subs[0][1].walk()}
    return {t.key for i, t in plan.targets.items() if i in ids}


def _scan(w: Watch, eqn: Equation, values: list[Any]) -> list[Any]:
    (_, body), = eqn.subs
    p = eqn.params
    nc, nk, length = p["num_consts"], p["num_carry"], p["length"]
    consts, init, xs = list(values[:nc]), list(values[nc:nc + nk]), list(values[nc + nk:])
    inside = w.plan.inside(eqn)
    inner = {k: v for k, v in w.patches.items() if k in inside}
    steps = jnp.arange(length, dtype=jnp.int32) if w.mode == "fn" and _wants_step(w.repl) else None

    def step(carry: list[Any], x: tuple[Any, ...]) -> tuple[Any, ...]:
        xs_i, patches_i, i = x
        child = w.child(patches_i, w.step if i is None else (*w.step, i))
        outs = run(body, [*consts, *carry, *xs_i], hooks=child)
        return outs[:nk], (outs[nk:], child.got)

    ys: list[Any]
    got: dict[str, dict[str, list[Any]]]
    carry, (ys, got) = jax.lax.scan(step, init, (xs, inner, steps), length=length, reverse=p.get("reverse", False),
                                    unroll=p.get("unroll", 1))
    w.got.update(got)
    return [*carry, *ys]


_DESCEND: dict[str, Callable[..., Any]] = {"inline": _inline, "remat": _remat, "scan": _scan}


def _positional(fn: Callable[..., Any]) -> tuple[int, bool]:
    """How many positional arguments ``fn`` takes (a large number for ``*args``), and whether it takes ``step``."""
    try:
        ps = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2, False
    if any(p.kind == p.VAR_POSITIONAL for p in ps):
        return 99, any(p.name == "step" for p in ps)
    pos = [p for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "step"]
    return len(pos), any(p.name == "step" for p in ps)


def _wants_step(fn: Callable[..., Any]) -> bool:
    return _positional(fn)[1]


def _replaced(t: Target, repl: Callable[..., Any], values: list[Any], arg: Any, step: tuple[Any, ...]) -> list[Any]:
    """``repl(path, value[, arg][, step=])`` at one target, checked to fit."""
    n, wants_step = _positional(repl)
    call_args = (t.key, t.results(values), arg)[: 3 if n >= 3 else 2]
    new = repl(*call_args, **({"step": step} if wants_step else {}))
    flat = fitted(t, new, what=f"`{getattr(repl, '__name__', 'repl')}` returned", stacked=False)
    return flat


def fitted(t: Target, value: Any, what: str, stacked: bool) -> list[Any]:
    """The traced leaves of ``value`` given for target ``t``'s output, checked:
    the same structure, shapes and dtypes (stacked along the scan axes when
    ``stacked``)."""
    node = t.node
    want = t.expected() if stacked else [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in node.outputs]
    sig = node.sig.outs if isinstance(node, Mox) else None
    leaves, tree = jax.tree_util.tree_flatten(value)
    if sig is not None and sig.tree is not None and tree == sig.tree:
        leaves = [leaves[i] for i in sig.dyn]
    elif len(want) == 1 and len(leaves) == 1:
        pass  # one array for a node with one traced output (`(x, None)` given as `x`)
    elif len(leaves) != len(want) or (sig is not None and sig.tree is not None):
        shown = t.results([_Shown(w) for w in want])
        raise PatchDoesNotFit(t.key, "structure", _tree_str(shown), _tree_str(value), what)
    for i, (x, w) in enumerate(zip(leaves, want)):
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        if shape is None or dtype is None or tuple(shape) != tuple(w.shape) or np.dtype(dtype) != np.dtype(w.dtype):
            found = type_str(x) if shape is not None and dtype is not None else f"a `{type(x).__name__}`"
            part = f" (output {i})" if len(want) > 1 else ""
            scan = (f" It runs inside a scan, so its values are stacked along {len(t.stack)} leading "
                    f"ax{'e' if len(t.stack) == 1 else 'i'}s of the scan length{'s' * (len(t.stack) > 1)}."
                    if stacked and t.stack else "")
            raise PatchDoesNotFit(t.key, "type", type_str(w), found, what, i if part else None, scan)
    return list(leaves)


class _Shown:
    def __init__(self, s: jax.ShapeDtypeStruct):
        self.s = s

    def __repr__(self) -> str:
        return type_str(self.s)


def _tree_str(x: Any) -> str:
    def show(v: Any) -> Any:
        if isinstance(v, _Shown):
            return v
        return _Shown(v) if hasattr(v, "shape") and hasattr(v, "dtype") else v

    return str(jax.tree_util.tree_map(show, x, is_leaf=lambda v: isinstance(v, _Shown)))[:200]
