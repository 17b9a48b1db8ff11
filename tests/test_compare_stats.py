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
    with pytest.raises(yax.YaxInputError, match="scalar"):
        yax.compare(mox, gelu, p, x, grad_of=lambda out: out)


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
