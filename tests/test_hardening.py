"""Hostile and unusual input, one case at a time: queries that used to raise
other errors or hang, `load_xml` refusals and limits, `eval_mox`'s structure errors, and
every post-trace function on MoX trees thousands of levels deep. The random search over
the same inputs is tests/test_fuzz.py."""

from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from deep import nested_calls, nested_jits
from helpers import mox_of, traced
from lxml import etree

import yax
from yax import _xpath
from yax.internal import build_view, call_keys

pytestmark = pytest.mark.core


# -- 1. queries raise YaxQueryError and nothing else -------------------------------------

@pytest.mark.parametrize("q, kind, detail", [
    ('re:test(@path, "(")', "regex", "missing )"),
    ('//*[re:test(@path, "[")]', "regex", ""),
    ("re:replace('a')", "call", "replace() takes"),
    ("re:test()", "call", ""),
    ('re:match("a", "a", "q", "x")', "call", ""),
    ("//*[unknown-fn(1)]", "evaluation", ""),
    ("$undefined", "evaluation", ""),
    ("//*[", "syntax", ""),
    ("\x00", "syntax", ""),
    ("\ud800", "syntax", ""),
])
def test_failing_queries_raise_yax_query_error(tf, q, kind, detail):
    with pytest.raises(yax.errors.InvalidXPath) as e:
        yax.query(q, tf)
    assert (e.value.xpath, e.value.kind) == (q, kind) and detail in e.value.detail
    with pytest.raises(yax.YaxQueryError):  # sub selects with the same query
        yax.sub(q, jnp.tanh, tf)


def test_comments_nodes_and_regex_matches_come_back_as_values():
    mox = mox_of("mlp")
    comments = yax.query("//comment()", mox)
    assert len(comments) == 3 and all(isinstance(c, str) for c in comments)
    assert "dot_general" in comments[0]
    every = yax.query("//self::node()", mox)
    assert [n for n in every if not isinstance(n, str)] == yax.query("//*", mox)
    assert sorted(every[1:], key=str) != []  # elements and the three comments, in document order
    assert sum(isinstance(n, str) for n in every) == 3
    assert yax.query("re:match('MLP/Dense_0', '(\\w+)/(\\w+)')", mox) == ["MLP/Dense_0", "MLP", "Dense_0"]
    assert yax.query('re:replace("a-b-c", "-", "g", "+")', mox) == "a+b+c"
    assert yax.query("//*/namespace::*", mox)[0].startswith("xml ")


def test_queries_over_a_loaded_document_return_its_nodes():
    mox = mox_of("mlp")
    doc = yax.load_xml(yax.to_xml(mox).encode())
    dense = yax.query('//module_call[@type="Dense"]', doc)
    assert [e.get("path") for e in dense] == ["MLP/Dense_0", "MLP/Dense_1"]
    assert all(isinstance(e, etree._Element) and e.getroottree().getroot() is doc.root for e in dense)
    assert [c.text for c in yax.query("//comment()", doc)] == yax.query("//comment()", mox)
    with pytest.raises(yax.errors.NotQueryable) as e:
        yax.query("//*", dense[0])
    assert (e.value.tool, e.value.found) == ("query", "_Element")


# -- 2. every query's time is bounded ---------------------------------------------------

@pytest.mark.parametrize("q", [
    're:test("' + "a" * 40 + '!", "^(a|aa)+$")',  # backtracking: doubles per character
    "count(//*[count(//*[count(//*[count(//*)>0])>0])>0])",  # n^4 node visits
])
def test_a_query_that_would_run_for_hours_is_stopped(tf, q):
    t = time.perf_counter()
    with pytest.raises(yax.errors.QueryTimeout) as e:
        yax.query(q, tf, timeout=0.5)
    assert (e.value.xpath, e.value.seconds) == (q, 0.5)
    assert time.perf_counter() - t < 5
    # the next query gets a fresh process and the same answers
    assert [n.path for n in yax.query('//module_call[@type="Embed"]', tf)] == ["Transformer/embed"] * 2


def test_query_timeout_argument_and_explain_share_one_limit(tf):
    with pytest.raises(yax.errors.BadQueryArgument) as e:
        yax.query("//*", tf, timeout=0)
    assert isinstance(e.value, yax.YaxQueryError) and (e.value.argument, e.value.value) == ("timeout", 0)
    slow = '//module_call[re:test("' + "a" * 40 + '!", "^(a|aa)+$")]/dot_general'
    t = time.perf_counter()
    text = yax.explain(slow, tf, timeout=0.5)
    assert time.perf_counter() - t < 5 and "not evaluated" in text


def test_a_killed_query_process_is_replaced(tf):
    yax.query("//*", tf)
    _xpath._evaluator._proc.kill()
    _xpath._evaluator._proc.wait()
    assert yax.query("count(//module_call)", tf) == sum(n.kind == "module_call" for n in tf.modules())


def test_queries_run_in_process_where_no_process_can_start(tf, monkeypatch):
    ev = _xpath.Evaluator()
    monkeypatch.setattr(_xpath, "_evaluator", ev)

    def refuse(*a, **k):
        raise OSError("no subprocesses here")

    monkeypatch.setattr(_xpath.subprocess, "Popen", refuse)
    assert yax.query('count(//*[@name="gelu"])', tf) == 2.0
    with pytest.raises(yax.errors.InvalidXPath) as e:
        yax.query('re:test(@path, "(")', tf)
    assert e.value.kind == "regex"
    assert ev._proc is None and ev._local is not None


# -- 3. load_xml ------------------------------------------------------------------------

XXE = '<?xml version="1.0"{enc}?><!DOCTYPE m [<!ENTITY x SYSTEM "file://{secret}">]><mox>&x;</mox>'


@pytest.mark.parametrize("codec", ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le",
                                   "utf-32-be", "latin-1"])
def test_a_dtd_is_refused_in_every_encoding(tmp_path, codec):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    name = codec.replace("-sig", "").replace("latin-1", "ISO-8859-1")
    data = XXE.format(enc=f' encoding="{name}"', secret=secret).encode(codec)
    with pytest.raises(yax.errors.DeclaresDTD):
        yax.load_xml(data)
    utf7 = b'<?xml version="1.0" encoding="UTF-7"?>+ADw-!DOCTYPE m+AD4-<mox/>'  # "<!DOCTYPE m>" in UTF-7
    with pytest.raises(yax.errors.DeclaresDTD):
        yax.load_xml(utf7)


def test_what_is_only_mentioned_in_comments_is_no_dtd():
    doc = yax.load_xml(b"<?xml version='1.0'?><!-- <!DOCTYPE x> --><?pi <!ENTITY y 'z'> ?><mox><!-- <!DOCTYPE --></mox>")
    assert doc.root.tag == "mox" and doc.tree.docinfo.internalDTD is None
    text = '<?xml version="1.0" encoding="UTF-16"?><mox a="\u00e9\u4e2d"/>'
    assert yax.load_xml(text.encode("utf-16")).root.get("a") == "\u00e9\u4e2d"
    assert yax.load_xml(io.StringIO(text)).root.get("a") == "\u00e9\u4e2d"  # a text file: already decoded
    latin = '<?xml version="1.0" encoding="ISO-8859-1"?><mox a="\u00e9"/>'.encode("latin-1")
    assert yax.load_xml(latin).root.get("a") == "\u00e9"


def test_every_kind_of_source(tmp_path):
    data = yax.to_xml(mox_of("mlp")).encode()
    path = tmp_path / "mlp.xml"
    path.write_bytes(data)
    with open(path, "rb") as f, open(path, encoding="utf-8") as t:
        sources = [data, bytearray(data), memoryview(data), io.BytesIO(data), path, str(path), f, t]
        docs = [yax.load_xml(s) for s in sources]
    assert len({str(d) for d in docs}) == 1
    for bad, problem, detail, looks_like_xml in [
            (None, "source", "NoneType", False), (42, "source", "int", False),
            (str(tmp_path / "missing.xml"), "open", "No such file or directory", False),
            ("<mox/>", "open", "No such file or directory", True), (tmp_path, "read", "Is a directory", False)]:
        with pytest.raises(yax.errors.CannotRead) as e:
            yax.load_xml(bad)
        assert (e.value.problem, e.value.detail, e.value.looks_like_xml) == (problem, detail, looks_like_xml)
        assert e.value.path == (None if problem == "source" else str(bad))
    with pytest.raises(yax.errors.BadLimit) as e:
        yax.load_xml(data, max_bytes=-1)
    assert (e.value.argument, e.value.value) == ("max_bytes", -1)


def test_a_file_over_the_limit_is_refused_unread(tmp_path):
    big = tmp_path / "big.xml"
    with open(big, "wb") as f:  # sparse: 1 GiB that costs nothing on disk
        f.truncate(2**30)

    class Unreadable(io.FileIO):
        def read(self, *a):
            raise AssertionError("read before refusing")

        readinto = readall = read

    for source in (big, str(big), Unreadable(big)):
        with pytest.raises(yax.errors.DocumentTooLarge) as e:
            yax.load_xml(source)
        assert e.value.unread and e.value.size == 2**30
    # a stream of unknown size is refused as soon as it passes the limit
    with pytest.raises(yax.errors.DocumentTooLarge) as e:
        yax.load_xml(_Stream(b"<mox>" + b" " * 5000 + b"</mox>"), max_bytes=1000)
    assert (e.value.limit_name, e.value.limit, e.value.unread) == ("max_bytes", 1000, False)


class _Stream:
    """A file object that cannot seek and has no descriptor (a socket, a pipe)."""

    def __init__(self, data: bytes):
        self._b = io.BytesIO(data)

    def read(self, n: int = -1) -> bytes:
        return self._b.read(n)


def test_memory_is_bounded_and_the_bound_measured():
    """A flood of tiny elements costs about 120 bytes of tree each: the tree stops
    growing at `max_memory` (measured in a fresh process, sampling its memory)."""
    code = (
        "import io, os, threading, time, yax\n"
        "def rss():\n"
        "    with open('/proc/self/statm') as f:\n"
        "        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
        "data = b'<r>' + b'<a/>' * 10_000_000 + b'</r>'\n"  # 40 MB: 1.2 GB of tree, unbounded
        "base, peak, done = rss(), [0], []\n"
        "def sample():\n"
        "    while not done:\n"
        "        peak[0] = max(peak[0], rss() - base)\n"
        "        time.sleep(0.001)\n"
        "t = threading.Thread(target=sample)\n"
        "t.start()\n"
        "try:\n"
        "    yax.load_xml(io.BytesIO(data), max_memory=200_000_000)\n"
        "except yax.YaxXMLError as e:\n"
        "    print(str(e).split(';')[0])\n"
        "done.append(1)\n"
        "t.join()\n"
        "print(peak[0] // 2**20)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    refused, grown_mib = out.stdout.splitlines()
    assert "would take more than `max_memory` = 200000000 bytes" in refused, out.stderr[-2000:]
    assert 0 < int(grown_mib) < 200


@pytest.mark.slow
def test_what_dump_xml_writes_load_xml_reads():
    # a leaf computation whose jaxpr text is a comment over 10 MB (libxml2's default limit)
    f32, shape = np.dtype("float32"), (1,) * 100
    x = yax.Var(shape, f32)
    one = yax.Literal(1.0, (), f32)
    eqs, cur = [], x
    for _ in range(50_000):
        out = yax.Var(shape, f32)
        eqs.append(yax.Equation(jax.lax.add_p, {}, (cur, one), (out,)))
        cur = out
    long = yax.Mox("root", tuple(eqs), invars=(x,), outvars=(cur,), name="chain")
    buf = io.BytesIO()
    yax.dump_xml(long, buf)
    doc = yax.load_xml(buf.getvalue())
    (comment,) = doc.root.xpath("comment()")
    assert len(comment.text) > 10 * 2**20 and len(doc.root) == 50_001
    # nesting deeper than libxml2 parses (2048 levels): read again by expat
    deep = nested_calls(2100)
    buf = io.BytesIO()
    yax.dump_xml(deep, buf)
    for source in (buf.getvalue(), io.BytesIO(buf.getvalue())):
        doc = yax.load_xml(source)
        assert str(doc) == yax.to_xml(deep)
    with pytest.raises(yax.errors.CannotRead) as e:
        yax.load_xml(_Stream(buf.getvalue()))
    assert e.value.problem == "seek"


# -- 4. depth: every function after tracing takes any depth -------------------------------

DEPTH = 2100  # past the default recursion limit (1000) and libxml2's parse depth (2048)


@pytest.fixture(scope="module")
def deep():
    return nested_calls(DEPTH)


def test_deep_module_calls_evaluate_jit_and_differentiate(deep):
    x = jnp.linspace(-1, 1, 6).reshape(2, 3)
    want = jnp.sin(x) + DEPTH
    np.testing.assert_allclose(yax.eval_mox(deep, x), want, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(yax.to_function(deep))(x), want, rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda x: yax.eval_mox(deep, x).sum())(x), jnp.cos(x), rtol=1e-6)


def test_deep_module_calls_print_serialise_query_and_draw(deep):
    text = str(deep)
    assert text.count("module_call[path=M/m") == DEPTH and text.splitlines()[-1] == "  in (" + text.split("in (")[-1]
    assert deep.summary().splitlines()[-1].startswith("total")
    text = deep.to_json()
    assert text == deep.to_json(indent=None) and text.count('"kind": "module_call"') == DEPTH
    d = _loads(text)
    for _ in range(DEPTH):
        d = d["children"][0]
    assert d["kind"] == "module_call" and d["children"][0]["primitive"] == "sin"
    buf = io.BytesIO()
    yax.dump_yson(deep, buf, format="binary")
    assert buf.getvalue().count(b"module_call") == DEPTH
    assert yax.query("count(//module_call)", deep) == DEPTH
    assert [n.path for n in yax.query("//module_call[sin]", deep)] == ["M" + "/m" * DEPTH]
    assert "stops matching" in yax.explain("//module_call/cos", deep)
    dot = yax.to_dot(deep)
    assert dot.count("subgraph cluster_") == DEPTH - 1 + 1  # the inputs and all but the innermost call
    assert not yax.diff(deep, yax.map_mox(lambda n: n, deep))
    assert len(call_keys(deep)) == DEPTH and next(iter(call_keys(deep))) == "M" + "/m" * DEPTH  # compare's names
    assert sum(1 for _ in deep.walk()) == 2 * DEPTH + 1


def _loads(text: str) -> object:
    """`json.loads` of a deep document: json's reader recurses (its writer did too; ours does not)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(4 * text.count("{") + 1000)
    try:
        return json.loads(text)
    finally:
        sys.setrecursionlimit(limit)


def test_deep_nested_computations_print_serialise_and_query():
    mox = nested_jits(1200)
    assert str(mox).count("jaxpr={ lambda") == 1200
    assert yax.query("count(//jit)", mox) == 1200.0
    assert _loads(mox.to_json())["children"][0]["subs"]["jaxpr"]["kind"] == "jaxpr"
    assert "digraph" in yax.to_dot(mox) and mox.summary()
    assert yax.load_xml(yax.to_xml(mox).encode()).root.tag == "mox"
    assert yax.map_mox(lambda n: n, mox) is mox


# -- 7. eval_mox names where the arguments differ -----------------------------------------

def test_structure_errors_name_the_key_not_the_treedefs():
    mox, fn, args, kwargs = traced("transformer")
    params = jax.tree.map(lambda a: a, args[0])
    del params["params"]["Block_1"]["Dense_0"]["kernel"]
    with pytest.raises(yax.YaxInputError) as e:
        yax.eval_mox(mox, params, *args[1:], **kwargs)
    msg = str(e.value)
    assert "at `args[0]['params']['Block_1']['Dense_0']`, the key `'kernel'` is missing" in msg
    assert len(msg) < 400 and "PyTreeDef" not in msg
    cases = [
        (lambda p: {**p, "params": {**p["params"], "extra": jnp.ones(2)}}, "the key `'extra'` was not there"),
        (lambda p: [p], "a `list` was passed where a `dict` was traced"),
        (lambda p: {"params": None}, "`None` was passed where a `dict` was traced"),
    ]
    for change, match in cases:
        with pytest.raises(yax.errors.InputsDiffer) as e:
            yax.eval_mox(mox, change(args[0]), *args[1:], **kwargs)
        assert e.value.kind == "structure" and match in e.value.found
    with pytest.raises(yax.errors.InputsDiffer) as e:
        yax.eval_mox(mox, *args, **kwargs, train=True)
    assert e.value.argument == "kwargs" and "the key `'train'` was not there" in e.value.found


def test_structure_error_of_a_48_layer_model_is_short():
    layers = {f"Block_{i}": {"Dense_0": {"kernel": jnp.ones(2), "bias": jnp.ones(2)}} for i in range(48)}
    mox = yax.make_mox(lambda p, x: sum(v["Dense_0"]["kernel"].sum() for v in p.values()) + x)(layers, 1.0)
    bad = {**layers, "Block_47": {"Dense_0": {"kernel": jnp.ones(2)}}}
    with pytest.raises(yax.YaxInputError) as e:
        yax.eval_mox(mox, bad, 1.0)
    assert "at `args[0]['Block_47']['Dense_0']`, the key `'bias'` is missing" in str(e.value)
    assert len(str(e.value)) < 400


def test_the_query_process_reads_only_what_it_is_sent():
    """The child is started from the worker's source alone: it must not import yax
    or JAX (a slow start), and it answers on its own pipe."""
    src = pathlib.Path(_xpath.__file__).with_name("_xpath_worker.py").read_text()
    assert "import yax" not in src and "import jax" not in src
    t = time.perf_counter()
    ev = _xpath.Evaluator()
    view = build_view(mox_of("mlp"))
    assert ev.evaluate(view, "count(//*)", 30.0) == ("value", 16.0)
    assert time.perf_counter() - t < 10
    ev.stop()
    assert os.name != "posix" or ev._proc is None
