"""DeepMind's `gemma` library (linen), a tiny Gemma 3 with random weights: every
feature against the library's own model (issue 41). Run by tests/test_gemma.py in an
interpreter of its own: importing gemma changes Flax for the whole process. Gemma's `Transformer`
defines ``__getattr__`` (which Flax wraps and ``nn.jit`` probes through
``hasattr``), wraps ``nn.Module.param`` to require a shape, shares one scope
between its MLP's two einsums, calls its ``Einsum`` layer with the equation as
an argument, and initialises its parameters in bfloat16 unless told otherwise:
each of those broke something once."""

from __future__ import annotations

import functools
from unittest import mock

import flax.linen
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gemma.gm.nn import _config, _modules, _transformer

import yax

TOKENS = (jnp.arange(16, dtype=jnp.int32).reshape(2, 8) * 7 + 3) % 64
ATTENTION = '//module_call[@type="Einsum"][@name!="mlp"]'  # q, kv and the output projection of each layer


def config() -> _config.TransformerConfig:
    return _config.TransformerConfig(
        num_embed=64, embed_dim=32, hidden_dim=64, num_heads=4, head_dim=8, num_kv_heads=2,
        final_logit_softcap=None, use_post_attn_norm=True, use_post_ffw_norm=True, use_qk_norm=True,
        attention_types=(_modules.AttentionType.LOCAL_SLIDING, _modules.AttentionType.GLOBAL),
        sliding_window_size=4, transpose_gating_einsum=True, local_base_frequency=10_000,
        global_base_frequency=1_000_000)


@functools.cache
def traced(dtype: str = "float32"):
    model = _transformer.Transformer(config=config(), dtype=jnp.dtype(dtype))
    params = model.init(jax.random.key(0), TOKENS)
    return model, params, yax.make_mox(model.apply)(params, TOKENS)


def flat(tree):
    return {jax.tree_util.keystr(k): np.asarray(v, np.float32) for k, v in jax.tree_util.tree_leaves_with_path(tree)
            if v is not None}


def assert_close(got, want, rtol=1e-5, atol=1e-5):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    got, want = flat(got), flat(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=atol, err_msg=k)


def loss(out):
    return jnp.mean(jnp.square(out.logits.astype(jnp.float32)))


def test_gemma3_traces_into_its_modules_and_evaluates_as_the_library():
    model, params, mox = traced()
    paths = yax.query("//module_call/@path", mox)
    assert {"Transformer/layer_0/attn/q_einsum", "Transformer/layer_1/mlp", "Transformer/final_norm"} <= set(paths)
    assert yax.query('count(//module_call[@type="Block"])', mox) == 2.0
    want = model.apply(params, TOKENS)
    assert_close(yax.eval_mox(mox, params, TOKENS), want, rtol=0, atol=0)  # the very same output pytree, bit for bit
    assert_close(jax.jit(lambda p, t: yax.eval_mox(mox, p, t))(params, TOKENS), want)
    grad = jax.jit(jax.grad(lambda p: loss(yax.eval_mox(mox, p, TOKENS))))(params)
    grad_want = jax.jit(jax.grad(lambda p: loss(model.apply(p, TOKENS))))(params)
    assert max(np.abs(v).max() for v in flat(grad_want).values()) > 0
    assert_close(grad, grad_want, rtol=1e-4, atol=1e-7)


def test_a_linen_model_called_through_kauldrons_wrapped_apply_points_at_the_users_line():
    """kauldron (imported by gemma) wraps `nn.Module.apply` for every linen model in the process:
    a call's source is still the user's line calling `apply`, not kauldron's wrapper."""
    net, x = flax.linen.Dense(3), jnp.ones((2, 4))
    v = net.init(jax.random.key(0), x)
    assert hasattr(flax.linen.Module.apply, "__wrapped__")  # kauldron's wrapper is there
    mox = yax.make_mox(lambda v, x: net.apply(v, x))(v, x)
    top = yax.query("//module_call", mox)[0]
    assert top.source is not None and top.source.path == __file__, top.source


def test_a_gelu_swap_equals_the_library_run_with_relu_and_compare_names_it():
    model, params, mox = traced()
    new = yax.sub('//*[@name="gelu"]', jax.nn.relu, mox)
    # gemma's FeedForward calls `nn.gelu`; run eagerly, or `nn.jit` hands back the program compiled before
    with mock.patch.object(flax.linen, "gelu", jax.nn.relu), jax.disable_jit():
        want = model.apply(params, TOKENS)
    assert not np.allclose(want.logits, model.apply(params, TOKENS).logits, atol=1e-4)
    assert_close(yax.eval_mox(new, params, TOKENS), want)
    c = yax.compare(mox, new, params, TOKENS)
    assert c.first_divergence == "Transformer/layer_0/mlp/gelu"


def test_lora_on_the_attention_einsums_trains_and_merges():
    model, params, mox = traced()
    new, lp = yax.sub(ATTENTION, yax.LoRA(rank=2), mox, params=params, key=jax.random.key(1))
    assert yax.query('count(//module_call[@type="LoRA"])', new) == 6.0
    assert lp["params"]["layer_0"]["attn"]["kv_einsum"]["lora_b"].shape == (2, 2 * 2 * 8)  # (k, v) x heads x dim
    assert_close(yax.eval_mox(new, lp, TOKENS), model.apply(params, TOKENS), rtol=0, atol=0)
    trained = jax.tree_util.tree_map_with_path(
        lambda kp, v: v + 0.05 if "lora_b" in jax.tree_util.keystr(kp) else v, lp)
    out = yax.eval_mox(new, trained, TOKENS)
    assert not np.allclose(out.logits, model.apply(params, TOKENS).logits, atol=1e-4)
    merged, mp = yax.merge_lora(new, trained)
    assert_close(model.apply(mp, TOKENS), out, rtol=1e-4, atol=1e-5)  # the library's model on merged weights
    with pytest.raises(yax.errors.CannotAdapt) as e:
        yax.sub('//module_call[@type="Einsum"]', yax.LoRA(rank=2), mox, params=params)
    assert e.value.node.path.startswith("Transformer/") and e.value.found.startswith("has ")


def test_lora_on_bfloat16_gemma_is_exact_and_merge_says_why_it_cannot_rebuild():
    model, params, mox = traced("bfloat16")  # gemma's default: parameters made in bfloat16
    new, lp = yax.sub(ATTENTION, yax.LoRA(rank=2), mox, params=params, key=jax.random.key(1))
    assert lp["params"]["layer_0"]["attn"]["q_einsum"]["lora_a"].dtype == jnp.bfloat16
    assert_close(yax.eval_mox(new, lp, TOKENS), model.apply(params, TOKENS), rtol=0, atol=0)
    with pytest.raises(yax.errors.ParamDtypeDiffers) as e:
        yax.merge_lora(new, lp)
    assert (e.value.problem, e.value.held) == ("merge", "bfloat16")


def test_capture_patch_and_the_explorer():
    from yax_widget import Explorer

    model, params, mox = traced()
    out, acts = yax.capture('//*[@name="gelu"]', mox, params, TOKENS)
    assert sorted(acts) == ["Transformer/layer_0/mlp/gelu", "Transformer/layer_1/mlp/gelu"]
    assert_close(yax.patch('//*[@name="gelu"]', mox)(acts, params, TOKENS), out, rtol=0, atol=0)
    with mock.patch.object(flax.linen, "gelu", jnp.zeros_like), jax.disable_jit():
        want = model.apply(params, TOKENS)
    zeros = {k: jnp.zeros_like(v) for k, v in acts.items()}
    assert_close(yax.patch('//*[@name="gelu"]', mox)(zeros, params, TOKENS), want)
    ex = Explorer(model, params, TOKENS)
    try:
        ex.substitute('//*[@name="gelu"]', "ReLU")
        assert ex.comparison.first_divergence == "Transformer/layer_0/mlp/gelu"
        ex.add_replacement("LoRA r=2", yax.LoRA(rank=2))
        ex.substitute(ATTENTION, "LoRA r=2")
        assert yax.query('count(//module_call[@type="LoRA"])', ex.mox) == 6.0
    finally:
        ex.close()


def test_compiled_cost_is_xlas_and_names_every_call():
    from helpers import check_compiled_cost

    model, params, mox = traced()
    cost = check_compiled_cost(mox, params, TOKENS)
    want = jax.jit(model.apply).lower(params, TOKENS).compile().cost_analysis()
    assert cost.xla["flops"] == want["flops"]  # the program yax compiled is the library's own
    # the attention projections' matrix products are theirs: 2·m·n·k at least (XLA adds their elementwise work)
    q = cost["Transformer/layer_0/attn/q_einsum"]
    assert q.flops >= 2 * 16 * 32 * 4 * 8
