"""The fuzz suite: random and hostile input to every way in, each run
bounded in time. Queries (XPath 1.0 and the EXSLT ``re:`` functions, over a MoX and
over a loaded document), `load_xml` input (encodings, sizes, depths, DTDs, broken
bytes, every kind of source), `eval_mox` arguments and `load_weights` files (hostile
headers and metadata, truncated and damaged bytes). The widget's messages are
fuzzed in tests/widget/test_protocol.py (every field of every request kind given the
wrong type) and tests/widget/test_hardening.py, the `%yax` line in
tests/widget/test_magic.py and the names "copy as code" writes in tests/widget/test_code.py.

Each test keeps what it saw in `SEEN` (inputs tried, worst latency), which
``YAX_FUZZ_REPORT=1`` prints at the end for the issue's closing note.
"""

from __future__ import annotations

import io
import os
import time
from xml.sax.saxutils import escape, quoteattr

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import traced
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

import yax

pytestmark = pytest.mark.core

SEEN: dict[str, dict] = {}
TIMEOUT = 2.0  # per query: a random query may be slow, never longer than this


def _seen(area: str, seconds: float = 0.0) -> None:
    s = SEEN.setdefault(area, {"inputs": 0, "worst_s": 0.0})
    s["inputs"] += 1
    s["worst_s"] = max(s["worst_s"], seconds)


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if os.environ.get("YAX_FUZZ_REPORT"):
        print("\nfuzz:", {k: {"inputs": v["inputs"], "worst_s": round(v["worst_s"], 3)} for k, v in SEEN.items()})


# -- queries ---------------------------------------------------------------------------

_MLP = traced("mlp")
MOX = _MLP[0]
DOC = yax.load_xml(yax.to_xml(MOX).encode())

names = st.sampled_from(["module_call", "activation", "method_call", "dot_general", "jit", "mox", "jaxpr",
                         "*", "node()", "comment()", "text()", "processing-instruction()", "add", "pjit"])
axes = st.sampled_from(["", "", "child::", "descendant::", "ancestor::", "following-sibling::", "parent::",
                        "self::", "attribute::", "namespace::", "preceding::", "descendant-or-self::"])
attrs = st.sampled_from(["@name", "@path", "@type", "@features", "@params", "@shape", "@id", "@primitive",
                         "@nope", "@*", ".", "text()"])
literals = st.sampled_from(['"Dense"', "'relu'", "3", "-1", "1e3", '""', "'MLP/Dense_0'", "0 div 0", "'<&>'"])
regexes = st.text(alphabet="ab()[]{}|*+?.^$\\-,0123456789dwsDWS:_/'", max_size=12)
flags = st.sampled_from(["", "g", "i", "gi", "x", "gg", "'"])


def _quote(s: str) -> str:
    return f'"{s}"' if '"' not in s else f"'{s}'" if "'" not in s else '""'


@st.composite
def exslt(draw):
    """An EXSLT regular-expression call, of any arity (the right ones most often)."""
    fn = draw(st.sampled_from(["re:test", "re:match", "re:replace", "re:nope"]))
    parts = [draw(attrs | literals), _quote(draw(regexes)), _quote(draw(flags)), _quote("+")]
    n = draw(st.sampled_from([0, 1, 2, 3, 4, 5, 2, 3, 4]))
    return f"{fn}({', '.join(parts[:n] + ['1'] * max(0, n - len(parts)))})"


@st.composite
def paths(draw, depth=0):
    steps = []
    for _ in range(draw(st.integers(1, 3))):
        sep = draw(st.sampled_from(["/", "//", "//"]))
        step = draw(axes) + draw(names)
        for _ in range(draw(st.integers(0, 2))):
            step += f"[{draw(predicates(depth + 1))}]"
        steps.append(sep + step)
    return "".join(steps)


@st.composite
def predicates(draw, depth):
    kinds = ["cmp", "num", "fn", "re"] + (["path"] if depth < 2 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "cmp":
        return f"{draw(attrs)} {draw(st.sampled_from(['=', '!=', '<', '>=']))} {draw(literals)}"
    if kind == "num":
        return draw(st.sampled_from(["1", "last()", "position() > 1", "0", "-1", "1.5", "last() - 1"]))
    if kind == "fn":
        fn = draw(st.sampled_from(["contains", "starts-with", "not", "string-length", "count", "normalize-space",
                                   "translate", "substring", "concat", "boolean", "number", "name", "sum"]))
        args = [draw(attrs | literals) for _ in range(draw(st.integers(0, 3)))]
        return f"{fn}({', '.join(args)})"
    if kind == "re":
        return draw(exslt())
    return draw(paths(depth))


@st.composite
def queries(draw):
    kind = draw(st.sampled_from(["path", "path", "union", "fn", "re", "op"]))
    if kind == "path":
        return draw(paths())
    if kind == "union":
        return f"{draw(paths())} | {draw(paths())}"
    if kind == "re":
        return draw(exslt())
    if kind == "op":
        return f"{draw(paths())} {draw(st.sampled_from(['=', 'and', 'or', '+', 'div', 'mod', '<']))} {draw(literals)}"
    fn = draw(st.sampled_from(["count", "sum", "string", "boolean", "number", "name", "local-name", "concat"]))
    return f"{fn}({draw(paths())})"


def _run_query(q: str, target) -> None:
    t = time.perf_counter()
    try:
        r = yax.query(q, target, timeout=TIMEOUT)
    except yax.YaxQueryError as e:
        assert str(e).endswith((".", ")", "`")) and len(str(e)) < 2000
        r = None
    took = time.perf_counter() - t
    _seen("query", took)
    _seen("query answered" if r is not None else "query refused")
    assert took < TIMEOUT + 3
    if isinstance(r, list):
        ok = (yax.Mox, yax.Equation, str) if target is MOX else (etree._Element, str)
        assert all(isinstance(x, ok) for x in r)
    else:
        assert r is None or isinstance(r, (float, bool, str))


@pytest.mark.slow
@settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queries())
def test_generated_queries_answer_or_raise_yax_query_error(q):
    _run_query(q, MOX)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.sampled_from(list("/[]()@*=<>!|'\" .,:-_$0123456789abcdegilmnoprstuxy")), max_size=60)
       | st.text(max_size=40) | st.binary(max_size=30).map(lambda b: b.decode("latin-1")))
def test_random_text_queries_answer_or_raise_yax_query_error(q):
    _run_query(q, MOX)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queries())
def test_queries_over_a_loaded_document_and_explain(q):
    _run_query(q, DOC)
    t = time.perf_counter()
    try:
        text = yax.explain(q, MOX, timeout=TIMEOUT)
        assert isinstance(text, str)
    except yax.YaxQueryError:
        pass
    _seen("explain", time.perf_counter() - t)


# -- load_xml --------------------------------------------------------------------------

SECRET = "TOP-SECRET-5f1c"
DTDS = [
    '<!DOCTYPE m [<!ENTITY x SYSTEM "file://{secret}">]>',
    '<!DOCTYPE m [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
    '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]>',
    '<!DOCTYPE m SYSTEM "http://127.0.0.1:9/evil.dtd">',
    '<!DOCTYPE m [<!ENTITY % p SYSTEM "file://{secret}"> %p;]>',
    "<!DOCTYPE m>",
    "<!doctype m>",
    "<!ENTITY x 'y'>",
]
TAGS = ["mox", "module_call", "dot_general", "a", "jaxpr"]
CODECS = ["utf-8", "utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-be", "latin-1",
          "cp1252", "ascii"]
TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")) | st.sampled_from(["\n", "\t", "\x01"]), max_size=12)


@st.composite
def elements(draw, depth=0) -> str:
    tag = draw(st.sampled_from(TAGS))
    attr = "".join(f" {k}={quoteattr(v)}" for k, v in
                   draw(st.dictionaries(st.sampled_from(["id", "path", "name", "x", "y"]), TEXT, max_size=3)).items())
    kids = []
    for _ in range(draw(st.integers(0, 3 if depth < 3 else 0))):
        kind = draw(st.sampled_from(["el", "el", "text", "comment", "pi", "cdata", "ref"]))
        if kind == "el":
            kids.append(draw(elements(depth + 1)))
        elif kind == "text":
            kids.append(escape(draw(TEXT)))
        elif kind == "comment":
            kids.append("<!--" + draw(TEXT).replace("-", "_") + "-->")
        elif kind == "pi":
            kids.append("<?pi " + draw(TEXT).replace("?>", "") + "?>")
        elif kind == "cdata":
            kids.append("<![CDATA[" + draw(TEXT).replace("]]>", "") + "]]>")
        else:
            kids.append(draw(st.sampled_from(["&amp;", "&#60;", "&#x41;", "&lt;", "&quot;", "&undefined;"])))
    return f"<{tag}{attr}>{''.join(kids)}</{tag}>" if kids else f"<{tag}{attr}/>"


@st.composite
def documents(draw):
    codec = draw(st.sampled_from(CODECS))
    decl = draw(st.sampled_from(["", "", '<?xml version="1.0"?>', '<?xml version="1.0" encoding="{enc}"?>',
                                 '<?xml version="1.0" encoding="{enc}"?>',
                                 "<?xml version='1.0' encoding='{enc}' standalone='yes'?>",
                                 '<?xml version="1.0" encoding="UTF-16"?>', '<?xml version="1.0" encoding="nope"?>']))
    decl = decl.format(enc=codec.replace("-sig", "").replace("latin-1", "ISO-8859-1"))
    dtd = draw(st.sampled_from([None] * 12 + DTDS))
    prolog = draw(st.lists(st.sampled_from(["<!-- <!DOCTYPE x> -->", "<?pi <!ENTITY y 'z'> ?>", "\n", " "]),
                           max_size=3))
    body = draw(elements())
    depth = draw(st.sampled_from([0, 0, 0, 300, 2100]))
    body = "<a>" * depth + body + "</a>" * depth
    text = decl + "".join(prolog) + (dtd.format(secret=SECRET_PATH) if dtd else "") + body
    if codec in ("latin-1", "cp1252", "ascii"):  # characters it lacks as references (literal in CDATA)
        data = text.encode(codec, "xmlcharrefreplace")
        text = data.decode(codec)
    else:
        data = text.encode(codec)
    mutation = draw(st.sampled_from([None, None, None, None, None, "truncate", "flip", "insert"]))
    if mutation == "truncate" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif mutation == "flip" and data:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    elif mutation == "insert":
        i = draw(st.integers(0, len(data)))
        data = data[:i] + draw(st.binary(min_size=1, max_size=8)) + data[i:]
    return data, text, codec, dtd is not None, mutation, depth


SECRET_PATH = ""


@pytest.fixture(scope="module", autouse=True)
def _secret(tmp_path_factory):
    global SECRET_PATH
    path = tmp_path_factory.mktemp("fuzz") / "secret.txt"
    path.write_text(SECRET)
    SECRET_PATH = str(path)


class _Stream:
    def __init__(self, data: bytes):
        self._b = io.BytesIO(data)

    def read(self, n: int = -1) -> bytes:
        return self._b.read(n)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents(), st.sampled_from(["bytes", "bytearray", "memoryview", "BytesIO", "stream", "text", "path"]),
       st.sampled_from([None] * 6 + [64, 4096]), st.sampled_from([None] * 6 + [2000, 10**6]))
def test_load_xml_loads_safely_or_refuses(tmp_path_factory, doc, how, max_bytes, max_memory):
    data, text, codec, has_dtd, mutation, depth = doc
    if how == "text":
        try:
            source = io.StringIO(data.decode(codec))
        except UnicodeDecodeError:
            source = io.BytesIO(data)
    elif how == "path":
        source = tmp_path_factory.mktemp("doc") / "doc.xml"
        source.write_bytes(data)
    else:
        source = {"bytes": bytes, "bytearray": bytearray, "memoryview": memoryview, "BytesIO": io.BytesIO,
                  "stream": _Stream}[how](data)
    kw = {k: v for k, v in (("max_bytes", max_bytes), ("max_memory", max_memory)) if v is not None}
    t = time.perf_counter()
    try:
        loaded = yax.load_xml(source, **kw)
    except yax.YaxXMLError as e:
        loaded, message = None, str(e)
    _seen("load_xml", time.perf_counter() - t)
    _seen("load_xml refused" if loaded is None else "load_xml loaded")
    if loaded is None:
        assert message.endswith((".", ")")) and len(message) < 1000
        if has_dtd and mutation is None and not max_bytes and not max_memory and "encoding" not in message:
            assert "DTD" in message
        return
    assert not (has_dtd and mutation is None)  # a DTD never gets through
    assert loaded.tree.docinfo.internalDTD is None and loaded.tree.docinfo.externalDTD is None
    assert not any(isinstance(n, etree._Entity) for n in loaded.root.iter())
    assert SECRET not in str(loaded)
    if max_bytes:
        assert len(data) <= max_bytes or how == "text"
    if depth > 2000:
        _seen("load_xml loaded deeper than 2048")
    if mutation is None and depth < 2000:  # what was written is what was read
        want = etree.fromstring(text.split("?>", 1)[1].encode() if text.startswith("<?xml") else text.encode(),
                                etree.XMLParser(huge_tree=True))
        assert etree.tostring(loaded.root) == etree.tostring(want)


# -- eval_mox arguments ----------------------------------------------------------------

_FN, _ARGS = _MLP[1], _MLP[2]
_WANT = np.asarray(_FN(*_ARGS))


@st.composite
def arguments(draw):
    """``(args, kwargs, valid)``: the traced arguments, changed in a place or two
    (leaves and keys first, then perhaps the shape of ``args`` or ``kwargs``)."""
    args, kwargs = jax.tree.map(lambda a: a, (_ARGS, {}))
    params, valid = args[0]["params"], True
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["leaf", "leaf", "drop", "add"]))
        if kind == "leaf":
            layer, name = draw(st.sampled_from([("Dense_0", "kernel"), ("Dense_0", "bias"), ("Dense_1", "bias")]))
            old = params[layer].get(name)
            old = old if isinstance(old, jax.Array) else jnp.ones(3)  # changed or dropped before
            new = draw(st.sampled_from(["none", "list", "str", "int", "shape", "dtype", "same", "numpy", "tuple"]))
            params[layer][name] = {"none": None, "list": [old], "str": "x", "int": 3, "shape": old[..., :1],
                                   "dtype": old.astype(jnp.int32), "same": old * 1, "numpy": np.asarray(old),
                                   "tuple": (old,)}[new]
            valid &= new in ("same", "numpy") and old.shape != (3,)
        elif kind == "drop":
            layer = draw(st.sampled_from(["Dense_0", "Dense_1"]))
            params[layer].pop(draw(st.sampled_from(["kernel", "bias"])), None)
            valid = False
        else:
            params[draw(st.sampled_from(["Dense_0", "Dense_9"]))] = {"kernel": jnp.ones(2)}
            valid = False
    shape = draw(st.sampled_from(["same", "same", "fewer", "more", "none", "list", "batch", "empty", "kwargs"]))
    if shape == "kwargs":
        kwargs = {draw(st.sampled_from(["train", "x", "deterministic"])): draw(st.sampled_from([True, 1, None]))}
    elif shape != "same":
        args = {"fewer": lambda: args[:1], "more": lambda: (*args, args[1]), "none": lambda: (args[0], None),
                "list": lambda: ([args[0]], args[1]), "batch": lambda: (args[0], args[1][None]),
                "empty": lambda: ()}[shape]()
    return args, kwargs, valid and shape == "same"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arguments())
def test_eval_mox_arguments_evaluate_or_raise_yax_input_error(case):
    args, kwargs, valid = case
    t = time.perf_counter()
    try:
        out = yax.eval_mox(MOX, *args, **kwargs)
    except yax.YaxInputError as e:
        msg = str(e)
        assert not valid and len(msg) < 1000 and ("args" in msg or "kwargs" in msg or "arguments" in msg)
        assert "PyTreeDef" not in msg
        _seen("eval_mox", time.perf_counter() - t)
        return
    _seen("eval_mox", time.perf_counter() - t)
    assert valid
    np.testing.assert_allclose(out, _WANT, rtol=1e-5, atol=1e-5)


# -- weights files ---------------------------------------------------------------------

_KEY = jax.random.key(3)
_IMPL = str(jax.random.key_impl(_KEY))
_LIKES = {
    "plain": {"w": jnp.arange(2, dtype=jnp.uint32), "f8": jnp.ones(3, jnp.float8_e4m3fn), "b": jnp.ones((), jnp.bfloat16)},
    "key": {"w": _KEY, "f8": jnp.ones(3, jnp.float8_e4m3fn), "b": jnp.ones((), jnp.bfloat16)},
    "abstract": {"w": jax.ShapeDtypeStruct((2,), jnp.uint32), "f8": jax.ShapeDtypeStruct((3,), jnp.float8_e4m3fn),
                 "b": jax.ShapeDtypeStruct((), jnp.bfloat16)},
}
_SIZES = {"U32": 4, "F8_E4M3": 1, "BF16": 2, "F32": 4, "U8": 1, "BOOL": 1, "XX": 2}
_KEY_ARRAYS = ["", "{}", f'{{"w": "{_IMPL}"}}', '{"w": null}', '{"w": 3}', '{"w": ["x"]}', '{"w": "nope"}',
               f'{{"zz": "{_IMPL}"}}', f'{{"f8": "{_IMPL}"}}', "[1]", '"x"', "{", "null", "[" * 5000 + "]" * 5000,
               f'{{"w": "{_IMPL}", "w": null}}']


@st.composite
def weight_files(draw):
    """``(bytes of a safetensors file, like's name)``: entries of drawn dtypes and shapes (some
    of them what ``like`` asks for), drawn metadata (``key_arrays`` among them), then perhaps
    damaged: cut short, a byte changed, the header's length or an offset wrong, bytes added."""
    import json
    import struct

    header: dict = {}
    data = b""
    names = st.lists(st.sampled_from(["w", "f8", "b", "__metadata__", "zz"]), max_size=4, unique=True)
    for name in draw(st.one_of(st.just(["w", "f8", "b"]), st.just(["b", "w", "f8"]), names)):
        if name == "__metadata__":
            continue
        code = draw(st.sampled_from([{"w": "U32", "f8": "F8_E4M3", "b": "BF16", "zz": "F32"}[name]] * 12
                                    + ["U8", "BOOL", "XX", "F32"]))
        shape = draw(st.sampled_from([{"w": [2], "f8": [3], "b": [], "zz": [1]}[name]] * 12 + [[0], [2, 2], [1, 1]]))
        size = _SIZES[code] * int(np.prod(shape, dtype=np.int64))
        header[name] = {"dtype": code, "shape": shape, "data_offsets": [len(data), len(data) + size]}
        data += draw(st.binary(min_size=size, max_size=size))
    meta = {"format": draw(st.sampled_from(["yax.weights", "other"])), "version": draw(st.sampled_from(["1", "1", "2"]))}
    if (key_arrays := draw(st.sampled_from([""] * 4 + _KEY_ARRAYS))):
        meta["key_arrays"] = key_arrays
    if draw(st.booleans()):
        header["__metadata__"] = meta
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    blob = bytearray(struct.pack("<Q", len(text)) + text + data)
    damage = draw(st.sampled_from([None] * 10 + ["cut", "byte", "length", "offset", "more"]))
    if damage == "cut":
        del blob[draw(st.integers(0, len(blob) - 1)):]
    elif damage == "byte":
        blob[draw(st.integers(0, len(blob) - 1))] = draw(st.integers(0, 255))
    elif damage == "length":
        blob[:8] = struct.pack("<Q", draw(st.sampled_from([0, 1, len(text) + 8, 2**40, 2**64 - 1])))
    elif damage == "offset" and set(header) - {"__metadata__"}:
        name = next(n for n in header if n != "__metadata__")
        header[name]["data_offsets"][draw(st.integers(0, 1))] += draw(st.sampled_from([-1, 1, 2**33]))
        text = json.dumps(header).encode()
        blob = bytearray(struct.pack("<Q", len(text)) + text + data)
    elif damage == "more":
        blob += draw(st.binary(min_size=1, max_size=16))
    return bytes(blob), draw(st.sampled_from(sorted(_LIKES)))


def _bits(a) -> bytes:
    if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
        a = jax.random.key_data(a)
    return np.ascontiguousarray(np.asarray(a)).tobytes()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(weight_files())
def test_load_weights_loads_what_safetensors_reads_or_refuses(tmp_path, case):
    """Whatever the file holds, `load_weights` gives `like`'s types with the file's bits, or refuses
    with a `YaxInputError` in a sentence; never another error, a wait, or a leaf of another type (a
    ``{"w": null}`` made a uint32 leaf a PRNG key). safetensors' own reader is the oracle: a file it
    refuses is refused."""
    import safetensors

    blob, like_name = case
    like = _LIKES[like_name]
    path = tmp_path / "w.safetensors"
    path.write_bytes(blob)
    try:
        with safetensors.safe_open(str(path), "np") as f:
            readable = set(f.keys())
    except safetensors.SafetensorError:
        readable = None
    t = time.perf_counter()
    try:
        loaded = yax.load_weights(path, like=like)
    except yax.YaxInputError as e:
        msg = yax.errors.message(e)  # without the docs pointer of a specific class
        _seen("load_weights", time.perf_counter() - t)
        _seen("load_weights refused")
        assert msg.endswith(".") and ("Try " in msg or " try " in msg) and len(msg) < 2000, msg
        return
    _seen("load_weights", time.perf_counter() - t)
    _seen("load_weights loaded")
    assert readable == set(like), readable  # safetensors reads it, with exactly `like`'s keys
    for k, want in like.items():
        got = loaded[k]
        assert got.shape == want.shape and got.dtype == want.dtype, (k, got, want)
    # the bits are the file's: each entry's bytes, where the header says they lie
    import json
    import struct

    size = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + size])
    for k in like:
        begin, end = header[k]["data_offsets"]
        assert _bits(loaded[k]) == blob[8 + size + begin:8 + size + end], k
