"""What a careful user meets in the explorer's first hour (issue 38): both GELUs offered and
named, the default precision policy as one drop, `add_replacement` taking `yax.sub`'s options,
and "copy as code" of those changes running as written. Every model is checked against the
hand-written JAX it stands for."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import yax
from yax.internal import view

from .helpers import IDS, ask, explorer


def _run(ex, mox=None, params=None):
    return yax.eval_mox(ex.mox if mox is None else mox, ex.params if params is None else params, IDS)


def test_both_gelus_are_offered_by_what_they_compute(model):
    ex = explorer(model)
    docs = {p["name"]: p["doc"] for p in ex._palette}
    assert "GELU" not in docs  # a bare name says nothing of which one
    assert "tanh approximation" in docs["GELU (tanh)"] and "erf" in docs["GELU (erf)"]
    m, v = model
    for name, approximate in (("GELU (tanh)", True), ("GELU (erf)", False)):
        ex.session.goto(0)
        ex.substitute("//activation[@name='gelu']", "ReLU")
        ex.substitute("//activation[@name='relu']", name)
        # against the model written by hand with that GELU
        want = m.clone(act=lambda x, a=approximate: jax.nn.gelu(x, approximate=a)).apply(v, IDS)
        np.testing.assert_allclose(np.asarray(_run(ex)), np.asarray(want), rtol=1e-6, atol=1e-6)
        assert ex.comparison.allclose == approximate  # the original's GELU is flax's tanh one
    assert "lambda x: jax.nn.gelu(x, approximate=False)" in ex.code()


def test_the_default_precision_policy_is_one_drop_on_a_block(model):
    ex = explorer(model)
    assert {p["name"]: p["kind"] for p in ex._palette}["bfloat16 compute"] == "policy"
    block = yax.query("//module_call[@name='Block_0']", ex.mox)[0]
    gelu = yax.query("//activation", ex.mox)[0]
    ids = view(ex.mox).ids
    fits = ask(ex, rid=1, type="fits", id=ids[id(block)])
    assert "bfloat16 compute" in fits["fits"]
    refused = ask(ex, rid=2, type="fits", id=ids[id(gelu)])
    assert refused["refused"]["bfloat16 compute"].startswith("bfloat16 compute changes nothing there: ")  # its own sentence
    ex.substitute(block, "bfloat16 compute")
    # only the block's dense-like layers compute in bfloat16; its norms and Block_1 stay float32
    bf16 = {n.path for n in yax.query('//module_call[@compute="bfloat16"]', ex.mox)}
    assert bf16 and all(p.startswith("Transformer/Block_0/") for p in bf16)
    assert not yax.query('//module_call[@path="Transformer/Block_1"]//module_call[@compute="bfloat16"]', ex.mox)
    # exactly what yax.mixed_precision gives with the policy on those layers
    want_mox, want_params = yax.mixed_precision(ex.original, {
        f'//module_call[@path="{p}"]': "params=float32,compute=bfloat16,output=float32" for p in bf16},
        params=ex.session.states[0].params)
    np.testing.assert_array_equal(np.asarray(_run(ex)), np.asarray(yax.eval_mox(want_mox, want_params, IDS)))
    assert not ex.comparison.allclose  # bfloat16 shows in the numbers, layer by layer
    assert ex.comparison.first_divergence.startswith("Transformer/Block_0")
    # "copy as code" runs as written and makes the same model
    scope = {"jax": jax, "yax": yax, "mox": ex.original, "params": ex.session.states[0].params}
    exec(_body(ex.code()), scope)  # noqa: S102
    np.testing.assert_array_equal(np.asarray(yax.eval_mox(scope["mox"], scope["params"], IDS)), np.asarray(_run(ex)))


def test_the_policy_on_the_whole_model_is_yax_mixed_precision(model):
    ex = explorer(model)
    top = yax.query("/*/*[1]", ex.mox)[0]
    ex.substitute(top, "bfloat16 compute")
    want = yax.eval_mox(*yax.mixed_precision(ex.original, params=ex.session.states[0].params), IDS)
    np.testing.assert_array_equal(np.asarray(_run(ex)), np.asarray(want))


def _body(code: str) -> str:
    """The script's changes, after its opening lines (which trace the model again)."""
    return "\n".join(line for line in code.splitlines() if line.startswith("mox, params = yax."))


def test_add_replacement_takes_the_options_sub_takes(model):
    ex = explorer(model)

    def gelu_bf16(x):
        return jax.nn.gelu(x.astype(jnp.bfloat16))

    ex.add_replacement("GELU in bf16, uncast", gelu_bf16)
    with pytest.raises(yax.YaxRewriteError):
        ex.substitute("//activation[@name='gelu']", "GELU in bf16, uncast")  # bfloat16 out where float32 was
    ex.add_replacement("GELU in bf16", gelu_bf16, cast=True)
    ex.substitute("//activation[@name='gelu']", "GELU in bf16")
    m, v = model
    want = m.clone(act=lambda x: gelu_bf16(x).astype(jnp.float32)).apply(v, IDS)
    np.testing.assert_array_equal(np.asarray(_run(ex)), np.asarray(want))
    assert "cast=True" in _body(ex.code())
    with pytest.raises(yax.YaxInputError):
        ex.add_replacement("bad", gelu_bf16, cast="yes")
    with pytest.raises(yax.YaxInputError):
        ex.add_replacement("bad", {1: "params=float32"})
    assert "bad" not in {p["name"] for p in ex._palette}


def test_the_top_row_is_given_the_inputs_as_the_user_passed_them():
    """Hugging Face's CLIP wrapper transposes the pixels and adds position ids before its module runs:
    the explorer shows the inputs as passed ([2,3,32,32], no `position_ids`), not as the module gets them."""
    import transformers

    clip = transformers.FlaxCLIPModel(transformers.CLIPConfig(
        text_config=dict(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=8),
        vision_config=dict(image_size=32, patch_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2), projection_dim=8), seed=0)
    ids = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 50
    pix = jnp.zeros((2, 3, 32, 32))
    mask = jnp.ones((2, 8), jnp.int32)
    ex = explorer_of(clip, input_ids=ids, pixel_values=pix, attention_mask=mask)
    assert ex._batches["inputs"] == [{"name": "input_ids", "type": "i32[2,8]", "sharding": ""},
                                     {"name": "pixel_values", "type": "f32[2,3,32,32]", "sharding": ""},
                                     {"name": "attention_mask", "type": "i32[2,8]", "sharding": ""}]
    top = ex._tree["rows"][0]
    assert "f32[2,32,32,3]" in top[6]  # what the module receives: why the row says what was passed instead


def test_a_sharded_input_shows_its_spec():
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from models import Transformer

    assert len(jax.devices()) >= 8  # tests/conftest.py asks for 8 host devices
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    m = Transformer(num_layers=1)
    ids = jax.device_put(jnp.arange(64, dtype=jnp.int32).reshape(4, 16) % 64, NamedSharding(mesh, P("data")))
    ex = explorer_of(m, m.init(jax.random.key(0), ids), ids)
    assert ex._batches["inputs"] == [{"name": "ids", "type": "i32[4,16]", "sharding": "P('data')"}]


def explorer_of(target, *args, **kwargs):
    from yax_widget import Explorer

    return Explorer(target, *args, **kwargs)
