"""`compare`: run two MoX on the same inputs and measure how outputs differ,
at the outputs and at every module boundary the two share."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import math
import os
import threading
import weakref
from collections.abc import Mapping
from typing import Any, cast

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from . import _calls, _capture, _reference, frontends
from ._eval import eval_mox, flatten_inputs, run
from ._ir import FN_KINDS, Equation, Kind, Mox
from ._jit import model_jit
from ._reference import Reference
from ._sharding import any_spread, subnormal, to_host
from ._vocab import type_str
from ._weights import key_of
from .errors import CannotCompare, LossNotScalar, NotARootMox, WrongType, YaxInputError


@dataclasses.dataclass(frozen=True)
class Stats:
    """How one value of the modified model differs from the original's.

    The statistics are computed over the entries finite in both models;
    ``nonfinite`` counts the others (NaN or ±Inf in either) and ``changed``
    those of them that differ (a NaN or an Inf that appears, disappears or
    changes sign). A statistic that cannot be computed is NaN, and
    ``undefined`` says why (``{"rel": "the original is 0 everywhere"}``):
    never a 0 or a 1 standing for what was not computed. They are float64
    NumPy's on the two models' values as the models computed them (float64
    values, x64 on, never narrowed to float32), from the smallest subnormal
    to the largest float64; a difference beyond float64's range is +Inf in
    ``max_abs`` only. A model laid out over several devices: sums of values
    scaled by their largest, in float32 to about 1e-6 (float64 values: in
    float64)."""

    max_abs: float
    mean_abs: float
    rel: float        #: ||modified - original|| / ||original|| over the finite entries
    cosine: float     #: cosine similarity of the finite entries
    allclose: bool    #: ``|m - o| <= atol + rtol * |o|`` at every finite entry, and the non-finite ones equal
    nonfinite: int = 0    #: entries left out: NaN or ±Inf in either model
    changed: int = 0      #: of those, entries where the two models differ
    undefined: tuple[tuple[str, str], ...] = ()  #: ``(statistic, why)`` for each one that is NaN

    def why(self, name: str) -> str | None:
        """Why statistic ``name`` could not be computed, or ``None``."""
        return dict(self.undefined).get(name)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["undefined"] = dict(self.undefined)
        return d

    def cell(self, name: str, fmt: str) -> str:
        """The statistic as printed: ``undefined`` where it could not be computed."""
        return "undefined" if self.why(name) else format(getattr(self, name), fmt)


@dataclasses.dataclass(frozen=True)
class Matching:
    """How a model's calls were matched with the modules of a `Reference` (`Comparison.matching`).

    Attributes:
      source: what the reference recorded (``torch GPT2LMHeadModel``).
      calls: model call key -> reference module name, for every pair compared (a call inside
        a scan: the names of its steps' modules, in step order).
      only_model: the model's numeric calls with no module of the reference.
      only_reference: the reference's modules with no call of the model.
      layouts: call key or parameter path -> how the reference's values are laid out
        against the model's, where they differ by a known permutation (``NCHW ↔ NHWC``):
        they were compared transposed, and this says so.
      weights: model parameter path -> reference weight name, for every pair compared.
      only_model_weights / only_reference_weights: the parameters either side has alone.
      atol_scaled: the comparison's ``atol`` is relative to the largest absolute value of each reference array
        (`port_tolerances`' default); ``False`` when you passed ``atol``, an absolute one.
    """

    source: str
    calls: dict[str, str | tuple[str, ...]]
    only_model: tuple[str, ...]
    only_reference: tuple[str, ...]
    layouts: dict[str, str] = dataclasses.field(default_factory=dict)
    weights: dict[str, str] = dataclasses.field(default_factory=dict)
    only_model_weights: tuple[str, ...] = ()
    only_reference_weights: tuple[str, ...] = ()
    atol_scaled: bool = True

    def __repr__(self) -> str:
        return (f"Matching({self.source}: {len(self.calls)} calls matched, {len(self.only_model)} only in the "
                f"model, {len(self.only_reference)} only in the reference; {len(self.weights)} weights matched)")


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The result of `compare`: per output, and per call boundary (in the
    order the original evaluates them) of the calls both models share,
    including those inside ``scan`` bodies (compared at every step).

    Attributes:
      outputs: output name -> `Stats`.
      boundaries: call key (as `yax.capture` names it) -> `Stats` over all its values
        (every step of a call inside a scan).
      steps: for calls inside scans, key -> `Stats` of each step (outermost scan
        first, steps flattened in row-major order; ``stacks[key]`` gives the lengths).
      first_divergence / first_divergence_step: the first boundary, and the scan step,
        in evaluation order, whose values are not allclose (where the outputs start to differ).
      labels: key -> how to name the call in the modified model (``Seq/relu (now gelu)``).
      unavailable: key -> why a call of the original was not compared (inside a ``while``
        loop, a ``cond`` branch or a custom derivative rule; output types changed).
      gradients: with ``grad_of``: parameter path -> `Stats` of the gradients.
      matching: against a `Reference`: which of the model's calls and parameters were
        matched with which of the reference's modules and weights (`Matching`).
      weights: against a `Reference` that holds weights: parameter path -> `Stats` of the
        model's parameter against the reference's weight.
    """

    outputs: dict[str, Stats]
    boundaries: dict[str, Stats]
    rtol: float
    atol: float
    #: output name -> (original, modified) values as float32 NumPy arrays (float64 for 64-bit values,
    #: `_measured`), for plots (a sharded model's: device arrays, left on the devices that hold them)
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=dict, repr=False,
                                                                         compare=False)
    steps: dict[str, list[Stats]] = dataclasses.field(default_factory=dict, repr=False)
    stacks: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict, repr=False)
    first_divergence: str | None = None
    first_divergence_step: tuple[int, ...] = ()
    labels: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)
    unavailable: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)
    gradients: dict[str, Stats] | None = dataclasses.field(default=None, repr=False)
    matching: Matching | None = dataclasses.field(default=None, repr=False)
    weights: dict[str, Stats] | None = dataclasses.field(default=None, repr=False)

    @property
    def allclose(self) -> bool:
        return all(s.allclose for s in self.outputs.values()) and all(
            s.allclose for s in (self.gradients or {}).values()) and all(
            s.allclose for s in (self.weights or {}).values())

    def label(self, key: str) -> str:
        """``key`` named as the modified model names it, with the step when it is the first divergence."""
        return self.labels.get(key, key)

    @property
    def verdict(self) -> str:
        """One sentence: whether the outputs are allclose, and where they start to differ."""
        if self.first_divergence is None:
            return "The outputs are allclose." if self.allclose else (
                "The outputs differ, but every call boundary both models share is allclose.")
        at = f" at scan step {', '.join(map(str, self.first_divergence_step))}" if self.first_divergence_step else ""
        return f"The outputs {'are allclose' if self.allclose else 'differ'}; the first divergence is " \
               f"`{self.label(self.first_divergence)}`{at}."

    def to_dict(self) -> dict[str, Any]:
        return {
            "rtol": self.rtol,
            "atol": self.atol,
            "allclose": self.allclose,
            "first_divergence": self.first_divergence,
            "first_divergence_step": list(self.first_divergence_step),
            "outputs": {k: s.to_dict() for k, s in self.outputs.items()},
            "boundaries": {k: s.to_dict() for k, s in self.boundaries.items()},
            "steps": {k: [s.to_dict() for s in v] for k, v in self.steps.items()},
            "labels": dict(self.labels),
            "unavailable": dict(self.unavailable),
            "gradients": None if self.gradients is None else {k: s.to_dict() for k, s in self.gradients.items()},
            "weights": None if self.weights is None else {k: s.to_dict() for k, s in self.weights.items()},
            "matching": None if self.matching is None else dataclasses.asdict(self.matching),
        }

    def __repr__(self) -> str:
        rows = {"outputs": self.outputs, "boundaries": self.boundaries, **(
            {"gradients": self.gradients} if self.gradients is not None else {}), **(
            {"weights": self.weights} if self.weights is not None else {})}
        names = {k: self.label(k) + (f" ×{_times(self.stacks[k])}" if k in self.stacks else "")
                 for part in rows.values() for k in part}
        width = max([len(v) for v in names.values()] + [8])
        head = f"{'':{width}}  {'max|Δ|':>10} {'mean|Δ|':>10} {'rel':>10} {'cos':>9}  close"
        at = f", step={self.first_divergence_step}" if self.first_divergence_step else ""
        lines = [f"Comparison(allclose={self.allclose}, first_divergence={self.first_divergence!r}{at})", head]
        notes = []
        for title, part in rows.items():
            lines.append(f"-- {title}")
            for k, s in part.items():
                lines.append(f"{names[k]:{width}}  {s.cell('max_abs', '10.3g')} {s.cell('mean_abs', '10.3g')} "
                             f"{s.cell('rel', '10.3g'):>10} {s.cell('cosine', '9.5f'):>9}  "
                             f"{'yes' if s.allclose else 'NO'}"
                             + (f"  ({s.nonfinite} non-finite left out, {s.changed} of them changed)"
                                if s.nonfinite else ""))
                notes += [f"{names[k]}: {stat} undefined: {why}" for stat, why in s.undefined]
        if self.unavailable:
            notes += [f"{self.label(k)}: not compared: {why}" for k, why in self.unavailable.items()]
        if self.matching is not None:
            m = self.matching
            notes += [f"{k}: {why}" for k, why in m.layouts.items()]
            notes.append(f"matched with {m.source}: {len(m.calls)} calls ({len(m.only_model)} only in the model, "
                         f"{len(m.only_reference)} only in the reference), {len(m.weights)} weights")
            notes += [f"only in the reference: {', '.join(m.only_reference)}"] if m.only_reference else []
        return "\n".join(lines + (["-- notes", *notes] if notes else []))


def _times(stack: tuple[int, ...]) -> str:
    return "×".join(map(str, stack))


def call_keys(mox: Mox) -> dict[str, Mox]:
    """key -> call node, for every call (inside scan and ``jit``/``remat`` bodies too), in the
    order they finish: the boundaries `compare` measures, named as `yax.capture` names them."""
    return _calls.calls(mox)


# Values per chunk of `_stats`: three float64 chunks stay in the L2 cache, and a dot product of this
# length is below the 10,000 at which OpenBLAS splits one over threads (on a busy machine that costs
# more than it saves, and `compare` runs its boundaries on every core already: `_on_cores`).
_CHUNK = 8192


def _stats(x: np.ndarray, y: np.ndarray, rtol: float, atol: float) -> Stats:
    """Statistics of two flat float32 host arrays, in NumPy after the models ran. Reducing
    hundreds of boundaries inside the models' jitted programs multiplied XLA's compile time by
    ten; NumPy compiles nothing.

    Every sum is a float64 sum of float64 products, so the statistics are float64 NumPy's on
    the same values, whatever their size: a product of two float32 is exact in float64, and no
    square of a float32 under- or overflows there (the largest is 1.2e77, the smallest nonzero
    2e-90). In float32 the squares of values near 1e-30 underflowed to 0 (rel 0, no cosine)
    and those near 1e30 overflowed, and BLAS's float32 sums of a million values were off by
    1e-5. The values are converted a chunk at a time (`_CHUNK`), which costs no more than the
    float32 dot products did: the chunks stay in cache. A chunk whose sum of |Δ| is not finite
    holds a NaN or an Inf (finite float32 differences cannot overflow float64): its entries
    finite in both are kept and the others counted. Values of any other type (float64, x64
    on; a float32 output against a float64 one) are measured by `_stats_wide`."""
    if x.dtype != np.float32 or y.dtype != np.float32:
        return _stats_wide(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol, atol)
    n = x.size
    size = min(n, _CHUNK)
    bx, by, bd = np.empty(size), np.empty(size), np.empty(size)
    kept = nonfinite = changed = far = 0
    max_abs = sum_abs = sx = sy = sd = dot = 0.0
    for i in range(0, n, _CHUNK):
        xc, yc = x[i:i + _CHUNK], y[i:i + _CHUNK]
        k = xc.size
        a, b, d = bx[:k], by[:k], bd[:k]
        np.copyto(a, xc)
        np.copyto(b, yc)
        with np.errstate(invalid="ignore"):  # Inf - Inf
            np.subtract(b, a, out=d)
        np.abs(d, out=d)
        total = float(d.sum())
        if not math.isfinite(total):  # a NaN or an Inf in either model: left out and counted
            fin = np.isfinite(xc) & np.isfinite(yc)
            bad_x, bad_y = xc[~fin], yc[~fin]
            same = (bad_x == bad_y) | (np.isnan(bad_x) & np.isnan(bad_y))
            nonfinite += bad_x.size
            changed += int(same.size - np.count_nonzero(same))
            k = k - bad_x.size
            a, b, d = bx[:k], by[:k], bd[:k]
            np.copyto(a, xc[fin])
            np.copyto(b, yc[fin])
            np.subtract(b, a, out=d)
            np.abs(d, out=d)
            total = float(d.sum())
        if not k:
            continue
        kept += k
        top = float(d.max())
        max_abs = max(max_abs, top)
        sum_abs += total
        sx += float(np.dot(a, a))
        sy += float(np.dot(b, b))
        sd += float(np.dot(d, d))
        dot += float(np.dot(a, b))
        # every |Δ| within atol is within the tolerance: the test per entry only where one is not
        if not (top <= atol and rtol >= 0):
            far += int(k - np.count_nonzero(d <= atol + rtol * np.abs(a)))
    if not kept:
        return _finish(0, nonfinite, changed, 0, np.nan, np.nan, 0.0, 0.0, 0.0, 0.0)
    return _finish(kept, nonfinite, changed, far, max_abs, sum_abs, math.sqrt(sx), math.sqrt(sy), math.sqrt(sd), dot)


#: An exponent below every float64's (the smallest subnormal is 2**-1074): a sum of nothing yet.
_NO_EXPONENT = -1100


def _exponent(top: float) -> int:
    """The power of two above ``top`` (``top < 2**e``), for the largest |value| of a chunk."""
    return math.frexp(top)[1] if top > 0 else _NO_EXPONENT


def _stats_wide(x: np.ndarray, y: np.ndarray, rtol: float, atol: float) -> Stats:
    """`_stats` of two flat float64 arrays (a float64 model's values, x64 on), in float64.

    A product of two float64 is not exact in float64, and squares over- and underflow it
    (1e300**2 is inf, 1e-300**2 is 0): each sum of squares and the dot product are taken of
    values scaled by a power of two (exactly) so that the largest |value| of x, of y and of
    |Δ| is below 1, as LAPACK's ``dnrm2`` keeps its scale, and a sum is scaled down when a
    later chunk holds a larger value. ``_finish`` multiplies the scales back. A difference
    beyond float64's range (1.5e308 - -1.5e308) is float64's +Inf in ``max_abs``, as NumPy's;
    its chunk is summed halved (``b/2 - a/2``, exact for normal values) and its test against
    the tolerances is taken halved. Differences of float64 values round (once each, as
    NumPy's do), so the statistics are float64 NumPy's to the rounding of its sums."""
    n = x.size
    kept = nonfinite = changed = far = 0
    max_abs = sum_abs = sx = sy = sd = dot = 0.0
    ex = ey = ed = _NO_EXPONENT  # the units of the sums: 2**ex (x), 2**ey (y), 2**ed (|Δ|)
    for i in range(0, n, _CHUNK):
        a, b = x[i:i + _CHUNK], y[i:i + _CHUNK]
        fin = np.isfinite(a) & np.isfinite(b)
        if not fin.all():  # a NaN or an Inf in either model: left out and counted
            bad_a, bad_b = a[~fin], b[~fin]
            same = (bad_a == bad_b) | (np.isnan(bad_a) & np.isnan(bad_b))
            nonfinite += bad_a.size
            changed += int(same.size - np.count_nonzero(same))
            a, b = a[fin], b[fin]
        if not a.size:
            continue
        kept += a.size
        with np.errstate(over="ignore"):  # a difference beyond float64's range: +Inf, as NumPy's
            d = np.abs(b - a)
        top = float(d.max())
        max_abs = max(max_abs, top)
        half = not math.isfinite(top)
        h = np.abs(b * 0.5 - a * 0.5) if half else d  # |Δ| = h * 2**half
        if not (top <= atol and rtol >= 0):
            with np.errstate(over="ignore"):
                ok = d <= atol + rtol * np.abs(a)
                if half:
                    big = ~np.isfinite(d)
                    ok[big] = h[big] <= atol * 0.5 + rtol * 0.5 * np.abs(a[big])
            far += int(ok.size - np.count_nonzero(ok))
        e_x, e_y = _exponent(max(float(a.max()), -float(a.min()))), _exponent(max(float(b.max()), -float(b.min())))
        e_d = _exponent(float(h.max())) + half
        if e_x > ex:
            sx, dot, ex = math.ldexp(sx, 2 * (ex - e_x)), math.ldexp(dot, ex - e_x), e_x
        if e_y > ey:
            sy, dot, ey = math.ldexp(sy, 2 * (ey - e_y)), math.ldexp(dot, ey - e_y), e_y
        if e_d > ed:
            sd, sum_abs, ed = math.ldexp(sd, 2 * (ed - e_d)), math.ldexp(sum_abs, ed - e_d), e_d
        xs, ys, ds = np.ldexp(a, -ex), np.ldexp(b, -ey), np.ldexp(h, half - ed)
        sx += float(np.dot(xs, xs))
        sy += float(np.dot(ys, ys))
        sd += float(np.dot(ds, ds))
        dot += float(np.dot(xs, ys))
        sum_abs += float(ds.sum())
    if not kept:
        return _finish(0, nonfinite, changed, 0, np.nan, np.nan, 0.0, 0.0, 0.0, 0.0)
    return _finish(kept, nonfinite, changed, far, max_abs, sum_abs, math.sqrt(sx), math.sqrt(sy), math.sqrt(sd), dot,
                   ex, ey, ed)


def _ldexp(v: float, e: int) -> float:
    """``v * 2**e``, +Inf where it is beyond float64's range (``math.ldexp`` raises there)."""
    try:
        return math.ldexp(v, e)
    except OverflowError:
        return math.copysign(math.inf, v)


def _finish(n: int, nonfinite: int, changed: int, far: int, max_abs: float, sum_abs: float, nx: float, ny: float,
            nd: float, dot: float, ex: int = 0, ey: int = 0, ed: int = 0) -> Stats:
    """The `Stats` of ``n`` entries finite in both models from their sums: ``far`` entries
    not within the tolerances, the largest and summed ``|Δ|``, the norms of the original,
    the modified and the difference, and the dot product of the two. ``sum_abs`` and ``nd``
    are in units of ``2**ed``, ``nx`` of ``2**ex``, ``ny`` of ``2**ey`` and ``dot`` of
    ``2**(ex + ey)``: float64 values' sums are kept scaled, which no square over- or
    underflows (`_stats_wide`); the ratios are taken before the scales are put back."""
    undefined: list[tuple[str, str]] = []
    if not n:
        why = (f"no entry is finite in both models ({nonfinite} non-finite)" if nonfinite else "the value is empty")
        undefined = [(k, why) for k in ("max_abs", "mean_abs", "rel", "cosine")]
        return Stats(np.nan, np.nan, np.nan, np.nan, changed == 0, nonfinite, changed, tuple(undefined))
    if nx > 0:
        rel = nd / nx if ed == ex else _ldexp(nd / nx, ed - ex)
    elif nd == 0:
        rel = 0.0  # both 0 everywhere: no difference at all
    else:
        rel = np.nan
        undefined.append(("rel", "the original is 0 at every finite entry, so no relative error exists"))
    if nx > 0 and ny > 0:
        # within [-1, 1] (Cauchy-Schwarz): rounding of the sums could put it an ulp outside
        cosine = min(1.0, max(-1.0, dot / (nx * ny)))
    else:
        cosine = np.nan
        zero = "both are" if nx == ny == 0 else ("the original is" if nx == 0 else "the modified is")
        undefined.append(("cosine", f"{zero} 0 at every finite entry, so no angle exists"))
    return Stats(
        max_abs=max_abs,
        mean_abs=sum_abs / n if not ed else _ldexp(sum_abs / n, ed),
        rel=rel,
        cosine=cosine,
        allclose=far == 0 and changed == 0,
        nonfinite=nonfinite,
        changed=changed,
        undefined=tuple(undefined),
    )


# -- statistics of sharded values, reduced where they are --------------------------------------

def _row_sums(xs: list[jax.Array], ys: list[jax.Array], lead: int, tol: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per row (each step of the ``lead`` scan axes; one row outside scans), the sums
    `_finish` needs of the values ``xs`` and ``ys`` (float32, or float64 where one is: a
    float64 model's, x64 on; paired in order, as laid out): ``[finite, non-finite, changed,
    far, inexact]`` (int32) and ``[max |Δ|, Σ|Δ|/sΔ, sΔ, sx, sy, Σ(x/sx)², Σ(y/sy)², Σ(Δ/sΔ)²,
    Σ(x/sx)(y/sy)]`` (in the values' type). Each of x, y and
    Δ has its own scale, its largest |value|, so that no sum or square under- or overflows
    and none is lost beside the others' (a modified model 1e-30 times the original had all
    its squares flushed to 0 under a shared scale); the host multiplies the scales back in
    float64. ``inexact`` counts the entries the devices cannot measure in the values' type: a
    subnormal x or y, which XLA flushes to 0 in arithmetic (tested on its bits), a
    difference beyond the type's range (3e38 - -3e38 in float32), or one flushed to 0 though
    x and y differ. A pair with any is measured on the host instead (`_spread_stats`).
    ``tol`` is ``[rtol, atol]``."""
    rows = xs[0].shape[:lead]
    ft = jnp.result_type(*xs, *ys)
    tol = tol.astype(ft)

    def each(f: Any, vals: Any, dtype: Any = ft) -> list[jax.Array]:
        """``f`` of each value reduced over its axes after the scan axes: one array of ``rows`` each."""
        return [f(v, axis=tuple(range(lead, v.ndim))).astype(dtype) for v in vals]

    def total(vals: Any, dtype: Any = ft) -> jax.Array:
        return sum(each(jnp.sum, vals, dtype), jnp.zeros(rows, dtype))

    def widest(vals: Any, start: float) -> jax.Array:
        out = jnp.full(rows, start, ft)
        for v in vals:
            out = jnp.maximum(out, jnp.max(v, axis=tuple(range(lead, v.ndim)), initial=start))
        return out

    # XLA divides by a scale as it multiplies by its reciprocal, which it flushes to 0 once
    # subnormal: a scale above 2**(maxexp - 2) (9e37 in float32) made every scaled value 0 (x
    # and y "both 0", no cosine). Scales stop at 2**(maxexp - 8); the values scaled stay
    # below 2**8, whose squares sum without overflow.
    cap = float(2.0 ** (np.finfo(np.dtype(ft)).maxexp - 8))

    def scale_of(vals: Any) -> jax.Array:
        top = widest([jnp.abs(v) for v in vals], 0.0)
        return jnp.where(jnp.isfinite(top) & (top > 0), jnp.minimum(top, cap), 1.0)

    def scaled(vals: Any, scale: jax.Array) -> list[jax.Array]:
        return [v / scale.reshape(*rows, *([1] * (v.ndim - lead))) for v in vals]

    fin = [jnp.isfinite(x) & jnp.isfinite(y) for x, y in zip(xs, ys)]
    xf = [jnp.where(f, x, 0.0) for f, x in zip(fin, xs)]
    yf = [jnp.where(f, y, 0.0) for f, y in zip(fin, ys)]
    d = [jnp.abs(b - a) for a, b in zip(xf, yf)]
    inexact = [subnormal(x) | subnormal(y) | (f & ~jnp.isfinite(e)) | ((e == 0) & (a != b))
               for x, y, f, e, a, b in zip(xs, ys, fin, d, xf, yf)]
    d = [jnp.where(jnp.isfinite(e), e, 0.0) for e in d]
    same = [(x == y) | (jnp.isnan(x) & jnp.isnan(y)) for x, y in zip(xs, ys)]
    far = [f & ~(e <= tol[1] + tol[0] * jnp.abs(a)) for f, e, a in zip(fin, d, xf)]
    ints = jnp.stack([total(fin, jnp.int32), total([~f for f in fin], jnp.int32),
                      total([~f & ~s for f, s in zip(fin, same)], jnp.int32), total(far, jnp.int32),
                      total(inexact, jnp.int32)], axis=-1)
    cx, cy, cd = scale_of(xf), scale_of(yf), scale_of(d)
    sx, sy, sd = scaled(xf, cx), scaled(yf, cy), scaled(d, cd)
    floats = jnp.stack([widest(d, -jnp.inf), total(sd), cd, cx, cy, total([a * a for a in sx]),
                        total([b * b for b in sy]), total([e * e for e in sd]),
                        total([a * b for a, b in zip(sx, sy)])], axis=-1)
    return ints.reshape(-1, 5), floats.reshape(-1, 9)


_row_sums_jit = jax.jit(_row_sums, static_argnums=2)  # compiled once per shapes and shardings of a pair


def _spread_stats(pairs: list[tuple[list[Any], list[Any]]], leads: tuple[int, ...], rtol: float,
                  atol: float) -> list[tuple[Stats, list[Stats]]]:
    """For each pair of values laid out over several devices: its `Stats` over all of it and per
    row (per scan step, row-major, with ``leads[i]`` scan axes), reduced on their devices
    (`_row_sums`: fourteen numbers per row cross to the host). Each pair's reduction compiles once
    per shapes and shardings (a model's boundaries share a few: one program reducing every
    boundary at once compiled 2.5 times slower, sharing nothing), and each is waited for before
    the next is dispatched: XLA's CPU client deadlocks in a collective's rendezvous with some 40
    multi-device programs in flight (8 host devices, jax 0.9 and 0.10), as hundreds of
    boundaries dispatched at once would be. A pair holding values the devices cannot measure
    (`_row_sums`' ``inexact``: subnormals, differences beyond the values' range) is brought
    to the host and measured there in float64 (`_stats`)."""
    tol = np.array([rtol, atol])  # in the values' type on the devices (float32: as jnp.float32 rounds them)
    out = []
    for (xs, ys), lead in zip(pairs, leads):
        ints, floats = to_host(_row_sums_jit(xs, ys, lead, tol))
        if ints[:, 4].any():
            out.append(_on_host(xs, ys, lead, rtol, atol))
        else:
            out.append(_from_rows(ints.astype(np.int64), floats.astype(np.float64)))
    return out


def _on_host(xs: list[Any], ys: list[Any], lead: int, rtol: float, atol: float) -> tuple[Stats, list[Stats]]:
    """`_spread_stats` of one pair, on the host: each value gathered and flattened per row."""
    n = math.prod(xs[0].shape[:lead])
    x, y = (np.concatenate([np.asarray(v).reshape(n, -1) for v in vs], axis=1) for vs in (xs, ys))
    return _stats(x.ravel(), y.ravel(), rtol, atol), [_stats(x[r], y[r], rtol, atol) for r in range(n)]


def _from_rows(ints: np.ndarray, floats: np.ndarray) -> tuple[Stats, list[Stats]]:
    """The `Stats` over all rows and of each row, from `_row_sums` (the scales multiplied back,
    and the rows combined, in float64). Each scale is split into a mantissa, multiplied in,
    and a power of two, which `_finish` puts back after taking the ratios: a float64 model's
    norms (1e300 times the square root of a count) may lie beyond float64's range."""
    top = floats[:, 0]
    (md, ed), (mx, ex), (my, ey) = (np.frexp(floats[:, k]) for k in (2, 3, 4))
    sum_abs = md * floats[:, 1]
    nx, ny, nd = mx * np.sqrt(floats[:, 5]), my * np.sqrt(floats[:, 6]), md * np.sqrt(floats[:, 7])
    dot = mx * my * floats[:, 8]

    def one(i: Any, top_: float, sum_: float, nx_: float, ny_: float, nd_: float, dot_: float,
            e: tuple[int, int, int]) -> Stats:
        n, nonfinite, changed, far = (int(v) for v in i[:4])
        return _finish(n, nonfinite, changed, far, top_ if n else np.nan, sum_ if n else np.nan, nx_, ny_, nd_, dot_,
                       *e)

    rows = [one(ints[r], float(top[r]), float(sum_abs[r]), float(nx[r]), float(ny[r]), float(nd[r]), float(dot[r]),
                (int(ex[r]), int(ey[r]), int(ed[r]))) for r in range(len(ints))]

    def unit(e: np.ndarray, v: np.ndarray) -> int:
        """The largest power of two of the rows where ``v`` is not 0: the whole's unit (the others' shift
        down, never up, so nothing overflows)."""
        return int(e[v != 0].max()) if (v != 0).any() else 0

    ux, uy, ud = unit(ex, nx), unit(ey, ny), unit(ed, nd)
    whole = one(ints.sum(axis=0), float(top.max()), float(np.ldexp(sum_abs, ed - ud).sum()),
                float(np.sqrt((np.ldexp(nx, ex - ux) ** 2).sum())), float(np.sqrt((np.ldexp(ny, ey - uy) ** 2).sum())),
                float(np.sqrt((np.ldexp(nd, ed - ud) ** 2).sum())), float(np.ldexp(dot, ex + ey - ux - uy).sum()),
                (ux, uy, ud))
    return whole, rows


def _numeric(vals: Any) -> bool:
    return bool(vals) and all(jnp.issubdtype(v.dtype, jnp.number) or v.dtype == jnp.bool_ for v in vals)


#: The types float32 would narrow (x64 on): `compare` measures them in float64. float32 holds
#: float16 and bfloat16 values exactly, and integers up to 2**24.
_WIDE = frozenset(np.dtype(t) for t in ("float64", "int64", "uint64", "complex128"))


def _measured(v: Any) -> Any:
    """``v`` as `compare` measures it: float64 for a 64-bit value (`_WIDE`), else float32
    (a float32 value as it is)."""
    dt = np.dtype(np.float64) if np.dtype(v.dtype) in _WIDE else np.dtype(np.float32)
    return v if v.dtype == dt else v.astype(dt)


def _flat(vals: list[jax.Array]) -> jax.Array:
    return jnp.concatenate([jnp.ravel(_measured(v)) for v in vals])




def _tapped(mox: Mox) -> list[Mox]:
    """The call boundaries `compare` measures: numeric, and where their values can come out
    (not inside ``while``, ``cond`` or custom derivative bodies)."""
    idx = _calls.index(mox)
    return [c for c in idx.calls.values() if _numeric(c.outputs) and idx.positions[id(c)].blocked is None]


def _unavailable(mox: Mox) -> dict[str, str]:
    """The numeric calls whose values cannot come out, and why."""
    idx = _calls.index(mox)
    out = {}
    for k, c in idx.calls.items():
        eqn = idx.positions[id(c)].blocked
        if eqn is not None and _numeric(c.outputs):
            why = _calls.WHY.get(_calls.how(eqn), f"`{eqn.name}` does not give out the values of what it runs")
            out[k] = f"it runs inside the `{eqn.name}` in `{eqn.path or 'the root'}`: {why}"
    return out


# Primitives whose outputs XLA keeps in memory anyway: a boundary computed by one costs the
# compiler nothing more when it is brought out. Others (elementwise chains) are fused away in
# the plain model, and each brought out costs XLA a kernel of its own (milliseconds to compile).
_MATERIALISED = frozenset(_calls.HIGHER_ORDER) | frozenset({
    "dot_general", "conv_general_dilated", "sort", "gather", "scatter", "scatter-add", "argmax", "argmin", "cumsum",
    "fft", "reduce_sum", "reduce_max", "reduce_min", "reduce_prod"})


def eager_is_cheaper(mox: Mox) -> bool:
    """Whether `compare` measures ``mox`` op by op rather than as one jitted program.

    A jitted program compiles a kernel for every boundary value XLA would otherwise fuse away
    (a chain of 1,000 one-equation modules: 7-16 s, where the model compiles in 0.1 s); op by
    op, each distinct operation compiles once and each equation is dispatched (~30 ms and
    ~40 µs, measured on a 12-layer Transformer: 2.2 s op by op against 1.1 s jitted). The
    cheaper is chosen from those counts (a fused-away boundary counted at ~3 ms); models whose
    boundaries are mostly matrix products stay jitted (bench/bench_compare.py)."""
    producer: dict[int, str] = {}
    signatures: set[tuple[Any, ...]] = set()
    n_eqns = 0
    for n in mox.walk():
        if isinstance(n, Equation):
            n_eqns += 1
            for o in n.outputs:
                producer[id(o)] = n.name
            if len(signatures) < 4096:
                signatures.add((n.name, tuple((a.shape, str(a.dtype)) for a in n.inputs)))
    fused = sum(1 for c in _tapped(mox) for o in c.outvars if id(o) in producer and producer[id(o)] not in _MATERIALISED)
    return fused * 3e-3 > len(signatures) * 30e-3 + n_eqns * 4e-5


def _program(mox: Mox, out_idx: tuple[int, ...], taps: bool, eager: bool, shaped: bool = False) -> Any:
    """The program computing ``mox``'s outputs and the values at all its numeric call
    boundaries (inside scans: stacked per step), each in the type it is measured in
    (`_measured`: float32, float64 for 64-bit values), outputs flattened (with ``shaped``,
    for values laid out over several devices: each as it is shaped and laid out).
    Jitted (or, with ``eager``, op by op): one per MoX, kept while the MoX lives, so
    comparing many rewrites against one original compiles the original once."""
    cache: dict[tuple[Any, ...], Any] = _calls.memo(mox, "compare.programs", dict)
    key = (out_idx, taps, eager, shaped)
    f = cache.get(key)
    if f is None:
        plan = _capture.plan_of(_tapped(mox), mox, "compare") if taps else None
        ref = weakref.ref(mox)  # the cache must not keep its own key alive

        def program(flat: list[Any]) -> Any:
            root = ref()
            assert root is not None  # the program is cached with its MoX and dies with it
            out = _measured if shaped else (lambda o: _flat([o]))
            if plan is None:
                return [out(o) for o in (lambda outs: [outs[i] for i in out_idx])(run(root, flat))], {}
            outs, got = _capture.watched(root, plan, "capture", flat)
            # float32 and float64 as they are (flattened and joined on the host, `_rows`); narrower types
            # converted here, where it is cheaper than on the host (0.1 s against 0.5 s for a bfloat16 1B Llama)
            return [out(outs[i]) for i in out_idx], {k: [_measured(v) for v in g["out"]] for k, g in got.items()}

        f = cache[key] = program if eager else model_jit(program)
    return f


@dataclasses.dataclass(frozen=True)
class Measured:
    """One model's values on one set of inputs, on the host as flat float32
    (float64 for 64-bit values, `_measured`): the outputs `compare` looks at
    and, when measured with boundaries, the values at every numeric call
    boundary (by key; inside scans stacked per step: ``(*scan lengths, n)``).
    ``eager``: measured op by op (`eager_is_cheaper`); two measurements
    compared are taken the same way. ``shaped``: the model ran on values laid
    out over several devices (a sharded model), and they stay there: each
    output a device array as it is shaped and laid out, each boundary a list
    of them (one per output of the call), reduced where they are when compared."""

    out_idx: tuple[int, ...]
    outs: list[Any]
    taps: dict[str, Any] | None
    eager: bool = False
    shaped: bool = False


def paired_outputs(original: Mox, modified: Mox) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The dynamic outputs of each model that `compare` pairs up (numeric,
    equal shapes); raises `YaxInputError` when they cannot be paired."""
    for m, what in ((original, "original"), (modified, "modified")):
        if not isinstance(m, Mox) or m.kind != Kind.ROOT:
            raise NotARootMox("compare", f"a `{type(m).__name__}`", role=what)
    sel_a, sel_b = (frontends.of_root(m).compared(m) for m in (original, modified))
    if frontends.of_root(original).pair_by_name and frontends.of_root(modified).pair_by_name:
        names_b = {_output_names(modified)[j]: j for j in sel_b}
        names_a = _output_names(original)
        sel_a = [i for i in sel_a if names_a[i] in names_b]
        sel_b = [names_b[names_a[i]] for i in sel_a]
    if len(sel_a) != len(sel_b):
        raise YaxInputError(
            f"The models return {len(sel_a)} and {len(sel_b)} arrays; they cannot be compared."
        )
    for i, (x, y) in enumerate(zip((original.outvars[j] for j in sel_a), (modified.outvars[j] for j in sel_b))):
        if x.shape != y.shape:
            raise YaxInputError(f"Output {i} has shape {x.shape} in the original but {y.shape} in the modified model.")
    pos = [k for k, i in enumerate(sel_a) if _numeric([original.outvars[i]])]
    return tuple(sel_a[k] for k in pos), tuple(sel_b[k] for k in pos)


def measure(mox: Mox, args: tuple[Any, ...], kwargs: dict[str, Any], out_idx: tuple[int, ...], boundaries: bool = True,
            lowered: threading.Event | None = None, eager: bool | None = None) -> Measured:
    """Run ``mox`` (jitted, compiled once per MoX) and bring its outputs
    ``out_idx`` and, with ``boundaries``, its call boundaries to the host.
    ``lowered`` is set once the program is traced and lowered (Python work,
    holding the GIL): XLA compiles it without holding the GIL, so another
    thread can work meanwhile. ``eager``: measure op by op (``None``: when
    `eager_is_cheaper`; pass the original's ``Measured.eager`` for a model compared with it)."""
    return _to_host(_dispatch(mox, flatten_inputs(mox, args, kwargs), out_idx, boundaries, lowered, eager), mox)


def _dispatch(mox: Mox, flat: list[Any], out_idx: tuple[int, ...], boundaries: bool,
              lowered: threading.Event | None = None, eager: bool | None = None) -> Measured:
    """`measure` of flattened inputs, without waiting: the values are device arrays still being computed."""
    if eager is None:
        eager = boundaries and eager_is_cheaper(mox)
    shaped = any_spread(flat)
    program = _program(mox, out_idx, boundaries, eager, shaped)
    if lowered is not None and not eager:
        low = program.lower(flat)
        lowered.set()
        low.compile()  # the jitted program's caches keep it: the call below runs it
    outs, taps = program(flat)
    if lowered is not None:
        lowered.set()
    return Measured(out_idx, outs, taps if boundaries else None, eager, shaped)


def _to_host(m: Measured, mox: Mox) -> Measured:
    """``m`` with its values on the host, each boundary as flat rows (one per scan
    step); a sharded model's stay where they are (only their statistics cross,
    when compared)."""
    if m.shaped:
        return m
    outs, taps = to_host((m.outs, m.taps))
    if taps:
        idx = _calls.index(mox)
        stacks = [idx.positions[id(idx.calls[k])].stack for k in taps]
        taps = dict(zip(taps, _on_cores(lambda a: _rows(*a), zip(taps.values(), stacks))))
    return Measured(m.out_idx, outs, taps, m.eager)


def _rows(values: list[np.ndarray], stack: tuple[int, ...]) -> np.ndarray:
    """The outputs of one call as measured (float32, or float64 for 64-bit values: joined
    with a float32 one, float64), each flattened per scan step and joined: ``(*stack, n)``.
    On the host, not in the measured program: 310 flattenings and joins made a 1B Llama's
    program compile 0.15 s longer."""
    lead = len(stack)
    flat = [np.asarray(v).reshape(*stack, math.prod(np.shape(v)[lead:])) for v in values]
    return flat[0] if len(flat) == 1 else np.concatenate(flat, axis=-1)


def _on_cores(fn: Any, items: Any) -> list[Any]:
    """``[fn(x) for x in items]`` on every core (NumPy and BLAS release the GIL)."""
    items = list(items)
    if len(items) < 2:
        return [fn(x) for x in items]
    with concurrent.futures.ThreadPoolExecutor(min(len(items), os.cpu_count() or 1)) as pool:
        return list(pool.map(fn, items))


def _on_devices(v: Any, stack: tuple[int, ...]) -> Any:
    """A host measurement's flat value as a device array of rows (``(*stack, n)``),
    to be compared with a sharded model's values."""
    return jnp.asarray(np.asarray(v).reshape(*stack, -1))


def _pairs(items: list[tuple[Any, Any, tuple[int, ...]]], shaped: tuple[bool, bool], rtol: float,
           atol: float) -> list[tuple[Stats, list[Stats] | None]]:
    """The `Stats` of each value ``(x, y, scan lengths)`` of two measurements, and per scan step
    inside scans: in NumPy on the host, or, for a sharded model's values, reduced where they are
    (`_spread_stats`)."""
    if not any(shaped):
        return _on_cores(lambda item: _host_pair(item[0], item[1], item[2], rtol, atol), items)
    pairs = []
    for x, y, stack in items:
        xs, ys = (list(v) if isinstance(v, (list, tuple)) else [v] for v in (x, y))
        if not all(shaped) or len(xs) != len(ys) or any(a.shape != b.shape for a, b in zip(xs, ys)):
            # one of the two ran on one device (or they split outputs apart): compared as rows
            xs, ys = ([jnp.concatenate([jnp.reshape(a, (*stack, -1)) for a in v], axis=-1)] if sh
                      else [_on_devices(v[0], stack)] for v, sh in ((xs, shaped[0]), (ys, shaped[1])))
        pairs.append((xs, ys))
    got = _spread_stats(pairs, tuple(len(stack) for _, _, stack in items), rtol, atol)
    return [(whole, rows if stack else None) for (whole, rows), (_, _, stack) in zip(got, items)]


def _host_pair(x: np.ndarray, y: np.ndarray, stack: tuple[int, ...], rtol: float,
               atol: float) -> tuple[Stats, list[Stats] | None]:
    s = _stats(x.ravel(), y.ravel(), rtol, atol)
    if not stack:
        return s, None
    rows = int(np.prod(stack))
    xs, ys = x.reshape(rows, -1), y.reshape(rows, -1)
    return s, [_stats(xs[r], ys[r], rtol, atol) for r in range(rows)]


def _label(key: str, node: Mox) -> str:
    """The key, with the call's name in the modified model when a rewrite changed it."""
    last = node.path.rsplit("/", 1)[-1]
    return key if node.kind not in FN_KINDS or node.name == last else f"{key} (now {node.name})"


def compare_measured(original: Mox, modified: Mox, a: Measured, b: Measured, *, rtol: float = 1e-5,
                     atol: float = 1e-6) -> Comparison:
    """The `Comparison` of two measurements (`measure`) of ``original`` and
    ``modified``; boundaries are compared when both were measured with them."""
    shaped = (a.shaped, b.shaped)
    outputs = [s for s, _ in _pairs([(x, y, ()) for x, y in zip(a.outs, b.outs)], shaped, rtol, atol)]
    names = [_output_names(original).get(i, f"out[{i}]") for i in a.out_idx]
    shapes = [original.outvars[i].shape for i in a.out_idx]
    bounds: dict[str, Stats] = {}
    steps: dict[str, list[Stats]] = {}
    stacks: dict[str, tuple[int, ...]] = {}
    labels: dict[str, str] = {}
    unavailable: dict[str, str] = {}
    first: tuple[Any, ...] | None = None
    if a.taps is not None and b.taps is not None:
        ia, ib = _calls.index(original), _calls.index(modified)
        unavailable = _unavailable(original)
        todo: list[tuple[str, Mox, Any]] = []
        for k, n in ia.calls.items():
            m = ib.calls.get(k)
            if m is None or k not in a.taps or k not in b.taps:
                continue
            if [type_str(x) for x in n.outputs] != [type_str(x) for x in m.outputs]:
                unavailable[k] = (f"its outputs are {' '.join(map(type_str, n.outputs))} in the original but "
                                  f"{' '.join(map(type_str, m.outputs))} in the modified model")
                continue
            pos = ia.positions[id(n)]
            if pos.stack != ib.positions[id(m)].stack:
                unavailable[k] = "it runs inside scans of other lengths in the two models"
                continue
            todo.append((k, m, pos))
        measured = _pairs([(a.taps[k], b.taps[k], pos.stack) for k, _, pos in todo], shaped, rtol, atol)
        for (k, m, pos), (s, per_step) in zip(todo, measured):
            bounds[k] = s
            labels[k] = _label(k, m)
            if pos.stack and per_step is not None:
                stacks[k] = pos.stack
                steps[k] = per = per_step
                bad = [tuple(int(i) for i in np.unravel_index(r, pos.stack)) for r, t in enumerate(per)
                       if not t.allclose]
                if bad:
                    at = min(bad, key=pos.sort_key)
                    first = min(first or (pos.sort_key(at), k, at), (pos.sort_key(at), k, at))
            elif not s.allclose:
                first = min(first or (pos.sort_key(), k, ()), (pos.sort_key(), k, ()))
    return Comparison(
        outputs=dict(zip(names, outputs)),
        boundaries=bounds,
        rtol=rtol,
        atol=atol,
        arrays={k: (_shaped(x, s), _shaped(y, s)) for k, x, y, s in zip(names, a.outs, b.outs, shapes)},
        steps=steps,
        stacks=stacks,
        first_divergence=None if first is None else first[1],
        first_divergence_step=() if first is None else first[2],
        labels=labels,
        unavailable=unavailable,
    )


def _shaped(x: Any, shape: tuple[int, ...]) -> Any:
    """An output for plots: a host array shaped as the output, or a sharded model's on its devices."""
    return x if isinstance(x, jax.Array) and tuple(x.shape) == tuple(shape) else np.asarray(x).reshape(shape)


def compare(original: Mox | Reference, modified: Mox | Reference, *args: Any, new_params: Any = None,
            rtol: float | None = None, atol: float | None = None, boundaries: bool = True, grad_of: Any = None,
            names: _reference.Names = None, **kwargs: Any) -> Comparison:
    """Run ``original`` and ``modified`` on the same inputs (each compiled
    once, with ``jax.jit``) and measure the differences: per output, and at every call
    boundary both share (matched by key: path, method and call order, with equal
    output types), inside ``scan`` bodies at every step, so the first divergent boundary
    (and step) shows where a change starts to matter.

    Statistics leave out entries that are NaN or ±Inf in either model and count them; a
    statistic that cannot be computed is NaN with the reason in ``Stats.undefined``. Values
    spread over several devices (a model sharded over a mesh) are reduced where they are: only
    the statistics cross to the host.

    Args:
      original, modified: root MoX (``modified`` typically from `yax.sub`).
      *args, **kwargs: the inputs, as for `eval_mox(original, ...)`.
      new_params: the modified model's parameters, if a rewrite changed
        them: they replace the first positional argument for ``modified``.
      rtol, atol: the tolerances of the ``allclose`` verdicts (default 1e-5 and 1e-6;
        against a `Reference`, `port_tolerances` of the values' dtypes).
      boundaries: also compare call boundaries (default True).
      grad_of: a function of what the model returns giving a scalar (a loss): the
        gradients of ``grad_of(model(*args))`` with respect to the first argument (the
        parameters) are compared too, per parameter both models have (``gradients``).
      names: with a `Reference` in place of one model: how its module names map to the
        model's call keys where automatic matching does not find them (a dict, a list of
        ``(pattern, replacement)`` regular expressions, or a function of a reference name
        giving a key or ``None``); see `yax.Reference`.

    Returns:
      A `Comparison`; its ``repr`` is a table, ``to_dict()`` plain data.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)]); x = jnp.ones((1, 3))
      >>> p = m.init(jax.random.key(0), x)
      >>> mox = yax.make_mox(m.apply)(p, x)
      >>> c = yax.compare(mox, yax.sub('//*[@name="relu"]', jax.nn.gelu, mox), p, x)
      >>> c.first_divergence, c.label(c.first_divergence)
      ('Sequential/relu', 'Sequential/relu (now gelu)')
    """
    if isinstance(original, Reference) or isinstance(modified, Reference):
        if new_params is not None or grad_of is not None or not boundaries:
            given = [k for k, v in (("new_params", new_params is not None), ("grad_of", grad_of is not None),
                                    ("boundaries", not boundaries)) if v]
            raise CannotCompare("compare", "options", "`compare` with a `Reference` takes the model's inputs, "
                                "`names`, `rtol` and `atol`; `new_params`, `grad_of` and `boundaries` are for two "
                                "MoXes.", given)
        if isinstance(original, Reference) and isinstance(modified, Reference):
            raise CannotCompare("compare", "two references", "`compare` takes two MoXes, or a MoX and a `Reference`, "
                                "but got two references: compare a model with each of them.")
        ref, mox = (original, modified) if isinstance(original, Reference) else (modified, original)
        return compare_reference(cast(Reference, ref), cast(Mox, mox), *args, names=names, rtol=rtol, atol=atol,
                                 **kwargs)
    rtol, atol = 1e-5 if rtol is None else rtol, 1e-6 if atol is None else atol
    idx_a, idx_b = paired_outputs(original, modified)
    if new_params is not None and not args:
        raise YaxInputError("`new_params` replaces the first positional argument, but no arguments were given.")
    if grad_of is not None and (not callable(grad_of) or not args):
        raise YaxInputError(
            "`grad_of` must be a function of what the model returns giving a scalar, and the parameters the "
            "gradients are taken with respect to must be the first positional argument. Pass "
            "`grad_of=lambda out: out.sum()` and the parameters first.")
    args_b = args if new_params is None else (new_params, *args[1:])
    flat_a = flatten_inputs(original, args, kwargs)  # both inputs are checked before either model runs
    flat_b = flatten_inputs(modified, args_b, kwargs)
    eager = boundaries and (eager_is_cheaper(original) or eager_is_cheaper(modified))
    # The two programs compile side by side: XLA compiles without holding Python's lock, so the
    # modified model is traced and compiled while the original compiles and runs in a helper thread
    # (started once the original is lowered, so the two traces do not contend for the lock).
    lowered = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fa = pool.submit(_with_callers_settings(_dispatch), original, flat_a, idx_a, boundaries, lowered, eager)
        fa.add_done_callback(lambda _: lowered.set())  # also when it fails
        lowered.wait()
        b = _dispatch(modified, flat_b, idx_b, boundaries, None, eager)
        a = fa.result()
    c = compare_measured(original, modified, _to_host(a, original), _to_host(b, modified), rtol=rtol, atol=atol)
    if grad_of is None:
        return c
    return dataclasses.replace(c, gradients=compare_gradients(original, modified, args, args_b, kwargs, grad_of,
                                                              rtol, atol))


#: JAX's settings that change what a model traces to, which a ``with`` block (``with
#: jax.enable_x64(True):``) sets for the calling thread only.
_TRACE_SETTINGS = ("enable_x64", "default_matmul_precision", "numpy_dtype_promotion", "numpy_rank_promotion")


def _with_callers_settings(fn: Any) -> Any:
    """``fn``, to run on another thread with the calling thread's `_TRACE_SETTINGS`: on `compare`'s
    helper thread the original ran with x64 off under ``with jax.enable_x64(True):`` (a NumPy
    float64 input narrowed to float32, then refused by the float64 MoX)."""
    settings = [(getattr(jax, k), getattr(jax.config, f"jax_{k}")) for k in _TRACE_SETTINGS]

    def call(*args: Any) -> Any:
        with contextlib.ExitStack() as stack:
            for setting, value in settings:
                stack.enter_context(setting(value))
            return fn(*args)

    return call


def compare_gradients(original: Mox, modified: Mox, args: tuple[Any, ...], args_b: tuple[Any, ...], kwargs: dict[str, Any], loss: Any,
                      rtol: float = 1e-5, atol: float = 1e-6) -> dict[str, Stats]:
    """Gradients of ``loss(model(*args))`` with respect to the first argument's floating
    leaves, compared per leaf both models have (by key path)."""
    def grads(mox: Mox, a: tuple[Any, ...]) -> dict[str, np.ndarray]:
        flat, tree = jax.tree_util.tree_flatten_with_path(a[0])
        where = [i for i, (_, x) in enumerate(flat) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
        leaves = [x for _, x in flat]

        def f(ws: list[Any]) -> Any:
            full = list(leaves)
            for i, w in zip(where, ws):
                full[i] = w
            out = loss(eval_mox(mox, jax.tree_util.tree_unflatten(tree, full), *a[1:], **kwargs))
            if jnp.shape(out) != ():
                raise LossNotScalar("compare", type_str(out))
            return out

        g = jax.jit(jax.grad(f))([leaves[i] for i in where])
        if any_spread(g):  # a sharded model's gradients stay where they are: only statistics cross
            return {jax.tree_util.keystr(flat[i][0]): _measured(v) for i, v in zip(where, g)}
        return {jax.tree_util.keystr(flat[i][0]): np.ravel(_measured(v)) for i, v in zip(where, to_host(g))}

    ga, gb = grads(original, args), grads(modified, args_b)
    keys = [k for k, v in ga.items() if k in gb and np.size(gb[k]) == np.size(v)]
    shaped = (any(isinstance(v, jax.Array) for v in ga.values()), any(isinstance(v, jax.Array) for v in gb.values()))
    return {k: s for k, (s, _) in zip(keys, _pairs([(ga[k], gb[k], ()) for k in keys], shaped, rtol, atol))}


def _output_names(mox: Mox) -> dict[int, str]:
    """``out`` / ``out[1]['batch_stats']…`` for each dynamic output."""
    paths = mox.sig.outs.leaf_paths()
    return {j: "out" + paths[i] for j, i in enumerate(mox.dyn_out)}


def compiled_programs(mox: Mox) -> dict[Any, Any]:
    """The jitted programs `compare` keeps for ``mox`` (empty until it ran)."""
    return _calls.kept(mox, "compare.programs") or {}


# -- against a recorded run of another implementation ------------------------------------------------

#: Tolerances against a `Reference`, in epsilons of the coarsest dtype of the values compared:
#: ``rtol = n * eps`` and ``atol = n * eps * max|reference|`` (the boundary's own scale). Two
#: implementations of the same function sum in other orders: in float32 (and float64), measured on
#: Hugging Face's PyTorch GPT-2, BERT and Llama against their Flax classes (tests/test_reference.py),
#: the largest faithful difference is under 18 eps of the boundary's norm, and the smallest planted
#: port bug (GELU's tanh form for its erf form) over 800, so n = 64. In 16-bit types one rounding is
#: already a large part of a value: n = 2, PyTorch's own ``assert_close`` default for bfloat16
#: (``rtol`` 1.6e-2) and float16 (1e-3, one epsilon).
EPS_UNITS = {2: 2, 4: 64, 8: 64}


def port_tolerances(*dtypes: Any) -> tuple[float, float]:
    """``(rtol, atol / max|reference|)`` for comparing values of these dtypes with a `Reference`:
    `EPS_UNITS` epsilons of the coarsest (float32's for integers).

    Example:
      >>> import jax.numpy as jnp, yax
      >>> yax.port_tolerances(jnp.float32)          # 64 eps of float32
      (7.62939453125e-06, 7.62939453125e-06)
      >>> yax.port_tolerances(jnp.float32, jnp.bfloat16)   # 2 eps of bfloat16
      (0.015625, 0.015625)
    """
    floats = [np.dtype(d) for d in dtypes if jnp.issubdtype(d, jnp.inexact)]
    coarse = max(floats, key=lambda d: float(ml_dtypes.finfo(d).eps),  # type: ignore[no-untyped-call]
                 default=np.dtype(np.float32))
    eps = float(ml_dtypes.finfo(coarse).eps)  # type: ignore[no-untyped-call]  # knows bfloat16; untyped
    n = EPS_UNITS.get(coarse.itemsize if coarse.kind != "c" else coarse.itemsize // 2, 64)
    return n * eps, n * eps


def _flat_pairs(model: list[Any], ref: tuple[np.ndarray, ...], pairs: list[tuple[int, int, _reference.Layout | None]],
                rtol: float | None, atol: float | None) -> Stats:
    """The `Stats` of a model's arrays against a reference's, paired as ``pairs`` say (the
    reference's read in the layout paired with it), the reference as the original."""
    ys = [np.asarray(model[i]) for i, _, _ in pairs]
    xs = [lay.read(ref[j], y.shape) if lay else ref[j] for (_, j, lay), y in zip(pairs, ys)]
    r, a = port_tolerances(*(x.dtype for x in xs), *(y.dtype for y in ys))
    x = np.concatenate([np.ravel(_measured(v)) for v in xs])  # float32 holds 16-bit values exactly
    y = np.concatenate([np.ravel(_measured(v)) for v in ys])
    scale = float(np.max(np.abs(x), initial=0.0, where=np.isfinite(x)))
    return _stats(x, y, r if rtol is None else rtol, a * scale if atol is None else atol)


class _Reading:
    """How an array that fits several ways (as stored and in a known layout: a square kernel,
    8 channels of 8×8) is read: as the arrays of its kind (`kind`: rank, and leaf name for
    weights) that fit one way only are, most of them; as stored when none tells."""

    def __init__(self, fitted: list[tuple[Any, list[_reference.Layout | None]]]) -> None:
        self.votes: dict[Any, collections.Counter[Any]] = {}
        for kind, ways in fitted:
            if len(ways) == 1:
                self.votes.setdefault(kind, collections.Counter())[ways[0]] += 1

    def told(self, kind: Any) -> bool:
        """Whether arrays of this kind that fit one way only exist."""
        return kind in self.votes

    def read(self, kind: Any, ways: list[_reference.Layout | None]) -> _reference.Layout | None:
        if len(ways) == 1 or kind not in self.votes:
            return ways[0]
        most: _reference.Layout | None = self.votes[kind].most_common(1)[0][0]
        return most


def _describe(arrays: Any) -> str:
    return " ".join(f"{np.dtype(a.dtype).name}{list(a.shape)}" for a in arrays) or "nothing"


def _layout_note(what: str, pairs: list[tuple[int, int, _reference.Layout | None]]) -> str | None:
    laid = [(j, lay) for _, j, lay in pairs if lay is not None]
    if not laid:
        return None
    return "; ".join(f"the reference's {what} {j} is compared {lay.name}" if lay.broadcast else
                     f"the reference's {what} {j} is laid out {lay.name}: compared as its transpose {lay.axes}"
                     for j, lay in laid)


def compare_reference(reference: Reference, mox: Mox, *args: Any, names: _reference.Names = None,
                      rtol: float | None = None, atol: float | None = None, **kwargs: Any) -> Comparison:
    """`compare` of a MoX with a `Reference`: the model runs once (`yax.capture` of its calls
    matched with the reference's modules) and each matched call's outputs are measured
    against the reference's, the reference as the original. The first argument's leaves (the
    parameters) are measured against the reference's weights where it holds some."""
    if not isinstance(mox, Mox) or mox.kind != Kind.ROOT:
        raise NotARootMox("compare", f"a `{type(mox).__name__}`", role="the model beside the `Reference`")
    idx = _calls.index(mox)
    numeric = [k for k, c in idx.calls.items() if _numeric(c.outputs)]
    stacks = {k: idx.positions[id(idx.calls[k])].stack for k in numeric}
    modules = [n for n in reference.outputs if n != ""]
    pairs = _reference.match(numeric, modules, names, {k: st[0] for k, st in stacks.items() if len(st) == 1})
    blocked = _unavailable(mox)
    unavailable = {k: why for k, why in blocked.items() if k in pairs}
    for k in numeric:
        if len(stacks[k]) > 1 and k not in pairs:
            unavailable[k] = (f"it runs inside nested scans ({_times(stacks[k])} steps): "
                              "the reference's modules are matched with one scan's steps only")
    todo = {k: r for k, r in pairs.items() if k not in blocked}
    out, values = _capture.capture([idx.calls[k] for k in todo], mox, *args, **kwargs) if todo else (
        eval_mox(mox, *args, **kwargs), {})
    # Each call's arrays, per step inside a scan, paired with its reference module's (step's) arrays.
    found: dict[str, list[tuple[list[np.ndarray], tuple[np.ndarray, ...], list[Any]]]] = {}
    for k, refs in todo.items():
        if stacks[k] and len(refs) != stacks[k][0]:
            unavailable[k] = (f"it runs at each of {stacks[k][0]} scan steps, and the reference's `{refs[0]}` is one "
                              f"module: name one module per step (`{k}@0` … `{k}@{stacks[k][0] - 1}` in `names`)")
            continue
        mine = [np.asarray(v) for v in jax.tree_util.tree_leaves(values[k]) if _numeric([v])]
        per_step = [mine] if not stacks[k] else [[a[s] for a in mine] for s in range(stacks[k][0])]
        found[k] = [(m, reference.outputs[r], _reference.pair(m, reference.outputs[r]))
                    for m, r in zip(per_step, refs)]
    leaves, names_out = _compared_outputs(mox, out)
    root = reference.outputs.get("", ())  # the whole model's outputs, where it recorded them
    root_pairs = _reference.pair(leaves, root)
    # outputs of a model laid out channels last are read so throughout, by rank
    reading = _Reading([(m[i].ndim, ways) for got in found.values() for m, _, ps in got for i, _, ways in ps]
                       + [(leaves[i].ndim, ways) for i, _, ways in root_pairs])

    def chosen(m: list[np.ndarray], ps: list[Any]) -> list[tuple[int, int, Any]]:
        return [(i, j, reading.read(m[i].ndim, ways)) for i, j, ways in ps]

    bounds: dict[str, Stats] = {}
    steps: dict[str, list[Stats]] = {}
    stacked: dict[str, tuple[int, ...]] = {}
    layouts: dict[str, str] = {}
    labels: dict[str, str] = {}
    first: tuple[Any, ...] | None = None
    for k, got in found.items():
        refs = todo[k]
        labels[k] = f"{k} ↔ {refs[0]}" + (f" … {refs[-1]}" if len(refs) > 1 else "")
        bad = [s for s, (_, _, ps) in enumerate(got) if not ps]
        if bad:
            m, ref, _ = got[bad[0]]
            unavailable[k] = (f"its outputs are {_describe(m)} in the model but {_describe(ref)} in the "
                              f"reference's `{refs[bad[0]]}`: no pair of equal shapes, nor of a known layout")
            continue
        picked = [chosen(m, ps) for m, _, ps in got]
        whole = [a for m, _, _ in got for a in m]
        whole_ref = tuple(a for _, ref, _ in got for a in ref)
        offsets = np.cumsum([0] + [len(m) for m, _, _ in got]), np.cumsum([0] + [len(r) for _, r, _ in got])
        flat = [(i + offsets[0][s], j + offsets[1][s], lay) for s, ps in enumerate(picked) for i, j, lay in ps]
        bounds[k] = _flat_pairs(whole, whole_ref, flat, rtol, atol)
        note = _layout_note("output", picked[0])
        if note:
            layouts[k] = note
        pos = idx.positions[id(idx.calls[k])]
        if stacks[k]:
            stacked[k] = stacks[k]
            steps[k] = [_flat_pairs(m, ref, ps, rtol, atol) for (m, ref, _), ps in zip(got, picked)]
            at = [(s,) for s, t in enumerate(steps[k]) if not t.allclose]
            if at:
                first = min(first or (pos.sort_key(at[0]), k, at[0]), (pos.sort_key(at[0]), k, at[0]))
        elif not bounds[k].allclose:
            first = min(first or (pos.sort_key(), k, ()), (pos.sort_key(), k, ()))
    outputs: dict[str, Stats] = {}
    arrays: dict[str, tuple[Any, Any]] = {}
    for i, j, lay in chosen(leaves, root_pairs):
        outputs[names_out[i]] = _flat_pairs(leaves, root, [(i, j, lay)], rtol, atol)
        x = lay.read(root[j], leaves[i].shape) if lay else root[j]
        arrays[names_out[i]] = (np.asarray(_measured(x)), np.asarray(_measured(leaves[i])))
        note = _layout_note("output", [(i, j, lay)])
        if note:
            layouts[names_out[i]] = note
    weights, wnames, only_w, only_rw = _weights(reference, args, rtol, atol, layouts, names)
    used = {r for refs in pairs.values() for r in refs}
    matching = Matching(
        source=reference.source or "the reference", calls={k: refs[0] if len(refs) == 1 else refs
                                                           for k, refs in pairs.items()},
        only_model=tuple(k for k in numeric if k not in pairs),
        only_reference=tuple(n for n in modules if n not in used),
        layouts=layouts, weights=wnames, only_model_weights=only_w, only_reference_weights=only_rw,
        atol_scaled=atol is None)
    r0, a0 = port_tolerances(*(v.dtype for v in leaves))
    return Comparison(outputs=outputs, boundaries=bounds, rtol=r0 if rtol is None else rtol,
                      atol=a0 if atol is None else atol, arrays=arrays, steps=steps, stacks=stacked,
                      first_divergence=None if first is None else first[1],
                      first_divergence_step=() if first is None else first[2], labels=labels,
                      unavailable=unavailable, matching=matching, weights=weights if reference.weights else None)


def _compared_outputs(mox: Mox, out: Any) -> tuple[list[np.ndarray], list[str]]:
    """The outputs `compare` pairs up (the frontend's `compared`: an nnx model's own output and
    the state it updates, not the parameters it hands back) as host arrays, and their names."""
    leaves = jax.tree_util.tree_leaves(out)
    names = _output_names(mox)
    picked = [j for j in frontends.of_root(mox).compared(mox) if _numeric([mox.outvars[j]])]
    if len(leaves) != mox.sig.outs.size:  # pragma: no cover - eval_mox returns the signature's leaves
        raise AssertionError("the model's outputs do not follow its signature")
    return [np.asarray(leaves[mox.dyn_out[j]]) for j in picked], [names[j] for j in picked]


def _weights(reference: Reference, args: tuple[Any, ...], rtol: float | None, atol: float | None,
             layouts: dict[str, str], names: _reference.Names = None
             ) -> tuple[dict[str, Stats], dict[str, str], tuple[str, ...], tuple[str, ...]]:
    """The model's parameters (the first argument's floating leaves) against the reference's weights."""
    if not reference.weights or not args:
        return {}, {}, (), tuple(reference.weights)
    flat = [(key_of(p), v) for p, v in jax.tree_util.tree_flatten_with_path(args[0])[0]
            if hasattr(v, "dtype") and jnp.issubdtype(v.dtype, jnp.inexact)]
    leaves = dict(flat)
    names = _reference.weight_names(list(leaves), list(reference.weights), names)
    ways = {p: _reference.fits(tuple(np.shape(leaves[p])), reference.weights[r], True) for p, r in names.items()}

    def kind(p: str) -> tuple[str, int]:
        return p.rsplit("/", 1)[-1], np.ndim(leaves[p])

    # a square weight is read as the other weights of its kind (leaf name and rank) are, so a
    # square kernel a port forgot to transpose still shows
    reading = _Reading([(kind(p), w) for p, w in ways.items()])
    stats: dict[str, Stats] = {}
    kept: dict[str, str] = {}
    for p, r in names.items():
        if not ways[p]:
            continue
        lay, vote = reading.read(kind(p), ways[p]), reading.told(kind(p))
        stats[p] = _flat_pairs([np.asarray(leaves[p])], (reference.weights[r],), [(0, 0, lay)], rtol, atol)
        kept[p] = r
        if lay is not None:
            layouts[p] = (f"the reference's `{r}` is laid out {lay.name}: compared as its transpose {lay.axes}"
                          + (" (square: read as the other weights of its kind are)" if len(ways[p]) > 1 else ""))
        elif len(ways[p]) > 1:
            layouts[p] = (f"the reference's `{r}` is square: compared as stored"
                          + (", as the other weights of its kind are" if vote else
                             "; no other weight of its kind tells whether it is stored transposed"))
    return (stats, kept, tuple(p for p in leaves if p not in kept),
            tuple(r for r in reference.weights if r not in set(kept.values())))


# -- N ways ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Comparisons:
    """The result of `compare_all`: each model after the first compared with the first,
    aligned by call (the model's call keys).

    Attributes:
      names: the models' names, the first the one the others are compared with.
      against_first: name -> the `Comparison` of that model with the first (a `Reference`
        is the original in its statistics, wherever it stands).
    """

    names: tuple[str, ...]
    against_first: dict[str, Comparison]

    @property
    def first_divergence(self) -> dict[str, str | None]:
        """name -> where that model starts to differ from the first (``None``: nowhere)."""
        return {n: c.first_divergence for n, c in self.against_first.items()}

    @property
    def allclose(self) -> bool:
        return all(c.allclose for c in self.against_first.values())

    def table(self, stat: str = "rel") -> dict[str, dict[str, float | None]]:
        """call key -> name -> the statistic ``stat`` of that call in that model against the first
        (``None`` where the two do not both have it), the calls in the order they first appear."""
        keys = list(dict.fromkeys(k for c in self.against_first.values() for k in c.boundaries))
        return {k: {n: (getattr(c.boundaries[k], stat) if k in c.boundaries else None)
                    for n, c in self.against_first.items()} for k in keys}

    def to_dict(self) -> dict[str, Any]:
        return {"names": list(self.names), "first_divergence": self.first_divergence,
                "against_first": {n: c.to_dict() for n, c in self.against_first.items()}}

    def __repr__(self) -> str:
        others = list(self.against_first)
        rows = self.table()
        width = max([len(k) for k in rows] + [8])
        cols = [max(len(n), 11) for n in others]
        lines = [f"Comparisons(against {self.names[0]!r}: " + ", ".join(
            f"{n}: {'allclose' if c.allclose else 'differs'}" for n, c in self.against_first.items()) + ")",
            f"{'rel':{width}}  " + "  ".join(f"{n:>{w}}" for n, w in zip(others, cols))]
        for k in rows:
            cells = []
            for n, w in zip(others, cols):
                c = self.against_first[n]
                s = c.boundaries.get(k)
                cell = "—" if s is None else s.cell("rel", ".3g") + ("*" if c.first_divergence == k else
                                                                     "" if s.allclose else "!")
                cells.append(f"{cell:>{w}}")
            lines.append(f"{k:{width}}  " + "  ".join(cells))
        lines.append("(* the first divergence from the first model; ! not allclose; — not compared)")
        return "\n".join(lines)


def compare_all(models: Any, *args: Any, names: _reference.Names = None, rtol: float | None = None,
                atol: float | None = None, **kwargs: Any) -> Comparisons:
    """Compare several models at once: each after the first with the first, on the same
    inputs, aligned by call, each with `compare`.

    Args:
      models: a dict of name -> model, or a list (named ``0``, ``1``, …; a `Reference` by its
        source). A model is a root MoX, ``(mox, params)`` when its parameters differ from
        ``args[0]`` (a rewrite that changed them: LoRA, mixed precision), or a `Reference`.
      *args, **kwargs: the inputs, as for `eval_mox`; the parameters first.
      names, rtol, atol: as for `compare`.

    Returns:
      `Comparisons`: ``against_first[name]`` is each model's `Comparison` with the first,
      ``table()`` one column per model, ``first_divergence`` where each starts to differ.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)]); x = jnp.ones((1, 3))
      >>> p = m.init(jax.random.key(0), x)
      >>> mox = yax.make_mox(m.apply)(p, x)
      >>> gelu = yax.sub('//*[@name="relu"]', jax.nn.gelu, mox)
      >>> same = yax.sub('//*[@name="relu"]', lambda h: jnp.maximum(h, 0), mox)
      >>> cs = yax.compare_all({"original": mox, "gelu": gelu, "same": same}, p, x)
      >>> cs.first_divergence
      {'gelu': 'Sequential/relu', 'same': None}
    """
    if isinstance(models, Mapping):
        named = [(str(k), v) for k, v in models.items()]
    elif isinstance(models, (list, tuple)):
        named = [(v.source if isinstance(v, Reference) and v.source else str(i), v) for i, v in enumerate(models)]
    else:
        raise WrongType("models", "a dict or a list of models", models)
    if len(named) < 2 or len({n for n, _ in named}) != len(named):
        raise CannotCompare("compare_all", "names", f"`compare_all` compares two or more models with distinct "
                            f"names; got {[n for n, _ in named]}.", [n for n, _ in named])

    def split(v: Any, what: str) -> tuple[Any, tuple[Any, ...]]:
        if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], Mox):
            if not args:
                raise YaxInputError(f"`{what}` comes with its parameters, which replace the first argument, but "
                                    f"no arguments were given.")
            return v[0], (v[1], *args[1:])
        if isinstance(v, (Mox, Reference)):
            return v, args
        raise WrongType(what, "a root MoX, a `(mox, params)` pair or a `Reference`", v)

    (first_name, first), rest = named[0], named[1:]
    a, args_a = split(first, first_name)
    out: dict[str, Comparison] = {}
    for name, v in rest:
        b, args_b = split(v, name)
        if isinstance(a, Reference) or isinstance(b, Reference):
            if isinstance(a, Reference) and isinstance(b, Reference):
                raise CannotCompare("compare_all", "two references", f"`{first_name}` and `{name}` are both "
                                    "references: compare a model with them.", [first_name, name])
            out[name] = compare(a, b, *(args_b if isinstance(a, Reference) else args_a), names=names, rtol=rtol,
                                atol=atol, **kwargs)
        else:
            out[name] = compare(a, b, *args_a, new_params=None if args_b is args_a else args_b[0], rtol=rtol,
                                atol=atol, **kwargs)
    return Comparisons(tuple(n for n, _ in named), out)
