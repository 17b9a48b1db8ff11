"""A jaxpr JAX keeps in its trace cache from an earlier `make_mox` holds that
trace's markers; a later trace must neither fail on them nor take them for its
own calls (marker ids are unique in the process, `yax._record._IDS`)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import yax

pytestmark = pytest.mark.core


@jax.jit
def _helper(h):
    return jax.nn.gelu(h) * 2.0  # traced (and its jaxpr cached) inside the first make_mox


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        return _helper(nn.relu(nn.Dense(3)(x)))


def test_a_cached_jaxpr_with_an_earlier_traces_markers():
    x = jnp.linspace(-1, 1, 8).reshape(2, 4)
    m = Block()
    p = m.init(jax.random.PRNGKey(0), x)
    first = yax.make_mox(m.apply)(p, x)
    second = yax.make_mox(m.apply)(p, x)  # _helper's jaxpr comes from JAX's cache this time
    for mox in (first, second):
        np.testing.assert_allclose(yax.eval_mox(mox, p, x), m.apply(p, x), rtol=1e-6)
        paths = [n.path for n in yax.query("//module_call | //activation", mox)]
        assert len(paths) == len(set(paths)), paths
    # no call of the second trace is named after a marker of the first, and the second sees what the
    # first saw (the helper's activation: JAX's cache no longer hands back the first trace's jaxpr)
    assert [n.path for n in yax.query("//module_call", second)] == ["Block", "Block/Dense_0"]
    assert [n.path for n in yax.query("//activation", second)] == [n.path for n in yax.query("//activation", first)]


class Deeper(nn.Module):
    @nn.compact
    def __call__(self, x):
        for _ in range(3):
            x = nn.Dense(4)(x)
        return _helper(x)


def test_a_cached_jaxpr_from_another_model():
    """The cached helper's markers were numbered in a trace of another model, where
    its numbers named other calls."""
    x = jnp.linspace(-1, 1, 8).reshape(2, 4)
    a, b = Block(), Deeper()
    pa, pb = a.init(jax.random.PRNGKey(0), x), b.init(jax.random.PRNGKey(1), x)
    yax.make_mox(lambda p, x: _helper(a.apply(p, x)))(pa, x)
    mox = yax.make_mox(lambda p, x: _helper(b.apply(p, x)))(pb, x)
    np.testing.assert_allclose(yax.eval_mox(mox, pb, x), _helper(b.apply(pb, x)), rtol=1e-6)
    assert [n.path for n in yax.query("//module_call", mox)] == ["Deeper", *(f"Deeper/Dense_{i}" for i in range(3))]
