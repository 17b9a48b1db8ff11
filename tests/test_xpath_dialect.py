"""The earlier prototype's XPath dialect (``pjit``, ``//[``, ``/``) is translated
outside string literals only."""

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import yax
from yax._xpath import normalise

pytestmark = pytest.mark.core


@pytest.fixture(scope="module")
def seq():
    import flax.linen as nn

    model = nn.Sequential([nn.Dense(4), nn.relu])
    x = jnp.ones((1, 3))
    return yax.make_mox(model.apply)(model.init(jax.random.key(0), x), x)


@pytest.mark.parametrize("query, expected", [
    ("string('a pjit b')", "a pjit b"),
    ('concat("//[", "pjit", \'/[\')', "//[pjit/["),
    ("string(\"x /[y\")", "x /[y"),
    ("substring-before('pjit(x)', '(')", "pjit"),
])
def test_string_literals_are_left_as_written(seq, query, expected):
    assert yax.query(query, seq) == expected


def test_a_literal_that_looks_like_the_dialect_matches_only_itself(seq):
    assert normalise("//*[@name='x /[y']") == "//*[@name='x /[y']"
    assert yax.query("//*[@name='x /[y']", seq) == []
    assert yax.query('count(//*[@name="a pjit b"])', seq) == 0


def test_the_dialect_is_still_translated_outside_literals(seq):
    assert normalise('//pjit[@name="relu"]') == '//jit[@name="relu"]'
    assert normalise('//[@name="relu"]') == '//*[@name="relu"]'
    assert normalise("/") == "/*"
    assert normalise("//pjit[@name='pjit']|//[@name=\"//[\"]") == "//jit[@name='pjit']|//*[@name=\"//[\"]"
    # after a literal, `//[` is a step of its own again
    assert normalise('//*[@name="a"] | //[@type="Dense"]') == '//*[@name="a"] | //*[@type="Dense"]'
    assert [n.path for n in yax.query('//[@type="Dense"]', seq)] == ["Sequential/layers_0"]
    relu_jits = yax.query('//jit[@name="relu"]', seq)
    assert relu_jits and yax.query('//pjit[@name="relu"]', seq) == relu_jits


def test_the_prototypes_own_queries_chain_empty_node_tests_after_a_step(seq):
    """The prototype's tests wrote `//[@name="ResBlock"]//[@features=10]` and `..//[@p]`: `//[`
    after a step is the same empty node test (it is no XPath, so nothing else is meant)."""
    assert normalise('//[@type="Sequential"]//[@features=3]') == '//*[@type="Sequential"]//*[@features=3]'
    want = yax.query('//*[@type="Sequential"]//*[@type="Dense"]', seq)
    assert want and yax.query('//[@type="Sequential"]//[@type="Dense"]', seq) == want
    assert yax.query('//module_call/..//[@type="Dense"]', seq) == yax.query('//module_call/..//*[@type="Dense"]', seq)
    with pytest.raises(yax.errors.InvalidXPath) as e:  # one slash after a step stays a mistake
        yax.query('//module_call/[@type="Dense"]', seq)
    assert e.value.kind == "syntax" and "node test" in e.value.hint


def test_an_unterminated_literal_is_reported_by_lxml(seq):
    with pytest.raises(yax.errors.InvalidXPath) as e:
        yax.query("//*[@name='pjit", seq)
    assert (e.value.xpath, e.value.kind) == ("//*[@name='pjit", "syntax")


# arbitrary text, and text made of the pieces the translation looks for
_TEXT = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12),
    st.lists(st.sampled_from(["pjit", " ", "/", "//", "[", "(", "|", "@", "x", "é", "'", '"']), max_size=8).map("".join),
)


@settings(max_examples=200, deadline=None)
@given(a=_TEXT.filter(lambda t: "'" not in t), b=_TEXT.filter(lambda t: '"' not in t),
       outside=st.sampled_from(["//pjit", "//[@x]", "/", "//*", " pjit ", "|//["]))
def test_literals_pass_through_translation_unchanged(a, b, outside):
    q = f"{outside}'{a}'{outside}\"{b}\"{outside}"
    out = normalise(q)
    assert f"'{a}'" in out and f'"{b}"' in out
    # and nothing outside them changed because of what they hold: the output is that of empty literals with
    # the literals put back in their places (b's first: its slot is the one `""`; a's `''` comes before it)
    empty = normalise(f"{outside}''{outside}\"\"{outside}")
    assert out == empty.replace('""', f'"{b}"', 1).replace("''", f"'{a}'", 1)
