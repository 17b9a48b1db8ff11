"""yax.to_dot (golden DOT output, the dataflow it draws) and to_svg, rendered by the real `dot`.

Regenerate goldens on purpose with ``YAX_REGEN_GOLDEN=1`` and review the diff.
"""

import os
import re
import shutil
import subprocess

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
    with pytest.raises(yax.YaxQueryError, match="selected 2 nodes"):
        yax.to_dot(tf, root='//module_call[@type="Block"]')
    with pytest.raises(yax.YaxQueryError, match="selected no module call"):
        yax.to_dot(tf, root='//module_call[@type="Nope"]')


def test_dot_is_valid_graphviz_and_renders_svg(tf):
    svg = yax.to_svg(tf, root='//module_call[@name="Block_1"]')
    root = etree.fromstring(svg.encode())
    assert root.tag.endswith("svg")
    assert "Dense_0 : Dense" in svg
    ids = {i for i in root.xpath("//*[local-name()='g']/@id") if i.startswith("yax-")}
    assert len(ids) == yax.to_dot(tf, root='//module_call[@name="Block_1"]').count('id="yax-')
    for name in ["transformer.dot", "transformer_scan.dot", "mlp.equations.dot"]:
        text = (os.path.dirname(__file__) + "/golden/" + name)
        done = subprocess.run([shutil.which("dot"), "-Tsvg", text], capture_output=True)
        assert done.returncode == 0, done.stderr


def test_svg_without_dot_program_says_how_to_install(tf, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH on which there is no `dot`
    with pytest.raises(yax.YaxDependencyError, match="apt-get install graphviz"):
        yax.to_svg(tf, depth=0)


def test_svg_layout_time_is_bounded(tf):
    with pytest.raises(yax.YaxRenderError, match="longer than 0.001 s"):
        yax.to_svg(tf, equations=True, timeout=0.001)
