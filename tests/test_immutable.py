"""MoX nodes are immutable in fact, deciders included: nothing a decider does to
the node it is handed reaches the MoX."""

import dataclasses
import io
import types

import jax
import jax.numpy as jnp
import pytest

import yax
import yax.internal

pytestmark = pytest.mark.core

DENSE = '//module_call[@type="Dense"]'


@pytest.fixture
def seq():
    import flax.linen as nn

    model = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)])
    x = jnp.ones((1, 3))
    params = model.init(jax.random.key(0), x)
    return yax.make_mox(model.apply)(params, x), params, x


def _state(mox):
    """How the MoX prints, what queries see, its XML, and its nodes' names."""
    buf = io.StringIO()
    yax.dump_xml(mox, buf)
    found = yax.query(DENSE, mox)
    names = [(n.name, n.path) for n in mox.walk()]
    return str(mox), [(n.path, dict(n.attrs)) for n in found], buf.getvalue(), names


def test_attrs_are_read_only(seq):
    mox = seq[0]
    dense = yax.query(DENSE, mox)[0]
    assert isinstance(dense.attrs, types.MappingProxyType)
    with pytest.raises(TypeError):
        dense.attrs["features"] = 7
    with pytest.raises(TypeError):
        dense.info.defaults["features"] = 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        dense.name = "x"
    assert dense.attrs["features"] == 4


def test_attrs_copy_what_they_were_built_from():
    fields = {"features": 3}
    info = yax.internal.ModuleInfo(attrs=fields)
    fields["features"] = 5
    assert info.attrs == {"features": 3}
    assert dataclasses.replace(info, attrs={"features": 4}).attrs == {"features": 4}
    assert info == yax.internal.ModuleInfo(attrs={"features": 3})


def _setting_attrs(path, node):
    node.attrs["features"] = 99
    return node


def _setting_a_field(path, node):
    object.__setattr__(node, "name", "renamed")
    return node


def _setting_a_field_below(path, node):
    object.__setattr__(node.children[0], "path", "elsewhere")
    return node


def _setting_info(path, node):
    object.__setattr__(node.info, "attrs", {"features": 99})
    return node


def _setting_equation_params(path, node):
    eq = next(c for c in node.walk() if isinstance(c, yax.Equation))
    eq.params["zz"] = 1
    return node


@pytest.mark.parametrize("decider", [_setting_attrs, _setting_a_field, _setting_a_field_below, _setting_info,
                                     _setting_equation_params])
def test_a_decider_that_mutates_the_node_is_refused_and_changes_nothing(seq, decider):
    mox = seq[0]
    before = _state(mox)
    refused = None
    try:
        yax.sub(DENSE, decider, mox)
    except yax.YaxRewriteError as e:
        refused = str(e)
    assert _state(mox) == before  # printing, querying and the XML as before
    assert refused is not None and f"decider `{decider.__name__}`" in refused and "Nothing was changed" in refused
    # the cached query view and a fresh one agree
    assert yax.internal.build_view(mox).xml_bytes() == yax.internal.view(mox).xml_bytes()


def test_a_decider_that_only_looks_still_works(seq):
    mox, params, x = seq
    before = _state(mox)
    new = yax.sub("//activation", lambda path, node: jax.nn.gelu if node.attrs == {} and node.name == "relu"
                  else node, mox)
    assert [n.name for n in new.modules()] == ["Sequential", "layers_0", "gelu", "layers_2"]
    assert _state(mox) == before
    assert yax.internal.misfit(lambda path, node: node, yax.query(DENSE, mox)[0], mox) is None
    assert "decider" in yax.internal.misfit(_setting_a_field, yax.query(DENSE, mox)[0], mox)
    assert _state(mox) == before
