"""docs/migrating.md is true. Its Python blocks (the earlier prototype's README in its yax form)
run and agree with the model's own `apply`; every row of its tables holds when run: the yax column
runs as written (or is true, for the names kept), each prototype entry fails with the error its row
names or gives the value its row names; and the schema tables are what `dump_xml`, `to_dict` and
`dump_yson` write. A row that stops being true fails here."""

from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import io
import json
import pathlib
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lxml import etree

import yax
import yax.errors
from yax.internal import view

pytestmark = pytest.mark.core

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "migrating.md"
TEXT = DOC.read_text()


# -- reading the page ------------------------------------------------------------------

def section(title: str) -> str:
    """The text under the heading ``title`` up to the next heading of the same or a higher level."""
    m = re.search(rf"^(#+) {re.escape(title)}$", TEXT, re.M)
    assert m, f"docs/migrating.md has no section {title!r}"
    body = TEXT[m.end():]
    end = re.search(rf"^#{{1,{len(m.group(1))}}} ", body, re.M)
    return body[: end.start()] if end else body


def cells(line: str) -> list[str]:
    """A table row's cells: split at `|` outside code spans; `\\|` is a `|` in a cell."""
    out, cur, in_code = [], "", False
    line = line.strip()[1:-1]  # the outer pipes
    i = 0
    while i < len(line):
        c = line[i]
        if line.startswith("\\|", i):
            cur, i = cur + "|", i + 2
            continue
        if c == "`":
            in_code = not in_code
        if c == "|" and not in_code:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
        i += 1
    out.append(cur.strip())
    return out


def table(text: str) -> list[list[str]]:
    """The rows of the first table in ``text``, without its header and rule."""
    lines: list[str] = []
    for ln in text.splitlines():
        if ln.startswith("|"):
            lines.append(ln)
        elif lines:
            break
    assert len(lines) > 2, "no table"
    rows = [cells(ln) for ln in lines[2:]]
    assert all(len(r) == len(cells(lines[0])) for r in rows), rows
    return rows


def code(cell: str) -> list[str]:
    """The code spans of a cell."""
    return re.findall(r"`([^`]+)`", cell)


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", TEXT, re.S)


def run(snippet: str, scope: dict[str, Any]) -> Any:
    """Evaluate an expression, or execute a statement (``new = ...``), in ``scope``."""
    try:
        compiled = compile(snippet, "docs/migrating.md", "eval", dont_inherit=True)
    except SyntaxError:
        exec(compile(snippet, "docs/migrating.md", "exec", dont_inherit=True), scope)
        return None
    return eval(compiled, scope)


def error_named(name: str) -> type[BaseException]:
    for where in (builtins, yax, yax.errors):
        err = getattr(where, name, None)
        if isinstance(err, type) and issubclass(err, BaseException):
            return err
    raise AssertionError(f"docs/migrating.md names an error that does not exist: {name}")


NAMES_KEPT = table(section("Names kept"))
DIFFERENCES = table(section("Every difference"))


@pytest.fixture(scope="module")
def page():
    """The page's Python blocks, run in order in one scope (later blocks go on from earlier ones),
    and what they printed."""
    scope: dict[str, Any] = {"__name__": "migrating_md"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in python_blocks():
            exec(compile(block, "docs/migrating.md", "exec", dont_inherit=True), scope)
    return scope, out.getvalue()


def dense_apply(p, x):
    return nn.Dense(10).apply({"params": p}, x)


# -- the README examples ---------------------------------------------------------------

def test_the_page_has_the_readme_in_yax_form_and_the_names_its_table_uses():
    blocks = python_blocks()
    assert len(blocks) == 2
    for form in ("yax.make_mox(model.apply)(params, x)", "print(mox)", "yax.eval_mox(mox, params, x)",
                 "yax.query('//module_call[@type=\"Dense\"]', mox)", "yax.sub('//pjit[@name=\"relu\"]', gelu_mox, mox)",
                 "yax.decider(to_lora)", "yax.dump_xml(mox, f, indent=4)", "mox.to_dict()", "mox.to_json(",
                 "yax.map_mox("):
        assert form in blocks[0], form


def test_tracing_printing_evaluating_and_querying_agree_with_apply(page):
    s, printed = page
    model, params, x = s["model"], s["params"], s["x"]
    want = model.apply(params, x)
    np.testing.assert_allclose(s["y"], want, rtol=1e-6)
    np.testing.assert_allclose(s["y_jit"], want, rtol=1e-5, atol=1e-6)
    assert "module_call[path=Model/Dense_0 type=Dense features=10 params=110]" in printed
    assert printed.startswith("{ lambda ")
    assert [n.path for n in s["dense_layers"]] == ["Model/Dense_0", "Model/Dense_1"]
    assert s["ten"] == s["dense_layers"]


def test_relu_to_gelu_by_the_prototypes_jitted_relu_query(page):
    s, _ = page
    params, x, mox = s["params"], s["x"], s["mox"]
    p = params["params"]

    def hand(params, x):  # the model written with gelu
        p = params["params"]
        return x + dense_apply(p["Dense_1"], jax.nn.gelu(dense_apply(p["Dense_0"], x)))

    new = s["gelu_model"]
    np.testing.assert_allclose(yax.eval_mox(new, params, x), hand(params, x), rtol=1e-5, atol=1e-6)
    # the derivative is gelu's (relu's rule went with its body)
    g_new = jax.grad(lambda q: yax.eval_mox(new, q, x).sum())(params)
    g_hand = jax.grad(lambda q: hand(q, x).sum())(params)
    for a, b in zip(jax.tree.leaves(g_new), jax.tree.leaves(g_hand)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # the old MoX is untouched, and `//jit` is the same query
    assert "relu" in [n.name for n in mox.modules()]
    assert yax.query('//jit[@name="relu"]', mox) == yax.query('//pjit[@name="relu"]', mox)
    assert p["Dense_0"]["kernel"].shape == (10, 10)


def test_lora_from_a_mox_of_an_adapter_keeps_the_trained_layer_and_is_live(page):
    s, _ = page
    params, x, new, lp = s["params"], s["x"], s["lora_model"], s["lora_params"]
    assert [n.type for n in yax.query('//module_call[@name="Dense_0" or @name="Dense_1"]', new)
            if n.path.count("/") == 1] == ["Adapter", "Adapter"]
    for name in ("Dense_0", "Dense_1"):
        np.testing.assert_array_equal(lp["params"][name]["Dense_0"]["kernel"], params["params"][name]["kernel"])
    np.testing.assert_allclose(yax.eval_mox(new, lp, x), s["model"].apply(params, x), rtol=1e-5, atol=1e-6)
    # with trained adapters it computes the adapter's math, each layer with its own variables
    lp = jax.tree_util.tree_map_with_path(
        lambda k, v: jnp.full_like(v, 0.1) if jax.tree_util.keystr(k).endswith("['b']") else v, lp)
    adapter = s["Adapter"](10)
    h = jax.nn.relu(adapter.apply({"params": lp["params"]["Dense_0"]}, x))
    want = x + adapter.apply({"params": lp["params"]["Dense_1"]}, h)
    np.testing.assert_allclose(yax.eval_mox(new, lp, x), want, rtol=1e-5, atol=1e-6)


def test_a_cut_node_and_the_marked_decider(page):
    s, _ = page
    params, x, model = s["params"], s["x"], s["model"]
    want = model.apply(params, x)
    np.testing.assert_allclose(yax.eval_mox(s["swapped"], params, x), want, rtol=1e-6)
    assert yax.query('//module_call[@name="Dense_1"]', s["swapped"])[0].type == "Dense"
    decided, dp = s["decided"], s["decided_params"]
    assert [n.type for n in decided.modules()] == ["Model", "Dense", "relu", "LoRA"]
    assert set(dp["params"]["Dense_1"]) == {"kernel", "bias", "lora_a", "lora_b"}
    assert set(dp["params"]["Dense_0"]) == {"kernel", "bias"}
    np.testing.assert_allclose(yax.eval_mox(decided, dp, x), want, rtol=1e-5, atol=1e-6)
    live = jax.tree_util.tree_map_with_path(
        lambda k, v: jnp.ones_like(v) if "lora_b" in jax.tree_util.keystr(k) else v, dp)
    assert not np.allclose(yax.eval_mox(decided, live, x), want)
    # unmarked, the prototype's decider is taken for a replacement and refused, naming the rule
    with pytest.raises(yax.YaxRewriteError, match=r"named `path, node`.*`yax.decider\(to_lora\)`"):
        yax.sub('//module_call[@type="Dense"]', s["to_lora"], s["mox"], params=params, key=s["key"])
    # a decider is given the node's path as a string
    paths = []
    yax.sub('//module_call[@type="Dense"]', yax.decider(lambda path, expr: paths.append(path) or expr), s["mox"])
    assert paths == ["Model/Dense_0", "Model/Dense_1"]


def test_serialisation_and_map_mox(page):
    s, _ = page
    mox, xml = s["mox"], s["xml"]
    lines = xml.splitlines()
    assert lines[0].startswith("<mox ") and lines[1].startswith("    <module_call ")
    assert etree.fromstring(xml.encode()).tag == "mox"
    assert json.loads(s["as_json"]) == s["as_dict"]
    assert s["same"] is mox
    # a map that changes nodes builds a new tree and leaves the old one as it was
    text = str(mox)
    new = yax.map_mox(lambda n: dataclasses.replace(n) if isinstance(n, yax.Equation) else n, mox)
    assert new is not mox and str(mox) == text and str(new) == text
    np.testing.assert_allclose(yax.eval_mox(new, s["params"], s["x"]), s["y"], rtol=1e-6)


def test_call_nodes_read_their_variables_from_the_enclosing_scope(page):
    s, _ = page
    mox, dense, x = s["mox"], s["dense"], s["x"]
    assert [v.shape for v in dense.inputs] == [x.shape] and dense.invars[0].shape == x.shape
    kernel = dense.equations[0].inputs[1]  # dot_general reads the kernel
    assert kernel.shape == (10, 10)
    assert kernel not in dense.inputs and kernel not in dense.invars and kernel in mox.inputs
    assert dense.var_tree["params"]["kernel"] == jax.ShapeDtypeStruct((10, 10), jnp.float32)
    assert s["params"]["params"][dense.scope[0]]["kernel"].shape == (10, 10)


# -- the tables --------------------------------------------------------------------------

@pytest.mark.parametrize("row", NAMES_KEPT, ids=[r[0] for r in NAMES_KEPT])
def test_every_name_kept_holds_as_written(page, row):
    scope = dict(page[0])
    [check] = code(row[1])
    assert run(check, scope), f"docs/migrating.md says `{check}`, which is false"


def test_the_differences_cover_what_the_prototype_relied_on():
    proto = [r[0] for r in DIFFERENCES]
    for needle in ("var.value", "mox.children[", "dense.inputs[", 'to_dict()["primitive"]', 'to_dict()["ephemeral"]',
                   "to_dict(False)", "yax.map_mox(", "@ephemeral=", '@use_bias="true"', "yax.dump_yson(",
                   "yax.query('//', mox)", ", fn, mox", "path[-1]", "is mox", "yax.XPath("):
        assert any(needle in p for p in proto), f"no row of docs/migrating.md covers `{needle}`"


@pytest.mark.parametrize("row", DIFFERENCES, ids=[code(r[0])[0][:60] for r in DIFFERENCES])
def test_every_difference_holds(page, row):
    prototype, new, why = row
    scope = dict(page[0])
    # the new way runs as written
    snippets = code(new)
    assert snippets, f"the row for {prototype} gives no code for the new way"
    for snippet in snippets:
        run(snippet, scope)
    # the prototype's code does what the row says
    [old] = code(prototype)
    if m := re.match(r"Raises `(\w+)`\.", why):
        with pytest.raises(error_named(m.group(1))):
            run(old, dict(page[0]))
    elif m := re.match(r"Now `([^`]+)`\.", why):
        assert run(old, dict(page[0])) == ast.literal_eval(m.group(1))
    else:
        pytest.fail(f"the row for `{old}` says neither what it raises nor what it gives now: {why!r}")


# -- the schemas ---------------------------------------------------------------------------

class Helper(nn.Module):
    """A module calling a helper method of its own (a `method_call`) and an activation."""

    @nn.compact
    def __call__(self, x):
        return self._twice(nn.gelu(nn.Dense(3, use_bias=False)(x)))

    def _twice(self, h):
        return 2 * h


@pytest.fixture(scope="module")
def moxes(page):
    x = jnp.ones((2, 4))
    helper = Helper()
    return [page[0]["mox"], yax.make_mox(helper.apply)(helper.init(jax.random.key(0), x), x)]


def test_the_xml_schema_is_what_dump_xml_writes(moxes):
    text = section("XML (`yax.dump_xml`, and what `yax.query` sees)")
    [every] = [ln for ln in text.splitlines() if ln.startswith("Every element has")]
    common = set(code(every))
    kinds: dict[str, set[str]] = {}
    shown_equations: set[str] = set()
    for what, _, attrs in table(text):
        if what.startswith("the primitive"):
            shown_equations |= set(code(what))
        else:
            [tag] = code(what)
            kinds[tag] = set(code(attrs))
    seen_tags: set[str] = set()
    for mox in moxes:
        f = io.StringIO()
        yax.dump_xml(mox, f)
        root = etree.fromstring(f.getvalue().encode())
        assert root.tag == "mox" and "mox" in kinds
        for el in root.iter(etree.Element):
            seen_tags.add(el.tag)
            assert common <= set(el.attrib), (el.tag, common - set(el.attrib))
            assert "ephemeral" not in el.attrib
            assert not {"true", "false"} & set(el.attrib.values())
            if el.tag in kinds:
                assert kinds[el.tag] <= set(el.attrib), (el.tag, kinds[el.tag] - set(el.attrib))
                # and nothing else but the node's own fields (or an activation's keywords)
                node = view(mox).nodes[int(el.get("id"))]
                extra = set(el.attrib) - common - kinds[el.tag] - set(getattr(node, "attrs", {}))
                assert not extra, f"`{el.tag}` has attributes the table does not list: {extra}"
            else:  # an equation: named after its primitive
                assert el.get("primitive") == el.tag
        comments = [c.text for c in root.iter(etree.Comment)]
        assert comments and all(c.strip().startswith("{ lambda") for c in comments)
    assert set(kinds) <= seen_tags, f"kinds the table lists that no test model shows: {set(kinds) - seen_tags}"
    assert shown_equations <= seen_tags
    dense = yax.query('//module_call[@type="Dense"]', moxes[1])[0]
    assert yax.query('//module_call[@use_bias="False"]', moxes[1]) == [dense]
    assert yax.query('//module_call[@type="Dense"]/@params', moxes[1]) == ["12"]


def _plain(y: Any) -> Any:
    """YSON's typed values as plain Python (for comparing with JSON)."""
    import yt.yson as yson

    if isinstance(y, dict):
        return {str(k): _plain(v) for k, v in y.items()}
    if isinstance(y, list):
        return [_plain(v) for v in y]
    if isinstance(y, yson.YsonEntity):
        return None
    if isinstance(y, bytes):
        return y.decode()
    if isinstance(y, str):
        return str(y)
    return int(y) if isinstance(y, int) and not isinstance(y, bool) else y


def test_the_dict_schema_is_what_to_dict_gives_and_dump_yson_writes(moxes):
    rows = table(section("Dicts (`to_dict`, `to_json`, `dump_yson`)"))
    [(call_kinds, call_keys), (eqn_kinds, eqn_keys), (_, atom_keys)] = [(set(code(a)), set(code(b))) for a, b in rows]
    documented = {"call": call_keys, "equation": eqn_keys, "atom": atom_keys}
    seen: dict[str, set[str]] = {k: set() for k in documented}
    for mox in moxes:
        top = mox.to_dict()
        todo = [top]
        while todo:
            d = todo.pop()
            cls = "equation" if d["kind"] == "equation" else "call"
            assert d["kind"] in (eqn_kinds if cls == "equation" else call_kinds), d["kind"]
            assert set(d) <= documented[cls], (cls, set(d) - documented[cls])
            seen[cls] |= set(d)
            values = d["params"].values() if cls == "equation" else d["attrs"].values()
            assert all(isinstance(v, str) for v in values)
            for atom in [*d["inputs"], *d["outputs"]]:
                assert set(atom) <= atom_keys and {"shape", "dtype"} <= set(atom)
                assert ("var" in atom) != ("literal" in atom)
                seen["atom"] |= set(atom)
            todo += d.get("children", []) + list(d.get("subs", {}).values())
        assert isinstance(top["params"], int)
        yson = pytest.importorskip("yt.yson")
        for fmt in ("binary", "text", "pretty"):
            b = io.BytesIO()
            yax.dump_yson(mox, b, format=fmt)
            assert _plain(yson.loads(b.getvalue())) == json.loads(mox.to_json())
    assert seen == documented, {k: documented[k] ^ seen[k] for k in seen}
