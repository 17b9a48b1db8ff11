"""The explorer's view inside the model: a row's values, the tree painted by a
statistic, the first NaN or Inf, and the checks on named input batches.

Values are reduced where the model runs. Call outputs are read off the
session's measurements (`compare`'s: the original's, made when the explorer
opens, and the current model's, made by its comparison); a model measured by
nothing is run by `yax.capture` (one program per model, compiled once) and its
outputs stay on the device. Selecting a row reduces that row's outputs to
statistics, a histogram and a heatmap slice in a small jitted function
(compiled once per shape), and only those cross to the host. Equations are captured one by one
when selected. Results are kept per model, batch and row, so selecting a row
again is instant; nothing here changes the model or the history.

`Inspector` is the session's part that holds these values; the formats
are in docs/widget.md ("Values").
"""

from __future__ import annotations

import math
import time
import weakref
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

import yax
from yax.errors import arg_name, where
from yax.internal import (
    ValueStats,
    capturable_calls,
    capture_keys,
    model_jit,
    node_ids,
    reduced_stats,
    results_of,
    type_str,
)

from ._payloads import HIST_BINS, floats, heat_slice

if TYPE_CHECKING:
    from ._session import Session

MAX_OUTPUTS = 8  # outputs of one row shown (a call returning a long tuple shows its first ones)
STATS = {"norm": "norm of the outputs", "zeros": "fraction of zeros", "nonfinite": "fraction of NaN or Inf",
         "grad": "gradient norm", "gxa": "gradient × activation"}
GRAD_STATS = ("grad", "gxa")  # the colourings by the gradient of a scalar of the output (`Scalar`)
SCALARS = {"loss": "the loss (`grad_of`)", "logit": "a logit", "sum": "the sum of the output"}
EXAMPLE = "example"  # the name of the batch the explorer was opened with, unless `batches` names it


# -- on the device ---------------------------------------------------------------------

def _reduced(x: Any) -> tuple[Any, Any, Any, Any, Any]:
    """One array's summary: counts ``[finite, NaN, +Inf, -Inf, zeros]`` (int32),
    ``[min, max, mean, std, norm]`` of the finite values (float32), the histogram of
    the finite values over ``[min, max]``, the heatmap (`heat_slice` of a 2-D slice)
    and which slice: the first holding a NaN or an Inf, else the first (a flat index
    over the leading axes)."""
    stats, counts = reduced_stats(x)  # what `yax.compare` and `first_nonfinite` report of an array
    lo, hi = stats[0], stats[1]
    f = _floats(x)
    fin = jnp.isfinite(f)
    # the norm and the histogram of values scaled by the largest |value|, as those statistics are
    big = jnp.maximum(-lo, hi)
    big = jnp.where((counts[0] > 0) & (big > 0), big, 1.0)
    s = jnp.where(fin, f, 0.0) / big
    norm = big * jnp.sqrt((s * s).sum())
    width = hi / big - lo / big  # scaled too: at most 2
    at = jnp.floor((s - lo / big) / jnp.where(width > 0, width, 1.0) * HIST_BINS)
    at = jnp.where(fin, jnp.clip(at, 0, HIST_BINS - 1), 0).astype(jnp.int32)
    hist = jnp.bincount(at.ravel(), weights=fin.ravel().astype(jnp.int32), length=HIST_BINS)
    k = jnp.zeros((), jnp.int32)
    if f.ndim > 2 and f.size:
        slices = f.reshape(-1, *f.shape[-2:])
        k = jnp.argmax(~fin.reshape(slices.shape[0], -1).all(axis=1)).astype(jnp.int32)
        f = slices[k]
    heat = heat_slice(f, "")[0] if f.ndim and f.size else jnp.zeros((0, 0), jnp.float32)
    return counts, jnp.concatenate([stats, norm[None]]), hist, heat, k


CHUNK = 4096  # values per chunk of `_dots`


def _chunked(arrays: list[Any]) -> tuple[Any, Any, Any]:
    """``arrays`` (float32) flattened and padded with zeros into chunks of `CHUNK`
    values, stacked: the chunks ``[K, CHUNK]``, the array each chunk belongs to, and
    each array's padding. Reductions along the chunks, then summed per array, make one
    program of a few large operations (a masked sum of each of a 1B model's outputs
    compiled for seconds)."""
    rows, seg, pad = [], [], []
    for n, x in enumerate(arrays):
        k = max(1, -(-x.size // CHUNK))
        rows.append(jnp.pad(x.ravel(), (0, k * CHUNK - x.size)).reshape(k, CHUNK))
        seg += [n] * k
        pad.append(k * CHUNK - x.size)
    return jnp.concatenate(rows), np.asarray(seg, np.int32), np.asarray(pad, np.float32)


def _squares(outs: list[Any]) -> Any:
    """``x · x`` of each array of ``outs`` (float32), in the program that made them: one
    matrix product each, which XLA compiles as fast as nothing and runs at the speed of
    reading the array (the zeros and NaN counts of a 1B Llama's 310 outputs, reduced in
    the same program, ran 0.7 s longer than the model). The colouring needs nothing
    else: `_Light` makes the rest from it, counting only where it must."""
    if not outs:
        return jnp.zeros((0,), jnp.float32)
    return jnp.stack([jnp.vdot(f, f) for f in (_floats(x).ravel() for x in outs)])


@jax.jit
def _zeros(x: Any) -> Any:
    """How many values of ``x`` are zero (int32; compiled once per shape and dtype)."""
    return (x == 0).sum(dtype=jnp.int32)


class _Light:
    """What the colouring needs of each of ``arrays`` (kept on the device) from their
    ``squares`` (`_squares`, on the host): the norm of the finite values and how many
    are NaN or Inf, and how many are zero, when asked.

    When ``x · x`` is finite, no value is NaN or Inf; when it is also at least
    ``1e-30`` per value, no square lost to underflow weighs (each lost one is below
    ``1.2e-38``) and the norm is its root. Otherwise (a NaN or an Inf, an overflow, or
    values so small their squares vanish) the array's full summary (`_reduced`, its sums
    scaled by the largest value) tells both, so a row of values near ``1e-25`` shows
    their norm, not 0. Zeros are counted only for the colouring by zeros (or where
    ``x · x`` is 0: a gradient zero everywhere)."""

    def __init__(self, arrays: list[Any], squares: Any):
        self.arrays = arrays
        self.squares = np.asarray(squares, np.float64)
        self._full: dict[int, tuple[float, int]] = {}
        self._zeros: dict[int, int] = {}

    def norm(self, i: int) -> tuple[float, int]:
        """``(norm of the finite values, how many are NaN or Inf)`` of array ``i``."""
        s, x = float(self.squares[i]), self.arrays[i]
        if math.isfinite(s) and s >= 1e-30 * x.size:
            return math.sqrt(s), 0
        if s == 0 and self.zeros(i) == x.size:
            return 0.0, 0
        if i not in self._full:
            counts, stats = jax.device_get(_summarize(x))[:2]
            self._full[i] = (float(stats[4]), int(counts[1] + counts[2] + counts[3]))
        return self._full[i]

    def zeros(self, i: int) -> int:
        """How many values of array ``i`` are zero."""
        if i not in self._zeros:
            x = self.arrays[i]
            self._zeros[i] = int(np.count_nonzero(x == 0) if isinstance(x, np.ndarray) else _zeros(x))
        return self._zeros[i]


def _floats(x: Any) -> Any:
    return (jnp.abs(x) if jnp.iscomplexobj(x) else x).astype(jnp.float32)


def _dots(gs: list[Any], xs: list[Any]) -> Any:
    """``sum(g * x)`` over the finite products of each pair of ``gs`` and ``xs`` (float32),
    `_chunked`."""
    if not gs:
        return jnp.zeros((0,), jnp.float32)
    products = [g.astype(jnp.float32) * x.astype(jnp.float32) for g, x in zip(gs, xs)]
    f, ids, _ = _chunked([jnp.where(jnp.isfinite(p), p, 0.0) for p in products])
    return jax.ops.segment_sum(f.sum(axis=1), ids, len(gs), indices_are_sorted=True)


_summarize = jax.jit(_reduced)  # one output summarised on the device: compiled once per shape and dtype


def _rebuilt(mox: yax.Mox, dyn: list, template: tuple) -> tuple[tuple, dict]:
    """The arguments of a program jitted with a `_Static` ``template``: its static
    leaves, with the dynamic ones (``dyn``, at ``mox.dyn_in``) put back."""
    leaves, tree = template
    leaves = list(leaves)
    for i, x in zip(mox.dyn_in, dyn):
        leaves[i] = x
    args, kwargs = jax.tree_util.tree_unflatten(tree, leaves)
    return args, kwargs


def _arrays(node: Any, value: Any) -> list[tuple[Any, str, Any, tuple]]:
    """The array outputs in ``value`` (what ``node`` returned, as `yax.capture` gives
    it): each one's pytree path, name (``out[0]``), array and scan steps (a node inside
    a scan gives its values stacked along the scan axes: those lead)."""
    found = [(p, x) for p, x in jax.tree_util.tree_flatten_with_path(value)[0] if hasattr(x, "dtype")]
    traced = node.outputs
    out = []
    for k, (path, x) in enumerate(found):
        nd = len(traced[k].shape) if len(traced) == len(found) else x.ndim
        out.append((path, "out" + jax.tree_util.keystr(path), x, tuple(x.shape[:x.ndim - nd])))
    return out


def _no_gradient(x: Any, g: Any) -> str:
    """Why the output ``x`` shows no gradient ``g`` ("" when it shows one)."""
    if g is not None and jnp.issubdtype(x.dtype, jnp.floating) and jnp.issubdtype(g.dtype, jnp.floating):
        return ""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return f"a {type_str(x)} output has no gradient"
    return f"a {type_str(x)} output: its gradient is not shown"


#: the dtypes whose values float32 holds exactly: `compare` measures every boundary as float32
_EXACT = frozenset(np.dtype(t) for t in (jnp.float32, jnp.bfloat16, jnp.float16))


class _Program:
    """One jitted program per model, so the values stay on the device: it brings out
    every capturable call's outputs and what the colouring needs of each (`_squares`).
    One compile serves every call row; a row's full summary is made when it is selected.

    ``where`` (set while tracing) maps a row id to its outputs: ``(name, index in the
    program's outputs, type, shape, scan steps)``."""

    def __init__(self, mox: yax.Mox):
        self.where: dict[int, list[tuple]] = {}
        self.more: dict[int, int] = {}
        calls = capturable_calls(mox)
        keys, ids = capture_keys(mox), node_ids(mox)
        self.rows = [ids[id(c)] for c in calls]
        ref = weakref.ref(mox)  # the cache must not keep its own key alive

        def program(dyn: list, template: tuple) -> tuple[list, list]:
            m = ref()
            args, kwargs = _rebuilt(m, dyn, template)
            _, got = yax.capture(calls, m, *args, **kwargs) if calls else (None, {})
            outs: list[Any] = []
            for rid, c in zip(self.rows, calls):
                found = _arrays(c, got[keys[id(c)]])
                self.more[rid] = max(0, len(found) - MAX_OUTPUTS)
                entries = []
                for _, name, x, steps in found[:MAX_OUTPUTS]:
                    entries.append((name, len(outs), type_str(x), tuple(x.shape), steps))
                    outs.append(x)
                self.where[rid] = entries
            return outs, _squares(outs)

        self.capture = model_jit(program, static_argnums=1)


class _Static:
    """The arguments' structure and static leaves, hashable for `jax.jit`'s static argument
    (the same for every batch: `add_batch` checks it; compared by their reprs)."""

    def __init__(self, leaves: list, tree: Any, mox: yax.Mox):
        dyn = set(mox.dyn_in)
        self.value = ([None if i in dyn else x for i, x in enumerate(leaves)], tree)
        self.key = (tree, tuple(repr(x) for i, x in enumerate(leaves) if i not in dyn))

    def __iter__(self):
        return iter(self.value)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and self.key == other.key


_programs: weakref.WeakKeyDictionary[yax.Mox, _Program] = weakref.WeakKeyDictionary()


# -- gradients of a scalar of the output ------------------------------------------------

class Scalar:
    """A real scalar of the model's output, which the gradient colouring, the gradient in
    the Values tab and the backward NaN search differentiate (the ``grad_of`` of
    `yax.capture` and `yax.first_nonfinite`). ``kind``: ``"loss"`` (the explorer's
    ``grad_of``), ``"logit"`` (``out[0, ..., -1, index]`` of the output's logits, the
    argmax at that position when ``index`` is None) or ``"sum"`` (the sum of the logits).
    The logits are the output's ``.logits`` (Hugging Face), else its first floating array.

    One object per kind and index (`Inspector.scalar`): yax compiles once per function."""

    def __init__(self, kind: str, index: int | None = None, loss: Any = None):
        self.kind, self.index, self.loss = kind, index, loss

    @property
    def key(self) -> tuple:
        return (self.kind, self.index)

    @staticmethod
    def logits(out: Any) -> tuple[str, Any]:
        """The array the logit and the sum are taken of, and its name."""
        found = getattr(out, "logits", None)
        if hasattr(found, "dtype") and jnp.issubdtype(found.dtype, jnp.floating):
            return "logits", found
        for path, x in jax.tree_util.tree_flatten_with_path(out)[0]:
            if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating):
                return "out" + jax.tree_util.keystr(path), x
        raise yax.YaxInputError("The model's output holds no floating array, so it has no logit or sum to "
                                "differentiate. Open the explorer with `grad_of=` a function of the output "
                                "giving a scalar, and colour by the gradient of the loss.")

    @staticmethod
    def position(x: Any) -> tuple[int, ...]:
        """Where the logit is read before its last axis: the first example, the last position."""
        return () if x.ndim <= 1 else (0,) if x.ndim == 2 else (0,) * (x.ndim - 2) + (-1,)

    def chosen(self, out: Any) -> Any:
        """The logit's index: the one given, else the argmax at `position` (jittable); -1 for a sum or loss."""
        if self.kind != "logit":
            return jnp.int32(-1)
        _, x = self.logits(out)
        if not x.ndim:
            return jnp.int32(-1)
        if self.index is not None:
            if not 0 <= self.index < x.shape[-1]:
                raise yax.YaxInputError(f"The logit index {self.index} is out of range: the output's logits have "
                                        f"{x.shape[-1]} entries along their last axis. Give an index from 0 to "
                                        f"{x.shape[-1] - 1}, or leave it empty for the argmax.")
            return jnp.int32(self.index)
        return jnp.argmax(jax.lax.stop_gradient(x[self.position(x)])).astype(jnp.int32)

    def __call__(self, out: Any) -> Any:
        if self.kind == "loss":
            return self.loss(out)
        _, x = self.logits(out)
        if self.kind == "sum":
            return x.sum(dtype=jnp.float32)
        if not x.ndim:
            return x.astype(jnp.float32)
        return x[self.position(x)][self.chosen(out)].astype(jnp.float32)

    def describe(self, leaf: tuple[str, int] | None = None, index: int = -1) -> str:
        """What is differentiated, as the legend says it: ``logits[0, -1, 1234] (argmax)``.
        ``leaf``: the name and rank of the output's logits; ``index``: the logit's (-1: not known)."""
        if self.kind == "loss":
            name = getattr(self.loss, "__name__", "")
            return f"{name if name.isidentifier() else 'grad_of'}(output)"
        name, ndim = leaf or ("logits", 3)
        if self.kind == "sum":
            return f"sum({name})"
        if not ndim:
            return name
        pos = () if ndim <= 1 else (0,) if ndim == 2 else (0,) * (ndim - 2) + (-1,)
        at = [*map(str, pos), str(index) if index >= 0 else "argmax"]
        return f"{name}[{', '.join(at)}]" + (" (argmax)" if self.index is None and index >= 0 else "")


class _GradProgram:
    """One jitted program per model and `Scalar`: the gradient of the scalar at every
    capturable call's outputs (`yax.capture` with ``grad_of``: one forward and one
    backward pass), kept on the device, and what the colouring needs of each: their
    ``g · g`` (`_squares`), ``sum(gradient × output)`` (`_dots`), the
    logit's index and the scalar's value.

    ``where`` (set while tracing) maps a row id to its outputs: ``(name, index in the
    program's gradients or None, type, shape, scan steps, why none)``."""

    def __init__(self, mox: yax.Mox, scalar: Scalar):
        self.where: dict[int, list[tuple]] = {}
        self.leaf: tuple[str, int] | None = None  # the logits' name and rank (set while tracing)
        calls = capturable_calls(mox)
        keys, ids = capture_keys(mox), node_ids(mox)
        rows = [ids[id(c)] for c in calls]
        ref = weakref.ref(mox)

        def program(dyn: list, template: tuple) -> tuple:
            m = ref()
            args, kwargs = _rebuilt(m, dyn, template)
            out, got, grads = yax.capture(calls, m, *args, grad_of=scalar, **kwargs) if calls else \
                (yax.eval_mox(m, *args, **kwargs), {}, {})
            gs: list[Any] = []
            xs: list[Any] = []
            for rid, c in zip(rows, calls):
                given = dict(jax.tree_util.tree_flatten_with_path(grads[keys[id(c)]])[0])
                entries = []
                for path, name, x, steps in _arrays(c, got[keys[id(c)]])[:MAX_OUTPUTS]:
                    g = given.get(path)
                    why = _no_gradient(x, g)
                    entries.append((name, None if why else len(gs), type_str(x), tuple(x.shape), steps, why))
                    if not why:
                        gs.append(g)
                        xs.append(x)
                self.where[rid] = entries
            chosen = scalar.chosen(out)
            if scalar.kind != "loss":
                name, x = scalar.logits(out)
                self.leaf = (name, x.ndim)
            return gs, _squares(gs), _dots(gs, xs), chosen, scalar(out)

        self.run = model_jit(program, static_argnums=1)


_grad_programs: weakref.WeakKeyDictionary[yax.Mox, dict] = weakref.WeakKeyDictionary()


class _Gradients:
    """The gradient of one `Scalar` at every capturable call's outputs, of one model on
    one batch, kept on the device; what the colouring needs crosses to the host."""

    def __init__(self, mox: yax.Mox, scalar: Scalar, args: tuple, kwargs: dict, batch: str):
        progs = _grad_programs.setdefault(mox, {})
        prog = progs.get(scalar.key)
        if prog is None:
            prog = progs[scalar.key] = _GradProgram(mox, scalar)
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        self.grads, squares, dots, chosen, value = prog.run([leaves[i] for i in mox.dyn_in],
                                                            _Static(leaves, tree, mox))
        squares, self.dots, chosen, value = jax.device_get((squares, dots, chosen, value))
        self.light = _Light(self.grads, squares)
        self.program, self.scalar, self.batch = prog, scalar, batch
        self.index = int(chosen)
        self.value = _number(value)
        self.overlay: dict[str, Any] | None = None

    def what(self) -> str:
        """The scalar differentiated: ``logits[0, -1, 1234] (argmax)``."""
        return self.scalar.describe(self.program.leaf, self.index)

    def label(self) -> str:
        """What was differentiated: ``d logits[0, -1, 1234] (argmax) / d output of each row, batch `example```."""
        return f"d {self.what()} / d output of each row, batch `{self.batch}`"

    def rows(self) -> tuple[dict[int, float | None], dict[int, float | None], dict[int, str]]:
        """Per row id: the norm of its outputs' gradient, ``sum(gradient × output)``, and why a
        row has no colour (or what its numbers leave out). `nonfinite` then holds, per row id,
        how many values of its gradient are NaN or Inf (only rows with some)."""
        if self.overlay is None:
            norms: dict[int, float | None] = {}
            gxa: dict[int, float | None] = {}
            why: dict[int, str] = {}
            nonfinite: dict[int, int] = {}
            for rid, at in self.program.where.items():
                sq = dot = zeros = bad = size = 0.0
                reasons = []
                for _, i, _, shape, _, reason in at:
                    if i is None:
                        reasons.append(reason)
                        continue
                    norm, nf = self.light.norm(i)
                    n = math.prod(shape)
                    sq += norm**2 if nf < n else 0.0
                    dot += float(self.dots[i])
                    # zeros only where they may be all there is: g . g is 0
                    z = self.light.zeros(i) if self.light.squares[i] == 0 else 0
                    zeros, bad, size = zeros + z, bad + nf, size + n
                if bad:
                    nonfinite[rid] = int(bad)
                if not size:
                    norms[rid] = gxa[rid] = None
                    why[rid] = "; ".join(dict.fromkeys(reasons)) or "this call has no array outputs"
                elif bad == size:
                    norms[rid] = gxa[rid] = None
                    why[rid] = "every value of its gradient is NaN or Inf"
                elif zeros == size:
                    norms[rid] = gxa[rid] = None
                    why[rid] = "its gradient is zero everywhere: to first order the scalar does not change with its outputs here"
                else:
                    norms[rid], gxa[rid] = _number(math.sqrt(sq)), _number(dot)
                    notes = [f"{int(bad):,} NaN or Inf in its gradient left out"] if bad else []
                    notes += [f"{r} (left out)" for r in dict.fromkeys(reasons)]
                    if notes:
                        why[rid] = "; ".join(notes)
            self.overlay = {"norms": norms, "gxa": gxa, "why": why, "nonfinite": nonfinite}
        o = self.overlay
        return o["norms"], o["gxa"], o["why"]

    def entries(self, rid: int) -> list[dict] | None:
        """The Values tab's gradient entries of call row ``rid`` (summaries of its outputs' gradients)."""
        at = self.program.where.get(rid)
        if at is None:
            return None
        out = []
        for name, i, type_, shape, steps, why in at:
            if i is None:
                out.append({"name": name, "type": type_, "shape": list(shape), "why": why})
            else:
                g = self.grads[i]
                out.append(_entry(name, type_str(g), shape, steps, *jax.device_get(_summarize(g))))
        return out


class _Boundaries:
    """Every capturable call's outputs, of one model on one batch, and what the colouring
    needs of each: run by the model's `_Program` (kept on the device; only that crosses to
    the host), or read off the session's measurement of the model (`measured`). ``where``
    and ``more`` as `_Program` has them."""

    def __init__(self, where: dict[int, list[tuple]], more: dict[int, int], outs: list[Any], squares: Any):
        self.where, self.more, self.outs = where, more, outs
        self.light = _Light(outs, squares)
        self.overlay: dict[str, dict[int, float]] = {}  # per statistic: per row

    @classmethod
    def run(cls, mox: yax.Mox, args: tuple, kwargs: dict) -> _Boundaries:
        prog = _programs.get(mox)
        if prog is None:
            prog = _programs[mox] = _Program(mox)
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        outs, squares = prog.capture([leaves[i] for i in mox.dyn_in], _Static(leaves, tree, mox))
        return cls(prog.where, prog.more, outs, jax.device_get(squares))

    @classmethod
    def measured(cls, mox: yax.Mox, taps: dict[str, np.ndarray]) -> _Boundaries | None:
        """The rows of ``mox`` read off what `compare` measured of it (``taps``: each call's
        outputs as float32 rows on the host, `Measured.taps`), without running it again: the
        session measures the original when the explorer opens and each changed model in its
        comparison, so colouring either costs no second run of the model (a float32 1B Llama:
        6.5 s -> 0.06 s) and no second copy of its outputs. None where a row is not there, or
        float32 would not hold its values exactly (float64, integers, complex): those are run
        (`run`)."""
        ids, keys = node_ids(mox), capture_keys(mox)
        where: dict[int, list[tuple]] = {}
        more: dict[int, int] = {}
        outs: list[Any] = []
        for c in capturable_calls(mox):
            row = taps.get(keys[id(c)])
            if row is None or not all(o.dtype in _EXACT for o in c.outputs):
                return None
            stack = row.shape[:-1]
            ends = np.cumsum([0] + [math.prod(o.shape) for o in c.outputs])
            if ends[-1] != row.shape[-1]:
                return None
            # each output a view of the row where it allows, in the type the model computed it in
            flat = [row[..., a:b].reshape(*stack, *o.shape) for a, b, o in zip(ends, ends[1:], c.outputs)]
            dtypes = {id(x): o.dtype for x, o in zip(flat, c.outputs)}
            found = _arrays(c, results_of(c, flat))  # as `_Program` finds them in what `capture` gives
            more[ids[id(c)]] = max(0, len(found) - MAX_OUTPUTS)
            entries = []
            for _, name, x, steps in found[:MAX_OUTPUTS]:
                shown = jax.ShapeDtypeStruct(x.shape, dtypes.get(id(x), x.dtype))
                entries.append((name, len(outs), type_str(shown), tuple(x.shape), steps))
                outs.append(x)
            where[ids[id(c)]] = entries
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is an Inf, which `_Light` handles
            squares = [np.dot(np.ravel(x), np.ravel(x)) for x in outs]  # float32, as `_squares` in the program
        return cls(where, more, outs, np.asarray(squares, np.float32))

    def entries(self, rid: int) -> tuple[list[dict], int] | None:
        """The values pane's entries of call row ``rid`` (only its summary crosses to the host)."""
        at = self.where.get(rid)
        if at is None:
            return None
        out = []
        for name, i, type_, shape, steps in at:
            # one at a time: XLA's CPU client deadlocks with dozens of sharded programs in flight
            out.append(_entry(name, type_, shape, steps, *jax.device_get(_summarize(self.outs[i]))))
        return out, self.more[rid]

    def stats(self, stat: str) -> dict[int, float]:
        """Row id -> ``stat`` of all its outputs: ``"norm"`` (of the finite values; NaN
        where there are none), ``"zeros"`` or ``"nonfinite"`` (fractions; NaN for a row
        without values). Zeros are counted only when asked for."""
        if stat not in self.overlay:
            got = self.overlay[stat] = {}
            for rid, at in self.where.items():
                sq = count = size = finite = 0.0
                for _, i, _, shape, _ in at:
                    n = math.prod(shape)
                    if stat == "zeros":
                        count += self.light.zeros(i)
                    else:
                        norm, nf = self.light.norm(i)
                        sq, count, finite = sq + (norm**2 if nf < n else 0.0), count + nf, finite + n - nf
                    size += n
                if stat == "norm":
                    got[rid] = math.sqrt(sq) if finite else math.nan  # none when no value is finite
                else:
                    got[rid] = count / size if size else math.nan
        return self.overlay[stat]


# -- on the host ------------------------------------------------------------------------

def _number(v: Any) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def _entry(name: str, type_: str, shape: tuple, steps: tuple, counts: Any, stats: Any, hist: Any,
           heat: Any, k: Any) -> dict:
    """The values pane's entry for one output from its summary (`_reduced`)."""
    n, nan, posinf, neginf, zeros = (int(c) for c in counts)
    lo, hi, mean, std, norm = (_number(s) if n else None for s in stats)
    size = int(np.prod(shape))
    entry = {
        "name": name, "type": type_, "shape": list(shape), "steps": list(steps), "size": size,
        "min": lo, "max": hi, "mean": mean, "std": std, "norm": norm,
        "finite": n, "nan": nan, "posinf": posinf, "neginf": neginf, "zeros": zeros,
        # the real range of the finite values: equal ends (one value everywhere) are said, not widened
        "hist": {"counts": np.asarray(hist).tolist(), "lo": lo, "hi": hi, "n": n, "nonfinite": nan + posinf + neginf},
        "heat": None,
    }
    if len(shape) and size:
        # what was cut is read off the shape: a zero-strided stand-in, no copy
        at = np.unravel_index(int(k), shape[:-2]) if len(shape) > 2 else ()
        label = f"{name}[{', '.join(map(str, at))}]" if at else name
        _, info = heat_slice(np.broadcast_to(np.zeros((), np.int8), shape[-2:]), label)
        entry["heat"] = {**info, "whole": len(shape) <= 2 and info["whole"], "values": floats(heat),
                         # the slice shown is where the NaN or Inf are, not simply the first
                         "nonfinite": bool(nan + posinf + neginf) and len(shape) > 2}
    return entry


def value_stats(entry: dict) -> ValueStats:
    """A values-pane entry as `yax.internal.ValueStats` (what `Explorer.values` returns)."""
    nan = float("nan")
    return ValueStats(entry["type"], *(nan if entry[k] is None else entry[k] for k in ("min", "max", "mean", "std")),
                      entry["nan"], entry["posinf"], entry["neginf"], entry["zeros"], entry["size"])


def _entries(node: Any, value: Any) -> tuple[list[dict], int]:
    """The entries of an equation's captured ``value``, reduced on the device, at
    most `MAX_OUTPUTS`, and how many outputs were left out."""
    found = _arrays(node, value)
    out = [_entry(name, type_str(x), tuple(x.shape), steps, *jax.device_get(_summarize(x)))
           for _, name, x, steps in found[:MAX_OUTPUTS]]
    return out, len(found) - len(out)


class Inspector:
    """The values pane and the colouring of one `Session`: each row's values on the
    batch in use, computed on the device and kept per model, batch and row; with a
    gradient colouring, the gradient of its `Scalar` at each row too."""

    def __init__(self, session: Session):
        self._session = session
        # Each value is kept under the model and the batch's key (`Session.batch_key`), never its
        # name: a batch added again under its name is measured anew.
        self._bounds: tuple[Any, int, _Boundaries] | None = None  # (model, batch, its boundaries): the latest
        self._shown: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(batch, id): entry}
        self._grads: tuple[Any, int, tuple, _Gradients] | None = None  # (model, batch, scalar key, gradients)
        self._gshown: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(batch, key, id): grad}
        self._scalars: dict[tuple, Scalar] = {}
        self.active: Scalar | None = None  # the scalar a gradient colouring differentiates: the Values tab shows it

    def clear(self) -> None:
        """Let go of every value held."""
        self._bounds, self._shown = None, weakref.WeakKeyDictionary()
        self._grads, self._gshown = None, weakref.WeakKeyDictionary()

    def scalars(self) -> list[dict]:
        """The scalars the UI offers to differentiate, the default first."""
        kinds = ["loss", "logit", "sum"] if self._session._grad_of is not None else ["logit", "sum"]
        return [{"name": k, "label": SCALARS[k]} for k in kinds]

    def scalar(self, kind: Any, index: Any = None) -> Scalar:
        """The `Scalar` of ``kind`` and ``index``: one object each, so that each compiles once."""
        if kind not in SCALARS or (kind == "loss" and self._session._grad_of is None):
            offered = ", ".join(s["name"] for s in self.scalars())
            raise yax.YaxInputError(f"The gradient is taken of one of {offered}; not {str(kind)[:40]!r}"
                                    + (" (the explorer was opened without `grad_of`)" if kind == "loss" else "")
                                    + ".")
        if index is not None and (kind != "logit" or not isinstance(index, int) or isinstance(index, bool)
                                  or index < 0):
            raise yax.YaxInputError(f"A logit's index is a whole number from 0, not {str(index)[:40]!r}; "
                                    "only `logit` takes one.")
        key = (kind, index)
        found = self._scalars.get(key)
        if found is None:
            found = self._scalars[key] = Scalar(kind, index, self._session._grad_of)
        return found

    def values(self, target: Any) -> dict[str, ValueStats]:
        """Statistics of the outputs of ``target`` (a node of the current model,
        or an XPath selecting one) on the batch in use (`Explorer.values`)."""
        if isinstance(target, str):
            found = yax.query(target, self._session.mox)
            found = [n for n in found if isinstance(n, (yax.Mox, yax.Equation))] if isinstance(found, list) else []
            if len(found) != 1:
                raise yax.YaxInputError(f"`values` shows one node, but `{target}` selects {len(found)}. "
                                        "Make the query select exactly one call or equation.")
            target = found[0]
        return {e["name"]: value_stats(e) for e in self.row(target)["outputs"]}

    def boundaries(self) -> _Boundaries:
        s = self._session
        mox = s.mox
        if self._bounds is None or self._bounds[0] is not mox or self._bounds[1] != s.batch_key:
            self._bounds = None  # let go of the previous values before the device holds the new ones
            found = self._measured(mox)
            self._bounds = (mox, s.batch_key, found or _Boundaries.run(mox, *s.call_args()))
        return self._bounds[2]

    def _measured(self, mox: yax.Mox) -> _Boundaries | None:
        """``mox``'s rows read off the session's measurement of it on the batch in use (the
        original's, made on the worker when the explorer opened; the current model's, made
        by its comparison), or None where there is none or they cannot be."""
        s = self._session
        if s.abstract or not (s.args or s.kwargs):
            return None
        try:
            m = s.measured(mox)
        except Exception:  # measuring failed (the comparison says why): the colouring runs the model itself
            return None
        return None if m is None or m.taps is None or m.shaped else _Boundaries.measured(mox, m.taps)

    def gradients(self, scalar: Scalar) -> _Gradients:
        """The gradient of ``scalar`` at every call row of the current model on the batch in use."""
        s = self._session
        mox = s.mox
        g = self._grads
        if g is None or g[0] is not mox or g[1] != s.batch_key or g[2] != scalar.key:
            self._grads = None  # let go of the previous gradients first
            args, kwargs = s.call_args()
            self._grads = (mox, s.batch_key, scalar.key, _Gradients(mox, scalar, args, kwargs, s.batch))
        return self._grads[3]

    def row(self, node: Any) -> dict:
        """The values pane's state for ``node`` (cached per model, batch and node), with
        the gradient of the `active` scalar at its outputs when a gradient colouring is on."""
        s = self._session
        mox = s.mox
        args, kwargs = s.call_args()
        rid = node_ids(mox).get(id(node))
        if rid is None:
            raise yax.YaxInputError(f"{where(node).capitalize()} is not part of the current model. "
                                    "Query `explorer.mox` for it.")
        cache = self._shown.setdefault(mox, {})
        entry = cache.get((s.batch_key, rid))
        if entry is None:
            t = time.perf_counter()
            found = self.boundaries().entries(rid) if isinstance(node, yax.Mox) else None
            if found is None:  # an equation (or a call inside a loop or branch: refused, saying why)
                _, got = yax.capture(node, mox, *args, **kwargs)
                found = _entries(node, got[capture_keys(mox)[id(node)]])
            outputs, more = found
            cache[(s.batch_key, rid)] = entry = {
                "id": rid, "key": capture_keys(mox)[id(node)], "batch": s.batch, "outputs": outputs, "more": more,
                "seconds": round(time.perf_counter() - t, 3)}
        if self.active is None:
            return entry
        return {**entry, "grad": self.grad_row(node, rid, self.active)}

    def grad_row(self, node: Any, rid: int, scalar: Scalar) -> dict:
        """The gradient of ``scalar`` at ``node``'s outputs, summarised as its values are."""
        s = self._session
        mox = s.mox
        cache = self._gshown.setdefault(mox, {})
        hit = cache.get((s.batch_key, scalar.key, rid))
        if hit is not None:
            return hit
        t = time.perf_counter()
        grads = self.gradients(scalar)
        outputs = grads.entries(rid) if isinstance(node, yax.Mox) else None
        if outputs is None:  # an equation: its own capture with the gradient
            args, kwargs = s.call_args()
            _, got, gs = yax.capture(node, mox, *args, grad_of=scalar, **kwargs)
            k = capture_keys(mox)[id(node)]
            outputs = _grad_entries(node, got[k], gs[k])
        cache[(s.batch_key, scalar.key, rid)] = found = {
            "label": grads.label(), "what": grads.what(), "scalar": grads.value, "outputs": outputs,
            "seconds": round(time.perf_counter() - t, 3)}
        return found

    def show(self, node: Any) -> dict:
        """Show ``node``'s values in the pane."""
        entry = self.row(node)
        self._session.show(values=entry)
        return entry

    def paint(self, stat: str, scalar: Any = None, index: Any = None) -> None:
        """Paint every call row by ``stat`` ("off": nothing); a gradient statistic
        (`GRAD_STATS`) by the gradient of the scalar ``scalar`` (`Scalar`; its default:
        the loss when the explorer has `grad_of`, else the logit) with ``index``. The colouring,
        the scalar and the Values tab change together or not at all (`Session.all_or_nothing`)."""
        if stat not in ("off", *STATS):
            raise yax.YaxInputError(f"The tree is painted by one of off, {', '.join(STATS)}; not {str(stat)[:40]!r}.")
        with self._session.all_or_nothing():
            self._paint(stat, scalar, index)

    def _paint(self, stat: str, scalar: Any, index: Any) -> None:
        before = self.active
        if stat not in GRAD_STATS:
            self.active = None
            if stat == "off":
                self._session.show(overlay={})
            else:
                t = time.perf_counter()
                vals = {str(rid): _number(v) for rid, v in self.boundaries().stats(stat).items()}
                shown = [v for v in vals.values() if v is not None]
                self._session.show(overlay={
                    "stat": stat, "label": STATS[stat], "batch": self._session.batch, "values": vals,
                    "lo": min(shown) if shown else None, "hi": max(shown) if shown else None,
                    "rows": len(vals), "seconds": round(time.perf_counter() - t, 3)})
        else:
            t = time.perf_counter()
            sc = self.scalar(scalar or self.scalars()[0]["name"], index)
            grads = self.gradients(sc)
            norms, gxa, why = grads.rows()
            got = norms if stat == "grad" else gxa
            vals = {str(rid): v for rid, v in got.items()}
            shown = [v for v in vals.values() if v is not None]
            self.active = sc
            self._session.show(overlay={
                "stat": stat, "label": STATS[stat], "batch": self._session.batch, "values": vals,
                "why": {str(rid): w for rid, w in why.items()},
                "nonfinite": {str(rid): n for rid, n in grads.overlay["nonfinite"].items()},
                "scalar": {"name": sc.kind, "index": sc.index, "chosen": grads.index if grads.index >= 0 else None,
                           "label": grads.label(), "what": grads.what(), "value": grads.value},
                "lo": min(shown) if shown else None, "hi": max(shown) if shown else None,
                "rows": len(vals), "seconds": round(time.perf_counter() - t, 3)})
        if self.active is not before:  # the Values tab shows the gradient with the values, or no more
            rid = self._session.state["values"].get("id")
            if rid is not None:
                try:
                    self.show(self._session.node(rid))
                except yax.YaxError:
                    self._session.show(values={})

    def batch_changed(self) -> None:
        """The batch in use changed: paint and show the selected row's values on it."""
        s = self._session
        o = s.state["overlay"]
        if o.get("stat"):
            sc = o.get("scalar") or {}
            self.paint(o["stat"], sc.get("name"), sc.get("index"))
        rid = s.state["values"].get("id")
        if rid is not None:
            try:
                self.show(s.node(rid))
            except Exception:  # the row is another model's: the pane waits for a selection
                s.show(values={})

    def nonfinite(self, scalar: Scalar | None = None) -> dict:
        """Where the first NaN or Inf of the current model on the batch in use is (with
        ``scalar``: of the gradient of that scalar, with respect to the parameters):
        the reply the front-end selects a row by."""
        s = self._session
        args, kwargs = s.call_args()
        if scalar is None:
            found = yax.first_nonfinite(s.mox, *args, **kwargs)
        else:
            found = yax.first_nonfinite(s.mox, *args, grad_of=scalar, **kwargs)
        what = "" if scalar is None else f", gradient of {scalar.describe(self._leaf(scalar))}"
        if found is None:
            if scalar is None:
                return {"found": False, "message": f"No NaN or Inf: every value is finite on the batch `{s.batch}`."}
            return {"found": False, "message": f"No NaN or Inf in the gradient: every gradient of "
                                               f"{scalar.describe(self._leaf(scalar))} is finite on the batch "
                                               f"`{s.batch}`."}
        ids = node_ids(s.mox)
        # the first line (an equation's) or paragraph (an argument's: its layer and first reader). A
        # masked one says first that every gradient is finite; its row is where the non-finite cotangent came from
        head = str(found).split("\n")[0] if found.equation is not None else \
            " ".join(line.strip() for line in str(found).split("\n\n")[0].split("\n"))
        first = found.equation or found.reader
        return {"found": True, "id": ids.get(id(found.call)) if found.call is not None else None,
                "eq": ids.get(id(first)) if first is not None else None, "masked": found.masked,
                "step": list(found.step), "message": f"{head} (batch `{s.batch}`{what})", "detail": str(found.output)}

    def _leaf(self, scalar: Scalar) -> tuple[str, int] | None:
        """The logits' name and rank for ``scalar``'s description, read off the model's traced outputs."""
        if scalar.kind == "loss":
            return None
        mox = self._session.mox
        name, x = scalar.logits(mox.sig.results([jax.ShapeDtypeStruct(o.shape, o.dtype) for o in mox.outputs]))
        return name, len(x.shape)


def _grad_entries(node: Any, value: Any, grad: Any) -> list[dict]:
    """The gradient entries of an equation's captured ``value`` and its gradient ``grad``."""
    given = dict(jax.tree_util.tree_flatten_with_path(grad)[0])
    out = []
    for path, name, x, steps in _arrays(node, value)[:MAX_OUTPUTS]:
        g = given.get(path)
        why = _no_gradient(x, g)
        out.append({"name": name, "type": type_str(x), "shape": list(x.shape), "why": why} if why else
                   _entry(name, type_str(g), tuple(g.shape), steps, *jax.device_get(_summarize(g))))
    return out


# -- batches -------------------------------------------------------------------------------

def as_args(value: Any, n: int) -> tuple:
    """A batch given in `batches` as positional arguments: the value itself for
    a model of one input, a tuple of them for several."""
    return (value,) if n <= 1 or not isinstance(value, tuple) else value


def same_inputs(a: Any, b: Any) -> bool:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    return ta == tb and all(x is y for x, y in zip(la, lb))


def check_fits(name: str, example: tuple, new: tuple) -> None:
    """Refuse a batch whose structure, shapes or dtypes differ from the example's."""
    want, wt = jax.tree_util.tree_flatten_with_path(example)
    got, gt = jax.tree_util.tree_flatten_with_path(new)
    if wt != gt:
        raise yax.YaxInputError(
            f"The batch `{name}` is structured as `{gt}`, but the model was traced with `{wt}`. Give the same "
            "arguments as the example (after the parameters), with arrays of the same shapes."
        )
    for (path, w), (_, g) in zip(want, got):
        ws, gs = hasattr(w, "dtype") and hasattr(w, "shape"), hasattr(g, "dtype") and hasattr(g, "shape")
        if ws and gs and (tuple(w.shape) != tuple(g.shape) or np.dtype(w.dtype) != np.dtype(g.dtype)):
            raise yax.YaxInputError(
                f"The batch `{name}` gives {type_str(g)} for `{arg_name(path)}`, but the model was traced with "
                f"{type_str(w)}. Give arrays of the traced shapes and dtypes (cast with `.astype`), or open "
                "another explorer for other shapes."
            )
        if ws != gs or (not ws and w != g):
            raise yax.YaxInputError(
                f"The batch `{name}` gives `{g!r}` for `{arg_name(path)}`, but the model was traced with "
                f"`{w!r}`, which it treats as fixed. Give the same value, or open another explorer."
            )
