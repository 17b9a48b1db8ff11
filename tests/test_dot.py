"""yax.to_dot (golden DOT output, the dataflow it draws) and to_svg, rendered by the real `dot`.

Regenerate goldens on purpose with ``YAX_REGEN_GOLDEN=1`` and review the diff.
"""

import os
import re
import shutil
import subprocess

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from helpers import check_golden, mox_of
from lxml import etree

import yax
import yax.internal

pytestmark = pytest.mark.core


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("transformer.dot", {}),
        ("transformer.depth0.dot", {"depth": 0}),
        ("transformer.block.dot", {"root": '//module_call[@name="Block_0"]'}),
        ("mlp.equations.dot", {"equations": True, "params": True}),
        ("transformer_scan.dot", {}),
        # folded: Block_0 and Block_1 drawn once, ×2 (the unfolded goldens above are unchanged)
        ("transformer.fold.dot", {"fold": True}),
        ("transformer.fold.depth1.dot", {"fold": True, "depth": 1}),
        ("transformer.fold.expand.dot", {"fold": True, "depth": 1, "expand": ['//module_call[@name="Block_0"]']}),
    ],
)
def test_dot_golden(name, kwargs):
    case = name.split(".")[0]
    check_golden(name, yax.to_dot(mox_of(case), **kwargs).rstrip("\n"))


def _edges(dot):
    ids = dict(re.findall(r'^\s*(n\d+) \[.*?label="([^"\\]*)', dot, re.M))
    return {(ids[s], ids[d]) for s, d in re.findall(r"(n\d+) -> (n\d+)", dot)}


def test_dot_dataflow_follows_the_model(tf):
    dot = yax.to_dot(tf, root='//module_call[@name="Block_0"]')
    e = _edges(dot)
    # MLP half of a pre-norm block: LayerNorm_1 -> Dense_0 -> gelu -> Dense_1 -> Dropout_1 -> residual add
    chain = ["LayerNorm_1 : LayerNorm", "Dense_0 : Dense", "gelu", "Dense_1 : Dense", "Dropout_1 : Dropout", "add"]
    for a, b in zip(chain, chain[1:]):
        assert (a, b) in e, (a, b)
    # q @ k joins the two projections in one node; the residual add joins block input and MLP output
    assert ("SelfAttention_0._split_heads : SelfAttention", "dot_general") in e
    assert ("in 0", "LayerNorm_0 : LayerNorm") in e and ("in 0", "add") in e
    # ids map back to the XML view's nodes
    ids = [int(i) for i in re.findall(r'id="yax-(\d+)"', dot)]
    nodes = yax.internal.view(tf).nodes
    assert {nodes[i].path for i in ids if isinstance(nodes[i], yax.Mox)} >= {
        "Transformer/Block_0/Dense_0", "Transformer/Block_0/SelfAttention_0"}


def test_dot_depth_and_params(tf):
    shallow = yax.to_dot(tf, depth=0)
    assert "cluster" in shallow and shallow.count("subgraph") == 1  # only the inputs group
    assert "Transformer : Transformer" in shallow
    assert "['params']" not in yax.to_dot(tf) and "args[0]['params']" in yax.to_dot(tf, params=True)


def test_dot_root_must_select_one_call(tf):
    with pytest.raises(yax.errors.NotOneNode) as e:
        yax.to_dot(tf, root='//module_call[@type="Block"]')
    assert isinstance(e.value, yax.YaxQueryError) and (e.value.tool, e.value.count) == ("to_dot", 2)
    with pytest.raises(yax.errors.NotOneNode) as e:
        yax.to_dot(tf, root='//module_call[@type="Nope"]')
    assert (e.value.xpath, e.value.count) == ('//module_call[@type="Nope"]', 0)


def test_dot_is_valid_graphviz_and_renders_svg(tf):
    svg = yax.to_svg(tf, root='//module_call[@name="Block_1"]')
    root = etree.fromstring(svg.encode())
    assert root.tag.endswith("svg")
    assert "Dense_0 : Dense" in svg
    ids = {i for i in root.xpath("//*[local-name()='g']/@id") if i.startswith("yax-")}
    assert len(ids) == yax.to_dot(tf, root='//module_call[@name="Block_1"]').count('id="yax-')
    for name in ["transformer.dot", "transformer_scan.dot", "mlp.equations.dot", "transformer.fold.dot"]:
        text = (os.path.dirname(__file__) + "/golden/" + name)
        done = subprocess.run([shutil.which("dot"), "-Tsvg", text], capture_output=True)
        assert done.returncode == 0, done.stderr


def test_svg_without_dot_program_says_how_to_install(tf, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH on which there is no `dot`
    with pytest.raises(yax.errors.MissingDependency) as e:
        yax.to_svg(tf, depth=0)
    assert e.value.needs == "`to_svg`" and "`apt-get install graphviz`" in e.value.install


def test_svg_layout_time_is_bounded(tf):
    with pytest.raises(yax.errors.RenderTimeout) as e:
        yax.to_svg(tf, equations=True, timeout=0.001)
    assert e.value.seconds == 0.001


def _boxes(dot):
    """``{label's first line: (id, attributes)}`` of the drawn boxes."""
    out = {}
    for attrs in re.findall(r"^\s*n\d+ \[(.*)\];$", dot, re.M):
        label = re.search(r'label="([^"\\]*)', attrs).group(1)
        out[label] = attrs
    return out


class Stack(nn.Module):
    """Four identical layers, each taking what the one before gives; then one of another width."""

    @nn.compact
    def __call__(self, x):
        for _ in range(4):
            x = nn.Dense(8)(x)
        return nn.Dense(2)(x)


class SideBySide(nn.Module):
    """Two identical projections of the same input (k and v), not a stack; neighbours that differ."""

    @nn.compact
    def __call__(self, x):
        k, v = nn.Dense(8, name="k")(x), nn.Dense(8, name="v")(x)
        return nn.Dense(8, name="wide")(k * v) + nn.Dense(8, use_bias=False, name="nobias")(x)


def _traced(module, x):
    return yax.make_mox(module.apply)(module.init(jax.random.key(0), x), x)


def test_fold_draws_a_stack_of_identical_layers_once():
    mox = _traced(Stack(), jnp.ones((1, 8)))
    plain, folded = yax.to_dot(mox), yax.to_dot(mox, fold=True)
    assert yax.to_dot(mox, fold=False) == plain and "×" not in plain and "yax-fold" not in plain
    boxes = _boxes(folded)
    assert set(boxes) == {"args[1]", "Dense_0–3 ×4 : Dense", "Dense_4 : Dense", "out 0"}
    fold = boxes["Dense_0–3 ×4 : Dense"]
    assert 'class="yax-fold"' in fold and "\\n72 params each" in fold
    assert 'tooltip="4 identical calls, drawn once: Stack/Dense_0 … Stack/Dense_3"' in fold
    # its id is the first layer's row; the edges go in and out of it as they went in and out of the stack
    nodes = yax.internal.view(mox).nodes
    first = int(re.search(r'id="yax-(\d+)"', fold).group(1))
    assert nodes[first].path == "Stack/Dense_0"
    assert _edges(folded) == {("args[1]", "Dense_0–3 ×4 : Dense"), ("Dense_0–3 ×4 : Dense", "Dense_4 : Dense"),
                              ("Dense_4 : Dense", "out 0")}
    # every id still names a node of the model, and the last three layers' ids are gone
    ids = {int(i) for i in re.findall(r'id="yax-(\d+)"', folded)}
    assert all(isinstance(nodes[i], yax.Mox) for i in ids)
    assert {nodes[i].path for i in ids} == {"Stack", "Stack/Dense_0", "Stack/Dense_4"}


class Residual(nn.Module):
    """``x = x + f(x)`` three times: the adds between the layers are folded with them."""

    @nn.compact
    def __call__(self, x):
        for _ in range(3):
            x = x + nn.Dense(8)(x)
        return x


def test_fold_takes_the_equations_between_layers_along():
    mox = _traced(Residual(), jnp.ones((1, 8)))
    folded = yax.to_dot(mox, fold=True)
    assert set(_boxes(folded)) == {"args[1]", "Dense_0–2 ×3 : Dense", "out 0"}
    assert _edges(folded) == {("args[1]", "Dense_0–2 ×3 : Dense"), ("Dense_0–2 ×3 : Dense", "out 0")}


def test_fold_leaves_side_by_side_and_different_neighbours_alone():
    mox = _traced(SideBySide(), jnp.ones((1, 8)))
    folded = yax.to_dot(mox, fold=True)
    assert folded == yax.to_dot(mox)  # k and v are alike but not a stack; wide and nobias differ
    assert "×" not in folded and {"k : Dense", "v : Dense"} <= set(_boxes(folded))


def test_fold_in_a_model_nobody_here_wrote():
    """Hugging Face's Llama (GQA, RoPE) of 3 layers: the layers fold, named by their collection;
    k_proj and v_proj (alike, side by side) and up_proj and gate_proj do not."""
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    model = transformers.FlaxLlamaForCausalLM(cfg, _do_init=False)
    ids = jnp.zeros((1, 8), jnp.int32)
    mask, pos = jnp.ones_like(ids), jnp.arange(8)[None]
    abstract = jax.eval_shape(lambda: model.module.init(jax.random.key(0), ids, mask, pos))
    mox = yax.make_mox(model.module.apply)(abstract, ids, mask, pos)
    shallow = yax.to_dot(mox, depth=3, fold=True)
    label = "layers 0–2 ×3 : FlaxLlamaDecoderLayer"
    assert label in _boxes(shallow) and "class=\"yax-fold yax-more\"" in _boxes(shallow)[label]
    assert [b for b in _boxes(shallow) if "FlaxLlamaDecoderLayer" in b] == [label]
    deep = yax.to_dot(mox, fold=True)
    assert 'label="FlaxLlamaForCausalLMModule/model/layers/0–2 ×3 : FlaxLlamaDecoderLayer"' in deep
    assert {"k_proj : Dense", "v_proj : Dense", "up_proj : Dense", "gate_proj : Dense"} <= set(_boxes(deep))
    assert deep.count("×") == 1
    # the mask and positions feed the fold once, not once per layer
    assert len(re.findall(r"->", deep)) < len(re.findall(r"->", yax.to_dot(mox))) / 2


def test_expand_opens_closed_boxes_whatever_the_depth(tf):
    closed = yax.to_dot(tf, depth=1)
    more = {b for b, attrs in _boxes(closed).items() if 'class="yax-more"' in attrs}
    assert more == {"Block_0 : Block", "Block_1 : Block"}  # the boxes that hold calls
    block = '//module_call[@name="Block_1"]'
    opened = yax.to_dot(tf, depth=1, expand=[block])
    assert 'label="Transformer/Block_1 : Block";' in opened and "Block_0 : Block" in _boxes(opened)
    assert "SelfAttention_0 : SelfAttention" in _boxes(opened)  # one level further, closed
    assert opened == yax.to_dot(tf, depth=1, expand=yax.query(block, tf))
