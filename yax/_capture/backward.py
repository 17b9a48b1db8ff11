"""`first_nonfinite(grad_of=)`: the first NaN or Inf of the backward pass that reaches the
gradients, in the order JAX runs it, and the forward equation whose derivative rule produced it.

Every floating input and output of every equation passes through a tap, an
identity whose derivative adds ``0 * d`` for a dummy scalar ``d`` (one per
tap, stacked per scan step). Transposed, the tap sends ``sum(ct * 0)`` to
``d``: NaN exactly when the cotangent through it holds a NaN or an Inf, so
one gradient gives a flag per (equation, input or output, step): at an input,
what the equation's rule sent there; at an output, what came in (the sum of
what its readers sent). The tap's rule sees JAX's symbolic zeros: a value that
does not depend on the differentiated arguments gets no tangent, so no
cotangent flows to it (as in ``jax.grad``) and its tap stays silent. The same
gradient says whether the gradients of the differentiated arguments are finite.

An equation whose rule sent a non-finite cotangent while every one that came
in was finite is an *origin*. A non-finite value can die on its way: a
``select`` (``relu``, ``where``) sends zeros where its branch was not taken,
so ``sqrt`` at 0 under a ``relu`` leaves every gradient finite. So the first
origin in backward order is not always the answer: the one reported is the
first whose non-finite value reaches the gradients. A switch per input tap
replaces the non-finite entries of the cotangent it passes by zeros (a second
program, compiled only when two origins or more leave a gradient non-finite, with
switches at their taps only: each one makes it slower to compile);
with every later origin switched (and those that switching reveals), the
gradients are non-finite exactly when the origins left on reach them, and a
bisection over the origins in backward order finds the first that does. When the
gradients are finite, the first origin is reported as masked, with the first
equation that received a non-finite cotangent and sent only finite ones.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero, linear_call

from .. import _calls, errors
from .._eval import Hooks, bind, run
from .._ir import Equation, Literal, Mox
from .._jit import model_jit
from .._sharding import to_host
from ..errors import LossNotAFunction
from .stats import NonFinite, ValueStats


@jax.custom_jvp
def _flag(x: Any, d: Any) -> Any:
    return x


def _flag_jvp(primals: tuple[Any, Any], tangents: tuple[Any, Any]) -> tuple[Any, Any]:
    x, d = primals
    x_dot, d_dot = tangents
    if type(x_dot) is SymbolicZero or type(d_dot) is SymbolicZero:
        return x, x_dot
    # ``d`` is a runtime zero (an argument of the program), so XLA cannot fold the product away
    zero = jnp.broadcast_to(d.astype(x.dtype), x.shape)
    return x, x_dot + zero * d_dot.astype(x.dtype)


_flag.defjvp(_flag_jvp, symbolic_zeros=True)


def _same(s: Any, t: Any) -> Any:
    return t


def _clean(s: Any, ct: Any) -> Any:
    """The transpose of `_same`: the cotangent, its NaN and Inf replaced by zeros where ``s`` is on."""
    return jnp.where(s & ~jnp.isfinite(ct), jnp.zeros_like(ct), ct)


@jax.custom_jvp
def _cleaning(x: Any, d: Any, s: Any) -> Any:
    return x


def _cleaning_jvp(primals: tuple[Any, Any, Any], tangents: tuple[Any, Any, Any]) -> tuple[Any, Any]:
    """`_flag`'s, the cotangent passed on cleaned (`_clean`) where the switch ``s`` is on; ``d``
    sees it as it came."""
    x, d, s = primals
    x_dot, d_dot, _ = tangents
    if type(x_dot) is SymbolicZero or type(d_dot) is SymbolicZero:
        return x, x_dot
    zero = jnp.broadcast_to(d.astype(x.dtype), x.shape)
    return x, linear_call(_same, _clean, s, x_dot) + zero * d_dot.astype(x.dtype)


_cleaning.defjvp(_cleaning_jvp, symbolic_zeros=True)


def _inexact(a: Any) -> bool:
    return bool(jnp.issubdtype(a.dtype, jnp.inexact))


class _Taps(Hooks):
    """Taps the floating inputs and outputs of every equation, inside ``jit``/``remat``
    bodies too and per step in ``scan`` bodies. ``ds`` is this level's dummies and ``ss``
    its switches (``None`` while counting: ``shape()`` is then how many a level needs);
    ``entries`` (static) says where each tap is. Only the input taps named in ``switchable``
    (``(scans, tap)``: `_Event.switches`) heed their switch: each one that does makes the
    program slower to compile."""

    def __init__(self, ds: dict[str, Any] | None, ss: dict[str, Any] | None,
                 switchable: frozenset[tuple[Any, ...]] = frozenset(), scans: tuple[int, ...] = ()):
        self.ds, self.ss, self.n = ds, ss, 0
        self.switchable, self.scans = switchable, scans
        self.entries: list[tuple[Any, ...]] = []
        self.subs: list[Any] = []  # per scan: its body's shape (counting)

    def shape(self) -> tuple[int, tuple[Any, ...]]:
        return self.n, tuple(self.subs)

    def tap(self, x: Any, sent: bool) -> Any:
        """``x`` tapped: an input's tap (``sent``) cleans what it passes on where its switch is on."""
        n = self.n
        self.n += 1
        if self.ds is None:
            return x
        if sent and self.ss is not None and (self.scans, n) in self.switchable:
            return _cleaning(x, self.ds["d"][n], self.ss["s"][n])
        return _flag(x, self.ds["d"][n])

    def equation(self, eqn: Equation, values: list[Any]) -> list[Any]:
        if _calls.in_place(_calls.how(eqn)):
            (_, body), = eqn.subs
            return run(body, values, hooks=self)
        if _calls.is_scan(eqn):
            return self._scan(eqn, values)
        taps = [j for j, (a, v) in enumerate(zip(eqn.inputs, values)) if not isinstance(a, Literal) and _inexact(v)]
        if not taps:  # nothing it reads can carry a cotangent, so nothing it writes can
            return bind(eqn, values)
        k = self.n
        outs = bind(eqn, [self.tap(v, True) if j in taps else v for j, v in enumerate(values)])
        kept = [i for i, o in enumerate(outs) if _inexact(o)]
        self.entries.append(("eq", eqn, k, tuple(taps), self.n, tuple(kept)))
        return [self.tap(o, False) if i in kept else o for i, o in enumerate(outs)]

    def _scan(self, eqn: Equation, values: list[Any]) -> list[Any]:
        (_, body), = eqn.subs
        p = eqn.params
        nc, nk = p["num_consts"], p["num_carry"]
        consts, init, xs = list(values[:nc]), list(values[nc:nc + nk]), list(values[nc + nk:])
        k = sum(e[0] == "scan" for e in self.entries)  # this scan's place among the level's scans
        sub = None if self.ds is None else (self.ds["subs"][k], None if self.ss is None else self.ss["subs"][k])
        inner: list[Any] = []

        def step(carry: list[Any], x: tuple[Any, Any]) -> tuple[Any, ...]:
            xs_i, sub_i = x
            ds_i, ss_i = sub_i or (None, None)
            child = _Taps(ds_i, ss_i, self.switchable, (*self.scans, k))
            outs = run(body, [*consts, *carry, *xs_i], hooks=child)
            inner[:] = [child]
            return outs[:nk], outs[nk:]

        ys: list[Any]
        carry, ys = jax.lax.scan(step, init, (xs, sub), length=p["length"], reverse=p.get("reverse", False),
                                 unroll=p.get("unroll", 1))
        if sub is None:
            self.subs.append((p["length"], inner[0].shape()))
        else:
            self.entries.append(("scan", eqn, inner[0].entries, bool(p.get("reverse", False)), k))
        return [*carry, *ys]


def _dummies(shape: tuple[int, tuple[Any, ...]], zero: Any, lead: tuple[int, ...] = ()) -> dict[str, Any]:
    n, subs = shape
    return {"d": [jnp.broadcast_to(zero, lead)] * n,
            "subs": [_dummies(s, zero, (*lead, length)) for length, s in subs]}


def _flags(cts: dict[str, Any], shape: tuple[int, tuple[Any, ...]], lead: tuple[int, ...] = ()) -> dict[str, Any]:
    """The dummies' cotangents as flags, one array a level (``[*lead, tap]``): a few
    transfers to the host, not one a tap."""
    n, subs = shape
    d = jnp.stack([jnp.isnan(c) for c in cts["d"]], axis=-1) if n else jnp.zeros((*lead, 0), bool)
    return {"d": d, "subs": [_flags(c, s, (*lead, length)) for c, (length, s) in zip(cts["subs"], subs)]}


def _switches(shape: tuple[int, tuple[Any, ...]], lead: tuple[int, ...] = ()) -> dict[str, Any]:
    """Every switch off: one array a level (a scan's stacked per step), so a pass costs few transfers."""
    n, subs = shape
    return {"s": np.zeros((*lead, n), bool), "subs": [_switches(s, (*lead, length)) for length, s in subs]}


@dataclasses.dataclass(frozen=True)
class _Event:
    """An equation, at a scan step, through whose rule a non-finite cotangent passed.

    ``where`` is, per scan around it, outermost first, ``(its place among its level's
    scans, step)``; ``k`` its first input tap at that level, ``n`` how many; ``sent`` the
    inputs its rule sent non-finite cotangents to; ``came`` whether one came in."""

    eqn: Equation
    where: tuple[tuple[int, int], ...]
    k: int
    n: int
    sent: tuple[int, ...]
    came: bool

    @property
    def key(self) -> tuple[Any, ...]:
        return self.where, self.k

    @property
    def switches(self) -> set[tuple[Any, ...]]:
        """Its input taps, as `_Taps.switchable` names them (the same at every step)."""
        scans = tuple(j for j, _ in self.where)
        return {(scans, self.k + i) for i in range(self.n)}

    @property
    def step(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.where)

    @property
    def origin(self) -> bool:
        """Its rule turned finite cotangents into non-finite ones."""
        return bool(self.sent) and not self.came


@dataclasses.dataclass(frozen=True)
class _Pass:
    """What one run of the search program flagged: per level its taps (``{"d": [*steps,
    tap], "subs": [...]}``, `_flags`), the outputs whose cotangent from the loss is not
    finite, and whether each differentiated argument's gradient holds a NaN or an Inf."""

    level: dict[str, Any]
    outs: list[bool]
    grads: list[bool]


class Search:
    """The jitted flagging programs of one MoX, loss and set of differentiated
    arguments: one that only flags, and one whose switches work at the input taps
    of the origins a search tries (compiled when it needs them, again only when
    more are needed); ``entries`` is set when either is traced."""

    def __init__(self, mox: Mox, grad_of: Callable[[Any], Any], diff: Sequence[int]):
        self.entries: list[tuple[Any, ...]] = []
        self.traces = 0
        self.shape: tuple[int, tuple[Any, ...]] | None = None
        self.ref = ref = weakref.ref(mox)
        self.outs = outs = [i for i, v in enumerate(mox.outvars) if _inexact(v)]

        def program(switchable: frozenset[tuple[Any, ...]] | None) -> Callable[..., Any]:
            def run_it(flat: list[Any], zero: Any, ss: dict[str, Any] | None = None, out_ss: Any = None) -> Any:
                from .programs import scalar_loss

                self.traces += 1
                root = ref()
                assert root is not None and self.shape is not None  # cached with its MoX; counted before
                ds = _dummies(self.shape, zero)

                def loss(args: list[Any], ds: dict[str, Any], out_ds: list[Any]) -> Any:
                    full = list(flat)
                    for i, a in zip(diff, args):
                        full[i] = a
                    top = _Taps(ds, ss, switchable or frozenset())
                    res = run(root, full, hooks=top)
                    self.entries = top.entries
                    for n, (i, d) in enumerate(zip(outs, out_ds)):  # what the loss sends back into the model
                        res[i] = _cleaning(res[i], d, out_ss[n]) if switchable and (None, n) in switchable else \
                            _flag(res[i], d)
                    return scalar_loss(grad_of, root.sig.results(res), "first_nonfinite")

                grads, cts, out_cts = jax.grad(loss, argnums=(0, 1, 2))([flat[i] for i in diff], ds,
                                                                        [zero] * len(outs))
                bad = jnp.stack([jnp.any(~jnp.isfinite(g)) for g in grads])
                return (_flags(cts, self.shape), jnp.isnan(jnp.stack(out_cts)) if out_cts else jnp.zeros(0, bool)), bad

            jitted: Callable[..., Any] = model_jit(run_it)
            return jitted

        self.program = program
        self.jitted = program(None)
        self.switchable: frozenset[tuple[Any, ...]] = frozenset()
        self.switched: Any = None

    def allow(self, cleaned: Sequence[_Event | int]) -> None:
        """Make the switches of ``cleaned`` work in the switched program (compiled anew
        on its next run where some did not)."""
        more = self.switchable.union(*({(None, c)} if isinstance(c, int) else c.switches for c in cleaned))
        if self.switched is None or more != self.switchable:
            self.switchable, self.switched = more, None

    def __call__(self, flat: list[Any], cleaned: Sequence[_Event | int] | None = None) -> _Pass:
        """One run; with ``cleaned``, the input taps of those events (and the loss's taps at
        the outputs numbered there) pass their cotangents on with NaN and Inf zeroed."""
        if self.shape is None:
            root = self.ref()
            assert root is not None
            counting = _Taps(None, None)
            jax.eval_shape(lambda f: run(root, f, hooks=counting), flat)
            self.shape = counting.shape()
        zero = jnp.zeros((), jnp.float32)
        if cleaned is None:
            got = self.jitted(flat, zero)
        else:
            ss, out_ss = _switches(self.shape), np.zeros(len(self.outs), bool)
            for c in cleaned:
                if isinstance(c, int):
                    out_ss[c] = True
                    continue
                switches: dict[str, Any] = ss
                at: tuple[int, ...] = ()
                for j, s in c.where:
                    switches, at = switches["subs"][j], (*at, s)
                switches["s"][(*at, slice(c.k, c.k + c.n))] = True
            self.allow(cleaned)
            if self.switched is None:
                self.switched = self.program(self.switchable)
            got = self.switched(flat, zero, ss, out_ss)
        (level, outs), grads = to_host(got)
        return _Pass(level, [bool(b) for b in outs], [bool(b) for b in grads])


def _events(entries: list[tuple[Any, ...]], level: dict[str, Any],
            where: tuple[tuple[int, int], ...] = ()) -> Iterator[_Event]:
    """The equations a non-finite cotangent passed through, in backward order (the
    reverse of evaluation order, scan steps from the last)."""
    for e in reversed(entries):
        if e[0] == "eq":
            _, eqn, k, taps, k_out, outs = e
            sent = tuple(j for i, j in enumerate(taps) if level["d"][k + i])
            came = any(level["d"][k_out + i] for i in range(len(outs)))
            if sent or came:
                yield _Event(eqn, where, k, len(taps), sent, came)
            continue
        _, eqn, body, reverse, k = e
        sub = level["subs"][k]
        length = eqn.params["length"]
        bad = np.zeros(length, bool)
        for leaf in jax.tree_util.tree_leaves(sub):
            bad |= np.asarray(leaf).reshape(length, -1).any(axis=1)
        order = range(length) if reverse else range(length - 1, -1, -1)  # the backward pass runs the steps backwards
        for s in order:
            if bad[s]:
                yield from _events(body, jax.tree_util.tree_map(lambda a, s=s: a[s], sub), (*where, (k, s)))


def _origins(search: Search, got: _Pass) -> tuple[list[int], list[_Event], list[_Event]]:
    """The outputs the loss sent non-finite cotangents to, the origins among the
    flagged equations in backward order (the first flagged one always: a cotangent
    that came in non-finite although its readers' were finite overflowed as it was
    added up), and every flagged equation."""
    events = list(_events(search.entries, got.level))
    outs = [n for n, b in enumerate(got.outs) if b]
    origins = [e for i, e in enumerate(events) if e.origin or (i == 0 and e.sent and not outs)]
    return outs, origins, events


#: At most this many runs reveal the origins hidden behind others (a rule that would
#: turn a finite cotangent into a non-finite one, but received a non-finite one).
_ROUNDS = 8


def _reaches(search: Search, flat: list[Any], kept: Sequence[_Event | int], cleaned: list[_Event | int]) -> bool:
    """Whether the non-finite cotangents the origins ``kept`` produce reach the gradients
    once every other origin's are zeroed: those ``cleaned`` and those that come to light."""
    keys = {c if isinstance(c, int) else c.key for c in [*kept, *cleaned]}
    for _ in range(_ROUNDS):
        got = search(flat, cleaned)
        if not any(got.grads):
            return False
        new = [e for e in _events(search.entries, got.level) if e.origin and e.key not in keys]
        if not new:
            return True
        cleaned = [*cleaned, *new]
        keys.update(e.key for e in new)
    return True


def _first_reaching(search: Search, flat: list[Any], candidates: list[_Event | int]) -> _Event | int:
    """The first of ``candidates`` (origins in backward order, all kept: the gradients are
    not finite) whose non-finite cotangents reach the gradients, by bisection: the fewest
    first ones that, kept alone, still reach them."""
    lo, hi = 1, len(candidates)
    while lo < hi:
        mid = (lo + hi) // 2
        if _reaches(search, flat, candidates[:mid], list(candidates[mid:])):
            hi = mid
        else:
            lo = mid + 1
    return candidates[lo - 1]


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




def _differentiated(mox: Mox, args: tuple[Any, ...], kwargs: dict[str, Any], argnums: Any) -> tuple[int, ...]:
    """The flat inputs ``jax.grad(..., argnums)`` would differentiate: the floating leaves
    of those positional arguments."""
    nums = {argnums} if isinstance(argnums, int) else set(argnums)
    bad = [n for n in nums if not isinstance(n, int) or not 0 <= n < len(args)]
    if bad:
        raise errors.BadArgnums("range", bad[0], len(args))
    paths = [kp for kp, _ in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]]
    diff = tuple(i for i, v in enumerate(mox.invars) if _inexact(v)
                 and getattr(paths[mox.dyn_in[i]][0], "idx", None) == 0
                 and getattr(paths[mox.dyn_in[i]][1], "idx", None) in nums)
    if not diff:
        raise errors.BadArgnums("not floating", sorted(nums))
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
    from .nonfinite import _innermost_call

    if not callable(grad_of):
        raise LossNotAFunction("first_nonfinite", grad_of)
    diff = _differentiated(mox, args, kwargs, argnums)
    cache: dict[Any, Search] = _calls.memo(mox, "backward.searches", dict)
    search = cache.get((grad_of, diff))
    if search is None:
        search = cache[(grad_of, diff)] = Search(mox, grad_of, diff)
    got = search(flat)
    outs, origins, events = _origins(search, got)
    candidates: list[_Event | int] = [*outs, *origins]  # the loss's own rule runs first in the backward pass
    if not candidates:
        if not any(got.grads):
            return None
        return _overflowed(mox, flat, args, kwargs, grad_of, diff, got.grads.index(True))
    if any(got.grads):
        if len(candidates) > 1:
            search.allow(candidates)  # one switched program for the whole bisection, hidden origins aside
        return _origin(mox, flat, search, grad_of, _first_reaching(search, flat, candidates))
    # every gradient is finite: the first non-finite cotangent died on its way, and where
    first = candidates[0]
    after = events if isinstance(first, int) else events[next(i for i, e in enumerate(events) if e is first) + 1:]
    masker = next((e for e in after if e.came and not e.sent), None)
    found = _origin(mox, flat, search, grad_of, first)
    if masker is None:
        return dataclasses.replace(found, masked=True)
    return dataclasses.replace(found, masked=True, masked_by=masker.eqn, masked_call=_innermost_call(mox, masker.eqn),
                               masked_step=masker.step)


def _origin(mox: Mox, flat: list[Any], search: Search, grad_of: Callable[[Any], Any], c: _Event | int) -> NonFinite:
    """The `NonFinite` of an origin: the loss's rule at output ``c`` (its place among the
    floating outputs), or an equation's, its rule run again alone to name the primitive."""
    from .._print import window
    from .nonfinite import _innermost_call
    from .programs import cached_plan, program_for

    if isinstance(c, int):
        i = search.outs[c]
        outs = jax.jit(lambda f: run(mox, f))(flat)
        ct = jax.grad(lambda o: grad_of(mox.sig.results(o)))(outs)[i]
        return NonFinite(None, None, _output_name(mox, i), (), ValueStats.of(ct), direction="backward")
    eqn, j, step = c.eqn, c.sent[0], c.step
    call = _innermost_call(mox, eqn)
    nodes = [eqn] if call is None else [eqn, call]
    plan = cached_plan(nodes, mox, "first_nonfinite")
    _, got, cts = to_host(program_for(mox, nodes, plan, "grad", inputs=True, repl=grad_of)(flat, {}, None))

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


def _overflowed(mox: Mox, flat: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                grad_of: Callable[[Any], Any], diff: Sequence[int], n: int) -> NonFinite:
    """The gradient of the ``n``-th differentiated argument is not finite although every
    cotangent its readers sent it is: adding them up overflowed."""
    i = diff[n]

    def loss(a: Any) -> Any:
        full = list(flat)
        full[i] = a
        return grad_of(mox.sig.results(run(mox, full)))

    keypath = jax.tree_util.tree_flatten_with_path((args, kwargs))[0][mox.dyn_in[i]][0]
    return NonFinite(None, None, errors.arg_name(keypath), (), ValueStats.of(jax.jit(jax.grad(loss))(flat[i])),
                     direction="backward")
