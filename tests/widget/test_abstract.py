"""The explorer on a model known by its structure alone (`jax.ShapeDtypeStruct`
parameters: a 70B model planned before any weight exists, bench/bench_scale.py):
everything structural works and equals what the same model with real weights
gives; values, colouring, the NaN search, the comparison and export each say, in
one sentence, that they need concrete parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import yax
from yax.internal import view
from yax_widget import Explorer
from yax_widget._values import NO_VALUES

from .helpers import ask

transformers = pytest.importorskip("transformers")

IDS = jnp.arange(12, dtype=jnp.int32).reshape(1, 12) % 97
MASK = jnp.ones_like(IDS)
POS = jnp.arange(12)[None]
QV = '//module_call[@name="q_proj" or @name="v_proj"]'


@pytest.fixture(scope="module")
def llama():
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.FlaxLlamaForCausalLM(cfg, _do_init=False, dtype=jnp.bfloat16)
    real = model.module.init(jax.random.key(0), IDS, MASK, POS)
    return model.module.apply, real, jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), real)


def opened(fn, variables) -> Explorer:
    ex = Explorer(fn, variables, IDS, MASK, POS, warm=False)
    ex.sent = []
    ex.send = lambda content, buffers=None: ex.sent.append(content)
    ex.add_replacement("LoRA r=2", yax.LoRA(rank=2))
    return ex


@pytest.mark.slow
def test_the_structure_works_as_with_real_weights(llama):
    fn, real, abstract = llama
    a, r = opened(fn, abstract), opened(fn, real)
    assert a.session.abstract and not r.session.abstract
    assert a._tree["rows"] == r._tree["rows"]  # the same tree, row for row
    assert yax.summary(a.mox) == yax.summary(r.mox)
    assert [n.path for n in a.query(QV)] == [n.path for n in r.query(QV)] and len(a.query(QV)) == 6
    q = a.query('//module_call[@name="q_proj"]')[0]
    fits = ask(a, rid=1, type="fits", id=view(a.mox).ids[id(q)])
    assert "LoRA r=2" in fits["fits"]  # the menu offers what the drop does
    assert ask(a, rid=2, type="graph", id=None, depth=1)["type"] == "ok"
    for ex in (a, r):
        assert ex.substitute(QV, "LoRA r=2").startswith("replaced 6 node(s)")
    # the same rewrite: the same tree, and parameters of the same shapes (abstract ones stay abstract)
    assert yax.summary(a.mox) == yax.summary(r.mox)
    shapes = jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), a.params)
    assert shapes == jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), r.params)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(a.params))
    assert a._diff == r._diff and a._history == r._history
    assert "yax.LoRA(rank=2)" in a.code()
    a.undo()
    assert len(a.query('//module_call[@type="LoRA"]')) == 0
    a.redo()
    assert len(a.query('//module_call[@type="LoRA"]')) == 6


def test_values_colour_nan_search_comparison_and_export_say_they_need_real_weights(llama, tmp_path):
    fn, _, abstract = llama
    ex = opened(fn, abstract)
    q = ex.query('//module_call[@name="q_proj"]')[0]
    rid = view(ex.mox).ids[id(q)]
    for request in ({"type": "values", "id": rid}, {"type": "overlay", "stat": "norm"}, {"type": "nonfinite"}):
        reply = ask(ex, rid=4, **request)
        assert reply == {"type": "error", "rid": 4, "message": str(yax.errors.AbstractParams("values"))}, request
    ex.substitute(QV, "LoRA r=2")
    assert ex._comparison == {"message": NO_VALUES} and ex.comparison is None  # a sentence, never a number
    with pytest.raises(yax.errors.AbstractParams) as e:
        ex.values(q)
    assert e.value.tool == "values"
    with pytest.raises(yax.errors.AbstractParams) as e:
        ex.export(tmp_path / "m")
    assert e.value.tool == "export"
    assert not list(tmp_path.iterdir())
