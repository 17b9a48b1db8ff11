"""Every node linked to the user's line that made it: ``node.source``, the
view's ``@file``/``@line``, ``pprint(source=True)``, and `dump_xml` leaving
them out unless asked. Lines are checked against this file's own lines,
found by the marker comments on them."""

from __future__ import annotations

import inspect
import io
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import yax
from yax._source import Location, from_source_info, is_user_file, lines_around

HERE = os.path.abspath(__file__)
FILE = os.path.basename(HERE)


def line_of(marker: str) -> int:
    """The number of the line of this file holding ``# <marker>``."""
    with open(HERE) as f:
        found = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# <{marker}>")]
    assert len(found) == 1, marker
    return found[0]


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(8)(x)  # <dense1>
        h = nn.gelu(h)  # <gelu>
        return x + nn.Dense(4, name="out")(h)  # <out>


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = Block()(x)  # <block>
        return jnp.tanh(x) * 2.0  # <tanh>


class NnxNet(nnx.Module):
    def __init__(self, rngs):
        self.fc = nnx.Linear(4, 8, rngs=rngs)
        self.head = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        h = jax.nn.relu(self.fc(x))  # <nnx_fc>
        return self.head(h)  # <nnx_head>


def plain(x, w):
    y = jnp.dot(x, w)  # <plain_dot>
    return jnp.sin(y)  # <plain_sin>


@pytest.fixture(scope="module")
def linen_mox():
    x = jnp.ones((2, 4))
    m = Net()
    return yax.make_mox(m.apply)(m.init(jax.random.key(0), x), x)  # <trace>


def _at(loc: Location | None, marker: str) -> bool:
    return loc is not None and loc.path == HERE and loc.line == line_of(marker)


@pytest.mark.core
def test_linen_calls_point_at_the_caller_and_equations_at_the_line_making_them(linen_mox):
    by_path = {n.path: n for n in linen_mox.modules()}
    assert _at(by_path["Net/Block_0"].source, "block")
    assert _at(by_path["Net/Block_0/Dense_0"].source, "dense1")
    assert _at(by_path["Net/Block_0/gelu"].source, "gelu")
    assert _at(by_path["Net/Block_0/out"].source, "out")
    # Flax's own lines are skipped: the Dense's matmul lands on the line calling the Dense
    dot = by_path["Net/Block_0/Dense_0"].equations[0]
    assert dot.name == "dot_general" and _at(dot.source, "dense1")
    assert all(_at(e.source, "gelu") for e in by_path["Net/Block_0/gelu"].equations)
    tanh = next(e for e in by_path["Net"].equations if e.name == "tanh")
    assert _at(tanh.source, "tanh")
    assert str(tanh.source) == f"{FILE}:{line_of('tanh')}" and tanh.source.file == FILE
    # the outermost call is made by `apply`, which yax called: JAX 0.10 keeps no frame above the traced
    # function (no location), JAX 0.9 keeps the whole stack (the line calling `make_mox`)
    assert by_path["Net"].source is None or _at(by_path["Net"].source, "trace")
    assert linen_mox.source is None


@pytest.mark.core
def test_query_by_file_and_line(linen_mox):
    dots = yax.query(f'//dot_general[@file="{FILE}"]', linen_mox)
    assert len(dots) == 2 and {d.path for d in dots} == {"Net/Block_0/Dense_0", "Net/Block_0/out"}
    at = yax.query(f'//*[@file="{FILE}"][@line={line_of("out")}]', linen_mox)
    assert at and all(_at(n.source, "out") for n in at)
    assert [n.path for n in yax.query(f'//module_call[@line={line_of("dense1")}]', linen_mox)] == [
        "Net/Block_0/Dense_0"]
    assert yax.query('//module_call[@name="Net"]/tanh/@line', linen_mox) == [str(line_of("tanh"))]
    assert yax.query('count(//*[@file="no_such_file.py"])', linen_mox) == 0.0


@pytest.mark.core
def test_dump_xml_leaves_the_source_out_unless_asked(linen_mox):
    plain_text = yax.to_xml(linen_mox)
    assert " file=" not in plain_text and " line=" not in plain_text
    buf = io.StringIO()
    yax.dump_xml(linen_mox, buf, source=True)
    doc = yax.load_xml(buf.getvalue().encode())
    assert len(yax.query(f'//dot_general[@file="{FILE}"]', doc)) == 2
    assert HERE not in buf.getvalue()  # the base name only: no machine's directories
    for indent in (0, 4):  # each way of writing drops them, and the cached view keeps them for queries
        assert " line=" not in yax.to_xml(linen_mox, indent) and " line=" in yax.to_xml(linen_mox, indent, source=True)
    assert yax.query("count(//*[@line])", linen_mox) > 0
    # moving code is no difference between two models
    assert not yax.diff(linen_mox, doc).changed


@pytest.mark.core
def test_pprint_with_source(linen_mox):
    text = yax.pprint(linen_mox, source=True)
    assert text.splitlines()[0] == yax.pprint(linen_mox).splitlines()[0]
    lines = text.splitlines()
    dense = next(s for s in lines if "module_call[path=Net/Block_0/Dense_0" in s)
    assert dense.endswith(f"  # {FILE}:{line_of('dense1')}")
    tanh = [s for s in lines if " = tanh " in s][-1]  # Net's own (gelu's tanh comes first)
    assert tanh.endswith(f"  # {FILE}:{line_of('tanh')}")
    assert linen_mox.pprint(source=True) == text
    # without it, nothing changes
    assert "#" not in yax.pprint(linen_mox) and str(linen_mox) == yax.pprint(linen_mox)


@pytest.mark.core
def test_nnx():
    m = NnxNet(nnx.Rngs(0))
    mox = yax.make_mox(m)(jnp.ones((3, 4)))
    by_path = {n.path: n for n in mox.modules()}
    fc = next(n for p, n in by_path.items() if p.endswith("fc"))
    head = next(n for p, n in by_path.items() if p.endswith("head"))
    relu = next(n for n in mox.modules() if n.name == "relu")
    assert _at(fc.source, "nnx_fc") and _at(relu.source, "nnx_fc") and _at(head.source, "nnx_head")
    assert all(_at(e.source, "nnx_head") for e in head.equations)
    assert len(yax.query(f'//dot_general[@file="{FILE}"][@line={line_of("nnx_head")}]', mox)) == 1


@pytest.mark.core
def test_plain_function():
    mox = yax.make_mox(plain)(jnp.ones((2, 3)), jnp.ones((3, 5)))
    dot, sin = mox.equations
    assert _at(dot.source, "plain_dot") and _at(sin.source, "plain_sin")
    # a library function traced directly: the line tracing it (JAX 0.9) or none (JAX 0.10, see above)
    sin = yax.make_mox(jnp.sin)(jnp.ones(2)).equations[0]  # <trace_sin>
    assert sin.source is None or _at(sin.source, "trace_sin")


@pytest.mark.core
def test_which_files_are_the_users():
    assert is_user_file(HERE) and is_user_file("<ipython-input-3-abc>")
    assert not is_user_file(jax.numpy.__file__) and not is_user_file(nn.__file__)
    assert not is_user_file(yax.__file__) and not is_user_file(inspect.__file__)
    assert not is_user_file("<frozen importlib._bootstrap>")
    # a package installed in the standard library's site-packages is not the standard library
    site = os.path.join(os.path.dirname(inspect.__file__), "site-packages", "somepkg", "model.py")
    assert is_user_file(site)
    # a traceback of another shape: no location, no error
    assert from_source_info(None) is None
    assert from_source_info(type("S", (), {"traceback": object()})()) is None
    assert from_source_info(type("S", (), {"traceback": type("T", (), {"raw_frames": lambda s: 1 / 0})()})()) is None


@pytest.mark.core
def test_lines_around():
    loc = Location(HERE, line_of("tanh"))
    got = lines_around(loc, 2)
    assert [n for n, _ in got] == [loc.line - 2, loc.line - 1, loc.line, loc.line + 1, loc.line + 2]
    assert dict(got)[loc.line].strip() == "return jnp.tanh(x) * 2.0  # <tanh>"
    assert lines_around(Location("/no/such/file.py", 3)) is None
    assert lines_around(Location(HERE, 10**6)) is None


@pytest.mark.core
def test_hugging_face_lines_are_in_its_modeling_file():
    from thirdparty import case

    c = case("bert-module")
    mox = yax.make_mox(c.fn)(*c.args, **c.kwargs)
    query = yax.query('//module_call[@type="FlaxBertSelfAttention"]', mox)[0]
    loc = query.source
    home = sys.modules[query.module_type.__module__].__file__
    assert loc is not None and loc.file == "modeling_flax_bert.py" and loc.path == home
    # the line calling the attention, read from transformers' file
    with open(loc.path) as f:
        text = f.readlines()[loc.line - 1]
    assert "self.self(" in text
    dots = yax.query('//module_call[@type="FlaxBertSelfAttention"]//dot_general[@file="modeling_flax_bert.py"]', mox)
    assert dots and all(d.source.file == "modeling_flax_bert.py" for d in dots)
    # Flax's Dense code is skipped: the projections' matmuls are on the lines calling them in BERT's file
    q = yax.query('//module_call[@type="FlaxBertSelfAttention"]/module_call[@name="query"]', mox)[0]
    assert q.equations[0].source == q.source
    with open(loc.path) as f:
        assert "self.query(" in f.readlines()[q.source.line - 1]
