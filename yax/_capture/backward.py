"""`first_nonfinite(grad_of=)`: the first NaN or Inf of the backward pass, in the order
JAX runs it, and the forward equation whose derivative rule produced it.

Every floating input of every equation passes through a tap, an identity whose
derivative adds ``0 * d`` for a dummy scalar ``d`` (one per tap, stacked per
scan step). Transposed, the tap sends ``sum(ct * 0)`` to ``d``: NaN exactly
when the cotangent the equation's rule sent to that input holds a NaN or an
Inf, so one gradient gives a flag per (equation, input, step). The tap's rule
sees JAX's symbolic zeros: a value that does not depend on the differentiated
arguments gets no tangent, so no cotangent flows to it (as in ``jax.grad``)
and its tap stays silent. Walking equations in reverse evaluation order (scan
steps from the last), the first flagged one is the first whose rule turned
finite cotangents into non-finite ones: every reader of its outputs runs
earlier in the backward pass and sent finite ones.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from .. import _calls
from .._eval import Hooks, bind, run
from .._ir import Equation, Literal, Mox
from .._jit import model_jit
from ..errors import YaxCaptureError
from .stats import NonFinite, ValueStats


@jax.custom_jvp
def _tap(x: Any, d: Any) -> Any:
    return x


def _tap_jvp(primals: tuple[Any, Any], tangents: tuple[Any, Any]) -> tuple[Any, Any]:
    x, d = primals
    x_dot, d_dot = tangents
    if type(x_dot) is SymbolicZero or type(d_dot) is SymbolicZero:
        return x, x_dot
    # ``d`` is a runtime zero (an argument of the program), so XLA cannot fold the product away
    zero = jnp.broadcast_to(d.astype(x.dtype), x.shape)
    return x, x_dot + zero * d_dot.astype(x.dtype)


_tap.defjvp(_tap_jvp, symbolic_zeros=True)


def _inexact(a: Any) -> bool:
    return bool(jnp.issubdtype(a.dtype, jnp.inexact))


class _Taps(Hooks):
    """Taps the floating inputs of every equation, inside ``jit``/``remat`` bodies too and
    per step in ``scan`` bodies. ``ds`` is this level's dummies (``None`` while counting:
    ``shape()`` is then how many a level needs); ``entries`` (static) says where each tap is."""

    def __init__(self, ds: dict[str, Any] | None):
        self.ds, self.n = ds, 0
        self.entries: list[tuple[Any, ...]] = []
        self.subs: list[Any] = []  # per scan: its body's shape (counting)

    def shape(self) -> tuple[int, tuple[Any, ...]]:
        return self.n, tuple(self.subs)

    def tap(self, x: Any) -> Any:
        d = None if self.ds is None else self.ds["d"][self.n]
        self.n += 1
        return x if d is None else _tap(x, d)

    def equation(self, eqn: Equation, values: list[Any]) -> list[Any]:
        how = _calls.how(eqn)
        if how in ("inline", "remat"):
            (_, body), = eqn.subs
            return run(body, values, hooks=self)
        if how == "scan":
            return self._scan(eqn, values)
        taps = [j for j, (a, v) in enumerate(zip(eqn.inputs, values)) if not isinstance(a, Literal) and _inexact(v)]
        if taps:
            self.entries.append(("eq", eqn, self.n, tuple(taps)))
            values = [self.tap(v) if j in taps else v for j, v in enumerate(values)]
        return bind(eqn, values)

    def _scan(self, eqn: Equation, values: list[Any]) -> list[Any]:
        (_, body), = eqn.subs
        p = eqn.params
        nc, nk = p["num_consts"], p["num_carry"]
        consts, init, xs = list(values[:nc]), list(values[nc:nc + nk]), list(values[nc + nk:])
        k = sum(e[0] == "scan" for e in self.entries)  # this scan's place among the level's scans
        sub = None if self.ds is None else self.ds["subs"][k]
        inner: list[Any] = []

        def step(carry: list[Any], x: tuple[Any, Any]) -> tuple[Any, ...]:
            xs_i, ds_i = x
            child = _Taps(ds_i)
            outs = run(body, [*consts, *carry, *xs_i], hooks=child)
            inner[:] = [child]
            return outs[:nk], outs[nk:]

        ys: list[Any]
        carry, ys = jax.lax.scan(step, init, (xs, sub), length=p["length"], reverse=p.get("reverse", False),
                                 unroll=p.get("unroll", 1))
        if self.ds is None:
            self.subs.append((p["length"], inner[0].shape()))
        else:
            self.entries.append(("scan", eqn, inner[0].entries, bool(p.get("reverse", False)), k))
        return [*carry, *ys]


def _dummies(shape: tuple[int, tuple[Any, ...]], zero: Any, lead: tuple[int, ...] = ()) -> dict[str, Any]:
    n, subs = shape
    return {"d": [jnp.broadcast_to(zero, lead)] * n,
            "subs": [_dummies(s, zero, (*lead, length)) for length, s in subs]}


class Search:
    """The jitted flagging program of one MoX, loss and set of differentiated
    arguments; ``entries`` is set when it is traced."""

    def __init__(self, mox: Mox, grad_of: Callable[[Any], Any], diff: Sequence[int]):
        self.entries: list[tuple[Any, ...]] = []
        self.traces = 0
        ref = weakref.ref(mox)

        def program(flat: list[Any], zero: Any) -> Any:
            from .programs import scalar_loss

            self.traces += 1
            root = ref()
            assert root is not None  # the program is cached with its MoX and dies with it
            counting = _Taps(None)
            jax.eval_shape(lambda f: run(root, f, hooks=counting), flat)
            ds, outs = _dummies(counting.shape(), zero), self.outs

            def loss(args: list[Any], ds: dict[str, Any], out_ds: list[Any]) -> Any:
                full = list(flat)
                for i, a in zip(diff, args):
                    full[i] = a
                top = _Taps(ds)
                res = run(root, full, hooks=top)
                self.entries = top.entries
                for i, d in zip(outs, out_ds):  # what the loss sends back into the model
                    res[i] = _tap(res[i], d)
                return scalar_loss(grad_of, root.sig.results(res), "first_nonfinite")

            _, cts, out_cts = jax.grad(loss, argnums=(0, 1, 2))([flat[i] for i in diff], ds, [zero] * len(outs))
            return jax.tree_util.tree_map(jnp.isnan, (cts, out_cts))

        self.jitted = model_jit(program)
        self.outs = [i for i, v in enumerate(mox.outvars) if _inexact(v)]

    def __call__(self, flat: list[Any]) -> tuple[dict[str, Any], list[bool]]:
        level, outs = jax.device_get(self.jitted(flat, jnp.zeros((), jnp.float32)))
        return level, [bool(b) for b in outs]


def first_flagged(entries: list[tuple[Any, ...]], level: dict[str, Any]) -> tuple[Any, ...] | None:
    """The first flagged tap in backward order: ``(equation, input index, steps)``."""
    for e in reversed(entries):
        if e[0] == "eq":
            _, eqn, k, taps = e
            hit = next((j for i, j in enumerate(taps) if level["d"][k + i]), None)
            if hit is not None:
                return eqn, hit, ()
            continue
        _, eqn, body, reverse, k = e
        sub = level["subs"][k]
        length = eqn.params["length"]
        bad = np.zeros(length, bool)
        for leaf in jax.tree_util.tree_leaves(sub):
            bad |= np.asarray(leaf).reshape(length, -1).any(axis=1)
        order = range(length) if reverse else range(length - 1, -1, -1)  # the backward pass runs the steps backwards
        for s in order:
            if not bad[s]:
                continue
            found = first_flagged(body, jax.tree_util.tree_map(lambda a, s=s: a[s], sub))
            if found is not None:
                return found[0], found[1], (s, *found[2])
    return None


def rule(eqn: Equation, ins: list[Any], cts: list[Any], j: int) -> tuple[ValueStats, str]:
    """Run ``eqn``'s derivative rule alone on its forward inputs and the cotangents that
    came in: statistics of what it sends to input ``j``, and the first primitive of the
    rule, in order, whose output is non-finite (``""`` when none is). The rule is
    ``jax.vjp``'s, dead code dropped: what the forward pass saves for it (``0.5 /
    sqrt(x)`` for ``sqrt``) and the backward computation, not the primal result."""
    wrt = [i for i, x in enumerate(ins) if _inexact(x)]

    def f(*xs: Any) -> list[Any]:
        vals = list(ins)
        for i, x in zip(wrt, xs):
            vals[i] = x
        return bind(eqn, vals)

    def backward(xs: list[Any], cts: list[Any]) -> Any:
        return jax.vjp(f, *xs)[1](cts)

    xs = [ins[i] for i in wrt]
    outs = jax.eval_shape(f, *xs)
    cts = [c if _inexact(o) else np.zeros(o.shape, jax.dtypes.float0) for c, o in zip(cts, outs)]
    sent = backward(xs, cts)
    return ValueStats.of(sent[wrt.index(j)]), _first_bad_primitive(jax.make_jaxpr(backward)(xs, cts), [*xs, *cts])


def _first_bad_primitive(closed: Any, args: list[Any]) -> str:
    """The first equation of ``closed``'s top level, among those its outputs need, whose
    output holds a NaN or an Inf (evaluated one by one, as ``jax_debug_nans`` does)."""
    jaxpr = closed.jaxpr
    live = {v for v in jaxpr.outvars if not hasattr(v, "val")}
    kept = []
    for e in reversed(jaxpr.eqns):
        if any(o in live for o in e.outvars):
            kept.append(e)
            live.update(v for v in e.invars if not hasattr(v, "val"))
    env = dict(zip(jaxpr.constvars, closed.consts))
    env.update(zip(jaxpr.invars, jax.tree_util.tree_leaves(args)))
    for e in reversed(kept):
        params = e.primitive.get_bind_params(e.params)
        subfuns, params = params if isinstance(params, tuple) else ((), params)
        out = e.primitive.bind(*subfuns, *(v.val if hasattr(v, "val") else env[v] for v in e.invars), **params)
        outs = list(out) if e.primitive.multiple_results else [out]
        if any(_inexact(o) and not np.isfinite(np.asarray(o)).all() for o in outs):
            return str(e.primitive.name)
        env.update(zip(e.outvars, outs))
    return ""


_searches: weakref.WeakKeyDictionary[Mox, dict[Any, Search]] = weakref.WeakKeyDictionary()


def _differentiated(mox: Mox, args: tuple[Any, ...], kwargs: dict[str, Any], argnums: Any) -> tuple[int, ...]:
    """The flat inputs ``jax.grad(..., argnums)`` would differentiate: the floating leaves
    of those positional arguments."""
    nums = {argnums} if isinstance(argnums, int) else set(argnums)
    bad = [n for n in nums if not isinstance(n, int) or not 0 <= n < len(args)]
    if bad:
        raise YaxCaptureError(
            f"`argnums` names positional arguments to differentiate, like `jax.grad`'s, but {bad[0]!r} is not one "
            f"of the {len(args)} given. Pass an index below {len(args)} (0, the parameters, by default)."
        )
    paths = [kp for kp, _ in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]]
    diff = tuple(i for i, v in enumerate(mox.invars) if _inexact(v)
                 and getattr(paths[mox.dyn_in[i]][0], "idx", None) == 0
                 and getattr(paths[mox.dyn_in[i]][1], "idx", None) in nums)
    if not diff:
        shown = ", ".join(f"`args[{n}]`" for n in sorted(nums))
        raise YaxCaptureError(
            f"`first_nonfinite` takes the gradient with respect to {shown} (`argnums`), but the MoX traced no "
            "floating array there (a Python number is static: baked in when traced), so there is no gradient. "
            "Pass `argnums` naming the parameters, or trace with arrays (`jnp.asarray(1.0)`)."
        )
    return diff


class _Mark:
    def __init__(self, i: int):
        self.i = i


def _output_name(mox: Mox, i: int) -> str:
    marks = mox.sig.results([_Mark(j) for j in range(len(mox.outvars))])
    for kp, m in jax.tree_util.tree_flatten_with_path(marks, is_leaf=lambda x: isinstance(x, _Mark))[0]:
        if isinstance(m, _Mark) and m.i == i:
            return f"out{jax.tree_util.keystr(kp)}"
    return "out"


def first_backward(mox: Mox, flat: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                   grad_of: Callable[[Any], Any], argnums: Any) -> NonFinite | None:
    from .._print import window
    from .nonfinite import _innermost_call
    from .programs import cached_plan, program_for

    if not callable(grad_of):
        raise YaxCaptureError(
            f"`grad_of` must be a function of the model's output returning a scalar loss, but got a "
            f"`{type(grad_of).__name__}`. Pass e.g. `grad_of=lambda out: jnp.mean(out ** 2)`."
        )
    diff = _differentiated(mox, args, kwargs, argnums)
    cache = _searches.setdefault(mox, {})
    search = cache.get((grad_of, diff))
    if search is None:
        search = cache[(grad_of, diff)] = Search(mox, grad_of, diff)
    level, out_flags = search(flat)
    if any(out_flags):  # the loss's own rule: the first to run in the backward pass
        i = search.outs[out_flags.index(True)]
        outs = jax.jit(lambda f: run(mox, f))(flat)
        ct = jax.grad(lambda o: grad_of(mox.sig.results(o)))(outs)[i]
        return NonFinite(None, None, _output_name(mox, i), (), ValueStats.of(ct), direction="backward")
    found = first_flagged(search.entries, level)
    if found is None:
        return None
    eqn, j, step = found
    call = _innermost_call(mox, eqn)
    nodes = [eqn] if call is None else [eqn, call]
    plan = cached_plan(nodes, mox, "first_nonfinite")
    _, got, cts = jax.device_get(program_for(mox, nodes, plan, "grad", inputs=True, repl=grad_of)(flat, {}, None))

    def at(x: Any) -> Any:
        return np.asarray(x)[step] if step else np.asarray(x)

    k = plan.targets[id(eqn)].key
    ins = [at(v) for v in got[k]["in"]]
    ct = [np.zeros(o.shape, jax.dtypes.float0) if c is None else at(c) for c, o in zip(cts[k], eqn.outputs)]
    sent, prim = rule(eqn, ins, ct, j)
    call_ins = tuple(ValueStats.of(at(v)) for v in got[plan.targets[id(call)].key]["in"]) if call else ()
    return NonFinite(eqn, call, eqn.path, tuple(step), sent, tuple(ValueStats.of(v) for v in ins), call_ins,
                     window(mox, eqn), direction="backward",
                     cotangents=tuple(ValueStats.of(c) for c, o in zip(ct, eqn.outputs) if _inexact(o)),
                     backward=prim, input_index=j)
