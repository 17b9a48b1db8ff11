"""`compare`'s statistics never show a number they did not compute: entries that are NaN
or ±Inf in either model are left out and counted, and a statistic without a value says why;
and with ``grad_of`` the parameters' gradients are compared too."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import KEY

import yax

pytestmark = pytest.mark.core


class Masked(nn.Module):
    """Scores with -inf where a causal mask hides them, as attention logits are."""

    @nn.compact
    def __call__(self, x):
        h = nn.relu(nn.Dense(8)(x))
        mask = jnp.tril(jnp.ones((8, 8), bool))
        return jnp.where(mask, h[:, :, None] * h[:, None, :], -jnp.inf)


def _case():
    x = jax.random.normal(KEY, (2, 4))
    m = Masked()
    p = m.init(KEY, x)
    return yax.make_mox(m.apply)(p, x), p, x


def test_identical_infinities_are_left_out_and_counted_not_folded_into_rel_or_cos():
    mox, p, x = _case()
    c = yax.compare(mox, yax.sub('//activation[@name="relu"]', jax.nn.gelu, mox), p, x)
    s = c.outputs["out"]
    a, b = (np.asarray(v) for v in c.arrays["out"])
    fin = np.isfinite(a)
    assert s.nonfinite == int((~fin).sum()) == 2 * 28 and s.changed == 0
    # rel and cos over the finite entries, as numpy computes them there
    x_, y_ = a[fin], b[fin]
    assert s.rel == pytest.approx(np.linalg.norm(y_ - x_) / np.linalg.norm(x_), rel=1e-5)
    assert s.cosine == pytest.approx(x_ @ y_ / np.linalg.norm(x_) / np.linalg.norm(y_), rel=1e-5)
    assert s.rel > 0 and not s.undefined and not s.allclose
    assert "non-finite left out" in repr(c)


def test_a_nan_that_appears_is_a_change_never_allclose():
    mox, p, x = _case()
    logged = yax.sub('//activation[@name="relu"]', jnp.log, mox)  # NaN where Dense gives negatives
    c = yax.compare(mox, logged, p, x)
    s = c.boundaries["Masked/relu (now log)".split(" ")[0]]
    assert s.changed > 0 and not s.allclose
    assert c.label("Masked/relu") == "Masked/relu (now log)"


def test_a_statistic_that_cannot_be_computed_is_undefined_with_the_reason():
    f = yax.make_mox(lambda x: jax.nn.relu(x) - 1.0)(jnp.ones(3))  # 0 everywhere
    g = yax.sub('//activation[@name="relu"]', lambda x: x + 1.0, f)
    c = yax.compare(f, g, jnp.ones(3))
    s = c.outputs["out"]
    assert np.isnan(s.rel) and "original is 0" in s.why("rel")
    assert np.isnan(s.cosine) and "original is" in s.why("cosine")
    assert not s.allclose and s.max_abs == 1.0
    assert "undefined" in repr(c)
    # two zero values: equal (rel 0), but no angle between them
    same = yax.compare(f, f, jnp.ones(3)).outputs["out"]
    assert same.rel == 0 and np.isnan(same.cosine) and "both are 0" in same.why("cosine") and same.allclose
    # nothing finite at all
    inf = yax.make_mox(lambda x: x * jnp.inf)(jnp.ones(3))
    s = yax.compare(inf, inf, jnp.ones(3)).outputs["out"]
    assert s.nonfinite == 3 and s.changed == 0 and s.allclose and "no entry is finite" in s.why("rel")


def test_gradients_compared_with_respect_to_the_parameters():
    m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)])
    x = jax.random.normal(KEY, (3, 5))
    p = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(p, x)

    def loss(out):
        return (out ** 2).sum()

    same = yax.compare(mox, mox, p, x, grad_of=loss)
    assert same.allclose and set(same.gradients) == {
        f"['params']['layers_{i}']['{w}']" for i in (0, 2) for w in ("kernel", "bias")}
    assert all(s.max_abs == 0 for s in same.gradients.values())
    gelu = yax.sub('//activation[@name="relu"]', jax.nn.gelu, mox)
    c = yax.compare(mox, gelu, p, x, grad_of=loss)
    # against jax.grad of hand-written models
    def hand(params, act):
        q = params["params"]
        h = act(x @ q["layers_0"]["kernel"] + q["layers_0"]["bias"])
        return loss(h @ q["layers_2"]["kernel"] + q["layers_2"]["bias"])

    ga, gb = jax.grad(hand)(p, jax.nn.relu), jax.grad(hand)(p, jax.nn.gelu)
    k = ga["params"]["layers_0"]["kernel"]
    d = np.abs(np.asarray(gb["params"]["layers_0"]["kernel"]) - np.asarray(k)).max()
    assert c.gradients["['params']['layers_0']['kernel']"].max_abs == pytest.approx(float(d), rel=1e-4)
    assert not c.allclose
    with pytest.raises(yax.errors.LossNotScalar) as e:
        yax.compare(mox, gelu, p, x, grad_of=lambda out: out)
    assert isinstance(e.value, yax.YaxInputError) and e.value.tool == "compare"


def test_finite_values_whose_squares_overflow_float32_keep_exact_statistics():
    """Entries near float32's maximum are finite, but their squares and differences are not:
    the norms are then taken in float64 rather than reported as inf, 0 or NaN."""
    from yax._compare import _stats

    x = np.array([3e38, -3e38, 1.0], np.float32)
    y = np.array([3e38, 3e38, 1.0], np.float32)
    s = _stats(x, y, 1e-5, 1e-6)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    assert s.max_abs == pytest.approx(6e38) and s.nonfinite == 0 and not s.undefined
    assert s.rel == pytest.approx(np.linalg.norm(y64 - x64) / np.linalg.norm(x64))
    assert s.cosine == pytest.approx(x64 @ y64 / (np.linalg.norm(x64) * np.linalg.norm(y64)))
    assert not s.allclose


def _float64_stats(x, y):
    """What `Stats` should say of two arrays, in float64 NumPy over the entries finite in both."""
    x, y = np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()
    fin = np.isfinite(x) & np.isfinite(y)
    x, y = x[fin], y[fin]
    d = np.abs(y - x)
    return {"max_abs": d.max(), "mean_abs": d.mean(), "rel": np.linalg.norm(d) / np.linalg.norm(x),
            "cosine": x @ y / (np.linalg.norm(x) * np.linalg.norm(y))}


def test_gradients_of_a_tiny_loss_keep_rel_and_cosine():
    """Issue 37.4: with ``grad_of=lambda o: 1e-24 * jnp.sum(o**2)`` the gradients' squares underflow
    float32, and `compare` reported rel 0.0 and cosine NaN ("both are 0 at every finite entry"). A loss
    scaled by 2**-80 scales every gradient by exactly 2**-80: rel and cosine are those of the loss
    unscaled, max|Δ| and mean|Δ| scaled by 2**-80."""
    m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)])
    x = jax.random.normal(KEY, (3, 5))
    p = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(p, x)
    gelu = yax.sub('//activation[@name="relu"]', jax.nn.gelu, mox)
    plain = yax.compare(mox, gelu, p, x, grad_of=lambda o: jnp.sum(o ** 2)).gradients
    tiny = yax.compare(mox, gelu, p, x, grad_of=lambda o: 2.0 ** -80 * jnp.sum(o ** 2)).gradients
    for k, s in plain.items():
        t = tiny[k]
        assert not t.undefined and t.rel > 0
        assert t.rel == pytest.approx(s.rel, rel=1e-12) and t.cosine == pytest.approx(s.cosine, rel=1e-12)
        assert t.max_abs == pytest.approx(s.max_abs * 2.0 ** -80, rel=1e-12)
        assert t.mean_abs == pytest.approx(s.mean_abs * 2.0 ** -80, rel=1e-12)
    # the issue's own loss: not a power of two, so the same to float32's precision
    t = yax.compare(mox, gelu, p, x, grad_of=lambda o: 1e-24 * jnp.sum(o ** 2)).gradients
    for k, s in plain.items():
        assert t[k].rel == pytest.approx(s.rel, rel=1e-4) and t[k].cosine == pytest.approx(s.cosine, rel=1e-4)


def test_finite_values_whose_squares_underflow_float32_keep_exact_statistics():
    """The twin of the overflow case above: values near 1e-30 have squares below float32's range."""
    from yax._compare import _stats

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(64) * 1e-30).astype(np.float32)
    for y in ((x * 1.5).astype(np.float32), (rng.standard_normal(64) * 1e-30).astype(np.float32),
              (x * 1e-8).astype(np.float32)):  # near 1e-38: squares below even float32's subnormals
        s = _stats(x, y, 1e-5, 1e-6)
        want = _float64_stats(x, y)
        assert not s.undefined
        for k, v in want.items():
            assert getattr(s, k) == pytest.approx(v, rel=1e-12), k


def test_statistics_of_many_values_are_float64_sums():
    """Two million float32 values: float32 dot products (BLAS ``sdot``) were off by 7e-6 relative,
    enough to report a cosine above 1 for two models that differ."""
    from yax._compare import _stats

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(2**21) + 1).astype(np.float32)
    y = (x * np.float32(1.0001)).astype(np.float32)
    s = _stats(x, y, 1e-5, 1e-6)
    want = _float64_stats(x, y)
    for k, v in want.items():
        assert getattr(s, k) == pytest.approx(v, rel=1e-10), k
    assert s.cosine <= 1.0


def _laid_out(*arrays):
    """Each array split over the 8 CPU devices tests/conftest.py asks XLA for."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]), ("d",))
    return [jax.device_put(a, NamedSharding(mesh, P("d"))) for a in arrays]


eight = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")


def _spread_and_host(x, y):
    from yax._compare import _spread_stats, _stats

    [[whole, _]] = _spread_stats([(_laid_out(x), _laid_out(y))], (0,), 1e-5, 1e-6)
    return whole, _stats(x, y, 1e-5, 1e-6)


@eight
def test_sharded_statistics_of_values_of_very_different_sizes():
    """On the devices, one scale (the largest of both models' values) was shared by x, y and their
    difference: a modified model 1e-30 times the original had every square flushed to 0 and no cosine."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(64).astype(np.float32)
    for y in ((x * 1e-30).astype(np.float32), (x * 1e30).astype(np.float32)):
        got, host = _spread_and_host(x, y)
        want = _float64_stats(x, y)
        assert not got.undefined and not host.undefined
        for k, v in want.items():
            assert getattr(host, k) == pytest.approx(v, rel=1e-12), k
            assert getattr(got, k) == pytest.approx(v, rel=1e-5), k


@eight
def test_sharded_differences_beyond_float32s_range_are_not_inf():
    """3e38 - (-3e38) is finite in float64 but not in float32: the device's difference was inf,
    so max|Δ|, mean|Δ| and rel were reported as inf."""
    x = np.array([3e38, -3e38] + [1.0] * 6, np.float32)
    y = np.array([3e38, 3e38] + [1.0] * 6, np.float32)
    got, host = _spread_and_host(x, y)
    want = _float64_stats(x, y)
    for k, v in want.items():
        assert getattr(got, k) == pytest.approx(v, rel=1e-6), k
        assert getattr(host, k) == pytest.approx(v, rel=1e-12), k


@eight
def test_sharded_subnormal_values_are_not_flushed_to_zero():
    """XLA flushes float32 subnormals (below 1.2e-38) to zero on CPU and GPU: reduced on the devices,
    such values read as 0 (no difference, a zero original). They are measured on the host instead."""
    from yax.internal import ValueStats

    x = (np.arange(1, 65) * 1e-42).astype(np.float32)
    y = (x * 2).astype(np.float32)
    got, host = _spread_and_host(x, y)
    want = _float64_stats(x, y)
    for k, v in want.items():
        assert getattr(got, k) == pytest.approx(v, rel=1e-12), k
    [a] = _laid_out(x)
    s, t = ValueStats.of(a), ValueStats.of(x)
    assert (s.min, s.max, s.zeros) == (t.min, t.max, t.zeros) == (float(x[0]), float(x[-1]), 0)
    assert s.mean == pytest.approx(t.mean, rel=1e-12) and s.std == pytest.approx(t.std, rel=1e-12)


def test_value_stats_of_float64_values_beyond_float32s_range():
    """float64 values (x64 on) are reduced in float64: 1e300 is neither narrowed to +Inf on the
    devices nor squared to inf by NumPy's std on the host."""
    from yax.internal import ValueStats

    with jax.enable_x64(True):
        z = np.array([1e300, -1e300, 1e-300, 2.0, 0.0, 0.0, 0.0, 0.0])
        values = [z] + (_laid_out(jnp.asarray(z)) if len(jax.devices()) >= 8 else [])
        for v in values:
            s = ValueStats.of(v)
            assert (s.nan, s.posinf, s.neginf, s.zeros) == (0, 0, 0, 4), type(v)
            np.testing.assert_allclose([s.min, s.max, s.std], [-1e300, 1e300, 5e299], rtol=1e-12, err_msg=str(type(v)))
            assert abs(s.mean - 0.25) <= 1e-15 * 1e300  # a sum cancelling to 0.25 is known to float64's precision of 1e300


# Counterexamples the oracle (tests/oracle/test_stats_weights_oracle.py) found before the fix.

def test_cosine_of_one_value_and_a_slightly_larger_one_is_one():
    """Float32 sums gave 1.000000005: a cosine above 1."""
    from yax._compare import _stats

    s = _stats(np.array([1.0], np.float32), np.array([1.0001], np.float32), 1e-5, 1e-6)
    assert s.cosine == 1.0


def test_rel_of_one_value_is_its_float64_relative_difference():
    """Float32 sums gave 0.1000000222 for 1 against float32(1.1), whose rel is 0.1000000238."""
    from yax._compare import _stats

    y = np.float32(1.1)
    s = _stats(np.array([1.0], np.float32), np.array([y], np.float32), 1e-5, 1e-6)
    assert s.rel == pytest.approx(float(y) - 1.0, rel=1e-15)


def test_max_abs_is_the_float64_difference_not_its_float32_rounding():
    """|4e8 - 0.3| is 399999999.7; float32 rounded it to 4e8 (max|Δ| and mean|Δ|)."""
    from yax._compare import _stats

    x, y = np.array([0.3], np.float32), np.array([4e8], np.float32)
    s = _stats(x, y, 1e-5, 1e-6)
    want = float(np.float64(y[0]) - np.float64(x[0]))
    assert s.max_abs == want and s.mean_abs == want


@eight
def test_sharded_statistics_of_zeros_and_ones_against_1e26_times_them():
    """On the devices, the shared scale (1e26) made the original's squares (1e-52) flush to 0:
    rel and cosine were undefined ("the original is 0 at every finite entry")."""
    x = np.array([[1, 1, 1, 0, 1], [1, 1, 0, 1, 1], [1, 0, 1, 1, 0]] * 3, np.float32).ravel()[:40]
    y = (x * np.float32(1e26)).astype(np.float32)
    got, host = _spread_and_host(x, y)
    want = _float64_stats(x, y)
    assert not got.undefined and got.cosine == pytest.approx(1.0, abs=1e-6)
    for k, v in want.items():
        assert getattr(got, k) == pytest.approx(v, rel=1e-5), k
        assert getattr(host, k) == pytest.approx(v, rel=1e-12), k


@eight
def test_value_stats_on_devices_count_a_subnormal_as_nonzero():
    """One float32 subnormal (1e-38) among 1e-9s and zeros: on the devices XLA read it as 0 (33
    zeros, not 32)."""
    from yax.internal import ValueStats

    x = np.zeros(64, np.float32)
    x[:31] = 1e-9
    x[31] = 1e-38
    [a] = _laid_out(x)
    s, t = ValueStats.of(a), ValueStats.of(x)
    assert s.zeros == t.zeros == 32
    assert (s.min, s.max) == (t.min, t.max) and s.mean == pytest.approx(t.mean, rel=1e-12)


# float64 models (x64 on): measured in float64, never narrowed to float32 on the way.

def _exact_stats(x, y):
    """`Stats`' four statistics of two float64 arrays, over the entries finite in both, computed
    exactly (rational sums, 40-digit square roots) and rounded once to float64: no square
    over- or underflows, whatever the values' size."""
    from decimal import Decimal, localcontext
    from fractions import Fraction

    x, y = (np.asarray(v, np.float64).ravel() for v in (x, y))
    fin = np.isfinite(x) & np.isfinite(y)
    xs, ys = [Fraction(float(v)) for v in x[fin]], [Fraction(float(v)) for v in y[fin]]
    d = [abs(b - a) for a, b in zip(xs, ys)]
    sx, sy, sd = (sum(v * v for v in vs) for vs in (xs, ys, d))
    dot = sum(a * b for a, b in zip(xs, ys))
    with localcontext() as ctx:
        ctx.prec = 40

        def dec(f):
            return Decimal(f.numerator) / Decimal(f.denominator)

        return {"max_abs": float(dec(max(d))), "mean_abs": float(dec(sum(d) / len(d))),
                "rel": float((dec(sd) / dec(sx)).sqrt()), "cosine": float(dec(dot) / (dec(sx) * dec(sy)).sqrt())}


def _assert_stats(s, want, rel=1e-13):
    assert not s.undefined, s
    for k, v in want.items():
        assert getattr(s, k) == pytest.approx(v, rel=rel, abs=0), (k, s, want)


def _dense64():
    m = nn.Sequential([nn.Dense(8, param_dtype=jnp.float64), nn.tanh, nn.Dense(3, param_dtype=jnp.float64)])
    x = jax.random.normal(KEY, (4, 5), jnp.float64)
    p = m.init(KEY, x)
    q = jax.tree_util.tree_map(lambda a: a * (1 + 1e-12), p)
    return m, p, q, x


def _dense64_reference(p, x):
    """Every call boundary of `_dense64`'s model, by hand."""
    k0, b0 = p["params"]["layers_0"]["kernel"], p["params"]["layers_0"]["bias"]
    k2, b2 = p["params"]["layers_2"]["kernel"], p["params"]["layers_2"]["bias"]
    h = x @ k0 + b0
    t = jnp.tanh(h)
    o = t @ k2 + b2
    return {"Sequential/layers_0": h, "Sequential/tanh": t, "Sequential/layers_2": o, "Sequential": o}


def test_float64_models_differing_by_1e_12_relative_are_told_apart():
    """Measured in float32, two float64 models whose values differ by 1e-12 relative were reported
    equal (max|Δ| 0, rel 0) and allclose at ``rtol=1e-14, atol=0``."""
    with jax.enable_x64(True):
        m, p, q, x = _dense64()
        mox = yax.make_mox(m.apply)(p, x)
        c = yax.compare(mox, mox, p, x, new_params=q, rtol=1e-14, atol=0)
        a, b = c.arrays["out"]
        assert a.dtype == b.dtype == np.float64
        # the values as the model computes them (to float64's rounding: XLA fuses the jitted program otherwise)
        np.testing.assert_allclose(a, m.apply(p, x), rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(b, m.apply(q, x), rtol=1e-14, atol=1e-15)
        _assert_stats(c.outputs["out"], _exact_stats(a, b))
        ra, rb = _dense64_reference(p, x), _dense64_reference(q, x)
        assert list(c.boundaries) == list(ra)
        for k, s in c.boundaries.items():
            # the models' values to float64's rounding (an ulp of 1 is 2e-4 of a difference of 1e-12)
            _assert_stats(s, _exact_stats(ra[k], rb[k]), rel=1e-2)
            assert 1e-13 < s.rel < 1e-11 and not s.allclose, k
        assert not c.allclose and c.first_divergence == "Sequential/layers_0"
        # the explorer's path (`measure`, `compare_measured`) gives the same statistics
        from yax.internal import compare_measured, measure, paired_outputs

        ia, ib = paired_outputs(mox, mox)
        ma = measure(mox, (p, x), {}, ia)
        e = compare_measured(mox, mox, ma, measure(mox, (q, x), {}, ib, eager=ma.eager), rtol=1e-14, atol=0)
        assert all(v.dtype == np.float64 for v in ma.taps.values())
        assert (e.outputs, e.boundaries, e.first_divergence) == (c.outputs, c.boundaries, c.first_divergence)
        loose = yax.compare(mox, mox, p, x, new_params=q, rtol=1e-9, atol=0)
        assert loose.allclose and loose.first_divergence is None


def test_float64_values_near_1e300_and_1e_300_keep_exact_statistics():
    """float32 made 1e300 an Inf (left out as non-finite) and 1e-300 a 0 (rel 0: "no difference")."""
    with jax.enable_x64(True):
        for x in (np.array([1e300, 3e300, 1e-300, 2e-300, 5.0]),  # squares beyond float64's range
                  np.array([1e-300, 3e-300, 3e-308, 7e-305]),  # squares below it
                  np.array([1e308, 1e-300, 2.0, 1.1e308])):  # and their sums
            f = yax.make_mox(lambda v: jax.nn.relu(v) * 2.0)(x)
            g = yax.sub('//activation[@name="relu"]', lambda v: v * 1.5, f)
            c = yax.compare(f, g, x, rtol=0.25, atol=0)
            want = _exact_stats(x, x * 1.5)
            _assert_stats(c.boundaries["relu"], want)
            assert c.boundaries["relu"].nonfinite == 0
            assert not c.boundaries["relu"].allclose  # |Δ| = 0.5|x| > 0.25|x|
            with np.errstate(over="ignore"):
                _assert_stats(c.outputs["out"], _exact_stats(x * 2.0, x * 1.5 * 2.0))
        # subnormal values, which XLA flushes to 0 in the models' arithmetic: measured as they are on the host
        from yax._compare import _stats

        x = np.array([1e-300, 5e-324, -2e-310, 3e-308])
        y = np.array([1e-300, 1e-323, 2e-310, 0.0])
        _assert_stats(_stats(x, y, 1e-5, 0), _exact_stats(x, y))
        # differences beyond float64's range: max|Δ| is float64's +Inf (as NumPy's), the others exact
        x = np.array([1.5e308, 1.0])
        f = yax.make_mox(lambda v: jax.nn.relu(v) * 1.0)(x)
        s = yax.compare(f, yax.sub('//activation[@name="relu"]', lambda v: -v, f), x).outputs["out"]
        assert s.max_abs == np.inf and s.nonfinite == 0 and not s.allclose
        want = _exact_stats(x, -x)
        assert (s.rel, s.cosine) == (pytest.approx(want["rel"], rel=1e-15), -1.0)
        assert s.mean_abs == pytest.approx(want["mean_abs"], rel=1e-15)


class _Cell64(nn.Module):
    @nn.compact
    def __call__(self, h, _):
        h = jnp.tanh(nn.Dense(4, param_dtype=jnp.float64)(h))
        return h, None


class _Scan64(nn.Module):
    @nn.compact
    def __call__(self, h):
        scan = nn.scan(_Cell64, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)
        return scan(name="cells")(h, None)[0]


def test_float64_model_inside_a_scan_compared_in_float64_at_every_step():
    with jax.enable_x64(True):
        m = _Scan64()
        x = jax.random.normal(KEY, (2, 4), jnp.float64)
        p = m.init(KEY, x)
        q = jax.tree_util.tree_map(lambda a: a * (1 + 1e-12), p)
        mox = yax.make_mox(m.apply)(p, x)
        c = yax.compare(mox, mox, p, x, new_params=q, rtol=1e-14, atol=0)

        def steps(params):
            w = params["params"]["cells"]["Dense_0"]
            h, dense = x, []
            for i in range(3):
                dense.append(h @ w["kernel"][i] + w["bias"][i])
                h = jnp.tanh(dense[-1])
            return jnp.stack(dense)

        ra, rb = steps(p), steps(q)
        [key] = [k for k in c.steps if k.endswith("Dense_0")]
        assert c.stacks[key] == (3,)
        _assert_stats(c.boundaries[key], _exact_stats(ra, rb), rel=1e-2)
        for i, s in enumerate(c.steps[key]):
            _assert_stats(s, _exact_stats(ra[i], rb[i]), rel=1e-2)
            assert 1e-13 < s.rel < 1e-11 and not s.allclose
        assert c.first_divergence == key and c.first_divergence_step == (0,)


def test_float64_gradients_compared_in_float64():
    with jax.enable_x64(True):
        m, p, q, x = _dense64()
        mox = yax.make_mox(m.apply)(p, x)

        def loss(o):
            return jnp.sum(o ** 2)

        c = yax.compare(mox, mox, p, x, new_params=q, rtol=1e-14, atol=0, grad_of=loss)
        ga, gb = ({jax.tree_util.keystr(k): np.asarray(g) for k, g in
                   jax.tree_util.tree_flatten_with_path(jax.grad(lambda w: loss(m.apply(w, x)))(w))[0]} for w in (p, q))
        assert set(c.gradients) == set(ga) and len(ga) == 4
        for k, s in c.gradients.items():
            a, b = ga[k], gb[k]
            assert a.dtype == np.float64
            _assert_stats(s, _exact_stats(a, b), rel=1e-2)
            assert 1e-13 < s.rel < 1e-10 and not s.allclose, k
        assert not c.allclose


@pytest.mark.slow
def test_float64_statistics_over_many_chunks_keep_one_scale():
    """`_stats` of float64 values sums a chunk at a time, each sum scaled by a power of two near the
    largest value seen so far: chunks of 1e-300, 1 and 1e300 (growing, so the sums are rescaled twice;
    and shrinking) give the statistics of the whole, exactly rounded."""
    from yax._compare import _CHUNK, _stats

    rng = np.random.default_rng(0)
    parts = [rng.standard_normal(_CHUNK) * scale for scale in (1e-300, 1.0, 1e300)]
    for x in (np.concatenate(parts), np.concatenate(parts[::-1])):
        y = x * (1 + rng.standard_normal(x.size) * 1e-12)
        _assert_stats(_stats(x, y, 1e-5, 0), _exact_stats(x, y), rel=1e-12)
        z = x.copy()
        z[:_CHUNK] = 0.0  # the first chunk all zeros: no scale yet
        _assert_stats(_stats(z, y, 1e-5, 0), _exact_stats(z, y), rel=1e-12)
