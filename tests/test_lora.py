"""yax.LoRA, lora_mask and merge_lora: the train-and-merge recipe checked against
optax and the plain model, and saving the adapters."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util
from helpers import DENSE_MLP, traced
from models import KEY, Transformer

import yax
import yax.internal

pytestmark = pytest.mark.core


def test_lora_train_merge_recipe():
    ids = jnp.arange(16).reshape(2, 8) % 64
    model = Transformer()
    params = model.init(KEY, ids)
    mox = yax.make_mox(model.apply)(params, ids)
    new, lp = yax.sub(DENSE_MLP, yax.LoRA(rank=2), mox, params=params, key=jax.random.key(7))
    assert [n.type for n in yax.query(DENSE_MLP.replace('[@type="Dense"]', ""), new)] == ["LoRA"] * 4
    b0 = lp["params"]["Block_0"]
    assert set(b0["Dense_0"]) == {"kernel", "bias", "lora_a", "lora_b"}
    assert b0["Dense_0"]["kernel"] is params["params"]["Block_0"]["Dense_0"]["kernel"]  # kept, not copied
    np.testing.assert_allclose(yax.eval_mox(new, lp, ids), model.apply(params, ids), atol=1e-6)  # B = 0

    # train only the adapters on a toy task: predict the next token
    mask = yax.lora_mask(lp)
    opt = optax.multi_transform({True: optax.adam(3e-2), False: optax.set_to_zero()}, mask)
    state = opt.init(lp)

    def loss(p):
        logits = yax.eval_mox(new, p, ids)
        return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], ids[:, 1:]).mean()

    @jax.jit
    def step(p, s):
        val, g = jax.value_and_grad(loss)(p)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, val

    losses = []
    for _ in range(8):
        lp, state, val = step(lp, state)
        losses.append(float(val))
    assert losses[-1] < losses[0] - 0.05, losses
    frozen = traverse_util.flatten_dict(lp["params"])
    orig = traverse_util.flatten_dict(params["params"])
    assert all(jnp.array_equal(frozen[k], orig[k]) for k in orig)  # only adapters moved
    assert not jnp.array_equal(lp["params"]["Block_1"]["Dense_1"]["lora_b"], 0)

    merged, mp = yax.merge_lora(new, lp)
    assert yax.query('count(//module_call[@type="LoRA"])', merged) == 0.0
    assert "lora_a" not in mp["params"]["Block_0"]["Dense_0"]
    assert jax.tree_util.tree_structure(mp) == jax.tree_util.tree_structure(params)
    np.testing.assert_allclose(yax.eval_mox(merged, mp, ids), yax.eval_mox(new, lp, ids), rtol=1e-4, atol=1e-5)
    # the merged parameters run the plain, unmodified model
    np.testing.assert_allclose(model.apply(mp, ids), yax.eval_mox(new, lp, ids), rtol=1e-4, atol=1e-5)


def test_save_load_params_and_rebuild_from_recipe(tmp_path):
    def recipe(mox, params):
        return yax.sub(DENSE_MLP, yax.LoRA(rank=2), mox, params=params, key=jax.random.key(3))

    mox, fn, (params, ids), kw = traced("transformer")
    new, lp = recipe(mox, params)
    lp["params"]["Block_0"]["Dense_0"]["lora_b"] = jnp.full((2, 64), 0.5)
    flat = {"/".join(k): np.asarray(v) for k, v in traverse_util.flatten_dict(lp).items()}
    np.savez(tmp_path / "lora.npz", **flat)
    with np.load(tmp_path / "lora.npz") as f:
        loaded = traverse_util.unflatten_dict({tuple(k.split("/")): jnp.asarray(f[k]) for k in f.files})
    mox2 = yax.make_mox(fn)(params, ids, **kw)
    rebuilt, _ = recipe(mox2, params)
    np.testing.assert_array_equal(yax.eval_mox(rebuilt, loaded, ids, **kw), yax.eval_mox(new, lp, ids, **kw))


# -- the layers LoRA knows, and those it refuses -------------------------------------

class Layers(nn.Module):
    """One of each layer `yax.LoRA` adapts, and one it does not."""

    @nn.compact
    def __call__(self, x):  # x: [2, 5, 8]
        h = nn.Dense(6, name="dense")(x)
        h = nn.DenseGeneral((2, 3), axis=-1, name="general")(h)               # [2, 5, 2, 3]
        h = nn.DenseGeneral(4, axis=(-2, -1), name="general2")(h)             # [2, 5, 4]
        h = nn.Einsum((4, 3, 2), "btd,dhk->bthk", name="einsum")(h)           # [2, 5, 3, 2]
        h = h.reshape(2, 5, 6)
        return nn.Conv(4, (3,), name="conv")(h)


@pytest.mark.parametrize("name", ["dense", "general", "general2", "einsum"])
def test_lora_starts_exactly_equal_and_trains_on_every_layer_it_knows(name):
    model, x = Layers(), jax.random.normal(KEY, (2, 5, 8))
    params = model.init(KEY, x)
    mox = yax.make_mox(model.apply)(params, x)
    new, lp = yax.sub(f'//module_call[@name="{name}"]', yax.LoRA(rank=2), mox, params=params, key=KEY)
    np.testing.assert_array_equal(yax.eval_mox(new, lp, x), model.apply(params, x))  # bit for bit
    layer = lp["params"][name]
    assert set(layer) - set(params["params"][name]) == {"lora_a", "lora_b"}
    n_out = layer["kernel"].size // layer["lora_a"].shape[0]
    assert layer["lora_a"].shape[1] == 2 and layer["lora_b"].shape == (2, n_out)
    # a trained adapter changes the layer by exactly its low-rank update, and merges back
    trained = jax.tree_util.tree_map_with_path(
        lambda kp, v: v + 0.05 if getattr(kp[-1], "key", None) == "lora_b" else v, lp)
    out = yax.eval_mox(new, trained, x)
    assert not np.allclose(out, model.apply(params, x), atol=1e-4)
    merged, mp = yax.merge_lora(new, trained)
    np.testing.assert_allclose(yax.eval_mox(merged, mp, x), out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model.apply(mp, x), out, rtol=1e-5, atol=1e-5)  # the original model, merged


def test_lora_refuses_layers_it_does_not_know():
    model, x = Layers(), jnp.ones((2, 5, 8))
    params = model.init(KEY, x)
    mox = yax.make_mox(model.apply)(params, x)
    before = str(mox), jax.tree_util.tree_map(np.copy, params)
    with pytest.raises(yax.YaxRewriteError, match=r"adapts linen's `Dense`, `DenseGeneral`, `Einsum` layers, .* `Conv`"):
        yax.sub('//module_call[@name="conv"]', yax.LoRA(rank=2), mox, params=params, key=KEY)
    assert str(mox) == before[0]
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, params, before[1]))
    conv = yax.query('//module_call[@name="conv"]', mox)[0]  # what the explorer's menu says agrees
    assert "`Conv`" in yax.internal.misfit(yax.LoRA(rank=2), conv, mox)


def test_lora_on_nnx_linear_is_lora_linear_and_starts_equal():
    from flax import nnx

    model = nnx.Sequential(nnx.Linear(4, 8, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(8, 2, rngs=nnx.Rngs(1)))
    x = jax.random.normal(KEY, (3, 4))
    _, state = nnx.split(model)
    mox = yax.make_mox(model)(x)
    new, ns = yax.sub('//module_call[@type="Linear"]', yax.LoRA(rank=2), mox, params=state)
    assert [n.path for n in yax.query('//module_call[@type="LoRALinear"]', new)] == [
        "Sequential/layers/0", "Sequential/layers/2"]
    out, _ = yax.eval_mox(new, ns, x)
    np.testing.assert_array_equal(out, model(x))
    np.testing.assert_array_equal(nnx.merge(new.graphdef, ns)(x), model(x))
