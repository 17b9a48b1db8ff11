"""What a replacement can be and how it is called (yax/rewrite/replacement.py,
select.py): the earlier prototype's forms, modules called like the original
call, patterns that match nothing, kept weights; refusals change nothing."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import traced

import yax

pytestmark = pytest.mark.core
KEY = jax.random.key(0)


def snapshot(mox, params):
    return str(mox), jax.tree_util.tree_map(lambda x: np.asarray(x).copy(), params)


def unchanged(before, mox, params):
    text, leaves = before
    assert str(mox) == text
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, leaves, params))


class Adapter(nn.Module):
    """The prototype's LoRA layout: the adapted layer as a submodule `Dense_0`."""

    features: int

    @nn.compact
    def __call__(self, x):
        a = self.param("a", nn.initializers.normal(0.1), (x.shape[-1], 2))
        b = self.param("b", nn.initializers.zeros, (2, self.features))
        return nn.Dense(self.features)(x) + x @ a @ b


def mlp():
    mox, fn, (params, x), _ = traced("mlp")
    return mox, fn, params, x


def test_a_root_mox_of_module_apply_stands_for_its_module():
    mox, fn, params, x = mlp()
    dense = nn.Dense(16)
    dense_mox = yax.make_mox(dense.apply)(dense.init(KEY, x), x)
    # its variables exist at the target with the same shapes: no params= needed, outputs unchanged
    new = yax.sub('//module_call[@name="Dense_0"]', dense_mox, mox)
    np.testing.assert_allclose(yax.eval_mox(new, params, x), fn(params, x), rtol=1e-6)
    # the prototype's LoRA form: a root MoX of an adapter's apply, with new variables placed
    lora = Adapter(16)
    lora_mox = yax.make_mox(lora.apply)(lora.init(KEY, x), x)
    new, p2 = yax.sub('//module_call[@name="Dense_0"]', lora_mox, mox, params=params, key=KEY)
    assert yax.query('//module_call[@name="Dense_0"]', new)[0].type == "Adapter"
    # the wrapped Dense_0 takes the trained kernel: the adapter starts equal to the original
    np.testing.assert_array_equal(p2["params"]["Dense_0"]["Dense_0"]["kernel"], params["params"]["Dense_0"]["kernel"])
    np.testing.assert_allclose(yax.eval_mox(new, p2, x), fn(params, x), rtol=1e-6)


def test_a_call_node_cut_from_another_mox_stands_for_its_module():
    mox, fn, params, x = mlp()
    other, *_ = traced("mlp")
    cut = yax.query('//module_call[@name="Dense_1"]', other)[0]
    new = yax.sub('//module_call[@name="Dense_1"]', cut, mox)
    assert yax.query('//module_call[@name="Dense_1"]', new)[0].type == "Dense"
    np.testing.assert_allclose(yax.eval_mox(new, params, x), fn(params, x), rtol=1e-6)
    relu = yax.query("//activation", other)[0]  # a cut activation stands for its computation
    np.testing.assert_allclose(yax.eval_mox(yax.sub("//activation", relu, mox), params, x), fn(params, x))


def test_jitted_helpers_are_found_by_function_name_and_root_is_slash():
    mox, fn, params, x = mlp()
    assert [n.name for n in yax.query('//pjit[@name="relu"]', mox)] == ["jit"]
    assert yax.query('//jit[@name="relu"]', mox) == yax.query('//pjit[@name="relu"]', mox)
    gelu_mox = yax.make_mox(jax.nn.gelu)(jnp.ones((2, 16)))
    new = yax.sub('//pjit[@name="relu"]', gelu_mox, mox)
    h = jax.nn.gelu(x @ params["params"]["Dense_0"]["kernel"] + params["params"]["Dense_0"]["bias"])
    want = h @ params["params"]["Dense_1"]["kernel"] + params["params"]["Dense_1"]["bias"]
    np.testing.assert_allclose(yax.eval_mox(new, params, x), want, rtol=1e-5, atol=1e-6)
    assert yax.query("/", mox) == [mox]


def test_a_pattern_matching_nothing_is_refused_with_the_explanation():
    mox, fn, params, x = mlp()
    before = snapshot(mox, params)
    with pytest.raises(yax.errors.NothingToRewrite) as e:
        yax.sub('//module_call[@type="Dense"][@features=99]', jax.nn.relu, mox, params=params)
    assert (e.value.tool, e.value.pattern) == ("sub", '//module_call[@type="Dense"][@features=99]')
    assert "0  //module_call[@type=\"Dense\"][@features=99]   <- stops matching here" in str(e.value)
    assert "must_match=False" in str(e.value)
    unchanged(before, mox, params)
    same, p = yax.sub('//module_call[@features=99]', jax.nn.relu, mox, params=params, must_match=False)
    assert same is mox and p is params
    with pytest.raises(yax.errors.NothingToRewrite) as e:
        yax.sub([], jax.nn.relu, mox)
    assert e.value.pattern == []


class Gated(nn.Module):
    """Called with a None, a bool and a keyword, as Hugging Face layers are."""

    features: int = 8

    @nn.compact
    def __call__(self, h, mask=None, deterministic: bool = True, scale: float = 1.0):
        y = nn.Dense(self.features)(h) * scale
        return y if mask is None else y * mask


class UsesGated(nn.Module):
    @nn.compact
    def __call__(self, x):
        return Gated(name="layer")(x, None, deterministic=True, scale=2.0)


def test_a_module_replacement_is_called_like_the_original_call():
    model, x = UsesGated(), jnp.ones((2, 4))
    params = model.init(KEY, x)
    mox = yax.make_mox(model.apply)(params, x)
    node = yax.query('//module_call[@name="layer"]', mox)[0]
    before = snapshot(mox, params)
    new, p2 = yax.sub('//module_call[@name="layer"]', yax.module_of(node), mox, params=params)
    unchanged(before, mox, params)
    np.testing.assert_allclose(yax.eval_mox(new, p2, x), model.apply(params, x), rtol=1e-6)
    assert jax.tree_util.tree_structure(p2) == jax.tree_util.tree_structure(params)
    # functions keep taking the array inputs, and may take the original call's arguments
    seen = []

    def like_the_call(h, mask, deterministic, scale):
        seen.append((mask, deterministic, scale))
        return jnp.zeros((2, 8)) + scale * h.sum()

    new = yax.sub('//module_call[@name="layer"]', like_the_call, mox)
    assert seen == [(None, True, 2.0)]
    np.testing.assert_allclose(yax.eval_mox(new, params, x), jnp.full((2, 8), 16.0))


def test_every_old_variable_reinitialised_is_refused_unless_mapped():
    mox, fn, params, x = mlp()

    class Renamed(nn.Module):
        @nn.compact
        def __call__(self, x):
            w = self.param("w", nn.initializers.zeros, (4, 16))
            b = self.param("b", nn.initializers.zeros, (16,))
            return x @ w + b

    before = snapshot(mox, params)
    with pytest.raises(yax.errors.KeepsNothing) as e:
        yax.sub('//module_call[@name="Dense_0"]', Renamed(), mox, params=params, key=KEY)
    assert "params/w" in e.value.alike and e.value.node.name == "Dense_0" and "keep=" in str(e.value)
    unchanged(before, mox, params)
    new, p2 = yax.sub('//module_call[@name="Dense_0"]', Renamed(), mox, params=params, key=KEY,
                      keep={"params/w": "params/kernel", "params/b": "params/bias"})
    np.testing.assert_array_equal(p2["params"]["Dense_0"]["w"], params["params"]["Dense_0"]["kernel"])
    np.testing.assert_allclose(yax.eval_mox(new, p2, x), fn(params, x), rtol=1e-6)
    new, p3 = yax.sub('//module_call[@name="Dense_0"]', Renamed(), mox, params=params, key=KEY, keep={})
    assert not np.any(p3["params"]["Dense_0"]["w"])


class Attend(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.SelfAttention(num_heads=2, qkv_features=8, name="attn")(x)


@pytest.mark.filterwarnings("ignore:SelfAttention will be deprecated")
def test_super_calls_fold_into_their_call():
    model, x = Attend(), jnp.ones((1, 3, 8))
    params = model.init(KEY, x)
    mox = yax.make_mox(model.apply)(params, x)
    found = yax.query('//module_call[@type="SelfAttention"]/module_call[@name="query"]', mox)
    assert [n.path for n in found] == ["Attend/attn/query"]
    assert not yax.query('//module_call[@type="SelfAttention"]//module_call[@type="SelfAttention"]', mox)
    np.testing.assert_allclose(yax.eval_mox(mox, params, x), model.apply(params, x), rtol=1e-6)
