"""The oracle for `yax.first_nonfinite`, forward and backward (``grad_of``), on
generated stacks, against references computed without yax.

A model is 2 to 4 blocks over ``x: f32[3, 4]``, in linen or as a plain JAX
function: each block a dense layer ``z = x @ kernel + bias`` and one of
`OPS` (relu; sqrt of a relu'd quantity, dropped by relu or not; log; division;
a ``where`` around log; a ``where`` mask), some with a scalar ``gate``
parameter. NaN and Inf are planted in the forward pass (an input or weight
entry set to NaN/Inf, the input or a kernel scaled by up to 1e30, a gate of 0
under log or a division) or only in the backward pass (sqrt at 0, a gate of 0
under ``where(h > 0, log(h), 0)``), or nowhere.

The references use the same block functions, run stage by stage in plain JAX
(every intermediate through a ``tap``), never yax:

- forward: an argument holding NaN/Inf is what yax names (the first one in the
  arguments' flattened order, and the block that reads it); otherwise the
  block of the first stage, in evaluation order, whose value is not finite;
  otherwise nothing. Whether any stage holds a NaN is checked against
  ``jax_debug_nans`` raising on the same model.
- backward: ``jax.grad`` of ``mean(model(x) ** 2)`` says whether every
  gradient (parameters; with ``argnums=(0, 1)``, the input too) is finite; the
  cotangent at every stage (the gradient with respect to a zero added there)
  says whether a non-finite cotangent appears at all. When a gradient is not
  finite, `jax.vjp` block by block, backwards, says which block's backward
  pass (or the loss's) produced the non-finite value that reaches the
  gradients: the first, in backward order, that does so when every other
  block's own non-finite output (one it made from a finite cotangent) is
  zeroed (yax, which sees inside a block, may also name a block that received
  a non-finite cotangent and made one of its own). When every gradient is
  finite but a non-finite cotangent appears, yax must say it is masked, and
  where it came from: the first block, in backward order, that made one.

``YAX_ORACLE_EXAMPLES`` examples (25 by default); a failure prints the
``@reproduce_failure`` blob, and a counterexample becomes a named test in
tests/test_nonfinite_grad.py.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import yax

from .gen import SETTINGS, reporting

#: what the examples exercised (forward: none, argument, block; backward: none, masked, loss,
#: block, and whether an earlier non-finite cotangent was masked first), for a look after a run
COUNTS: collections.Counter[str] = collections.Counter()
D, B = 4, 3


_report = reporting(COUNTS)


def _id(x: Any) -> Any:
    return x


# -- the blocks: each intermediate goes through ``tap`` (the identity in the models) -------------

def relu(z: Any, g: Any, t: float, tap: Callable[[Any], Any]) -> Any:
    return tap(jax.nn.relu(z))


def sqrt_relu(z: Any, g: Any, t: float, tap: Callable[[Any], Any]) -> Any:
    """sqrt at relu's 0: an Inf cotangent that relu's rule drops."""
    r = tap(jax.nn.relu(z))
    return tap(z + tap(jnp.sqrt(r)))


def norm_relu(z: Any, g: Any, t: float, tap: Callable[[Any], Any]) -> Any:
    """Issue 37's layer: ``z + sqrt(sum(relu(z - t) ** 2))``; at ``t = 100`` sqrt at 0, dropped by relu."""
    r = tap(jax.nn.relu(tap(z - t)))
    s = tap(jnp.sum(tap(r ** 2), -1, keepdims=True))
    return tap(z + tap(jnp.sqrt(s)))


def sqrt_gate(z: Any, g: Any, t: float, tap: Callable[[Any], Any]) -> Any:
    """sqrt of a relu'd quantity times the gate: its Inf reaches the gate's gradient."""
    m = tap(tap(jax.nn.relu(z)) * g)
    return tap(z + tap(jnp.sqrt(m)))


def log(z: Any, g: Any, t: float, tap: Callable[[Any], Any]) -> Any:
    """log(relu(z) + gate): -Inf forward at a gate of 0."""
    return tap(jnp.log(tap(tap(jax.nn.relu(z)) + g)))


def div(z: Any, g: Any, t: float, tap: Callable[[Any], Any]) -> Any:
    return tap(z / g)


def where_log(z: Any, g: Any, t: float, tap: Callable[[Any], Any]) -> Any:
    """The where trap: at a gate of 0 log(0) is dropped forward, its rule's 0/0 reaches the gate."""
    h = tap(tap(z * z) * g)
    return tap(z + tap(jnp.where(h > 0, tap(jnp.log(h)), 0.0)))


def where_mask(z: Any, g: Any, t: float, tap: Callable[[Any], Any]) -> Any:
    return tap(jnp.where(z > 0, z, 0.0))


OPS: dict[str, Callable[..., Any]] = {f.__name__: f for f in (relu, sqrt_relu, norm_relu, sqrt_gate, log, div,
                                                               where_log, where_mask)}
GATED = {"sqrt_gate", "log", "div", "where_log"}


def dense(p: dict[str, Any], x: Any, tap: Callable[[Any], Any]) -> Any:
    return tap(tap(x @ p["kernel"]) + p["bias"])


def block(op: str, t: float, p: dict[str, Any], x: Any, tap: Callable[[Any], Any] = _id) -> Any:
    return OPS[op](dense(p, x, tap), p.get("gate"), t, tap)


# -- the same stack in linen and as a plain JAX function -----------------------------------

class Dense(nn.Module):
    @nn.compact
    def __call__(self, x: Any) -> Any:
        kernel = self.param("kernel", nn.initializers.zeros, (D, D))
        bias = self.param("bias", nn.initializers.zeros, (D,))
        return x @ kernel + bias


class Block(nn.Module):
    op: str
    t: float

    @nn.compact
    def __call__(self, x: Any) -> Any:
        z = Dense()(x)
        g = self.param("gate", nn.initializers.ones, ()) if self.op in GATED else None
        return OPS[self.op](z, g, self.t, _id)


class Stack(nn.Module):
    blocks: tuple[tuple[str, float], ...]

    @nn.compact
    def __call__(self, x: Any) -> Any:
        for op, t in self.blocks:
            x = Block(op, t)(x)
        return x


@dataclasses.dataclass
class Case:
    frontend: str
    blocks: list[tuple[str, float]]
    params: list[dict[str, Any]]  # per block: kernel, bias, gate (where gated)
    x: Any
    argnums: Any
    plants: list[tuple[Any, ...]]

    def args(self) -> tuple[Any, Any]:
        """What yax and the model are called with: linen's variables or the plain function's."""
        if self.frontend == "linen":
            return {"params": {f"Block_{i}": {"Dense_0": {"kernel": p["kernel"], "bias": p["bias"]},
                                              **({"gate": p["gate"]} if "gate" in p else {})}
                               for i, p in enumerate(self.params)}}, self.x
        return {f"b{i}": p for i, p in enumerate(self.params)}, self.x

    def model(self) -> Callable[[Any, Any], Any]:
        if self.frontend == "linen":
            return Stack(tuple(self.blocks)).apply
        blocks = self.blocks

        def stack(params: dict[str, Any], x: Any) -> Any:
            for i, (op, t) in enumerate(blocks):
                with jax.named_scope(f"block{i}"):
                    x = block(op, t, params[f"b{i}"], x)
            return x

        return stack


def loss(out: Any) -> Any:
    return jnp.mean(out ** 2)


# -- the references ----------------------------------------------------------------------

def finite(x: Any) -> bool:
    return all(bool(np.isfinite(np.asarray(a)).all()) for a in jax.tree_util.tree_leaves(x))


def reference(params: list[dict[str, Any]], x: Any, blocks: list[tuple[str, float]]) -> Any:
    """The hand-written model: the blocks in plain JAX, on a list of per-block parameters."""
    for (op, t), p in zip(blocks, params):
        x = block(op, t, p, x)
    return x


def clean(x: Any) -> Any:
    return jax.tree_util.tree_map(lambda a: jnp.where(jnp.isfinite(a), a, 0.0), x)


def stages(case: Case) -> list[tuple[int, Any]]:
    """``(block, value)`` of every intermediate, in evaluation order."""
    out: list[tuple[int, Any]] = []
    x = case.x
    for i, (op, t) in enumerate(case.blocks):
        def tap(v: Any, i: int = i) -> Any:
            out.append((i, v))
            return v

        x = block(op, t, case.params[i], x, tap)
    return out


def forward_reference(case: Case, values: list[tuple[int, Any]]) -> tuple[Any, bool]:
    """What yax must name forward: ``("arg", name, block)``, ``("block", i)`` or ``None``;
    and whether some value (``values``: `stages`) holds a NaN."""
    leaves = jax.tree_util.tree_flatten_with_path(case.args())[0]
    nan = any(bool(np.isnan(np.asarray(v)).any()) for _, v in values)
    for kp, a in leaves:
        if not finite(a):
            name = f"args[{kp[0].idx}]{jax.tree_util.keystr(tuple(kp[1:]))}"
            m = re.search(r"Block_(\d+)|'b(\d+)'", name)
            return ("arg", name, int(m.group(1) or m.group(2)) if m else 0), nan
    return next((("block", i) for i, v in values if not finite(v)), None), nan


def debug_nans_raises(case: Case) -> bool:
    """Whether ``jax_debug_nans`` (set with ``jax.config.update``, restored after) stops the
    hand-written model run op by op. The context manager is entered too: leaving any ``with
    jax.debug_nans(False)`` (JAX enters one itself, in ``core.jaxpr_as_fun``) sets the
    thread's own NaN-check hook to none, which then overrides the one ``config.update``
    installs globally (`jax._src.api._update_debug_special_thread_local`, JAX 0.9 and 0.10),
    so the global flag alone stops checking ops that run in this thread."""
    old = jax.config.jax_debug_nans
    jax.config.update("jax_debug_nans", True)
    try:
        with jax.debug_nans(True), jax.disable_jit():
            jax.block_until_ready(reference(case.params, case.x, case.blocks))
    except FloatingPointError:
        return True
    finally:
        jax.config.update("jax_debug_nans", old)
    return False


@dataclasses.dataclass
class Backward:
    finite: bool  # every gradient jax.grad gives, with respect to the differentiated arguments
    any_nonfinite: bool  # a non-finite cotangent anywhere: at a stage, a gradient or the loss's
    reaching: Any  # the block (or "loss") whose non-finite output reaches the gradients
    also: set[Any]  # blocks that received a non-finite cotangent and made one of their own too
    first: Any  # the first block (or "loss"), in backward order, whose rule made a non-finite cotangent


def vjps(case: Case) -> tuple[list[Any], Any]:
    """Each block's `jax.vjp` on its input, and the model's output."""
    x, out = case.x, []
    for (op, t), p in zip(case.blocks, case.params):
        x, f = jax.vjp(lambda p, x, op=op, t=t: block(op, t, p, x), p, x)
        out.append(f)
    return out, x


def _chain(case: Case, vjps: list[Any], y: Any, keep: Any = None) -> tuple[list[Any], list[Any], list[bool]]:
    """The backward pass block by block with the blocks' ``vjps`` from the output ``y``: the
    parameter gradients, the cotangent at each block's input (``cts[0]``: the input's
    gradient) and output, and whether each block's cotangent came in finite. With ``keep``
    given, every other block's (or the loss's) own non-finite output, made from a finite
    cotangent, is zeroed."""
    n = len(case.blocks)
    ct = jax.grad(loss)(y)
    if keep is not None and keep != "loss":
        ct = clean(ct)
    cts: list[Any] = [None] * (n + 1)
    cts[n] = ct
    gps: list[Any] = [None] * n
    came = [True] * n
    for i in range(n - 1, -1, -1):
        came[i] = finite(cts[i + 1])
        gp, cin = vjps[i](cts[i + 1])
        if keep is not None and keep != i and came[i]:
            gp, cin = clean(gp), clean(cin)
        gps[i], cts[i] = gp, cin
    return gps, cts, came


def grads(case: Case, gps: list[Any], cts: list[Any]) -> list[Any]:
    return gps + ([cts[0]] if case.argnums != 0 else [])


def backward_reference(case: Case, values: list[tuple[int, Any]]) -> Backward:
    """The backward reference, ``values`` being `stages`."""
    g = jax.grad(lambda ps, x: loss(reference(ps, x, case.blocks)), argnums=case.argnums)(case.params, case.x)
    fs, y = vjps(case)
    gps, cts, came = _chain(case, fs, y)
    all_finite = finite(g)
    assert all_finite == finite(grads(case, gps, cts)), "the block-by-block gradients disagree with jax.grad's"

    # the cotangent at every stage: the gradient with respect to a zero added there
    shapes = [v.shape for _, v in values]

    def with_zeros(zs: list[Any], params: list[Any], x: Any) -> Any:
        it = iter(zs)
        for (op, t), p in zip(case.blocks, params):
            x = block(op, t, p, x, lambda v: v + next(it))
        return loss(x)

    zeros = [jnp.zeros(s) for s in shapes]
    stage_cts = jax.grad(with_zeros)(zeros, case.params, case.x)
    owner = [i for i, _ in values]
    n = len(case.blocks)
    any_nonfinite = not all_finite or not finite(stage_cts) or not finite(cts[n])

    # the first block, in backward order, whose rule made a non-finite cotangent: one of its own
    # stages (its output's is what came in) or what it sent to its parameters or input
    def sent(i: int) -> list[Any]:  # what block i's rule sends where yax sees it: no input's gradient is
        return [gps[i], cts[i]] if i or case.argnums != 0 else [gps[i]]  # taken with argnums=0

    last = {i: max(k for k, o in enumerate(owner) if o == i) for i in range(n)}
    made = [not finite([c for k, c in enumerate(stage_cts) if owner[k] == i and k != last[i]])
            or not finite(sent(i)) for i in range(n)]
    first = "loss" if not finite(cts[n]) else next((i for i in range(n - 1, -1, -1) if made[i]), None)

    reaching, also = None, set()
    if not all_finite:
        origins = (["loss"] if not finite(cts[n]) else []) + \
            [i for i in range(n - 1, -1, -1) if came[i] and not finite(sent(i))]
        for c in origins:
            kg, kc, _ = _chain(case, fs, y, keep=c)
            if not finite(grads(case, kg, kc)):
                reaching = c
                break
        also = {i for i in range(n) if not came[i] and not finite(fs[i](clean(cts[i + 1])))}
    return Backward(all_finite, any_nonfinite, reaching, also, first)


# -- yax's answers, as blocks ---------------------------------------------------------------

def blocks_of(mox: Any, frontend: str) -> dict[int, int]:
    """Each equation's block (by ``id``): linen's ``Block_i`` in its path, the plain
    function's ``block{i}`` name scope (nested equations take their parent's)."""
    out: dict[int, int] = {}

    def visit(node: Any, b: Any) -> None:
        for c in node.children:
            if not hasattr(c, "primitive"):
                visit(c, b)
                continue
            if frontend == "linen":
                m = re.search(r"Block_(\d+)", c.path)
            else:
                m = re.search(r"block(\d+)", str(getattr(c.source_info, "name_stack", "")))
            bb = int(m.group(1)) if m else b
            out[id(c)] = bb
            for _, s in c.subs:
                visit(s, bb)

    visit(mox, None)
    return out


def block_of(found: Any, where: dict[int, int]) -> Any:
    if found.equation is None:
        return "loss" if found.path.startswith("out") else found.path
    return where[id(found.equation)]


# -- the generator ------------------------------------------------------------------------

NONFINITE = st.sampled_from([np.nan, np.inf, -np.inf])
#: the ops, those that make a NaN or Inf only in the backward pass twice as likely: so a masked
#: one often runs before one that reaches the gradients (the search's bisection)
CHOICES = sorted(OPS) + ["sqrt_relu", "norm_relu", "sqrt_gate", "where_log"]


@st.composite
def cases(draw: Any) -> Case:
    n = draw(st.integers(2, 4))
    blocks = [(draw(st.sampled_from(CHOICES)), draw(st.sampled_from([100.0, 100.0, -100.0]))) for _ in range(n)]
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    params = []
    for op, _ in blocks:
        p = {"kernel": rng.normal(0, 0.7, (D, D)).astype(np.float32), "bias": rng.normal(0, 0.1, (D,)).astype(np.float32)}
        if op in GATED:
            p["gate"] = np.float32(1.0)
        params.append(p)
    x = rng.normal(0, 1, (B, D)).astype(np.float32)
    plants = []
    for _ in range(draw(st.sampled_from([0, 1, 1, 2, 2]))):  # a gate of 0 is the likeliest: it plants in the ops
        kind = draw(st.sampled_from(["x", "weight", "scale_x", "scale_w", "gate", "gate", "gate", "zero_x"]))
        i = draw(st.integers(0, n - 1))
        if kind == "x":
            plant: tuple[Any, ...] = (kind, draw(st.integers(0, B * D - 1)), draw(NONFINITE))
            x.reshape(-1)[plant[1]] = plant[2]
        elif kind == "weight":
            what = draw(st.sampled_from(["kernel", "bias"]))
            plant = (kind, i, what, draw(st.integers(0, D - 1)), draw(NONFINITE))
            params[i][what].reshape(-1)[plant[3]] = plant[4]
        elif kind == "scale_x":  # drawn twice, the scales multiply and may overflow here: an Inf planted
            plant = (kind, draw(st.sampled_from([1e10, 1e20, 1e30])))
            with np.errstate(over="ignore"):
                x = x * np.float32(plant[1])
        elif kind == "scale_w":
            plant = (kind, i, draw(st.sampled_from([1e10, 1e20, 1e30])))
            with np.errstate(over="ignore"):
                params[i]["kernel"] = params[i]["kernel"] * np.float32(plant[2])
        elif kind == "gate":
            plant = (kind, i)
            if "gate" in params[i]:
                params[i]["gate"] = np.float32(0.0)
        else:
            plant = (kind,)
            x = np.zeros_like(x)
        plants.append(plant)
    return Case(draw(st.sampled_from(["linen", "jax"])), blocks,
                [{k: jnp.asarray(v) for k, v in p.items()} for p in params], jnp.asarray(x),
                draw(st.sampled_from([0, (0, 1)])), plants)


def check(case: Case) -> None:
    fn, args = case.model(), case.args()
    mox = yax.make_mox(fn)(*args)
    where = blocks_of(mox, case.frontend)

    # forward
    values = stages(case)
    want, nan = forward_reference(case, values)
    assert debug_nans_raises(case) == nan, "the stage-by-stage reference and jax_debug_nans disagree"
    fwd = yax.first_nonfinite(mox, *args)
    COUNTS["forward " + ("none" if want is None else want[0])] += 1
    if want is None:
        assert fwd is None, fwd
    elif want[0] == "arg":
        assert fwd is not None and fwd.equation is None and fwd.path == want[1], (want, fwd)
        assert fwd.reader is not None and where[id(fwd.reader)] == want[2], (want, fwd)
    else:
        assert fwd is not None and fwd.equation is not None, (want, fwd)
        assert where[id(fwd.equation)] == want[1], (want, str(fwd))

    # backward
    ref = backward_reference(case, values)
    back = yax.first_nonfinite(mox, *args, grad_of=loss, argnums=case.argnums)
    COUNTS["backward " + ("none" if not ref.any_nonfinite else "masked" if ref.finite else
                          "loss" if ref.reaching == "loss" else "block")] += 1
    COUNTS["backward reaching after a masked one"] += bool(not ref.finite and ref.first != ref.reaching)
    if not ref.any_nonfinite:
        assert back is None, str(back)
        return
    assert back is not None and back.direction == "backward", "a non-finite cotangent went unreported"
    got = block_of(back, where)
    if ref.finite:
        assert back.masked, f"every gradient is finite, but yax says:\n{back}"
        assert str(back).startswith("No non-finite gradient: every gradient is finite.")
        assert got == ref.first, (ref, str(back))
        assert back.masked_by is not None, str(back)  # a value that never reaches the gradients dies somewhere
        masker = where[id(back.masked_by)]
        assert got == "loss" or masker <= got, (ref, str(back))  # where the backward pass runs later
        return
    assert not back.masked, f"a gradient is not finite, but yax says:\n{back}"
    assert str(back).startswith(("The first non-finite gradient comes from", "The gradient with respect to"))
    assert got == ref.reaching or got in ref.also, (ref, str(back))
    COUNTS["backward: yax named a block that received one and made its own"] += got != ref.reaching


@SETTINGS
@given(cases())
def test_first_nonfinite_against_the_references(case: Case) -> None:
    check(case)
