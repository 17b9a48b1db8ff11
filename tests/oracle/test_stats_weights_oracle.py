"""The oracle for the statistics yax reports and for saved weights: generated values
checked against float64 NumPy written here by hand, never against yax itself.

(a) Statistics. Pairs of float32, bfloat16 and float16 arrays (up to 3 axes; magnitudes
1e-30..1e30 by their exponents, and now and then the whole float32 range, subnormals
and the largest values included; zeros, -0.0, NaN and ±Inf planted; the modified equal
to the original, near it, scaled by a power of ten, or unrelated), and for `compare`'s
reduction and `yax.compare` also float64 ones under ``jax.enable_x64(True)`` (1e-300..1e300,
now and then subnormals to the largest float64; "near" down to 1e-15 relative), go through:

- `compare`'s reduction as `compare` calls it (`_pairs`): on the host, and laid out over
  the 8 CPU devices (reduced where they are), as one value and per scan step (the first
  axis taken as the scan's); every `Stats` field against the reference;
- `yax.compare` end to end, of two plain functions returning the two arrays, on one
  device and with the arrays laid out over the devices;
- `ValueStats.of` (what `first_nonfinite` reports) on the host and on the devices, and
  `reduced_stats` (the explorer's) where its documented domain holds (no subnormals).

On the host the statistics are float64 sums: they must equal the reference to 1e-13. On
the devices they are float32 sums of values scaled by their largest: to 2e-5, and the
mean and std (which cancel) to 2e-6 of the largest |value|; float64 values' are float64
sums there: to 1e-12. The reference of float64 values is float64 NumPy's per entry (|Δ|,
the tolerance test) and exact rational sums, rounded once (NumPy's float64 sums of squares
over- and underflow from 1e154 and 1e-154 on).

(b) Weights. Pytrees of every dtype `save_weights` stores, random bits and edge values
(each integer type's min and max, 2**40+3, subnormals, NaN payloads signalling and quiet,
-0.0, ±Inf), held as NumPy arrays, NumPy scalars or jax arrays, saved and loaded with
``like`` the tree itself, its `jax.ShapeDtypeStruct`s or NumPy copies, with x64 off and on
(`jax.enable_x64`): every leaf comes back with its dtype and shape and every bit, as a jax
array where JAX holds its dtype and a NumPy array where it does not (64-bit, x64 off).

Budget: ``YAX_ORACLE_EXAMPLES`` examples per test (25 by default); a failure prints the
``@reproduce_failure`` blob to replay it.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import tempfile
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import yax
from yax._compare import _pairs
from yax.internal import ValueStats, reduced_stats

from .gen import SETTINGS, reporting

#: checks run in this process, added to $YAX_ORACLE_COUNTS (a JSON file) for the closing report
COUNTS: collections.Counter[str] = collections.Counter()

EIGHT = len(jax.devices()) >= 8


_report = reporting(COUNTS)


# -- (a) statistics --------------------------------------------------------------------------

FLOATS = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
          "float16": np.dtype(np.float16)}
#: float64, which JAX holds with x64 on (``jax.enable_x64(True)``, `x64`) and `compare` measures in float64
WIDE = {"float64": np.dtype(np.float64)}
SPECIAL = (0.0, -0.0, math.nan, math.inf, -math.inf)
TOLERANCES = ((1e-5, 1e-6), (0.0, 0.0), (1e-2, 1e-30))  # compare's defaults, exact, loose


#: the exponents of generated values per dtype: usually, and now and then (its whole range: subnormals to beyond its max)
EXPONENTS = {"float32": ((-30, 30), (-46, 38)), "bfloat16": ((-30, 30), (-41, 38)), "float16": ((-4, 4), (-8, 5)),
             "float64": ((-300, 300), (-323, 308))}
#: the exponents of the relative change of a "near" pair: float64 resolves 1e-15
NEAR = {"float64": (-15, -1)}


def _magnitude(dtype: str, wide: bool) -> st.SearchStrategy[float]:
    """A signed value m·10**e."""
    lo, hi = EXPONENTS[dtype][wide]
    return st.builds(lambda s, m, e: s * m * 10.0 ** e, st.sampled_from((1.0, -1.0)), st.floats(1.0, 9.999),
                     st.integers(lo, hi))


def _entry(dtype: str, wide: bool) -> st.SearchStrategy[float]:
    value = _magnitude(dtype, wide)
    return st.one_of(value, value, value, value, st.sampled_from(SPECIAL))


@dataclasses.dataclass(frozen=True)
class Pair:
    dtype: str
    x: np.ndarray  # of `dtype`
    y: np.ndarray
    how: str
    rtol: float
    atol: float


def _cast(values: list[float], dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    with np.errstate(over="ignore"):  # beyond the dtype's range: ±Inf, as the model's cast would give
        return np.asarray(values, np.float64).astype(dtype).reshape(shape)


@st.composite
def pairs(draw: Any, dtypes: tuple[str, ...] = tuple(FLOATS)) -> Pair:
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(st.one_of(st.lists(st.integers(1, 5), max_size=3).map(tuple), st.just((0,)), st.just((2, 0))))
    n = math.prod(shape)
    wide = draw(st.sampled_from((False, False, False, True)))
    xs = draw(st.lists(_entry(dtype, wide), min_size=n, max_size=n))
    how = draw(st.sampled_from(("same", "near", "scaled", "unrelated")))
    if how == "same":
        ys = list(xs)
    elif how == "near":
        r = draw(st.lists(st.builds(lambda s, e: s * 10.0 ** e, st.sampled_from((1.0, -1.0)),
                                    st.integers(*NEAR.get(dtype, (-8, -1)))), min_size=n, max_size=n))
        ys = [a * (1 + b) for a, b in zip(xs, r)]
    elif how == "scaled":
        k = draw(st.integers(*EXPONENTS[dtype][0]))
        ys = [a * 10.0 ** k for a in xs]
    else:
        ys = draw(st.lists(_entry(dtype, wide), min_size=n, max_size=n))
    if n:  # NaN, Inf and zeros planted in the modified: appearing, disappearing, changing sign
        for i, v in draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(SPECIAL)), max_size=3)):
            ys[i] = v
    rtol, atol = draw(st.sampled_from(TOLERANCES))
    dt = {**FLOATS, **WIDE}[dtype]
    return Pair(dtype, _cast(xs, dt, shape), _cast(ys, dt, shape), how, rtol, atol)


@dataclasses.dataclass(frozen=True)
class Want:
    """The reference `Stats` of two arrays, in float64 NumPy."""

    n: int
    nonfinite: int
    changed: int
    max_abs: float
    mean_abs: float
    rel: float
    cosine: float
    allclose: bool
    undefined: frozenset[str]
    borderline: bool  # an entry within 1e-5 (float64: 1e-14) of the tolerance: the devices may decide it either way
    wide: bool = False  # of float64 values


def _exact(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """``(mean |Δ|, ‖Δ‖/‖x‖, x·y/(‖x‖‖y‖))`` of float64 values in exact rational arithmetic (square
    roots to 40 digits), rounded once to float64; NaN for a ratio whose denominator is 0."""
    xs, ys = [Fraction(float(v)) for v in x], [Fraction(float(v)) for v in y]
    d = [abs(b - a) for a, b in zip(xs, ys)]
    sx, sy, sd = (sum((v * v for v in vs), Fraction(0)) for vs in (xs, ys, d))
    dot = sum((a * b for a, b in zip(xs, ys)), Fraction(0))
    with localcontext() as ctx:
        ctx.prec = 40

        def dec(f: Fraction) -> Decimal:
            return Decimal(f.numerator) / Decimal(f.denominator)

        rel = float((dec(sd) / dec(sx)).sqrt()) if sx else math.nan
        cosine = float(dec(dot) / (dec(sx) * dec(sy)).sqrt()) if sx and sy else math.nan
        return float(dec(sum(d, Fraction(0)) / len(d))), rel, cosine


def reference(x: np.ndarray, y: np.ndarray, rtol: float, atol: float) -> Want:
    wide = np.result_type(x, y) == np.float64
    x, y = np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()
    fin = np.isfinite(x) & np.isfinite(y)
    changed = sum(1 for a, b in zip(x[~fin], y[~fin]) if not (a == b or (np.isnan(a) and np.isnan(b))))
    nonfinite = int((~fin).sum())
    x, y = x[fin], y[fin]
    if not x.size:
        return Want(0, nonfinite, changed, math.nan, math.nan, math.nan, math.nan, changed == 0,
                    frozenset({"max_abs", "mean_abs", "rel", "cosine"}), False, wide)
    with np.errstate(over="ignore"):  # float64 values: a difference beyond float64's range is +Inf, as NumPy's
        d = np.abs(y - x)
        bound = atol + rtol * np.abs(x)
    borderline = bool(np.any(np.abs(d - bound) <= (1e-14 if wide else 1e-5) * np.maximum(bound, d)))
    close = bool(np.all(d <= bound)) and changed == 0
    if wide:
        mean_abs, rel, cosine = _exact(x, y)
        undefined = {k for k, v in (("rel", rel), ("cosine", cosine)) if math.isnan(v)}
        if not np.any(x) and not np.any(d):
            rel = 0.0
            undefined.discard("rel")
        return Want(x.size, nonfinite, changed, float(d.max()), mean_abs, rel, cosine, close, frozenset(undefined),
                    borderline, wide)
    nx, ny, nd = (math.sqrt(float(np.sum(v * v))) for v in (x, y, d))
    dot = float(np.sum(x * y))
    undefined = set()
    if nx > 0:
        rel = nd / nx
    elif nd == 0:
        rel = 0.0
    else:
        rel = math.nan
        undefined.add("rel")
    if nx > 0 and ny > 0:
        cosine = min(1.0, max(-1.0, dot / (nx * ny)))
    else:
        cosine = math.nan
        undefined.add("cosine")
    return Want(x.size, nonfinite, changed, float(d.max()), float(d.mean()), rel, cosine, close, frozenset(undefined),
                borderline)


def check(got: Any, want: Want, exact: bool, what: str) -> None:
    """``got`` (a `Stats`) is ``want``: to 1e-13 on the host (``exact``), to float32's sums on the devices
    (float64 values: to 1e-12). A float64 result among the subnormals may be an ulp of them off (5e-324:
    rounded twice, scaled back after a division)."""
    where = f"{what}: got {got}, want {want}"
    assert (got.nonfinite, got.changed) == (want.nonfinite, want.changed), where
    assert {k for k, _ in got.undefined} == want.undefined, where
    r = 1e-13 if exact else 1e-12 if want.wide else 2e-5
    tiny = 1e-322 if want.wide else 0.0
    for k, rtol in (("max_abs", 1e-13 if exact or want.wide else 1.2e-7), ("mean_abs", r), ("rel", r)):
        g, w = getattr(got, k), getattr(want, k)
        if k in want.undefined:
            assert math.isnan(g), f"{k} {where}"
        else:
            assert g == pytest.approx(w, rel=rtol, abs=tiny), f"{k} {where}"
    if "cosine" in want.undefined:
        assert math.isnan(got.cosine), where
    else:
        assert abs(got.cosine - want.cosine) <= r, f"cosine {where}"
    if exact or not want.borderline:
        assert got.allclose == want.allclose, f"allclose {where}"


_mesh: list[Mesh] = []


def laid_out(a: Any) -> jax.Array:
    """``a`` over a (2, 4) mesh of the CPU devices: each axis split where it divides, else replicated."""
    if not _mesh:
        _mesh.append(Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b")))
    entries: list[str | None] = []
    for size in np.shape(a):
        free = [m for m, k in (("a", 2), ("b", 4)) if m not in entries and size and size % k == 0]
        entries.append(free[0] if free else None)
    return jax.device_put(a, NamedSharding(_mesh[0], P(*entries)))


def f32(a: np.ndarray) -> np.ndarray:
    """``a`` as `compare` measures it: float32, float64 as it is."""
    return a if a.dtype == np.float64 else np.asarray(a, np.float32)


def x64(p: Pair) -> Any:
    """JAX's x64 mode for ``p``: on for float64 values, which JAX holds only with it."""
    return jax.enable_x64(p.dtype in WIDE)


@SETTINGS
@given(pairs((*FLOATS, *WIDE)))
def test_compare_statistics_are_float64_numpys(p: Pair) -> None:
    with x64(p):
        _compare_statistics(p)


def _compare_statistics(p: Pair) -> None:
    want = reference(p.x, p.y, p.rtol, p.atol)
    # on the host, as `compare` hands them: float32, flat
    [(got, rows)] = _pairs([(f32(p.x).ravel(), f32(p.y).ravel(), ())], (False, False), p.rtol, p.atol)
    check(got, want, True, "host")
    assert rows is None
    COUNTS["stats: host" + (", float64" if want.wide else "")] += 1
    stack = p.x.shape[:1] if p.x.ndim >= 2 else ()
    if stack:  # the first axis as a scan's steps: `compare`'s rows, one per step
        rx, ry = f32(p.x).reshape(*stack, -1), f32(p.y).reshape(*stack, -1)
        [(got, rows)] = _pairs([(rx, ry, stack)], (False, False), p.rtol, p.atol)
        check(got, want, True, "host, all steps")
        for i, row in enumerate(rows):
            check(row, reference(p.x[i], p.y[i], p.rtol, p.atol), True, f"host, step {i}")
        COUNTS["stats: host, per step" + (", float64" if want.wide else "")] += 1
    if not EIGHT:
        return
    # laid out over the devices: float32 as they are shaped, reduced where they are
    dx, dy = laid_out(f32(p.x)), laid_out(f32(p.y))
    [(got, rows)] = _pairs([(dx, dy, ())], (True, True), p.rtol, p.atol)
    check(got, want, False, "devices")
    COUNTS["stats: devices" + (", float64" if want.wide else "")] += 1
    if stack:
        [(got, rows)] = _pairs([(dx, dy, stack)], (True, True), p.rtol, p.atol)
        check(got, want, False, "devices, all steps")
        assert rows is not None
        for i, row in enumerate(rows):
            check(row, reference(p.x[i], p.y[i], p.rtol, p.atol), False, f"devices, step {i}")
        COUNTS["stats: devices, per step" + (", float64" if want.wide else "")] += 1


def _first(a: Any, b: Any) -> Any:
    return a


def _second(a: Any, b: Any) -> Any:
    return b


@SETTINGS
@given(pairs((*FLOATS, *WIDE)), st.booleans())
def test_compare_end_to_end_is_float64_numpys(p: Pair, sharded: bool) -> None:
    """`yax.compare` of a function returning its first argument against one returning its second: the
    outputs are the two arrays, measured as `compare` measures a model (converted to float32 by the
    measuring program, float64 values as they are, on the host or, laid out over the devices, where
    they are). float64 pairs run under ``jax.enable_x64(True)``."""
    with x64(p):
        _compare_end_to_end(p, sharded)


def test_values_near_float32s_largest_laid_out_over_the_devices_keep_their_angle() -> None:
    """A counterexample the property above found: equal values up to 9e37 laid out over the devices
    had every scaled value flushed to 0 (XLA divides by the scale as it multiplies by its reciprocal,
    subnormal there), and the cosine of two equal arrays said "both are 0"."""
    x = np.array([[1, 1, 1, 0], [1, 1, 9e37, 0], [0, 0, 1, 1]] * 2, np.float32).reshape(2, 3, 4)
    for y in (x, x * np.float32(0.5)):
        p = Pair("float32", x, y, "same" if y is x else "half", 1e-5, 1e-6)
        _compare_end_to_end(p, True)
        c = _stats_on_devices(x, y)
        assert c.cosine == 1.0 and not c.undefined, c


def _stats_on_devices(x: np.ndarray, y: np.ndarray) -> Any:
    a, b = jnp.asarray(x), jnp.asarray(y)
    f, g = yax.make_mox(_first)(a, b), yax.make_mox(_second)(a, b)
    if EIGHT:
        a, b = laid_out(a), laid_out(b)
    return yax.compare(f, g, a, b).outputs["out"]


def _compare_end_to_end(p: Pair, sharded: bool) -> None:
    a, b = jnp.asarray(p.x), jnp.asarray(p.y)
    assert a.dtype == p.x.dtype
    f, g = yax.make_mox(_first)(a, b), yax.make_mox(_second)(a, b)
    if sharded and EIGHT:
        a, b = laid_out(a), laid_out(b)
    else:
        sharded = False
    c = yax.compare(f, g, a, b, rtol=p.rtol, atol=p.atol)
    check(c.outputs["out"], reference(p.x, p.y, p.rtol, p.atol), not sharded,
          "compare, laid out over the devices" if sharded else "compare")
    COUNTS["compare end to end" + (", devices" if sharded else "") + (", float64" if p.dtype in WIDE else "")] += 1


def value_reference(a: np.ndarray) -> dict[str, Any]:
    f = np.asarray(a, np.float64)
    fin = f[np.isfinite(f)]
    out = {"nan": int(np.isnan(f).sum()), "posinf": int(np.isposinf(f).sum()), "neginf": int(np.isneginf(f).sum()),
           "zeros": int((f == 0).sum()), "size": f.size, "big": float(np.abs(fin).max()) if fin.size else 0.0}
    stats = (fin.min(), fin.max(), fin.mean(), fin.std()) if fin.size else (math.nan,) * 4
    return out | dict(zip(("min", "max", "mean", "std"), map(float, stats)))


def check_values(got: Any, want: dict[str, Any], exact: bool, what: str) -> None:
    where = f"{what}: got {got!r}, want {want}"
    for k in ("nan", "posinf", "neginf", "zeros", "size"):
        assert getattr(got, k) == want[k], f"{k} {where}"
    for k in ("min", "max"):
        g, w = getattr(got, k), want[k]
        assert (math.isnan(g) and math.isnan(w)) or g == w, f"{k} {where}"
    r, spread = (1e-13, 1e-13) if exact else (2e-5, 2e-6)
    for k in ("mean", "std"):
        g, w = getattr(got, k), want[k]
        if math.isnan(w):
            assert math.isnan(g), f"{k} {where}"
        else:
            assert abs(g - w) <= r * abs(w) + spread * want["big"], f"{k} {where}"


def _subnormal(a: np.ndarray) -> bool:
    f = np.abs(np.asarray(a, np.float64))
    return bool(np.any((f > 0) & (f < float(ml_dtypes.finfo(a.dtype).tiny))))


@SETTINGS
@given(pairs())
def test_value_statistics_are_float64_numpys(p: Pair) -> None:
    """`ValueStats.of` (`first_nonfinite`'s report) on the host and over the devices, and the explorer's
    `reduced_stats` where its documented domain holds (it reads subnormals as 0)."""
    for a in (p.x, p.y):
        want = value_reference(a)
        check_values(ValueStats.of(a), want, True, "host")
        COUNTS["ValueStats: host"] += 1
        if not EIGHT:
            continue
        d = laid_out(jnp.asarray(a))
        check_values(ValueStats.of(d), want, _subnormal(a), "devices")
        COUNTS["ValueStats: devices"] += 1
        if _subnormal(a):
            continue
        stats, counts = jax.device_get(reduced_stats(d))
        n, nan, posinf, neginf, zeros = (int(c) for c in counts)
        assert (n + nan + posinf + neginf, nan, posinf, neginf, zeros) == (
            want["size"], want["nan"], want["posinf"], want["neginf"], want["zeros"])
        if n:
            got = ValueStats(str(a.dtype), *map(float, stats), nan, posinf, neginf, zeros, a.size)
            check_values(got, want, False, "reduced_stats")
        COUNTS["reduced_stats"] += 1


# -- (b) weights -----------------------------------------------------------------------------

#: every dtype `save_weights` stores (its docstring's list: safetensors' dtypes)
SAVED = ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float16", "bfloat16",
         "float32", "float64", "complex64", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
         "float8_e8m0fnu")
DTYPES = {name: np.dtype(getattr(ml_dtypes, name, None) or name) for name in SAVED}


def _edges(dt: np.dtype) -> list[bytes]:
    """Values each dtype's round trip must keep, as bytes."""
    if dt == np.bool_:
        return [b"\x00", b"\x01"]
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        vals = [info.min, info.max, 0, 1, 2**31 - 1, 2**31, 2**32 + 1, 2**40 + 3, -1, -(2**40 + 3), -(2**31) - 1]
        return [np.array(v, dt).tobytes() for v in vals if info.min <= v <= info.max]
    if np.issubdtype(dt, np.complexfloating):
        parts = _edges(np.dtype(np.float32))
        return [a + b for a, b in zip(parts, parts[1:] + parts[:1])]
    info = ml_dtypes.finfo(dt)
    u = np.dtype(f"u{dt.itemsize}")
    with np.errstate(over="ignore", invalid="ignore"):
        vals = [np.array(v).astype(dt) for v in (0.0, -0.0, math.inf, -math.inf, math.nan, 0.1, -2.5, 2**40 + 3, 1e300,
                                                 float(info.max), -float(info.max), float(info.tiny))]
    sign, ones = 1 << (info.bits - 1), ((1 << info.nexp) - 1) << info.nmant
    quiet = 1 << max(info.nmant - 1, 0)
    raw = [v.tobytes() for v in vals]
    # the smallest subnormals of both signs; NaN payloads: signalling, quiet with a payload, negative
    raw += [np.array(k, u).tobytes() for k in (1, 2, sign | 1, ones | 1, ones | quiet | 5, sign | ones | 3)]
    return raw


@st.composite
def leaves(draw: Any) -> np.ndarray:
    name = draw(st.sampled_from(sorted(DTYPES)))
    dt = DTYPES[name]
    shape = draw(st.one_of(st.lists(st.integers(1, 4), max_size=3).map(tuple), st.just((0,))))
    n = math.prod(shape)
    if dt == np.bool_:
        return np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool).reshape(shape)
    item = st.one_of(st.binary(min_size=dt.itemsize, max_size=dt.itemsize), st.sampled_from(_edges(dt)))
    data = b"".join(draw(st.lists(item, min_size=n, max_size=n)))
    return np.frombuffer(data, dt).reshape(shape).copy()


@dataclasses.dataclass(frozen=True)
class Tree:
    leaves: dict[str, np.ndarray]  # key ("a/b") -> the saved values
    held: dict[str, str]  # key -> how the saved tree holds it: numpy, scalar or jax
    like: str  # tree | sds | numpy
    key: int | None  # a PRNG key array saved beside them, by its seed


@st.composite
def trees(draw: Any) -> Tree:
    names = draw(st.lists(st.sampled_from(("w", "b", "kernel", "step", "sub/w", "sub/deep/x", "sub/deep/y")),
                          min_size=1, max_size=6, unique=True))
    values = {k: draw(leaves()) for k in names}
    held = {k: draw(st.sampled_from(("numpy", "scalar", "jax") if v.shape == () else ("numpy", "jax")))
            for k, v in values.items()}
    return Tree(values, held, draw(st.sampled_from(("tree", "sds", "numpy"))),
                draw(st.one_of(st.none(), st.integers(0, 2**31 - 1))))


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in flat.items():
        *path, last = k.split("/")
        d = out
        for p in path:
            d = d.setdefault(p, {})
        d[last] = v
    return out


def held(dt: np.dtype) -> bool:
    """Whether JAX, in the current x64 mode, holds arrays of ``dt`` as they are (written here, not asked of yax)."""
    return dt.itemsize < 8 or dt == np.complex64 or bool(jax.config.read("jax_enable_x64"))


def round_trip(t: Tree, folder: str) -> None:
    def saved(k: str, a: np.ndarray) -> Any:
        how = t.held[k]
        if how == "jax" and held(a.dtype):
            return jnp.asarray(a)
        return a[()] if how == "scalar" else a

    flat: dict[str, Any] = {k: saved(k, a) for k, a in t.leaves.items()}
    if t.key is not None:
        flat["rng"] = jax.random.key(t.key)
    tree = nest(flat)
    path = os.path.join(folder, "w.safetensors")
    yax.save_weights(tree, path)
    if t.like == "sds":
        like = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), tree)
    elif t.like == "numpy":
        like = jax.tree_util.tree_map(lambda a: a if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else np.array(a),
                                      tree)
    else:
        like = tree
    loaded = yax.load_weights(path, like=like)
    assert jax.tree_util.tree_structure(loaded) == jax.tree_util.tree_structure(like)
    got = {k: v for k, v in flat.items()}
    for kp, leaf in jax.tree_util.tree_flatten_with_path(loaded)[0]:
        k = "/".join(str(getattr(e, "key", e)) for e in kp)
        got[k] = leaf
    if t.key is not None:
        assert jnp.issubdtype(got["rng"].dtype, jax.dtypes.prng_key)
        np.testing.assert_array_equal(jax.random.key_data(got["rng"]), jax.random.key_data(flat["rng"]))
    for k, want in t.leaves.items():
        g = got[k]
        what = f"{k}: {want.dtype}{list(want.shape)}, x64 {jax.config.read('jax_enable_x64')}, like={t.like}"
        assert g.dtype == want.dtype and g.shape == want.shape, f"{what}: got {g.dtype}{list(g.shape)}"
        assert isinstance(g, jax.Array if held(want.dtype) else np.ndarray), f"{what}: got a {type(g).__name__}"
        g_bytes = np.ascontiguousarray(np.asarray(g)).tobytes()
        assert g_bytes == want.tobytes(), f"{what}: bits {g_bytes.hex()} != {want.tobytes().hex()}"


@SETTINGS
@given(trees())
def test_weights_round_trip_bit_exact_with_their_dtypes(t: Tree) -> None:
    with tempfile.TemporaryDirectory() as folder:
        round_trip(t, folder)
        COUNTS["weights: x64 off"] += 1
        with jax.enable_x64(True):
            round_trip(t, folder)
        COUNTS["weights: x64 on"] += 1
