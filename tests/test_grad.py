"""yax.capture(..., grad_of=loss): the gradient of the loss at every matched node,
checked against the real thing: ``jax.grad`` with respect to a zero added by hand
at that node (in a plain JAX model written out, through flax's method
interceptors for linen and Hugging Face models, layer by layer for scanned
stacks) and ``jax.vjp`` of the rest of the model."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from models import KEY, DecoderLayer, ScannedTransformer
from nnx_models import NNX_CASES
from thirdparty import case

import yax
from yax.internal import capture_programs

pytestmark = pytest.mark.core


def close(a, b, atol=1e-5, rtol=1e-5):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


def sin_loss(out):
    return jnp.sum(jnp.sin(out))


def square_loss(out):
    return sum(jnp.mean(jnp.square(x)) for x in jax.tree_util.tree_leaves(out))


# -- a plain JAX model written out, the zeros added by hand ---------------------------------------

def mlp(p, x):
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return h @ p["w2"] + p["b2"]


def mlp_with_deltas(p, x, d):
    z = x @ p["w1"] + p["b1"] + d["add"]
    h = jnp.tanh(z) + d["tanh"]
    return h @ p["w2"] + p["b2"] + d["add#2"]


@functools.cache
def plain():
    k = jax.random.split(KEY, 5)
    p = {"w1": jax.random.normal(k[0], (3, 5)), "b1": jax.random.normal(k[1], (5,)),
         "w2": jax.random.normal(k[2], (5, 2)), "b2": jax.random.normal(k[3], (2,))}
    x = jax.random.normal(k[4], (4, 3))
    return yax.make_mox(mlp)(p, x), p, x


def test_grads_match_jax_grad_of_zeros_added_by_hand_and_jax_vjp():
    mox, p, x = plain()
    out, values, grads = yax.capture("//add | //tanh", mox, p, x, grad_of=sin_loss)
    assert list(grads) == list(values) == ["add", "tanh", "add#2"]
    zeros = {k: jnp.zeros_like(v) for k, v in values.items()}
    want = jax.grad(lambda d: sin_loss(mlp_with_deltas(p, x, d)))(zeros)
    close(grads, want)
    close(out, mlp(p, x))
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    close(values["tanh"], h)
    # the cotangent at the hidden layer is the vjp of the rest of the model applied to d loss / d out
    rest_out, rest = jax.vjp(lambda h: h @ p["w2"] + p["b2"], h)
    (ct,) = rest(jnp.cos(rest_out))
    close(grads["tanh"], ct)
    close(grads["add"], ct * (1 - h ** 2))
    assert float(jnp.abs(grads["tanh"]).max()) > 0.1  # not vacuous


def test_grad_of_is_jittable_and_compiles_once():
    mox, p, x = plain()

    @jax.jit
    def both(p, x):
        return yax.capture("//tanh", mox, p, x, grad_of=sin_loss)

    for s in (1.0, 2.0, 3.0):
        out, values, grads = both(p, s * x)
        _, _, eager = yax.capture("//tanh", mox, p, s * x, grad_of=sin_loss)
        close(grads, eager)
        want = jax.grad(lambda d: sin_loss(mlp_with_deltas(p, s * x, d)))(
            {"add": jnp.zeros((4, 5)), "tanh": jnp.zeros((4, 5)), "add#2": jnp.zeros((4, 2))})
        close(grads["tanh"], want["tanh"])
    (prog,) = [q for k, q in capture_programs(mox).items() if k[0] == "//tanh" and k[2] == "grad"]
    assert prog.traces == 1
    # the values and the plain capture agree; with inputs, the grads stay per output
    _, plain_values = yax.capture("//tanh", mox, p, x)
    _, with_in, g = yax.capture("//tanh", mox, p, x, grad_of=sin_loss, with_inputs=True)
    close(with_in["tanh"][1], plain_values["tanh"])
    assert g["tanh"].shape == (4, 5)


def test_a_loss_that_is_not_a_scalar_is_refused():
    mox, p, x = plain()
    with pytest.raises(yax.errors.LossNotScalar) as e:
        yax.capture("//tanh", mox, p, x, grad_of=lambda out: out)
    assert (e.value.tool, e.value.found) == ("capture", "f32[4,2]")
    with pytest.raises(yax.errors.LossNotScalar) as e:
        yax.capture("//tanh", mox, p, x, grad_of=lambda out: jnp.argmax(out))
    assert e.value.found == "i32[]"
    with pytest.raises(yax.errors.LossNotAFunction) as e:
        yax.capture("//tanh", mox, p, x, grad_of=3.0)
    assert (e.value.tool, e.value.found) == ("capture", "float")


# -- linen and Hugging Face models, zeros added through flax's method interceptors ----------------

def intercepted_grads(fn, args, kwargs, keys, loss):
    """``jax.grad`` of ``loss(fn(...))`` with respect to zeros added to the outputs of the
    modules named by ``keys`` (yax keys of modules called once), by flax's interceptors."""
    paths = {tuple(k.split("/")[1:]): k for k in keys}

    def f(d):
        def add(next_fun, a, kw, context):
            out = next_fun(*a, **kw)
            k = paths.get(context.module.path) if context.method_name == "__call__" else None
            return out if k is None else jax.tree_util.tree_map(jnp.add, out, d[k])
        with nn.intercept_methods(add):
            return loss(fn(*args, **kwargs))

    return f


@pytest.mark.parametrize("name, pattern", [
    ("linen-transformer", '//module_call[@type="Block"] | //module_call[@type="Dense"]'),
    # (the encoder: the tied decoder runs as `Dense.apply` with the embedding, which interceptors see apart)
    ("bert-module", '//module_call[@type="FlaxBertLayer"] | //module_call[@type="FlaxBertLayer"]//module_call'),
    ("gpt2-wrapper", '//module_call[@type="FlaxConv1D"]'),
])
def test_grads_of_linen_and_hugging_face_models_match_interceptors(name, pattern):
    if name == "linen-transformer":
        from models import CASES

        fn, args, kwargs = CASES["transformer"]()
    else:
        c = case(name)
        fn, args, kwargs = c.fn, c.args, c.kwargs
    mox = yax.make_mox(fn)(*args, **kwargs)
    out, values, grads = yax.capture(pattern, mox, *args, grad_of=square_loss, **kwargs)
    assert len(grads) >= 4 and all("#" not in k for k in grads)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, values)
    want = jax.grad(intercepted_grads(fn, args, kwargs, list(values), square_loss))(zeros)
    close(grads, want, atol=1e-6, rtol=1e-4)
    assert max(float(jnp.abs(g).max()) for g in jax.tree_util.tree_leaves(grads)) > 1e-4


def test_grads_of_a_scanned_remat_transformer_per_layer():
    m, ids = ScannedTransformer(), jnp.arange(16).reshape(2, 8) % 100
    params = m.init(KEY, ids)
    mox = yax.make_mox(m.apply)(params, ids)
    key = "ScannedTransformer/layers"
    out, values, grads = yax.capture(f'//*[@path="{key}"] | //activation[@name="gelu"]', mox, params, ids,
                                     grad_of=square_loss)
    assert grads[key][0].shape == (2, 2, 8, 32) and grads[f"{key}/gelu"].shape == (2, 2, 8, 64)
    pp = params["params"]
    mask, layer = nn.make_causal_mask(ids), DecoderLayer(4, 8, 64)

    def by_hand(d):
        h = nn.Embed(100, 32).apply({"params": pp["embed"]}, ids)
        for i in range(2):
            p = jax.tree_util.tree_map(lambda a, i=i: a[i], pp["layers"])
            h = layer.apply({"params": p}, h, mask)[0] + d[i]
        h = nn.LayerNorm().apply({"params": pp["final_norm"]}, h)
        return square_loss(nn.Embed(100, 32).apply({"params": pp["embed"]}, h, method="attend"))

    want = jax.grad(by_hand)(jnp.zeros((2, 2, 8, 32)))
    close(grads[key][0], want, atol=1e-6, rtol=1e-4)
    assert grads[key][1] is None  # the scan's ys: none
    assert float(jnp.abs(want[0] - want[1]).max()) > 1e-5  # the steps differ: stacked, not summed


# -- nnx ----------------------------------------------------------------------------------------

def test_grads_of_nnx_models_by_hand():
    model, (x,), _ = NNX_CASES["mlp"]()
    mox = yax.make_mox(model)(x)
    state = nnx.state(model)

    def loss(out):
        return sin_loss(out[0])  # an nnx MoX returns (output, new state)

    _, values, grads = yax.capture('//module_call[@path="MLP/fc1"]', mox, state, x, grad_of=loss)
    h = model.fc1(x)
    close(values["MLP/fc1"], h)
    close(grads["MLP/fc1"], jax.grad(lambda d: sin_loss(model.fc2(nnx.relu(h + d))))(jnp.zeros_like(h)))

    model, (ids,), _ = NNX_CASES["transformer_scan"]()
    mox = yax.make_mox(model)(ids)
    _, _, grads = yax.capture('//module_call[@path="ScanTransformer/blocks"]', mox, nnx.state(model), ids,
                              grad_of=lambda out: square_loss(out[0]))
    graphdef, blocks = nnx.split(model.blocks)

    def by_hand(d):
        h = model.embed(ids)
        for i in range(3):
            h = nnx.merge(graphdef, jax.tree_util.tree_map(lambda a, i=i: a[i], blocks))(h) + d[i]
        return square_loss(model.embed.attend(model.norm(h)))

    close(grads["ScanTransformer/blocks"], jax.grad(by_hand)(jnp.zeros((3, *ids.shape, 32))), atol=1e-6, rtol=1e-4)
