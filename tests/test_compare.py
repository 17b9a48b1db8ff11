"""yax.compare: where a rewritten model's values first diverge from the original's."""

import jax
import jax.numpy as jnp
import pytest
from helpers import DENSE_MLP, traced
from models import KEY

import yax

pytestmark = pytest.mark.core


def test_compare_finds_where_outputs_diverge():
    mox, fn, (params, ids), kw = traced("transformer")
    new = yax.sub('(//*[@name="gelu"])[2]', jax.nn.relu, mox)
    c = yax.compare(mox, new, params, ids, **kw)
    assert c.first_divergence == "Transformer/Block_1/gelu"
    assert all(s.allclose for k, s in c.boundaries.items() if "Block_0" in k)
    assert not c.allclose and c.outputs["out"].max_abs > 1e-3 and 0.9 < c.outputs["out"].cosine < 1
    ref = fn(params, ids, **kw)
    got = yax.eval_mox(new, params, ids, **kw)
    assert c.outputs["out"].max_abs == pytest.approx(float(jnp.abs(got - ref).max()), rel=1e-4)
    d = c.to_dict()
    assert d["first_divergence"] == "Transformer/Block_1/gelu" and "Transformer/embed.attend" in d["boundaries"]
    assert "first_divergence='Transformer/Block_1/gelu'" in repr(c) and "NO" in repr(c)
    same = yax.compare(mox, mox, params, ids, **kw)
    assert same.allclose and same.first_divergence is None and same.outputs["out"].max_abs == 0


def test_compare_with_new_params_and_pytree_outputs():
    mox, fn, (v, x), kw = traced("cnn_train")
    new = yax.sub('//activation[@name="relu"]', jax.nn.gelu, mox)
    c = yax.compare(mox, new, v, x, **kw)
    assert list(c.outputs) == ["out[0]", "out[1]['batch_stats']['BatchNorm_0']['mean']",
                               "out[1]['batch_stats']['BatchNorm_0']['var']"]
    assert c.outputs["out[1]['batch_stats']['BatchNorm_0']['mean']"].allclose  # stats are before relu
    assert not c.outputs["out[0]"].allclose
    lmox, fn2, (params, ids), kw2 = traced("transformer")
    new2, lp = yax.sub(DENSE_MLP, yax.LoRA(rank=2), lmox, params=params, key=KEY)
    assert yax.compare(lmox, new2, params, ids, new_params=lp, **kw2).allclose  # lora_b = 0
    with pytest.raises(yax.errors.InputsDiffer) as e:
        yax.compare(lmox, new2, params, ids, **kw2)
    assert e.value.kind == "structure"
