"""`first_nonfinite`: the first NaN or Inf in evaluation order, its layer, step and first reader."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import errors
from .._calls import formals, in_place, index, is_loop, is_scan, memo
from .._eval import Hooks, bind, flatten_inputs, run
from .._ir import Equation, Mox
from .._jit import model_jit
from .._sharding import any_spread, spread, to_host
from .backward import first_backward
from .plan import how_reached
from .programs import cached_plan, check_root, program_for
from .stats import NonFinite, ValueStats


def _bad(x: Any) -> Any:
    return jnp.any(~jnp.isfinite(x))


@jax.jit
def _bad_layers(x: Any) -> Any:
    """Per layer of a stacked array, whether it holds a NaN or an Inf (reduced where it is)."""
    return jnp.any(~jnp.isfinite(x), axis=tuple(range(1, x.ndim)))


def _inexact(a: Any) -> bool:
    return jnp.issubdtype(a.dtype, jnp.inexact)


class _Flags(Hooks):
    """Flags every inexact equation output that holds a NaN or an Inf, in
    evaluation order. ``entries`` (static) says what each flag stands for; a
    scan's body gives a level of its own, its flags stacked per step."""

    def __init__(self) -> None:
        self.flags: list[Any] = []
        self.subs: list[Any] = []
        self.entries: list[tuple[Any, ...]] = []

    def level(self) -> tuple[Any, ...]:
        flags = jnp.stack(self.flags) if self.flags else jnp.zeros((0,), bool)
        return flags, tuple(self.subs)

    def equation(self, eqn: Equation, values: list[Any]) -> list[Any]:
        rule = how_reached(eqn, forward_only=True)
        if in_place(rule):
            (_, body), = eqn.subs
            return run(body, values, hooks=self)
        if is_scan(eqn):
            return self._scan(eqn, values)
        outs = bind(eqn, values)
        for i, (o, v) in enumerate(zip(outs, eqn.outputs)):
            if _inexact(v):
                self.entries.append(("eq", eqn, len(self.flags), i))
                self.flags.append(_bad(o))
        return outs

    def _scan(self, eqn: Equation, values: list[Any]) -> list[Any]:
        (_, body), = eqn.subs
        p = eqn.params
        nc, nk = p["num_consts"], p["num_carry"]
        consts, init, xs = list(values[:nc]), list(values[nc:nc + nk]), list(values[nc + nk:])
        inner: list[list[Any]] = []

        def step(carry: list[Any], x: list[Any]) -> tuple[Any, ...]:
            child = _Flags()
            outs = run(body, [*consts, *carry, *x], hooks=child)
            inner[:] = [child.entries]
            return outs[:nk], (outs[nk:], child.level())

        ys: list[Any]
        level: tuple[Any, ...]
        carry, (ys, level) = jax.lax.scan(step, init, xs, length=p["length"], reverse=p.get("reverse", False),
                                          unroll=p.get("unroll", 1))
        self.entries.append(("scan", eqn, len(self.subs), inner[0], bool(p.get("reverse", False))))
        self.subs.append(level)
        return [*carry, *ys]


class _Search:
    """The jitted flagging program of one MoX; ``entries`` is set when it is traced."""

    def __init__(self, mox: Mox):
        self.entries: list[tuple[Any, ...]] = []
        self.args: list[int] = []
        self.traces = 0
        ref = weakref.ref(mox)

        def program(flat: list[Any]) -> tuple[Any, ...]:
            self.traces += 1
            top = _Flags()
            root = ref()
            assert root is not None  # the program is cached with its MoX and dies with it
            self.args = [i for i, v in enumerate(root.invars) if _inexact(v)]
            arg_flags = [_bad(flat[i]) for i in self.args]
            run(root, flat, hooks=top)
            self.entries = top.entries
            return jnp.stack(arg_flags) if arg_flags else jnp.zeros((0,), bool), top.level()

        self.jitted = model_jit(program)




def _first(entries: list[tuple[Any, ...]], level: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[int, ...]] | None:
    """The first flagged entry, in evaluation order, and its scan steps."""
    flags, subs = level
    for e in entries:
        if e[0] == "eq":
            if flags[e[2]]:
                return e, ()
            continue
        _, eqn, j, body, reverse = e
        sub = subs[j]
        leaves = jax.tree_util.tree_leaves(sub)
        length = eqn.params["length"]
        bad = np.zeros(length, bool)
        for leaf in leaves:
            bad |= np.asarray(leaf).reshape(length, -1).any(axis=1)
        order = range(length - 1, -1, -1) if reverse else range(length)
        s = next((s for s in order if bad[s]), None)
        if s is not None:
            found = _first(body, jax.tree_util.tree_map(lambda a, s=s: a[s], sub))
            if found is not None:
                return found[0], (s, *found[1])
    return None


def _innermost_call(mox: Mox, eqn: Equation) -> Mox | None:
    """The innermost call node around ``eqn`` (through nested computations)."""
    idx = index(mox)
    caller = idx.callers[idx.ids.get(id(eqn), 0)]  # the MoX itself (0) runs in no call
    return idx.nodes[caller] if caller >= 0 else None  # type: ignore[return-value]


def _first_reader(mox: Mox, var: Any) -> tuple[Equation | None, Equation | None]:
    """The first equation, in program order, that reads ``var`` (an input of ``mox``) for
    what it computes, following it into nested computations and calls; and the scan that
    slices it per step on the way, if one does."""
    alias: dict[Any, Equation | None] = {var: None}  # var -> the scan slicing it on the way
    for n in mox.walk():
        if isinstance(n, Mox):
            for formal, actual in zip(n.invars, n.inputs):
                if actual in alias:
                    alias[formal] = alias[actual]
            continue
        read = [(j, a) for j, a in enumerate(n.inputs) if a in alias]
        if not read:
            continue
        if not n.subs or is_loop(n):
            return n, next((alias[a] for _, a in read if alias[a] is not None), None)
        for _, _, pairs in formals(n):
            for formal, actual, kind in pairs:
                if actual in alias:
                    alias[formal] = alias[actual] or (n if kind == "step" else None)
    return None, None


def _bad_argument(mox: Mox, i: int, value: Any, name: str) -> NonFinite:
    """A `NonFinite` for argument ``i`` holding NaN or Inf: the first equation reading it and
    its call, and for an argument a scan slices per step (a stacked layer's weight), the
    first layer holding them."""
    from .._print import window

    reader, scan = _first_reader(mox, mox.invars[i])
    step: tuple[int, ...] = ()
    if scan is not None:
        n = value.shape[0]
        # which layers hold them: one flag per layer crosses to the host (a sharded stack stays where it is)
        bad = to_host(_bad_layers(value)) if spread(value) else \
            ~np.isfinite(np.asarray(value).reshape(n, -1)).all(axis=1)
        order = range(n - 1, -1, -1) if scan.params.get("reverse", False) else range(n)
        step = (next(s for s in order if bad[s]),)
    call = _innermost_call(mox, reader) if reader is not None else None
    return NonFinite(None, call, name, step, ValueStats.of(value), window=window(mox, reader) if reader else "",
                     reader=reader)


def first_nonfinite(mox: Mox, *args: Any, grad_of: Callable[[Any], Any] | None = None, argnums: int | Sequence[int] = 0,
                    **kwargs: Any) -> NonFinite | None:
    """Find where a NaN or an Inf first appears when ``mox`` runs on these
    arguments, or, with ``grad_of``, when its gradient is taken.

    Runs ``mox`` once (jitted, compiled once per MoX), flagging every floating
    output of every equation, inside ``jit``, ``remat``, custom-derivative and
    ``scan`` bodies too (per step); then a second program brings out the
    inputs of the first flagged equation. Unlike ``jax_debug_nans`` it sees
    inside scans, reports Inf as well, says which scan step, and names the
    module; ``jax_debug_nans``/``jax_debug_infs`` are switched off while it runs.
    ``while`` loops and ``cond`` branches are looked at from outside only.

    With ``grad_of``, it walks the backward pass of ``jax.grad(lambda *a:
    grad_of(eval_mox(mox, *a)), argnums)`` in the order JAX runs it (the
    reverse of evaluation order, scan steps from the last) and names the first
    forward equation whose derivative rule turned finite cotangents into a NaN
    or an Inf that reaches the gradients: the classic ``jnp.where(x > 0,
    jnp.log(x), 0)`` at ``x = 0``, an overflow in float16. A NaN or an Inf
    that a later rule drops does not make a gradient non-finite (``sqrt`` at 0
    under a ``relu``: relu's rule sends 0 where ``sqrt``'s sent Inf); when
    every gradient is finite but such a value appears, the result is
    ``masked``: it names where the value came from and the equation that
    dropped it. One jitted program flags the cotangent every equation sends to
    every floating input and receives at every floating output (inside
    ``jit``, ``remat`` and ``scan`` bodies, per step; custom derivative rules,
    ``cond`` and ``while`` as wholes), only where ``jax.grad`` computes one
    (values that do not depend on the differentiated arguments get none), and
    whether the gradients are finite; where several rules made NaN or Inf,
    a few more runs of it, some of their cotangents zeroed, tell which reaches
    the gradients. A second program brings out the cotangents and forward
    values at the equation found, and its rule is run alone to name the
    primitive that went non-finite.

    Args:
      mox: the root MoX.
      *args, **kwargs: the arguments, as for `eval_mox`.
      grad_of: a function of the model's output returning a real scalar (the
        loss): search the backward pass instead of the forward one.
      argnums: with ``grad_of``, the positional arguments differentiated, as
        for ``jax.grad`` (the first, the parameters, by default).

    Returns:
      A `NonFinite` (printed, it shows the equation, the module, the scan step,
      statistics of the inputs and the MoX around it; with ``grad_of``, its
      ``direction`` is ``"backward"`` and it shows the cotangents; ``masked``
      when every gradient is finite nonetheless), or ``None`` when every value
      (with ``grad_of``: every cotangent) is finite.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> class Net(nn.Module):
      ...     @nn.compact
      ...     def __call__(self, x):
      ...         return nn.Dense(2)(jnp.log(nn.Dense(3)(x)))
      >>> x = jnp.ones((1, 4)); p = Net().init(jax.random.key(0), x)
      >>> mox = yax.make_mox(Net().apply)(p, x)
      >>> found = yax.first_nonfinite(mox, p, x)
      >>> found.equation.name, found.path, found.inputs[0].min < 0
      ('log', 'Net', True)
      >>> def safe_log(w, x):   # the where trap: a finite result, a NaN gradient at x = 0
      ...     h = x * w
      ...     return jnp.where(h > 0, jnp.log(h), 0.0).sum()
      >>> w, x = jnp.asarray(1.0), jnp.array([0.0, 1.0])
      >>> mox = yax.make_mox(safe_log)(w, x)
      >>> yax.eval_mox(mox, w, x)           # finite: `where` dropped log(0) = -inf
      Array(0., dtype=float32)
      >>> back = yax.first_nonfinite(mox, w, x, grad_of=lambda out: out)   # d/dw, like jax.grad
      >>> back.direction, back.equation.name, back.backward, back.output.nan, back.masked
      ('backward', 'log', 'div', 1, False)
      >>> def dead_sqrt(w, x):   # sqrt at relu's 0: an Inf that relu's own rule drops
      ...     return jnp.sqrt(jax.nn.relu(x * w)).sum()
      >>> x = jnp.array([-1.0, 1.0])
      >>> bool(jnp.isfinite(jax.grad(dead_sqrt)(w, x)))
      True
      >>> back = yax.first_nonfinite(yax.make_mox(dead_sqrt)(w, x), w, x, grad_of=lambda out: out)
      >>> back.masked, back.equation.name, back.masked_by.name, back.masked_call.path
      (True, 'sqrt', 'custom_jvp_call', 'relu')
    """
    check_root(mox, "first_nonfinite")
    flat = flatten_inputs(mox, args, kwargs)
    try:
        with jax.debug_nans(False), jax.debug_infs(False):
            if grad_of is not None:
                return first_backward(mox, flat, args, kwargs, grad_of, argnums)
            return _forward(mox, flat, args, kwargs)
    except Exception as e:  # XLA's RESOURCE_EXHAUSTED: said as what to try, not as XLA's allocation report
        if errors.OutOfMemory.caused_by(e):
            raise errors.OutOfMemory("first_nonfinite", e, backward=grad_of is not None) from e
        raise


def _forward(mox: Mox, flat: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> NonFinite | None:
    """`first_nonfinite` of the forward pass (jax's NaN and Inf checks off)."""
    search = memo(mox, "nonfinite.search", lambda: _Search(mox))
    arg_flags, level = to_host(search.jitted(flat))
    if arg_flags.any():
        i = search.args[int(np.argmax(arg_flags))]
        keypath = jax.tree_util.tree_flatten_with_path((args, kwargs))[0][mox.dyn_in[i]][0]
        return _bad_argument(mox, i, flat[i], errors.arg_name(keypath))
    found = _first(search.entries, level)
    if found is None:
        return None
    (_, eqn, _, out_i), step = found
    call = _innermost_call(mox, eqn)
    nodes = [eqn] if call is None else [eqn, call]
    plan = cached_plan(nodes, mox, "first_nonfinite", forward_only=True)
    prog = program_for(mox, nodes, plan, "capture", inputs=True, forward_only=True)
    _, got = prog(flat, {}, None)
    if not any_spread(got):
        got = to_host(got)

    def at(x: Any) -> Any:
        """The value at the scan step: a sharded one indexed where it is (`ValueStats` reduces it there)."""
        if spread(x):
            return x[step] if step else x
        return np.asarray(x)[step] if step else np.asarray(x)

    k = plan.targets[id(eqn)].key
    ins = tuple(ValueStats.of(at(v)) for v in got[k]["in"])
    out = ValueStats.of(at(got[k]["out"][out_i]))
    call_ins = tuple(ValueStats.of(at(v)) for v in got[plan.targets[id(call)].key]["in"]) if call else ()
    from .._print import window

    return NonFinite(eqn, call, eqn.path, tuple(step), out, ins, call_ins, window(mox, eqn))
