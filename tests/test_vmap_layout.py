"""Calls under `jax.vmap` read in the stacked layout (issue 37, point 1).

A call's values under ``jax.vmap`` come out as ``jax.vmap(call)(x)`` returns
them: the mapped axes first, outermost first, whatever layout JAX's batching
rules left them in. Each test compares with the same computation written in
plain JAX, without yax.
"""

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import yax

pytestmark = pytest.mark.core

K = jax.random.PRNGKey(0)
X = jax.random.normal(jax.random.PRNGKey(1), (7, 3))


@pytest.fixture(scope="module")
def lin():
    return eqx.nn.Linear(3, 5, use_bias=False, key=K)


@pytest.fixture(scope="module")
def mox(lin):
    return yax.make_mox(lambda m, x: jnp.tanh(jax.vmap(m)(x)))(lin, X)


def test_capture_and_shapes_in_stacked_layout(lin, mox):
    out, values = yax.capture("//module_call", mox, lin, X)
    (v,) = values.values()
    np.testing.assert_array_equal(v, jax.vmap(lin)(X))
    node = yax.query("//module_call", mox)[0]
    assert node.outputs[0].shape == (7, 5)
    assert "f32[7,5]" in yax.summary(mox)
    np.testing.assert_allclose(out, jnp.tanh(jax.vmap(lin)(X)), rtol=1e-6)


def test_patch_steers_along_the_right_axis(lin, mox):
    v = jax.random.normal(jax.random.PRNGKey(2), (5,))
    steered = yax.patch("//module_call", mox, lambda path, h, s: h + s)(v, lin, X)
    np.testing.assert_allclose(steered, jnp.tanh(jax.vmap(lin)(X) + v), rtol=1e-6, atol=1e-6)


def test_function_replacement_takes_the_users_layout(lin, mox):
    w2 = jax.random.normal(jax.random.PRNGKey(3), (3, 5))
    new = yax.sub("//module_call", lambda x: x @ w2, mox)
    np.testing.assert_allclose(yax.eval_mox(new, lin, X), jnp.tanh(X @ w2), rtol=1e-5, atol=1e-6)
    with pytest.raises(yax.errors.DoesNotFit) as e:
        yax.sub("//module_call", lambda x: (x @ w2).T, mox)
    assert (e.value.index, e.value.found, e.value.expected) == (0, "f32[5,7]", "f32[7,5]")


def test_plain_activation_under_vmap():
    w = jax.random.normal(K, (5, 3))
    f = lambda w, x: jax.vmap(lambda xi: jax.nn.gelu(w @ xi))(x)  # noqa: E731
    mox = yax.make_mox(f)(w, X)
    _, values = yax.capture("//activation", mox, w, X)
    (v,) = values.values()
    np.testing.assert_allclose(v, jax.nn.gelu(X @ w.T), rtol=1e-6)


@pytest.mark.parametrize("in_axes,out_axes", [(0, 0), (1, 0), (1, 1), (0, 1)])
def test_nested_vmaps_and_axes(in_axes, out_axes):
    """Two levels of `jax.vmap`, mapped over axes other than 0: the call's
    values stack the outer level first, then the inner one."""
    lin = eqx.nn.Linear(3, 5, use_bias=False, key=K)
    x = jax.random.normal(K, (4, 6, 3)) if in_axes == 1 else jax.random.normal(K, (6, 4, 3))

    def f(m, x):
        inner = jax.vmap(m, in_axes=0, out_axes=out_axes)
        return jax.vmap(inner, in_axes=in_axes, out_axes=0)(x)

    mox = yax.make_mox(f)(lin, x)
    _, values = yax.capture("//module_call", mox, lin, x)
    (v,) = values.values()
    xs = jnp.moveaxis(x, in_axes, 0)  # (6 or 4, ...) as the outer vmap sees it
    want = jax.vmap(jax.vmap(lin))(xs)
    np.testing.assert_allclose(v, want, rtol=1e-6)
    np.testing.assert_allclose(yax.eval_mox(mox, lin, x), f(lin, x), rtol=1e-6)


def test_scan_inside_vmap_and_vmap_inside_scan():
    """A scan body traced first and mapped afterwards (its jaxpr batched by
    JAX) reads in the same layout as a vmap traced directly."""
    w = jax.random.normal(K, (3, 3))

    class Cell(eqx.Module):
        w: jax.Array

        def __call__(self, h):
            return jnp.tanh(self.w @ h)

    cell = Cell(w)

    def scanned(c, x):  # x: (steps, 3); vmapped over a batch of sequences
        return jax.lax.scan(lambda h, _: (c(h), c(h)), x[0], None, length=4)[1]

    xb = jax.random.normal(K, (7, 4, 3))
    f = lambda c, x: jax.vmap(lambda xi: scanned(c, xi))(x)  # noqa: E731
    mox = yax.make_mox(f)(cell, xb)
    _, values = yax.capture("//module_call", mox, cell, xb)
    want = jax.vmap(lambda xi: scanned(cell, xi))(xb)  # (7, 4, 3)
    got = list(values.values())
    # inside a scan: stacked per step first (the scan axis), then the vmap's batch as the body saw it
    assert got[0].shape[:1] == (4,)
    np.testing.assert_allclose(got[-1], jnp.moveaxis(want, 1, 0), rtol=1e-6, atol=1e-6)

    g = lambda c, x: jax.lax.scan(lambda h, xi: (h, jax.vmap(c)(xi)), 0.0, x)[1]  # noqa: E731
    mox = yax.make_mox(g)(cell, xb)
    _, values = yax.capture("//module_call", mox, cell, xb)
    (v,) = values.values()
    np.testing.assert_allclose(v, jax.vmap(jax.vmap(cell))(xb), rtol=1e-6)


def test_linen_vmap_in_axes_and_gradients():
    """`nn.vmap` over axis 1 with broadcast parameters: capture gives the stacked layout,
    and gradients through eval_mox equal jax.grad of apply."""
    Mapped = nn.vmap(nn.Dense, in_axes=1, out_axes=1, variable_axes={"params": None},
                     split_rngs={"params": False})

    class M(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.relu(Mapped(4, use_bias=False)(x))

    m = M()
    x = jax.random.normal(K, (2, 6, 3))
    params = m.init(K, x)
    mox = yax.make_mox(m.apply)(params, x)
    _, values = yax.capture('//module_call[@type="Dense"]', mox, params, x)
    (v,) = values.values()
    kernel = params["params"]["VmapDense_0"]["kernel"]
    np.testing.assert_allclose(v, jnp.einsum("bsi,io->sbo", x, kernel), rtol=1e-5, atol=1e-6)
    loss = lambda p: jnp.sum(m.apply(p, x) ** 2)  # noqa: E731
    got = jax.grad(lambda p: jnp.sum(yax.eval_mox(mox, p, x) ** 2))(params)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                           got, jax.grad(loss)(params))


def test_no_layout_ops_left_in_the_tree():
    """The unit axes that move mapped axes to the front leave nothing in the tree
    outside `jax.vmap` (the printed MoX is the one a plain trace gives)."""
    m = nn.Dense(3)
    x = jnp.ones((2, 4))
    p = m.init(K, x)
    text = str(yax.make_mox(m.apply)(p, x))
    assert "squeeze" not in text and "broadcast_in_dim" not in text
