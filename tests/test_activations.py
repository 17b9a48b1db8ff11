"""Activations reached through tables, partials and attributes built before
the trace (yax/_activations.py), on real Hugging Face Flax models built from
tiny configs with random weights (no network)."""

import functools
import sys
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx
from transformers import modeling_flax_utils

import yax
from yax import _activations

ACT2FN = modeling_flax_utils.ACT2FN
IDS = jnp.array([[5, 7, 11, 13, 2, 3, 17, 19]], dtype=jnp.int32)
GELU_EXACT = functools.partial(nn.gelu, approximate=False)  # built at import, like ACT2FN's


def close(a, b, tol=1e-5):
    return jax.tree.all(jax.tree.map(lambda x, y: np.allclose(x, y, rtol=tol, atol=tol), a, b))


def activations(mox):
    return [(n.path, n.name, n.method, dict(n.attrs)) for n in mox.modules() if n.kind == "activation"]


# -- Hugging Face models -------------------------------------------------------------

def gpt2(act):
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=16,
                                     activation_function=act)
    model = transformers.FlaxGPT2LMHeadModel(config, seed=0)
    return model, lambda ids, params: model(ids, params=params).logits


def bert(act):
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=37, max_position_embeddings=16, hidden_act=act)
    model = transformers.FlaxBertModel(config, seed=0)
    return model, lambda ids, params: model(ids, params=params).last_hidden_state


def clip(act):
    config = transformers.CLIPTextConfig(vocab_size=100, hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                                         num_attention_heads=2, max_position_embeddings=16, hidden_act=act)
    model = transformers.FlaxCLIPTextModel(config, seed=0)
    return model, lambda ids, params: model(ids, params=params).last_hidden_state


def llama(act):
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16,
                                      hidden_act=act)
    model = transformers.FlaxLlamaForCausalLM(config, seed=0)
    return model, lambda ids, params: model(ids, params=params).logits


# (builder, config activation, the node's name, the function it calls, its attrs)
HF = {
    "gpt2": (gpt2, "gelu_new", "gelu_new", "gelu", {"approximate": True}),
    "bert": (bert, "gelu", "gelu", "gelu", {"approximate": False}),
    "clip": (clip, "quick_gelu", "quick_gelu", "quick_gelu", {}),
    "llama": (llama, "silu", "silu", "silu", {}),
}


@pytest.fixture(scope="module")
def hf():
    cache = {}

    def get(name):
        if name not in cache:
            model, fn = HF[name][0](HF[name][1])
            cache[name] = (model, fn, yax.make_mox(fn)(IDS, model.params))
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(HF))
def test_hf_activation_is_a_named_node(name, hf):
    model, fn, mox = hf(name)
    _, _, node_name, method, attrs = HF[name]
    found = yax.query(f'//activation[@name="{node_name}"]', mox)
    assert len(found) == 1 and yax.query(f'//*[@name="{node_name}"]', mox)[0] is found[0]  # (then a jit inside)
    assert (found[0].method, dict(found[0].attrs)) == (method, attrs)
    assert "/mlp/" in found[0].path or "/intermediate/" in found[0].path
    assert close(yax.eval_mox(mox, IDS, model.params), fn(IDS, model.params))


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_hf_activation_swapped_to_relu_is_the_relu_model(name, hf):
    model, fn, mox = hf(name)
    new = yax.sub(f'//*[@name="{HF[name][2]}"]', jax.nn.relu, mox)
    assert [n.name for n in new.modules() if n.kind == "activation" and n.name == "relu"] == ["relu"]
    _, relu_fn = HF[name][0]("relu")
    want = relu_fn(IDS, model.params)  # the same weights, `hidden_act="relu"`
    assert close(yax.eval_mox(new, IDS, model.params), want)
    assert not close(want, fn(IDS, model.params))


def test_hf_table_restored_after_trace_and_failure(hf):
    before = dict(ACT2FN)
    model, fn, _ = hf("gpt2")
    seen = {}

    def boom(ids, params):
        seen.update(ACT2FN)
        fn(ids, params)
        raise ValueError("boom")

    with pytest.raises(yax.errors.CouldNotTrace) as e:
        yax.make_mox(boom)(IDS, model.params)
    assert type(e.value.error) is ValueError and e.value.error.args == ("boom",)
    assert all(ACT2FN[k] is v for k, v in before.items()) and ACT2FN.keys() == before.keys()
    assert all(seen[k] is not v for k, v in before.items())  # every entry was marked while tracing
    yax.make_mox(fn)(IDS, model.params)
    assert all(ACT2FN[k] is v for k, v in before.items())
    assert "optimization_barrier" not in str(jax.make_jaxpr(fn)(IDS, model.params))


def test_hf_table_entries_are_named_by_key():
    t = _activations.table()
    names = {k: t[id(v)][0] for k, v in ACT2FN.items()}
    assert names == {"gelu": "gelu", "relu": "relu", "silu": "silu", "swish": "silu", "gelu_new": "gelu_new",
                     "quick_gelu": "quick_gelu", "gelu_pytorch_tanh": "gelu_pytorch_tanh", "tanh": "tanh"}


def test_hf_activation_bound_before_the_trace(hf):
    """A module bound outside the trace ran `setup` then: its `self.act` is
    the table's own partial, pointed at the wrapper for the call."""
    model, _, _ = hf("gpt2")
    block = transformers.models.gpt2.modeling_flax_gpt2.FlaxGPT2MLP(model.config, intermediate_size=64)
    x = jnp.ones((1, 4, 32))
    bound = block.bind(block.init(jax.random.key(0), x))
    assert bound.act is ACT2FN["gelu_new"]  # reading it ran `setup`, outside any trace
    mox = yax.make_mox(lambda x: bound(x))(x)
    assert [(n.name, n.method, dict(n.attrs)) for n in mox.modules() if n.kind == "activation"] == [
        ("gelu_new", "gelu", {"approximate": True})]
    assert bound.act is ACT2FN["gelu_new"]
    assert close(yax.eval_mox(mox, x), bound(x))


# -- partials and attributes -----------------------------------------------------------

@pytest.mark.core
def test_partial_in_a_field_is_a_node():
    class Act(nn.Module):
        act: object = GELU_EXACT

        @nn.compact
        def __call__(self, x):
            return self.act(nn.Dense(3)(x))

    m, x = Act(), jnp.ones((1, 2))
    v = m.init(jax.random.key(0), x)
    mox = yax.make_mox(m.apply)(v, x)
    assert activations(mox) == [("Act/gelu", "gelu", "gelu", {"approximate": False})]
    assert len(yax.query('//activation[@name="gelu"][@approximate="False"]', mox)) == 1
    assert close(yax.eval_mox(mox, v, x), m.apply(v, x))
    assert m.act is GELU_EXACT and Act.act is GELU_EXACT
    new = yax.sub('//*[@name="gelu"]', jax.nn.relu, mox)
    assert close(yax.eval_mox(new, v, x), jax.nn.relu(nn.Dense(3).apply({"params": v["params"]["Dense_0"]}, x)))


@pytest.mark.core
def test_attribute_set_in_setup_is_a_node():
    class Act(nn.Module):
        def setup(self):
            self.dense = nn.Dense(3)
            self.act = GELU_EXACT

        def __call__(self, x):
            return self.act(self.dense(x))

    m, x = Act(), jnp.ones((1, 2))
    v = m.init(jax.random.key(0), x)
    mox = yax.make_mox(m.apply)(v, x)
    assert activations(mox) == [("Act/gelu", "gelu", "gelu", {"approximate": False})]
    assert close(yax.eval_mox(mox, v, x), m.apply(v, x))


@pytest.mark.core
def test_partial_in_an_nnx_attribute_is_a_node():
    class Act(nnx.Module):
        def __init__(self):
            self.dense = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
            self.act = GELU_EXACT

        def __call__(self, x):
            return self.act(self.dense(x))

    m, x = Act(), jnp.ones((1, 2))
    mox = yax.make_mox(m)(x)
    assert activations(mox) == [("Act/gelu", "gelu", "gelu", {"approximate": False})]
    assert m.act is GELU_EXACT
    state = nnx.state(m)
    assert close(yax.eval_mox(mox, state, x)[0], m(x))


@pytest.mark.core
def test_registered_table_of_a_module(monkeypatch):
    """A table is any loaded module's dict (or the module itself): its own
    functions and partials are named by key; restored afterwards."""
    mod = types.ModuleType("acts_for_test")

    def squash(x):
        return x / (1 + jnp.abs(x))

    squash.__module__ = mod.__name__
    mod.squash, mod.ACTS = squash, {"squash": squash, "gelu_exact": functools.partial(nn.gelu, approximate=False)}
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setattr(_activations, "TABLES", [*_activations.TABLES, (mod.__name__, "ACTS"), (mod.__name__, None)])
    before = dict(mod.ACTS)

    def f(x):
        return mod.ACTS["gelu_exact"](mod.squash(x)) + mod.ACTS["squash"](x)

    x = jnp.ones((2, 3))
    mox = yax.make_mox(f)(x)
    assert [(n, m, a) for _, n, m, a in activations(mox)] == [
        ("squash", "squash", {}), ("gelu_exact", "gelu", {"approximate": False}), ("squash", "squash", {})]
    assert close(yax.eval_mox(mox, x), f(x))
    assert mod.squash is squash and all(mod.ACTS[k] is v for k, v in before.items())
