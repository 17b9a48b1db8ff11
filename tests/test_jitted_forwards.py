"""Forwards the user has already wrapped in ``jax.jit``/``nn.jit``/``nnx.jit``, run before or after
tracing. JAX caches what it traced per function; without a cache of its own, `make_mox` was handed
the jaxpr of the user's earlier run (no module calls: a flat tree, silently), and the other way
round the user's own ``lower`` got yax's trace (its barriers in the user's program) while a second
`make_mox` failed. Each trace now runs in a context of its own in JAX's caches
(``jax.make_user_context``), so looking at a model never changes what it compiles."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import yax

pytestmark = pytest.mark.core

X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)


class Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(2, name="out")(nn.gelu(nn.Dense(4, name="hidden")(x)))


class JitCall(nn.Module):
    """``nn.jit`` on ``__call__``, as DeepMind's gemma `Transformer` has it."""

    @nn.jit
    @nn.compact
    def __call__(self, x):
        return jnp.tanh(nn.Dense(3, name="proj")(x))


class Tower(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(3, 3, rngs=rngs)

    def __call__(self, x):
        return nnx.relu(self.lin(x))


def _paths(mox):
    return [n.path for n in yax.query("//module_call | //activation", mox)]


LINEN = {"jax.jit(apply)": (Mlp(), ["Mlp", "Mlp/hidden", "Mlp/gelu", "Mlp/out"]),
         "nn.jit on __call__": (JitCall(), ["JitCall", "JitCall/proj"])}


@pytest.mark.parametrize("name", sorted(LINEN))
def test_a_forward_run_before_tracing_keeps_its_structure(name):
    model, want = LINEN[name]
    p = model.init(jax.random.key(0), X)
    apply = jax.jit(model.apply)
    expected = apply(p, X)  # the user's run: JAX caches its trace
    mox = yax.make_mox(apply)(p, X)
    assert _paths(mox) == want, str(mox)
    np.testing.assert_allclose(yax.eval_mox(mox, p, X), expected, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(LINEN))
def test_tracing_leaves_the_users_program_alone_and_traces_again_the_same(name):
    model, want = LINEN[name]
    p = model.init(jax.random.key(0), X)
    apply = jax.jit(model.apply)
    first = yax.make_mox(apply)(p, X)
    hlo = apply.lower(p, X).as_text()
    assert "optimization_barrier" not in hlo  # yax's markers are not in the user's program
    assert hlo == jax.jit(model.apply).lower(p, X).as_text()
    second = yax.make_mox(apply)(p, X)
    assert _paths(first) == _paths(second) == want
    np.testing.assert_allclose(yax.eval_mox(second, p, X), apply(p, X), rtol=1e-6)


def test_an_nnx_model_entered_through_a_jitted_forward():
    model = Tower(nnx.Rngs(0))

    @nnx.jit
    def forward(m, x):
        return m(x) * 2.0

    expected = forward(model, X)  # run first, as a user does
    mox = yax.make_mox(forward)(model, X)
    assert [n.path for n in yax.query("//module_call", mox)] == ["Tower", "Tower/lin"], str(mox)
    np.testing.assert_allclose(yax.eval_mox(mox, model, X), expected, rtol=1e-6)
