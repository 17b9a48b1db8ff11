"""Names XML cannot hold (a control character in a module name, a function
named "\\x00") are escaped reversibly in the XML view, and `query`, `dump_xml`
and `sub` fail only with a `YaxError`."""

import io

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yax
from yax.internal import from_xml_text, to_xml_text

pytestmark = pytest.mark.core

X = jnp.ones((1, 2))


class Named(nn.Module):
    """A Dense layer under whatever name it is given."""

    n: str

    @nn.compact
    def __call__(self, x):
        return nn.relu(nn.Dense(2, name=self.n)(x))


def traced(name):
    m = Named(name)
    params = m.init(jax.random.key(0), X)
    return yax.make_mox(m.apply)(params, X), params


def literal(s):
    """``s`` as an XPath 1.0 string expression."""
    if '"' not in s:
        return f'"{s}"'
    if "'" not in s:
        return f"'{s}'"
    return "concat(" + ", '\"', ".join(f'"{part}"' for part in s.split('"')) + ")"


def dumped(mox):
    buf = io.BytesIO()
    yax.dump_xml(mox, buf)
    return buf.getvalue()


def test_a_control_character_in_a_module_name():
    mox, _ = traced("a\x01b")
    dense = next(n for n in mox.modules() if n.type == "Dense")
    assert dense.name == "a\x01b"
    assert dense in yax.query("//*", mox)
    # as the XML shows it (and as Python writes it), or with the character itself
    assert yax.query(r'//module_call[@name="a\x01b"]', mox) == [dense]
    assert yax.query('//module_call[@name="a\x01b"]', mox) == [dense]
    assert yax.query(r'//module_call[@path="Named/a\x01b"]', mox) == [dense]
    data = dumped(mox)
    assert rb'name="a\x01b"' in data
    doc = yax.load_xml(data)
    [el] = yax.query('//module_call[@type="Dense"]', doc)
    assert el.get("name") == r"a\x01b" and from_xml_text(el.get("name")) == "a\x01b"
    assert str(doc) == data.decode()


def test_a_replacement_function_named_nul():
    model = nn.Sequential([nn.Dense(4), nn.relu])
    params = model.init(jax.random.key(0), X)
    mox = yax.make_mox(model.apply)(params, X)

    def f(x):
        return 2 * x

    f.__name__ = f.__qualname__ = "\x00"
    new = yax.sub('//*[@name="relu"]', f, mox)
    [fn] = [n for n in new.modules() if n.name == "\x00"]
    assert fn in yax.query("//*", new)
    assert yax.query(r'//*[@name="\x00"]', new) == [fn]
    doc = yax.load_xml(dumped(new))
    assert [from_xml_text(e.get("name")) for e in yax.query("//function", doc)] == ["\x00"]
    # and it can be rewritten again, by the name as the XML shows it
    again = yax.sub(r'//function[@name="\x00"]', jax.nn.relu, new)
    assert [n.name for n in again.modules()] == ["Sequential", "layers_0", "relu"]


@pytest.mark.parametrize("s, shown", [("", ""), ("plain", "plain"), ("a\x01b", r"a\x01b"), ("\\", "\\"),
                                      ("\\d+", "\\d+"), ("a\\x01", r"a\\x01"), ("\\\x01", r"\\\x01"),
                                      ("\ud800", r"\ud800"), ("é😀\t\n\r\x7f", "é😀\t\n\r\x7f")])
def test_escaping_shows_text_as_python_writes_it(s, shown):
    assert to_xml_text(s) == shown


@pytest.mark.parametrize("s", ["", "plain", "a\x01b", "\\", "a\\x01", "\\\x01", "\\\\x", "\ud800\udfff", "\ufffe",
                               "é😀", "\t\n\r", "\\u0041", "\x00\x1f\x7f"])
def test_escaping_is_reversible_and_leaves_ordinary_text_alone(s):
    t = to_xml_text(s)
    assert from_xml_text(t) == s
    from lxml import etree

    etree.Element("e").set("a", t)  # XML holds it


# Module names as Flax takes them: any text but lone surrogates (Flax itself fails on those).
_NAMES = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=8),
    st.lists(st.sampled_from(["a", "\x00", "\x01", "\x1f", "\t", "'", '"', "/", "\\", "x", "u", "😀", "\ufffe",
                              "[", "]", "pjit", " ", "&", "<"]), max_size=6).map("".join),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=_NAMES)
def test_any_module_name_is_found_by_its_name_and_round_trips(name):
    mox, _ = traced(name)
    dense = next(n for n in mox.modules() if n.type == "Dense")
    shown = to_xml_text(name or "module_call")  # a node without a name is named after its kind
    assert yax.query(f"//module_call[@name={literal(shown)}]", mox) == [dense]
    assert yax.query(f"//module_call[@path={literal(to_xml_text(dense.path))}]", mox) == [dense]
    if name and not ('"' in name and "'" in name):  # one literal: the name as written finds it too
        if shown == name or any(to_xml_text(c) != c for c in name if c != "\\"):
            assert yax.query(f"//module_call[@name={literal(name)}]", mox) == [dense]
    data = dumped(mox)
    doc = yax.load_xml(data)
    assert str(doc) == data.decode()
    [el] = yax.query(f"//module_call[@name={literal(shown)}]", doc)
    assert from_xml_text(el.get("name")) == (name or "module_call") and from_xml_text(el.get("path")) == dense.path
    assert yax.query("count(//module_call)", doc) == yax.query("count(//module_call)", mox) == 2


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.text(max_size=6))
def test_any_function_name_given_by_sub_is_queryable_and_dumped(name):
    model = nn.Sequential([nn.Dense(4), nn.relu])
    params = model.init(jax.random.key(0), X)
    mox = yax.make_mox(model.apply)(params, X)

    def f(x):
        return 2 * x

    f.__name__ = f.__qualname__ = name
    new = yax.sub('//*[@name="relu"]', f, mox)
    [fn] = yax.query("//function", new)
    assert fn.name == name or not name
    assert yax.query(f"//function[@name={literal(to_xml_text(fn.name))}]", new) == [fn]
    doc = yax.load_xml(dumped(new))
    assert [from_xml_text(e.get("name")) for e in yax.query("//function", doc)] == [fn.name]


# -- every failure is a YaxError ----------------------------------------------------

_MOX = object()  # stands for the fixture's MoX among the generated arguments
_JUNK = st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=20), st.binary(max_size=8),
                  st.lists(st.integers(), max_size=2), st.just(object()), st.just(jnp.ones(2)))


@pytest.fixture(scope="module")
def small():
    model = nn.Sequential([nn.Dense(4), nn.relu])
    params = model.init(jax.random.key(0), X)
    return yax.make_mox(model.apply)(params, X), params


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(xpath=_JUNK, target=st.one_of(st.just(_MOX), _JUNK), timeout=st.one_of(st.none(), st.just(2), _JUNK))
def test_query_fails_only_with_yax_errors(small, xpath, target, timeout):
    try:
        yax.query(xpath, small[0] if target is _MOX else target, timeout=timeout)
    except yax.YaxError:
        pass


def test_a_huge_indent_is_refused_before_anything_is_written(small):
    # each level's spaces are a string in memory: 10**9 took gigabytes per level and the process was killed
    buf = io.StringIO()
    for indent in (65, 10**9, 2**63):
        with pytest.raises(yax.errors.BadLimit) as e:
            yax.dump_xml(small[0], buf, indent=indent)
        assert (e.value.argument, e.value.value) == ("indent", indent) and "from 0 to 64" in e.value.expected
    assert buf.getvalue() == ""
    yax.dump_xml(small[0], buf, indent=64)
    assert "\n" + " " * 64 + "<" in buf.getvalue()


class _Closed(io.BytesIO):
    pass


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.one_of(st.just(_MOX), _JUNK), file=st.one_of(st.sampled_from(["bytes", "text", "closed"]), _JUNK),
       indent=st.one_of(st.booleans(), st.integers(-2, 4), _JUNK))
def test_dump_xml_fails_only_with_yax_errors(small, target, file, indent):
    f = {"bytes": io.BytesIO(), "text": io.StringIO(), "closed": _Closed()}.get(file, file) \
        if isinstance(file, str) else file
    if isinstance(f, _Closed):
        f.close()
    try:
        yax.dump_xml(small[0] if target is _MOX else target, f, indent=indent)
    except yax.YaxError:
        pass


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=st.one_of(st.sampled_from(['//*[@name="relu"]', "//module_call", "//dot_general", "//*"]), _JUNK),
       repl=st.one_of(st.sampled_from([jax.nn.gelu, "mox", "node"]), _JUNK),
       params=st.one_of(st.none(), st.just("params"), _JUNK), key=st.one_of(st.none(), _JUNK))
def test_sub_fails_only_with_yax_errors(small, pattern, repl, params, key):
    mox, p = small
    repl = {"mox": mox, "node": (lambda path, node: node)}.get(repl, repl) if isinstance(repl, str) else repl
    try:
        yax.sub(pattern, repl, mox, params=p if isinstance(params, str) and params == "params" else params, key=key)
    except yax.YaxError:
        pass
