"""Deep models: tracing reaches the depth Flax itself runs at, and `sub` works
on any MoX `make_mox` produced (iterative walks, no recursion limit)."""

import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import yax

pytestmark = pytest.mark.core


class Nest(nn.Module):
    """``depth`` modules, each calling the next and adding 1; a Dense innermost."""

    depth: int

    @nn.compact
    def __call__(self, x):
        if self.depth == 0:
            return nn.Dense(3)(x)
        return Nest(self.depth - 1)(x) + 1


def flax_limit(x, hi=400):
    """The deepest `Nest` Flax's own `init` runs under the default recursion limit."""
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            Nest(mid).init(jax.random.key(0), x)
            lo = mid
        except RecursionError:
            hi = mid - 1
    return lo


def test_tracing_reaches_flax_depth_and_sub_rewrites_it():
    assert sys.getrecursionlimit() == 1000
    x = jnp.linspace(-1, 1, 6).reshape(2, 3)
    depth = flax_limit(x)
    assert depth > 150
    m = Nest(depth)
    params = m.init(jax.random.key(0), x)
    mox = yax.make_mox(m.apply)(params, x)
    assert sys.getrecursionlimit() == 1000  # raised while tracing only
    np.testing.assert_allclose(yax.eval_mox(mox, params, x), m.apply(params, x), rtol=1e-6)
    dense = yax.query('//module_call[@type="Dense"]', mox)
    assert len(dense) == 1 and dense[0].path.count("/") == depth + 1
    new = yax.sub(dense, lambda h: h * 0.0, mox)
    np.testing.assert_allclose(yax.eval_mox(new, params, x), np.full((2, 3), float(depth)), rtol=1e-6)
    lora, lp = yax.sub(dense, yax.LoRA(rank=2), mox, params=params, key=jax.random.key(1))
    np.testing.assert_allclose(yax.eval_mox(lora, lp, x), m.apply(params, x), rtol=1e-6)
