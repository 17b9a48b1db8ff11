"""A module method that ends by an exception the model's own code (or Flax's) catches.

Its entry marker is in the jaxpr and its exit marker never comes: the trace used to stop with
"Internal error: the call of `Model` ended inside another call" (or "never returned"). DeepMind's
`gemma` library hit it: its `Transformer` defines `__getattr__`, which Flax wraps as a module
method, and `nn.jit` probes ``hasattr(module, "__fn_or_cls__")`` through it. Such a call is in no
tree; what it bound before raising stays in its caller, and the MoX computes what the model does.
Written from scratch in the same patterns, for linen, nnx and Equinox.
"""

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import yax

pytestmark = pytest.mark.core

X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
KEY = jax.random.key(0)


class LinenHelper(nn.Module):
    """A helper method that raises inside a ``try`` its caller catches."""

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(3, name="d")(x)
        try:
            self.check(h)
        except ValueError:
            h = h * 2.0
        return nn.relu(h)

    def check(self, h):
        jnp.sin(h)  # bound before raising: dead code in the caller
        raise ValueError("not this one")


class LinenGetattr(nn.Module):
    """``__getattr__`` (Flax wraps it as a module method) and ``hasattr`` through it."""

    @nn.compact
    def __call__(self, x):
        assert not hasattr(self, "missing")
        return nn.Dense(3)(x)

    def __getattr__(self, name):
        return super().__getattr__(name)


class LinenJit(nn.Module):
    """``__getattr__`` and ``nn.jit`` on ``__call__``, as gemma's `Transformer`: the lift probes
    ``hasattr(module, "__fn_or_cls__")``, which raises through the marked ``__getattr__``."""

    def __getattr__(self, name):
        return super().__getattr__(name)

    @nn.jit
    @nn.compact
    def __call__(self, x):
        return jnp.tanh(nn.Dense(3)(x))


class NnxHelper(nnx.Module):
    def __init__(self, rngs):
        self.d = nnx.Linear(3, 3, rngs=rngs)

    def check(self, h):
        raise ValueError("not this one")

    def __call__(self, x):
        h = self.d(x)
        try:
            self.check(h)
        except ValueError:
            h = h - 1.0
        return nnx.relu(h)


class EqxInner(eqx.Module):
    lin: eqx.nn.Linear

    def __call__(self, x):
        if x.shape[-1] != 5:
            raise ValueError("wants 5 features")
        return self.lin(x)


class EqxOuter(eqx.Module):
    inner: EqxInner
    lin: eqx.nn.Linear

    def __call__(self, x):
        try:
            return self.inner(x)
        except ValueError:
            return jax.nn.gelu(jax.vmap(self.lin)(x))


def _linen(model):
    params = model.init(KEY, X)
    return yax.make_mox(model.apply)(params, X), (params, X), lambda p, x: model.apply(p, x)


def _nnx(model):
    state = nnx.state(model)
    graphdef = nnx.graphdef(model)
    mox = yax.make_mox(model)(X)

    def real(s, x):
        return nnx.merge(graphdef, s)(x)

    return mox, (state, X), real


CASES = {
    "linen helper": lambda: _linen(LinenHelper()),
    "linen __getattr__": lambda: _linen(LinenGetattr()),
    "linen nn.jit with __getattr__": lambda: _linen(LinenJit()),
    "nnx helper": lambda: _nnx(NnxHelper(nnx.Rngs(0))),
}


def _out(mox, args):
    out = yax.eval_mox(mox, *args)
    return out[0] if isinstance(out, tuple) else out  # nnx: (output, state after the call)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_call_that_raised_is_in_no_tree_and_the_mox_computes_the_model(name):
    mox, args, real = CASES[name]()
    text = str(mox)
    assert "optimization_barrier" not in text, text  # no marker of the call that raised is left
    assert not yax.query("//*[@name='check' or @name='__getattr__']", mox), text
    assert len(yax.query("//module_call", mox)) == 2, text  # the model and its dense layer
    want = real(*args)
    np.testing.assert_allclose(_out(mox, args), want, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda *a: _out(mox, a))(*args), want, rtol=1e-6)
    g = jax.grad(lambda x: _out(mox, (args[0], x)).sum())(X)
    np.testing.assert_allclose(g, jax.grad(lambda x: real(args[0], x).sum())(X), rtol=1e-6)
    yax.check_mox(mox)


def test_an_equinox_call_that_raised_is_in_no_tree():
    k1, k2 = jax.random.split(KEY)
    model = EqxOuter(EqxInner(eqx.nn.Linear(5, 3, key=k1)), eqx.nn.Linear(3, 3, key=k2))
    mox = yax.make_mox(model)(X)
    assert "optimization_barrier" not in str(mox)
    assert [n.path for n in yax.query("//module_call", mox)] == ["EqxOuter", "EqxOuter/lin"], str(mox)
    out = yax.eval_mox(mox, model, X)
    np.testing.assert_allclose(out, model(X), rtol=1e-6)
    yax.check_mox(mox)
