"""Gradients are part of the truth.

``jax.grad`` through every rewrite form, with respect to the parameters and to
the inputs, against a hand-written model computing the same thing. The form
the issue names: the earlier prototype's ``yax.sub('//pjit[@name="relu"]',
yax.make_mox(nn.gelu)(x), mox)`` matches the jitted ``max`` inside
``jax.nn.relu``'s ``custom_jvp_call``; replacing only it kept relu's JVP rule
around the GELU body, so the forward pass was GELU's and the gradient relu's.
A node that is the whole computation of a custom derivative rule is now
replaced together with the rule; one that is only part of it is refused,
naming the rule and what to select instead.
"""

import contextlib
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import CustomGrads, ScannedTransformer, clip_grad_identity, softclip

import yax
import yax.internal

pytestmark = pytest.mark.core
KEY = jax.random.key(0)
X = jax.random.normal(jax.random.key(1), (3, 4))  # both signs: relu's two pieces both count


def grads(f, params, x):
    """``d/d(params, x) sum(f(params, x) * w)`` for a fixed random ``w`` (no symmetry hides a wrong term)."""
    out = f(params, x)
    w = jax.random.normal(jax.random.key(7), jnp.shape(out))
    return jax.grad(lambda p, x: jnp.sum(f(p, x) * w), argnums=(0, 1))(params, x)


def same_gradients(new_mox, hand, params, x=X, rtol=1e-5, atol=1e-6):
    """``eval_mox(new_mox)`` and ``hand`` agree in value and in gradient (parameters and inputs)."""
    f = lambda p, x: yax.eval_mox(new_mox, p, x)  # noqa: E731
    np.testing.assert_allclose(f(params, x), hand(params, x), rtol=rtol, atol=atol)
    a, b = grads(f, params, x), grads(hand, params, x)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(u, v, rtol=rtol, atol=atol)


def primitives(mox):
    return {n.name for n in mox.walk() if isinstance(n, yax.Equation)}


class ReluMLP(nn.Module):
    act: object = nn.relu

    @nn.compact
    def __call__(self, x):
        return nn.Dense(3, name="out")(self.act(nn.Dense(16, name="hidden")(x)))


def by_hand(f):
    """`ReluMLP` with activation ``f``, written out."""
    def model(params, x):
        p = params["params"]
        return f(x @ p["hidden"]["kernel"] + p["hidden"]["bias"]) @ p["out"]["kernel"] + p["out"]["bias"]

    return model


def relu_mlp():
    m = ReluMLP()
    params = m.init(KEY, X)
    return params, yax.make_mox(m.apply)(params, X)


@pytest.mark.parametrize("pattern", ['//pjit[@name="relu"]', '//jit[@name="relu"]'])
def test_the_prototypes_jitted_relu_rewrite_replaces_relus_rule_too(pattern):
    params, mox = relu_mlp()
    before = str(mox)
    new = yax.sub(pattern, yax.make_mox(jax.nn.gelu)(jnp.ones((3, 16))), mox)
    # the jitted max was all of relu's custom_jvp computation: the rule went with it
    assert "custom_jvp_call" not in primitives(new) and "max" not in primitives(new)
    assert [(n.name, n.path) for n in yax.query("//activation", new)] == [("gelu", "ReluMLP/relu")]
    same_gradients(new, by_hand(jax.nn.gelu), params)
    assert str(mox) == before


def rewrites():
    """``(name, rewrite(params, mox) -> (new_mox, new_params), hand-written model)`` for every form."""
    def lora(params, mox):
        new, p2 = yax.sub('//module_call[@type="Dense"]', yax.LoRA(rank=2, alpha=3.0), mox, params=params, key=KEY)
        # lora_b starts at zero (no gradient reaches lora_a then): give it values
        p2 = jax.tree_util.tree_map_with_path(
            lambda kp, v: jax.random.normal(jax.random.key(len(kp)), v.shape) * 0.3
            if jax.tree_util.keystr(kp).endswith("['lora_b']") else v, p2)
        return new, p2

    def lora_by_hand(params, x):
        p = params["params"]

        def dense(q, x):
            return x @ (q["kernel"] + q["lora_a"] @ q["lora_b"] * 3.0 / 2) + q["bias"]

        return dense(p["out"], jax.nn.relu(dense(p["hidden"], x)))

    def mox_of_block(params, mox):
        with patched(sigmoid):
            rep = yax.make_mox(Hidden().apply)({"params": params["params"]["hidden"]}, X)
        return yax.sub('//module_call[@name="hidden"]', rep, mox, params=params)

    def cut_node(params, mox):
        with patched(sigmoid):
            other = yax.make_mox(Helped().apply)(params, X)
        return yax.sub('//module_call[@name="hidden"]', yax.query('//module_call[@name="hidden"]', other)[0], mox,
                       params=params)

    def helped_by_hand(params, x):
        p = params["params"]
        h = jax.nn.sigmoid(x @ p["hidden"]["Dense_0"]["kernel"] + p["hidden"]["Dense_0"]["bias"])
        return h @ p["out"]["kernel"] + p["out"]["bias"]

    return [
        ("function", ReluMLP, lambda p, m: (yax.sub('//activation[@name="relu"]', lambda h: jnp.tanh(h) * 2.0, m), p),
         by_hand(lambda h: jnp.tanh(h) * 2.0)),
        ("activation swap", ReluMLP, lambda p, m: (yax.sub('//activation[@name="relu"]', jax.nn.gelu, m), p),
         by_hand(jax.nn.gelu)),
        ("swap to relu, whose rule comes along", lambda: ReluMLP(act=nn.gelu),
         lambda p, m: (yax.sub('//activation[@name="gelu"]', jax.nn.relu, m), p), by_hand(jax.nn.relu)),
        ("the prototype's //pjit form", ReluMLP,
         lambda p, m: (yax.sub('//pjit[@name="relu"]', yax.make_mox(jax.nn.gelu)(jnp.ones((3, 16))), m), p),
         by_hand(jax.nn.gelu)),
        ("the whole rule, selected", ReluMLP,
         lambda p, m: (yax.sub('//custom_jvp_call', jax.nn.softplus, m), p), by_hand(jax.nn.softplus)),
        ("module (yax.LoRA)", ReluMLP, lora, lora_by_hand),
        ("MoX replacement", Helped, mox_of_block, helped_by_hand),
        ("cut node", Helped, cut_node, helped_by_hand),
    ]


def act(h):
    return jax.nn.gelu(h)


def sigmoid(h):
    return jax.nn.sigmoid(h)


@contextlib.contextmanager
def patched(fn):
    module = sys.modules[__name__]
    old, module.act = module.act, fn
    try:
        yield
    finally:
        module.act = old


class Hidden(nn.Module):
    @nn.compact
    def __call__(self, x):
        return act(nn.Dense(16)(x))


class Helped(nn.Module):
    """A block whose activation is hard-coded through a helper (patched while tracing the replacement)."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(3, name="out")(Hidden(name="hidden")(x))


@pytest.mark.parametrize("name, make, rewrite, hand", rewrites(), ids=[r[0] for r in rewrites()])
def test_every_rewrite_form_differentiates_like_the_hand_written_model(name, make, rewrite, hand):
    m = make()
    params = m.init(KEY, X)
    mox = yax.make_mox(m.apply)(params, X)
    new, p2 = rewrite(params, mox)
    same_gradients(new, hand, p2)


class Layer(nn.Module):
    act: object = nn.relu

    @nn.compact
    def __call__(self, x, _):
        return x + nn.Dense(8, name="wo")(self.act(nn.Dense(16, name="wi")(nn.LayerNorm(name="norm")(x)))), None


class Stack(nn.Module):
    act: object = nn.relu

    @nn.compact
    def __call__(self, x):
        layers = nn.scan(nn.remat(Layer), variable_axes={"params": 0}, split_rngs={"params": True}, length=3)
        return nn.Dense(2, name="head")(layers(self.act, name="layers")(x, None)[0])


@pytest.mark.slow
def test_inside_scanned_and_rematerialised_stacks():
    x = jax.random.normal(jax.random.key(2), (2, 8))
    params = Stack().init(KEY, x)
    mox = yax.make_mox(Stack().apply)(params, x)
    # the prototype's form on relu inside `nn.scan(nn.remat(layer))`: its rule is replaced too
    new = yax.sub('//jit[@name="relu"]', yax.make_mox(jax.nn.gelu)(jnp.ones((2, 16))), mox)
    assert "custom_jvp_call" not in primitives(new)
    same_gradients(new, Stack(act=jax.nn.gelu).apply, params, x)
    # an activation swap in the stack's body
    same_gradients(yax.sub('//activation[@name="relu"]', jax.nn.silu, mox), Stack(act=jax.nn.silu).apply, params, x)
    # the scanned Transformer the zoo uses (tied embedding, causal mask, `nn.remat(prevent_cse=False)`)
    ids = (jnp.arange(16, dtype=jnp.int32).reshape(2, 8) * 7 + 3) % 100
    t = ScannedTransformer()
    tp = t.init(KEY, ids)
    tm = yax.make_mox(t.apply)(tp, ids)
    new = yax.sub('//activation[@name="gelu"]', jax.nn.relu, tm)
    f = lambda p: jnp.sum(yax.eval_mox(new, p, ids) ** 2)  # noqa: E731
    g = lambda p: jnp.sum(ScannedTransformer(act=jax.nn.relu).apply(p, ids) ** 2)  # noqa: E731
    for u, v in zip(jax.tree_util.tree_leaves(jax.grad(f)(tp)), jax.tree_util.tree_leaves(jax.grad(g)(tp))):
        np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-6)


@jax.jit
def _square(x):
    return x * x


@jax.custom_vjp
def clipped_square(x):
    """``x * x`` whose gradient is clipped (a custom VJP around a jitted helper)."""
    return _square(x)


clipped_square.defvjp(lambda x: (_square(x), x), lambda x, g: (jnp.clip(2 * x * g, -0.01, 0.01),))


class Clipped(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(clipped_square(nn.Dense(8)(x)))


def test_a_custom_vjp_whose_whole_computation_is_replaced_goes_with_it():
    m = Clipped()
    params = m.init(KEY, X)
    mox = yax.make_mox(m.apply)(params, X)
    new = yax.sub('//jit[@name="_square"]', jnp.sin, mox)
    assert "custom_vjp_call" not in primitives(new)

    def hand(params, x):
        p = params["params"]
        h = jnp.sin(x @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"])
        return h @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"]

    same_gradients(new, hand, params)


def test_part_of_a_custom_rules_computation_is_refused_naming_the_rule():
    m = CustomGrads()
    params = m.init(KEY, X)
    mox = yax.make_mox(m.apply)(params, X)
    before = str(mox)
    # `softclip` is a custom_jvp of `tanh(x) * 3`: its tanh alone cannot change under the old rule
    tanh = [n for n in yax.query("//tanh", mox) if n.path.lower() != "customgrads/gelu"]
    with pytest.raises(yax.errors.InsideCustomRule) as e:
        yax.sub(tanh, jnp.sin, mox)
    assert (e.value.rule.name, e.value.rule.path) == ("custom_jvp_call", "CustomGrads")
    text = yax.errors.message(e.value)
    assert "part of the computation of the `custom_jvp_call` at `CustomGrads`" in text
    assert "`jax.grad` through the result would be wrong" in text
    assert '`//custom_jvp_call[@path="CustomGrads"]`' in text and text.endswith("Nothing was changed.")
    assert yax.internal.misfit(jnp.sin, tanh[0], mox) == text  # the explorer says the same
    assert str(mox) == before
    # following the advice replaces softclip with its rule: the gradient is the new function's
    new = yax.sub('//custom_jvp_call[@path="CustomGrads"]', lambda h: jnp.sin(h) * 3.0, mox)

    def sin_by_hand(params, x):
        p = params["params"]["Dense_0"]
        h = x @ p["kernel"] + p["bias"]
        return clip_grad_identity(jnp.sin(jax.nn.relu(h) + jax.nn.gelu(h)) * 3.0)

    same_gradients(new, sin_by_hand, params)

    # relu's `max` reads a literal besides the input: it is not the whole computation on its own
    with pytest.raises(yax.errors.InsideCustomRule) as e:
        yax.sub("//max", lambda a, b: jnp.maximum(a, 0.1 * a), mox)
    assert (e.value.holder.kind, e.value.holder.path) == ("activation", "CustomGrads/relu")
    # what the message suggests works, with the gradient of what is put in
    new = yax.sub('//activation[@path="CustomGrads/relu"]', lambda h: jnp.maximum(h, 0.1 * h), mox)
    assert len(yax.query("//custom_jvp_call", new)) == 1  # softclip's rule stays

    def hand(params, x):  # `CustomGrads` with a leaky relu, written out (softclip and the clip keep their rules)
        p = params["params"]["Dense_0"]
        h = x @ p["kernel"] + p["bias"]
        return clip_grad_identity(softclip(jnp.maximum(h, 0.1 * h) + jax.nn.gelu(h)))

    same_gradients(new, hand, params)
    assert str(mox) == before


def test_nnx_models_differentiate_like_the_hand_written_model():
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.hidden = nnx.Linear(4, 16, rngs=rngs)
            self.out = nnx.Linear(16, 3, rngs=rngs)

        def __call__(self, x):
            return self.out(nnx.relu(self.hidden(x)))

    model = Net(nnx.Rngs(0))
    _, state = nnx.split(model)
    mox = yax.make_mox(model)(X)

    def hand(f):
        def net(state, x):
            s = nnx.to_pure_dict(state)
            return f(x @ s["hidden"]["kernel"] + s["hidden"]["bias"]) @ s["out"]["kernel"] + s["out"]["bias"]

        return net

    for new, f in [(yax.sub('//jit[@name="relu"]', yax.make_mox(jax.nn.gelu)(jnp.ones((3, 16))), mox), jax.nn.gelu),
                   (yax.sub('//activation[@name="relu"]', jax.nn.tanh, mox), jnp.tanh)]:
        g = lambda s, x, new=new: yax.eval_mox(new, s, x)[0]  # noqa: E731
        np.testing.assert_allclose(g(state, X), hand(f)(state, X), rtol=1e-5, atol=1e-6)
        a, b = grads(g, state, X), grads(hand(f), state, X)
        for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
            np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)
