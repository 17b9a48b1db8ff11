"""Values reduced where the model runs: the programs that bring out every call row's
outputs on a batch, and the summary of one output the values pane shows.

A model measured by nothing is run by `yax.capture` in one jitted program per model
(`_Program`, compiled once), its outputs staying on the device; a model the session
measured (`compare`'s measurement) is read off that instead (`Boundaries.measured`).
Either way only what the colouring needs (each output's ``x · x``) crosses to the host
at once; a row's full summary (statistics, histogram, heatmap slice: `_reduced`, jitted
once per shape) crosses when the row is selected. The entries built from those summaries
are `_payloads.value_entry`'s.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import yax
from yax.internal import (
    capturable_calls,
    capture_keys,
    memo,
    model_jit,
    node_ids,
    reduced_stats,
    results_of,
    to_host,
    type_str,
)

from ._payloads import HIST_BINS, heat_slice, value_entry

MAX_OUTPUTS = 8  # outputs of one row shown (a call returning a long tuple shows its first ones)


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


def squared_norms(outs: list[Any]) -> Any:
    """``x · x`` of each array of ``outs`` (float32), in the program that made them: one
    matrix product each, which XLA compiles as fast as nothing and runs at the speed of
    reading the array (the zeros and NaN counts of a 1B Llama's 310 outputs, reduced in
    the same program, ran 0.7 s longer than the model). The colouring needs nothing
    else: `Light` makes the rest from it, counting only where it must."""
    if not outs:
        return jnp.zeros((0,), jnp.float32)
    return jnp.stack([jnp.vdot(f, f) for f in (_floats(x).ravel() for x in outs)])


@jax.jit
def _zeros(x: Any) -> Any:
    """How many values of ``x`` are zero (int32; compiled once per shape and dtype)."""
    return (x == 0).sum(dtype=jnp.int32)


class Light:
    """What the colouring needs of each of ``arrays`` (kept on the device) from their
    ``squares`` (`squared_norms`, on the host): the norm of the finite values and how many
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
            counts, stats = to_host(_summarize(x))[:2]
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


_summarize = jax.jit(_reduced)  # one output summarised on the device: compiled once per shape and dtype


def entry_of(name: str, type_: str, shape: tuple, steps: tuple, x: Any) -> dict:
    """The values pane's entry for the output ``x``: summarised on the device (`_reduced`),
    only the summary crossing to the host (`_payloads.value_entry`)."""
    return value_entry(name, type_, shape, steps, *to_host(_summarize(x)))


def rebuilt(mox: yax.Mox, dyn: list, template: tuple) -> tuple[tuple, dict]:
    """The arguments of a program jitted with a `Static` ``template``: its static
    leaves, with the dynamic ones (``dyn``, at ``mox.dyn_in``) put back."""
    leaves, tree = template
    leaves = list(leaves)
    for i, x in zip(mox.dyn_in, dyn):
        leaves[i] = x
    args, kwargs = jax.tree_util.tree_unflatten(tree, leaves)
    return args, kwargs


def output_arrays(node: Any, value: Any) -> list[tuple[Any, str, Any, tuple]]:
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


#: the dtypes whose values float32 holds exactly: `compare` measures every boundary as float32
_EXACT = frozenset(np.dtype(t) for t in (jnp.float32, jnp.bfloat16, jnp.float16))


class _Program:
    """One jitted program per model, so the values stay on the device: it brings out
    every capturable call's outputs and what the colouring needs of each (`squared_norms`).
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
        self.traces = 0  # how many times `program` was traced (each trace is one compile)

        def program(dyn: list, template: tuple) -> tuple[list, list]:
            self.traces += 1
            m = ref()
            args, kwargs = rebuilt(m, dyn, template)
            _, got = yax.capture(calls, m, *args, **kwargs) if calls else (None, {})
            outs: list[Any] = []
            for rid, c in zip(self.rows, calls):
                found = output_arrays(c, got[keys[id(c)]])
                self.more[rid] = max(0, len(found) - MAX_OUTPUTS)
                entries = []
                for _, name, x, steps in found[:MAX_OUTPUTS]:
                    entries.append((name, len(outs), type_str(x), tuple(x.shape), steps))
                    outs.append(x)
                self.where[rid] = entries
            return outs, squared_norms(outs)

        self.capture = model_jit(program, static_argnums=1)


class Static:
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
        return isinstance(other, Static) and self.key == other.key




class Boundaries:
    """Every capturable call's outputs, of one model on one batch, and what the colouring
    needs of each: run by the model's `_Program` (kept on the device; only that crosses to
    the host), or read off the session's measurement of the model (`measured`). ``where``
    and ``more`` as `_Program` has them."""

    def __init__(self, where: dict[int, list[tuple]], more: dict[int, int], outs: list[Any], squares: Any):
        self.where, self.more, self.outs = where, more, outs
        self.light = Light(outs, squares)
        self.overlay: dict[str, dict[int, float]] = {}  # per statistic: per row

    @classmethod
    def run(cls, mox: yax.Mox, args: tuple, kwargs: dict) -> Boundaries:
        prog = memo(mox, "widget.reduce", lambda: _Program(mox))
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        outs, squares = prog.capture([leaves[i] for i in mox.dyn_in], Static(leaves, tree, mox))
        return cls(prog.where, prog.more, outs, to_host(squares))

    @classmethod
    def measured(cls, mox: yax.Mox, taps: dict[str, np.ndarray]) -> Boundaries | None:
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
            found = output_arrays(c, results_of(c, flat))  # as `_Program` finds them in what `capture` gives
            more[ids[id(c)]] = max(0, len(found) - MAX_OUTPUTS)
            entries = []
            for _, name, x, steps in found[:MAX_OUTPUTS]:
                shown = jax.ShapeDtypeStruct(x.shape, dtypes.get(id(x), x.dtype))
                entries.append((name, len(outs), type_str(shown), tuple(x.shape), steps))
                outs.append(x)
            where[ids[id(c)]] = entries
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is an Inf, which `Light` handles
            squares = [np.dot(np.ravel(x), np.ravel(x)) for x in outs]  # float32, as in `squared_norms`
        return cls(where, more, outs, np.asarray(squares, np.float32))

    def entries(self, rid: int) -> tuple[list[dict], int] | None:
        """The values pane's entries of call row ``rid`` (only its summary crosses to the host)."""
        at = self.where.get(rid)
        if at is None:
            return None
        out = []
        for name, i, type_, shape, steps in at:
            # one at a time: XLA's CPU client deadlocks with dozens of sharded programs in flight
            out.append(entry_of(name, type_, shape, steps, self.outs[i]))
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


def equation_entries(node: Any, value: Any) -> tuple[list[dict], int]:
    """The entries of an equation's captured ``value``, reduced on the device, at
    most `MAX_OUTPUTS`, and how many outputs were left out."""
    found = output_arrays(node, value)
    out = [entry_of(name, type_str(x), tuple(x.shape), steps, x) for _, name, x, steps in found[:MAX_OUTPUTS]]
    return out, len(found) - len(out)
