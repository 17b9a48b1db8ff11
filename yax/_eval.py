"""Evaluating a MoX: a jaxpr interpreter that walks module calls.

Equations are evaluated by binding their primitive, exactly like
``jax.core.eval_jaxpr``; so `eval_mox` composes with ``jit``, ``grad``,
``vmap`` and sharding, and a jitted unmodified MoX lowers to the same HLO as
the original function. Nested computations (a scan body, a jit callee) are
bound with their original jaxpr when nothing in them was marked, and with a
jaxpr re-traced from the nested MoX otherwise (once, then cached). A re-traced
body that cannot hold constants (remat's) takes those a rewrite put in as
leading inputs.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ._calls import is_remat
from ._ir import Equation, Kind, Literal, Mox, Symbol, holds_mox
from ._vocab import type_str
from .errors import InputsDiffer, NotARootMox, YaxEvalError, arg_name

# Equation -> ({param name: jaxpr} built from nested MoX nodes, constants its open body takes first).
_retraced: weakref.WeakKeyDictionary[Equation, tuple[dict[str, Any], tuple[Any, ...]]] = weakref.WeakKeyDictionary()


def _read(env: dict[Symbol, Any], a: Symbol) -> Any:
    return a.val if isinstance(a, Literal) else env[a]


class Hooks:
    """Callbacks `run` makes while it evaluates, for code that watches or
    changes values on the way (`yax.capture`, patching, the NaN search). This
    base class changes nothing; subclasses override what they need."""

    def enter(self, call: Mox, values: list[Any]) -> None:
        """A call node starts, with the values of its ``invars``."""

    def leave(self, call: Mox, values: list[Any]) -> list[Any]:
        """A call node is done: its results, or the values to bind instead."""
        return values

    def equation(self, eqn: Equation, values: list[Any]) -> list[Any]:
        """Evaluate ``eqn`` on ``values`` (flat outputs). Override to look at
        the results or to evaluate a nested computation another way."""
        return bind(eqn, values)


def run(mox: Mox, args: Sequence[Any], consts: Sequence[Any] | None = None,
        taps: list[tuple[Mox, list[Any]]] | None = None, hooks: Hooks | None = None) -> list[Any]:
    """Evaluate a root or ``"jaxpr"`` node on flat inputs; flat outputs.
    With ``taps``, append ``(call node, its output values)`` for every call
    evaluated at this level (not inside nested computations); with ``hooks``,
    call them back at every call and equation of this level."""
    env: dict[Symbol, Any] = {}
    for v, c in zip(mox.constvars, mox.consts if consts is None else consts):
        env[v] = c
    for v, x in zip(mox.invars, args):
        env[v] = x
    _exec(mox.children, env, taps, hooks)
    return [_read(env, a) for a in mox.outvars]


def bind(c: Equation, vals: list[Any], hooks: Hooks | None = None) -> list[Any]:
    """Bind one equation's primitive on ``vals``; its outputs as a list. With
    ``hooks``, its nested computations are traced again from their MoX with
    those hooks (not cached), so the hooks see the calls inside them."""
    try:
        params, lifted = _bind_params(c, hooks)
        vals = [*lifted, *vals]
        if isinstance(params, tuple):  # older JAX: (subfuns, params)
            subfuns, params = params
            vals = [*subfuns, *vals]
        if c.ctx is not None:
            with c.ctx.manager:
                out = c.primitive.bind(*vals, **params)
        else:
            out = c.primitive.bind(*vals, **params)
    except Exception as e:
        raise YaxEvalError(
            f"Evaluating `{c.name}` in `{c.path or 'the root'}` failed: {type(e).__name__}: {e}"
        ) from e
    return list(out) if c.primitive.multiple_results else [out]


def _exec(children: Sequence[Any], env: dict[Symbol, Any], taps: list[Any] | None = None, hooks: Hooks | None = None) -> None:
    # Not `_calls.visit`: evaluation binds a call's results after its children (a frame's end).
    # Without recursion: a call node opens a frame of its children, and its results are
    # bound when the frame is done, so a MoX of any depth evaluates (and traces under jit).
    stack: list[tuple[Any, Mox | None]] = [(iter(children), None)]
    while stack:
        it, call = stack[-1]
        c = next(it, None)
        if c is None:
            stack.pop()
            if call is not None:
                if hooks is None:
                    for out, res in zip(call.outputs, call.outvars):
                        env[out] = _read(env, res)
                else:
                    got = hooks.leave(call, [_read(env, r) for r in call.outvars])
                    for out, x in zip(call.outputs, got):
                        env[out] = x
                if taps is not None:
                    taps.append((call, [env[o] for o in call.outputs]))
            continue
        if isinstance(c, Equation):
            vals = [_read(env, a) for a in c.inputs]
            for v, x in zip(c.outputs, bind(c, vals) if hooks is None else hooks.equation(c, vals)):
                env[v] = x
        else:
            for v, x in zip(c.constvars, c.consts):  # constants a rewrite put in
                env[v] = x
            for formal, actual in zip(c.invars, c.inputs):
                env[formal] = _read(env, actual)
            if hooks is not None:
                hooks.enter(c, [env[v] for v in c.invars])
            stack.append((iter(c.children), c))


def _bind_params(eqn: Equation, hooks: Hooks | None = None) -> tuple[Any, tuple[Any, ...]]:
    """The params to bind ``eqn`` with, and the values to put before its inputs
    (constants a rewrite put into a body that cannot hold them, see `_to_jaxpr`).
    With ``hooks``, every nested computation is traced again under them (not cached)."""
    if not eqn.subs:
        return eqn.primitive.get_bind_params(eqn.params), ()
    if hooks is not None:
        jaxprs, lifted = _jaxprs(eqn, hooks)
    else:
        cached = _retraced.get(eqn)
        if cached is None:
            cached = _retraced[eqn] = _jaxprs(eqn, None)
        jaxprs, lifted = cached
    return eqn.primitive.get_bind_params({**eqn.params, **jaxprs}), lifted


def _jaxprs(eqn: Equation, hooks: Hooks | None) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """The jaxprs to bind ``eqn``'s nested computations with (the original ones where
    nothing was marked and no ``hooks`` watch), and the constants lifted to inputs."""
    jaxprs: dict[str, Any] = {}
    lifted: tuple[Any, ...] = ()
    for k, v in eqn.params.items():
        if k in eqn._jaxprs and hooks is None:
            jaxprs[k] = eqn._jaxprs[k]
        elif isinstance(v, Mox):
            jaxprs[k], lifted = _to_jaxpr(v, eqn, hooks=hooks)
        elif holds_mox(v):
            jaxprs[k] = tuple(_to_jaxpr(x, eqn, lift=False, hooks=hooks)[0] for x in v)
    return jaxprs, lifted



def _to_jaxpr(sub: Mox, eqn: Equation, lift: bool = True, hooks: Hooks | None = None) -> tuple[Any, tuple[Any, ...]]:
    """A JAX jaxpr for a nested MoX, with the type JAX expects in ``eqn``, and
    the constants it takes as leading inputs (open bodies only)."""
    avals = [jax.ShapeDtypeStruct(v.shape, v.dtype, weak_type=v.weak_type) for v in sub.invars]
    closed = jax.make_jaxpr(lambda *xs: run(sub, xs, hooks=hooks))(*avals)
    if sub.attrs.get("closed", True):
        return closed, ()
    if not closed.consts:
        return closed.jaxpr, ()
    # An open jaxpr (remat's body) holds no constants: a rewrite that put an
    # array into it (a replacement closing over a mask) gets it as an input. A remat
    # body takes the equation's inputs as they come, so they go in as more leading inputs.
    if not (lift and is_remat(eqn.primitive.name)):
        raise YaxEvalError(
            f"The body of `{eqn.name}` in `{eqn.path or 'the root'}` captures constants, which "
            f"`{eqn.name}` cannot hold. Pass the values as inputs instead."
        )
    consts = tuple(closed.consts)
    opened = jax.make_jaxpr(lambda cs, *xs: jax.core.eval_jaxpr(closed.jaxpr, cs, *xs))(consts, *avals)
    return opened.jaxpr, consts


# -- the public entry point ----------------------------------------------------------

def _same_dtype(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except TypeError:  # extended dtypes (PRNG keys) against numpy dtypes
        return False


def flatten_inputs(mox: Mox, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """Check ``(args, kwargs)`` against what ``mox`` was traced with and return
    the traced leaves."""
    flat, tree = jax.tree_util.tree_flatten_with_path((args, kwargs))
    if tree != mox.in_tree:
        where, what = structure_difference(mox.in_tree, (args, kwargs))
        raise InputsDiffer(where, "structure", None, what)
    leaves = [x for _, x in flat]
    for i, expected in mox.in_static:
        _check_static(arg_name(flat[i][0]), expected, leaves[i])
    return [_checked_leaf(arg_name(flat[i][0]), v, leaves[i]) for i, v in zip(mox.dyn_in, mox.invars)]


class _Traced:
    """A leaf of the arguments the MoX was traced with (its place only)."""

    def __repr__(self) -> str:
        return "an array"


def _level(x: Any) -> tuple[Any, list[tuple[Any, Any]]]:
    """The structure of ``x`` one level down, and its children with their keys."""
    def below(y: Any) -> bool:
        return y is not x

    flat, tree = jax.tree_util.tree_flatten_with_path(x, is_leaf=below)
    return tree, [(k[0], v) for k, v in flat if k]


def _kind(x: Any) -> str:
    if isinstance(x, _Traced):
        return "an array"
    if x is None:
        return "`None`"
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"an array ({type_str(x)})"
    return f"a `{type(x).__name__}`"


def _keys(keys: Any, n: int = 6) -> str:
    ks = [f"`{k!r}`" for k in keys]
    return ", ".join(ks[:n]) + (f" and {len(ks) - n} more" if len(ks) > n else "") if ks else "none"


def structure_difference(expected: Any, found: Any) -> tuple[str, str]:
    """Where the pytree ``found`` (``(args, kwargs)``) first differs from the
    treedef ``expected``, and how, in the user's terms: ``("args[0]['params']",
    "the key `'kernel'` is missing ...")``. Walks level by level, without
    recursion, so two large trees are never printed whole."""
    try:
        skeleton = jax.tree_util.tree_unflatten(expected, [_Traced() for _ in range(expected.num_leaves)])
    except Exception:  # a node type that cannot be rebuilt from placeholders
        return "the arguments", f"the structure is `{_short(str(found))}` where `{_short(str(expected))}` was traced"
    stack: list[tuple[tuple[Any, ...], Any, Any]] = [((), skeleton, found)]
    while stack:
        path, e, f = stack.pop()
        (te, ce), (tf, cf) = _level(e), _level(f)
        if te == tf:
            stack.extend((path + (ke,), ve, vf) for (ke, ve), (_, vf) in reversed(list(zip(ce, cf))))
            continue
        where = arg_name(path)
        if type(e) is not type(f):
            return where, f"{_kind(f)} was passed where {_kind(e)} was traced"
        ke, kf = [_key(k) for k, _ in ce], [_key(k) for k, _ in cf]
        if isinstance(e, Mapping) or ke != list(range(len(ke))):
            missing = [k for k in ke if k not in kf]
            extra = [k for k in kf if k not in ke]
            if missing or extra:
                parts = []
                if missing:
                    parts.append(f"the key{'s' * (len(missing) > 1)} {_keys(missing)} "
                                 f"{'is' if len(missing) == 1 else 'are'} missing")
                if extra:
                    parts.append(f"the key{'s' * (len(extra) > 1)} {_keys(extra)} "
                                 f"{'was' if len(extra) == 1 else 'were'} not there when traced")
                return where, f"{' and '.join(parts)} (traced: {_keys(ke)}; now: {_keys(kf)})"
        elif len(ce) != len(cf):
            return where, (f"{len(cf)} element{'s' * (len(cf) != 1)} {'was' if len(cf) == 1 else 'were'} passed "
                           f"where {len(ce)} {'was' if len(ce) == 1 else 'were'} traced")
        return where, f"the structure is `{_short(str(tf))}` where `{_short(str(te))}` was traced"
    return "the arguments", "the structure differs"


def _key(k: Any) -> Any:
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return getattr(k, attr)
    return k


def _short(s: str, n: int = 200) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _check_static(where: str, expected: Any, found: Any) -> None:
    same = found is expected
    if not same:
        try:
            same = bool(found == expected)
        except Exception:
            same = False
    if not same:
        raise InputsDiffer(where, "static", expected, found)


def _checked_leaf(where: str, v: Symbol, x: Any) -> Any:
    if isinstance(x, (bool, int, float, complex)):  # a Python number traced (`static_argnums`)
        x = jax.numpy.asarray(x)
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        raise InputsDiffer(where, "not an array", type_str(v), type(x).__name__)
    if tuple(np.shape(x)) != v.shape or not _same_dtype(_canonical(dtype), v.dtype):
        raise InputsDiffer(where, "type", type_str(v), type_str(x))
    if not _same_dtype(dtype, v.dtype):  # a NumPy float64 with x64 off: as `jax.jit` takes it, as float32
        x = jax.numpy.asarray(x, v.dtype)
    return x


def _canonical(dtype: Any) -> Any:
    """``dtype`` as JAX computes in it (`jax.jit` takes a NumPy float64 as float32 while
    x64 is off): the dtype an argument is compared to its traced one by."""
    try:
        return jax.dtypes.canonicalize_dtype(dtype)
    except (TypeError, ValueError):  # an extended dtype (a PRNG key's): as it is
        return dtype


def unflatten_outputs(mox: Mox, flat_out: Sequence[Any]) -> Any:
    return mox.sig.results(flat_out)


def eval_mox(mox: Mox, *args: Any, **kwargs: Any) -> Any:
    """Evaluate a MoX on new arguments; a drop-in for the traced function.

    Args:
      mox: a root MoX from `make_mox` (or a rewrite of one).
      *args, **kwargs: arguments with the same structure, shapes and dtypes as
        at trace time; static leaves (``train=False``) must be equal.

    Returns:
      The same pytree the traced function returns.

    Example:
      >>> import jax, jax.numpy as jnp, yax
      >>> mox = yax.make_mox(lambda x, y: {"s": jnp.sin(x) * y})(jnp.ones(3), 2.0)
      >>> yax.eval_mox(mox, jnp.zeros(3), 2.0)["s"]
      Array([0., 0., 0.], dtype=float32)
    """
    if not isinstance(mox, Mox) or mox.kind != Kind.ROOT:
        what = f"a `{mox.kind}` node" if isinstance(mox, Mox) else f"a `{type(mox).__name__}`"
        raise NotARootMox("eval_mox", what, "Evaluate the whole MoX; rewrite nodes with `yax.sub`.")
    flat = flatten_inputs(mox, args, kwargs)
    return unflatten_outputs(mox, run(mox, flat))


def to_function(mox: Mox) -> Any:
    """A plain function ``f(*args, **kwargs)`` computing ``mox`` (e.g.
    ``f(params, x)`` for a traced ``model.apply``): jit it, lower it, or
    ``jax.export`` it to serve or save a rewritten model without yax.

    Example:
      >>> import jax, jax.numpy as jnp, yax
      >>> f = yax.to_function(yax.make_mox(lambda x: jnp.sin(x) * 2)(jnp.ones(3)))
      >>> exp = jax.export.export(jax.jit(f))(jax.ShapeDtypeStruct((3,), jnp.float32))
      >>> exp.call(jnp.zeros(3))
      Array([0., 0., 0.], dtype=float32)
    """
    if not isinstance(mox, Mox) or mox.kind != Kind.ROOT:
        what = f"a `{mox.kind}` node" if isinstance(mox, Mox) else f"a `{type(mox).__name__}`"
        raise NotARootMox("to_function", what, "Give it the whole MoX from `yax.make_mox` or `yax.sub`.")

    def f(*args: Any, **kwargs: Any) -> Any:
        return eval_mox(mox, *args, **kwargs)

    f.__name__ = f.__qualname__ = mox.name or "mox"
    return f
