"""yax.query (lxml XPath 1.0) and explain, with exact node sets."""

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models import CASES

import yax

pytestmark = pytest.mark.core


def paths(nodes):
    return [n.path for n in nodes]


def test_type_and_numeric_field(tf):
    assert paths(yax.query('//module_call[@type="Dense"][@features=64]', tf)) == [
        "Transformer/Block_0/Dense_0", "Transformer/Block_1/Dense_0"]
    assert paths(yax.query('//module_call[@features > 40]', tf)) == [
        "Transformer/Block_0/Dense_0", "Transformer/Block_1/Dense_0"]


def test_descendant_and_child_steps(tf):
    got = yax.query('//module_call[@name="Block_1"]//module_call[@features=32]', tf)
    assert paths(got) == [f"Transformer/Block_1/{p}" for p in (
        "SelfAttention_0/query", "SelfAttention_0/key", "SelfAttention_0/value", "SelfAttention_0/out",
        "Dense_1")]
    got = yax.query('//module_call[@type="SelfAttention"]/module_call[@name="query"]', tf)
    assert paths(got) == ["Transformer/Block_0/SelfAttention_0/query", "Transformer/Block_1/SelfAttention_0/query"]


def test_activation_nodes_by_name(tf):
    got = yax.query('//*[@name="gelu"]', tf)
    assert [(n.kind, n.path) for n in got] == [
        ("activation", "Transformer/Block_0/gelu"), ("activation", "Transformer/Block_1/gelu")]


def test_functions_return_python_values(tf):
    assert yax.query('count(//module_call[@type="Dense"])', tf) == 12.0  # 6 per block
    assert yax.query('sum(//module_call[@type="Dense"]/@params)', tf) == 2 * (4 * 1056 + 2112 + 2080)
    assert yax.query('string(//module_call[@type="Embed"]/@path)', tf) == "Transformer/embed"
    assert yax.query('count(//module_call) > 3', tf) is True
    assert yax.query('//module_call[@name="embed"]/@method', tf) == ["__call__", "attend"]


def test_regex_union_axes_positions(tf):
    got = yax.query('//module_call[re:test(@path, "Block_[0-0]/Dense")]', tf)
    assert paths(got) == ["Transformer/Block_0/Dense_0", "Transformer/Block_0/Dense_1"]
    got = yax.query('//module_call[@params > 8000]', tf)
    assert paths(got) == ["Transformer", "Transformer/Block_0", "Transformer/Block_1"]
    got = yax.query('//module_call[@name="query"] | //module_call[@name="gelu"] | //activation[@name="gelu"]', tf)
    assert [n.name for n in got] == ["query", "gelu", "query", "gelu"]  # document order
    got = yax.query('//activation[@name="gelu"]/ancestor::module_call', tf)
    assert paths(got) == ["Transformer", "Transformer/Block_0", "Transformer/Block_1"]
    got = yax.query('//module_call[@name="Dense_0"]/following-sibling::module_call', tf)
    assert paths(got) == ["Transformer/Block_0/Dense_1", "Transformer/Block_0/Dropout_1",
                          "Transformer/Block_1/Dense_1", "Transformer/Block_1/Dropout_1"]
    assert paths(yax.query('(//module_call[@type="Dense"])[1]', tf)) == ["Transformer/Block_0/SelfAttention_0/query"]
    assert paths(yax.query('(//module_call[@type="Dense"])[last()]', tf)) == ["Transformer/Block_1/Dense_1"]


def test_equations_and_compat_dialect(tf):
    dots = yax.query("//module_call[@name='query']/dot_general", tf)
    assert len(dots) == 2 and all(isinstance(d, yax.Equation) and d.name == "dot_general" for d in dots)
    # the earlier prototype's dialect
    assert yax.query('//[@name="gelu"]', tf) == yax.query('//*[@name="gelu"]', tf)
    assert yax.query("//pjit", tf) == yax.query("//jit", tf) != []
    assert yax.query("/mox/module_call", tf) == [tf.calls[0]]
    # Mox.query is the same
    assert tf.query('//*[@name="gelu"]') == yax.query('//*[@name="gelu"]', tf)


def test_scan_body_is_queryable():
    fn, args, kwargs = CASES["transformer_scan"]()
    mox = yax.make_mox(fn)(*args, **kwargs)
    (scan,) = yax.query("//scan", mox)
    assert scan.params["length"] == 3
    assert paths(yax.query('//scan[@length=3]//module_call[@type="Block"]', mox)) == ["Transformer/layers/Block_0"]


def test_no_match_is_empty_and_explained(tf):
    q = '//module_call[@type="SelfAttention"]/module_call[@name="qurey"]'
    assert yax.query(q, tf) == []
    text = yax.explain(q, tf)
    assert text.splitlines() == [
        '2  //module_call[@type="SelfAttention"]',
        '0  //module_call[@type="SelfAttention"]/module_call[@name="qurey"]   <- stops matching here']


@pytest.mark.parametrize("q, hint", [
    ('//module_call[@type=Dense', "unbalanced"),
    ("//module_call[@type=Dense]]", "Quote string values"),
    ("//module_call/[@x]", "node test"),
    ("//module_call[", "unbalanced"),
])
def test_invalid_xpath_raises_with_hint(tf, q, hint):
    with pytest.raises(yax.errors.InvalidXPath) as e:
        yax.query(q, tf)
    assert (e.value.xpath, e.value.kind) == (q, "syntax") and hint in e.value.hint


def test_view_is_cached_and_per_mox(tf):
    from yax.internal import view

    assert view(tf) is view(tf)
    other = yax.map_mox(lambda n: n, tf)
    assert other is tf  # unchanged map shares nodes
    fn, args, kwargs = CASES["mlp"]()
    assert view(yax.make_mox(fn)(*args, **kwargs)) is not view(tf)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.sampled_from(list("/[]()@*=<>!|'\" .,:-_0123456789abcdegilmnoprstuxy")), max_size=40)
       | st.text(max_size=30))
def test_fuzz_query_never_hangs(q):
    t = time.perf_counter()
    try:
        r = yax.query(q, _FUZZ_MOX)
        assert isinstance(r, (list, float, bool, str))
    except yax.YaxQueryError:
        pass
    assert time.perf_counter() - t < 1.0


_FUZZ = CASES["mlp"]()
_FUZZ_MOX = yax.make_mox(_FUZZ[0])(*_FUZZ[1], **_FUZZ[2])


def test_string_fields_match_as_written():
    """``@padding="SAME"``: a string field is its text in the view, not its repr (which needed
    ``@padding="'SAME'"``); other values keep their form (numbers, tuples, functions by name)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    class Block(nn.Module):
        hidden_act: str = "gelu"

        @nn.compact
        def __call__(self, x):
            x = nn.Conv(4, (3, 3), padding="SAME")(x)
            return nn.Conv(4, (3, 3), padding="VALID", name="valid")(x)

    x = jnp.ones((1, 8, 8, 3))
    m = Block(hidden_act="relu")
    mox = yax.make_mox(m.apply)(m.init(jax.random.key(0), x), x)
    assert [n.path for n in yax.query('//module_call[@padding="SAME"]', mox)] == ["Block/Conv_0"]
    assert [n.path for n in yax.query("//module_call[@padding='VALID']", mox)] == ["Block/valid"]
    assert yax.query("//module_call[@padding=\"'SAME'\"]", mox) == []
    assert [n.path for n in yax.query('//module_call[@hidden_act="relu"]', mox)] == ["Block"]
    assert len(yax.query('//module_call[@kernel_size="(3, 3)"][@features=4]', mox)) == 2
