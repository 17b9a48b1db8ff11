"""What the explorer sends to the front-end: tree rows, the comparison with its
heatmap buffers, diff marks."""

from __future__ import annotations

import functools
import pathlib
import re

import numpy as np
from ipywidgets.widgets.widget import _remove_buffers

import yax
from yax.internal import structure_keys, value_str, view
from yax_widget._payloads import CALL_COLUMNS, CALL_NAMES, EQUATION_COLUMNS, EQUATION_NAMES, tree

from .helpers import IDS, ask, explorer

ROOT = pathlib.Path(__file__).resolve().parents[2]


def named(sent: dict) -> list[dict]:
    """The rows of a trait or reply, each as ``{column: value}`` by the names its ``columns`` give
    (as js/src/rows.js reads them)."""
    return [dict(zip(sent["columns"], r, strict=True)) for r in sent["rows"]]


def test_tree_rows_are_the_call_nodes_with_their_parents(model):
    ex = explorer(model)
    nodes = view(ex.mox).nodes
    assert ex._tree["columns"] == list(CALL_NAMES) and ex._original_tree["columns"] == list(CALL_NAMES)
    rows = named(ex._tree)
    assert [nodes[r["id"]].path for r in rows] == [n.path for n in ex.mox.modules()]
    by_id = {r["id"]: r for r in rows}
    for r in rows:
        node = nodes[r["id"]]
        if node.kind == "method_call":  # a helper method: named by its method, its module's params not again
            assert (r["name"], r["attrs"], r["params"]) == (f"{node.name}.{node.method}", "", 0)
            assert by_id[r["parent"]]["params"] == node.num_params
        else:
            assert (r["name"], r["params"]) == (node.name, node.num_params)
        assert (r["kind"], r["type"]) == (node.kind, node.type)
        if r["parent"] >= 0:  # the parent row is the nearest enclosing call
            parent = nodes[r["parent"]]
            assert node.path.startswith(parent.path) and r["parent"] in by_id
        else:
            assert node.path == "Transformer"
    assert any(r["kind"] == "method_call" for r in rows)  # the model has helper methods: the case above ran
    dense = next(r for r in rows if r["type"] == "Dense")
    assert "features=" in dense["attrs"] and dense["ins"].startswith("f32[") and dense["neq"] > 0
    # the row shows what differs from the defaults; the tooltip text has every field
    assert "use_bias" not in dense["attrs"] and "use_bias=True" in dense["fields"] and "features=" in dense["fields"]


def test_rows_are_laid_out_once_and_their_columns_travel_with_them(model):
    """`CALL_COLUMNS` / `EQUATION_COLUMNS` are the one layout: every row has one value per column,
    the `_tree` trait and the `expand` and `equations` replies name them in that order."""
    ex = explorer(model)
    assert CALL_NAMES == tuple(n for n, _ in CALL_COLUMNS) and len(set(CALL_NAMES)) == len(CALL_NAMES)
    assert EQUATION_NAMES == tuple(n for n, _ in EQUATION_COLUMNS) and len(set(EQUATION_NAMES)) == len(EQUATION_NAMES)
    assert ex._tree["columns"] == list(CALL_NAMES) and all(len(r) == len(CALL_NAMES) for r in ex._tree["rows"])
    dense = next(r for r in named(ex._tree) if r["type"] == "Dense")
    expand = ask(ex, rid=1, type="expand", id=dense["id"])
    assert expand["columns"] == list(EQUATION_NAMES) and expand["rows"]
    assert all(len(r) == len(EQUATION_NAMES) for r in expand["rows"])
    several = ask(ex, rid=2, type="equations", ids=[dense["id"]])
    assert several["columns"] == list(EQUATION_NAMES) and several["calls"] == [[dense["id"], expand["rows"]]]


def _columns_table(columns: tuple[tuple[str, str], ...]) -> str:
    """The markdown table docs/widget.md shows of ``columns``: position, name, what it holds."""
    return "\n".join(["| # | column | what it holds |", "|---|---|---|",
                      *(f"| {i} | `{name}` | {what.replace('|', chr(92) + '|')} |"
                        for i, (name, what) in enumerate(columns))])


def test_the_docs_list_exactly_the_columns_python_lays_out():
    """docs/widget.md's tables of a row's columns are `CALL_COLUMNS` and `EQUATION_COLUMNS`, in their
    order, saying what they say: the docs cannot drift from the rows. (A failure prints the table to paste.)"""
    doc = (ROOT / "docs" / "widget.md").read_text()
    for marker, columns in (("CALL_COLUMNS", CALL_COLUMNS), ("EQUATION_COLUMNS", EQUATION_COLUMNS)):
        found = re.search(rf"<!-- {marker} -->\n((?:\|.*\n)+)", doc)
        assert found, f"docs/widget.md has no table after `<!-- {marker} -->`"
        want = _columns_table(columns)
        assert found.group(1).rstrip("\n") == want, f"docs/widget.md's table of {marker} should read:\n{want}"


def test_the_front_end_reads_exactly_the_columns_python_names():
    """js/src/rows.js reads columns by name: the names it reads are those Python sends (no column
    it would miss, none Python sends that it drops unknowingly)."""
    js = (ROOT / "js" / "src" / "rows.js").read_text()

    def names(const: str) -> list[str]:
        found = re.search(rf"const {const} = \[([^\]]*)\]", js)
        assert found, const
        return re.findall(r'"(\w+)"', found.group(1))

    assert names("CALL_NEEDED") + names("CALL_OPTIONAL") == list(CALL_NAMES)
    assert names("EQUATION_NEEDED") + names("EQUATION_OPTIONAL") == list(EQUATION_NAMES)


def test_substitute_by_row_compares_and_keeps_the_original(model):
    ex = explorer(model)
    original, params = ex.mox, ex.params
    gelu = yax.query("//activation[@name='gelu']", ex.mox)[0]
    reply = ask(ex, rid=1, type="substitute", target=view(ex.mox).ids[id(gelu)], name="ReLU")
    assert reply["type"] == "ok" and "Block_0/gelu" in reply["description"]
    assert ex.original is original and ex.session.states[0].params is params
    assert [n.name for n in yax.query("//activation", ex.mox)] == ["softmax", "relu", "softmax", "gelu"]
    # the comparison is the real one
    c = ex.comparison
    assert c.first_divergence == "Transformer/Block_0/gelu" and not c.allclose  # the site keeps its path
    want = yax.compare(original, ex.mox, params, IDS)
    assert c.outputs == want.outputs
    state = ex._comparison
    assert state["first_divergence_id"] == view(ex.mox).ids[id(yax.query("//activation[@name='relu']", ex.mox)[0])]
    out = state["outputs"][0]
    assert out["shape"] == [2, 8, 64] and sum(out["hist"]["counts"]) == 2 * 8 * 64
    heat = out["heat"]
    assert (heat["rows"], heat["cols"]) == (8, 64)
    x, y = c.arrays[out["name"]]
    np.testing.assert_array_equal(np.frombuffer(heat["original"], "<f4").reshape(8, 64), x[0])
    np.testing.assert_array_equal(np.frombuffer(heat["diff"], "<f4").reshape(8, 64), np.abs(y - x)[0])
    # heatmaps travel as binary buffers, not JSON lists
    _, _, buffers = _remove_buffers(ex.get_state())
    assert len(buffers) == 3 and sum(len(b) for b in buffers) == 3 * 8 * 64 * 4
    # the divergence is coloured per row of the current tree
    rows = {r["id"]: r for r in named(ex._tree)}
    assert set(map(int, state["boundaries"])) <= set(rows)
    assert ex._diff["current"] and ex._diff["original"]
    assert ex._history == {"items": [reply["description"]], "index": 1}


def test_rows_show_each_calls_dtypes_once_the_model_mixes_them(model):
    ex = explorer(model)
    assert {r["policy"] for r in named(ex._tree)} == {""}  # one dtype throughout: nothing to show
    m, v = model
    half = yax.mixed_precision(ex.mox)
    mixed = explorer((half, v))
    nodes = view(mixed.mox).nodes
    shown = {nodes[r["id"]].path: r["policy"] for r in named(mixed._tree)}
    dense = [p for p, n in ((n.path, n) for n in half.modules()) if n.type == "Dense"]
    assert dense and all(shown[p] == "f32/bf16/f32" for p in dense)
    norms = [n.path for n in half.modules() if n.type == "LayerNorm"]
    assert norms and all(shown[p] == "f32/f32/f32" for p in norms)


def test_the_fold_column_is_the_structure_key_equal_for_calls_alike(model):
    ex = explorer(model)
    nodes = view(ex.mox).nodes
    keys = structure_keys(ex.mox)
    assert all(r["fold"] == keys[id(nodes[r["id"]])] for r in named(ex._tree))
    fold = {nodes[r["id"]].path: r["fold"] for r in named(ex._tree)}
    # the two blocks compute the same thing up to their weights: one key, whatever their names
    assert fold["Transformer/Block_0"] == fold["Transformer/Block_1"]
    assert fold["Transformer/Block_0/LayerNorm_0"] == fold["Transformer/Block_1/LayerNorm_1"]
    assert fold["Transformer/Block_0/Dense_0"] != fold["Transformer/Block_0/Dense_1"]  # other shapes
    ex.substitute('//module_call[@path="Transformer/Block_1/Dense_0"]', "LoRA r=4")
    nodes = view(ex.mox).nodes
    fold = {nodes[r["id"]].path: r["fold"] for r in named(ex._tree)}
    assert fold["Transformer/Block_0"] != fold["Transformer/Block_1"]  # a LoRA in one: no longer alike
    assert fold["Transformer/Block_0/LayerNorm_0"] == fold["Transformer/Block_1/LayerNorm_0"]


def test_value_str_reads_a_partial_as_the_call_it_builds():
    import flax.linen as nn
    import jax
    from flax import nnx

    # the arguments that differ from the callable's defaults, by name, deterministic: no address, no `partial`
    assert value_str(functools.partial(nn.Dense, features=64, use_bias=True)) == "Dense(features=64)"
    assert value_str(functools.partial(nn.Dense, 8, use_bias=False, kernel_init=nn.initializers.zeros)) == (
        "Dense(8, use_bias=False, kernel_init=zeros)")
    assert value_str(functools.partial(nn.Dense, features=64, use_bias=1)) == "Dense(features=64, use_bias=1)"
    assert value_str(functools.partial(jax.nn.gelu, approximate=False)) == "gelu(approximate=False)"
    assert value_str(functools.partial(jax.nn.gelu, approximate=True)) == "gelu()"
    # an nnx layer: its constructor's defaults, hidden behind nnx's `(*args, **kwargs)` signature
    assert value_str(functools.partial(nnx.Conv, in_features=3, out_features=8, kernel_size=(3, 3), strides=1,
                                       padding="SAME")) == "Conv(in_features=3, out_features=8, kernel_size=(3, 3))"
    assert value_str(functools.partial(max, 3, key=abs)) == "max(3, key=abs)"  # no signature: all of them
    assert value_str(nnx.LoRAParam) == "LoRAParam"  # a class as a value: by name


def test_a_lora_row_shows_the_layer_it_adapts_not_its_internals():
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    from flax import nnx

    class Linen(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(nn.Dense(64)(x))

    m, x = Linen(), jnp.ones((2, 4))
    v = m.init(jax.random.key(0), x)
    mox, _ = yax.sub('//module_call[@type="Dense"]', yax.LoRA(rank=2), yax.make_mox(m.apply)(v, x), params=v,
                     key=jax.random.key(1))
    rows = [r for r in named(tree(mox, 1)) if r["type"] == "LoRA"]
    assert [(r["attrs"], r["fields"]) for r in rows] == [  # attrs (the row), fields (its tooltip)
        ("rank=2 base=Dense(features=64)", "rank=2 alpha=4.0 base=Dense(features=64)"),
        ("rank=2 base=Dense(features=3)", "rank=2 alpha=4.0 base=Dense(features=3)")]

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.conv = nnx.Conv(3, 8, kernel_size=(3, 3), rngs=rngs)

        def __call__(self, x):
            return self.conv(x)

    net = Net(nnx.Rngs(0))
    mox = yax.make_mox(net)(jnp.ones((1, 8, 8, 3)))
    mox, _ = yax.sub("//module_call[@type='Conv']", yax.LoRA(rank=2), mox, params=nnx.state(net))
    (row,) = [r for r in named(tree(mox, 1)) if r["type"] == "LoRA"]
    assert row["attrs"] == "alpha=4.0 base=Conv(in_features=3, out_features=8, kernel_size=(3, 3)) rank=2"  # no in_axes
    assert "partial" not in row["fields"] and "0x" not in row["fields"]


def test_rows_carry_the_users_line_and_the_source_request_reads_it(model):
    """The `source` column of a call row (and of an equation row) is where the user's code made it, the
    `source` reply the lines around it as the file reads (the Source tab)."""
    import os

    ex = explorer(model)
    nodes = view(ex.mox).nodes
    rows = named(ex._tree)
    for r in rows:
        loc = nodes[r["id"]].source
        assert r["source"] == ("" if loc is None else str(loc))
    dense = next(r for r in rows if r["type"] == "Dense")
    assert re.fullmatch(r"models\.py:\d+", dense["source"])
    eqs = named(ask(ex, rid=1, type="expand", id=dense["id"]))
    assert eqs and all(e["source"] == str(nodes[e["id"]].source) for e in eqs)
    reply = ask(ex, rid=2, type="source", id=dense["id"])
    loc = nodes[dense["id"]].source
    assert reply["type"] == "ok" and (reply["file"], reply["path"], reply["line"]) == ("models.py", loc.path, loc.line)
    assert os.path.basename(loc.path) == "models.py" and reply["note"] == ""
    with open(loc.path) as f:
        text = f.read().splitlines()
    numbers = [n for n, _ in reply["lines"]]
    assert numbers == list(range(max(1, loc.line - 8), min(len(text), loc.line + 8) + 1))
    assert all(t == text[n - 1] for n, t in reply["lines"])
    # a node with no line of the user's: no lines, one sentence saying why
    bare = next((i for i, n in enumerate(nodes) if n is not ex.mox and n.source is None), None)
    if bare is not None:
        reply = ask(ex, rid=3, type="source", id=bare)
        assert reply["lines"] == [] and reply["note"].startswith("JAX recorded no line") and reply["note"].endswith(".")
    assert ask(ex, rid=4, type="source", id=10**9)["type"] == "error"  # an id the model does not have


def test_a_replaced_activation_is_marked_changed_not_added(model):
    """GELU swapped for ReLU is one replacement in each block: the rows are "changed" on both sides (as
    docs/rewrite.md says), not an addition and a removal; removing a layer (identity) stays "removed"."""
    ex = explorer(model)
    ex.substitute("//activation[@name='gelu']", "ReLU")
    ids_now, ids_then = view(ex.mox).ids, view(ex.original).ids
    relus = [ids_now[id(n)] for n in yax.query("//activation[@name='relu']", ex.mox)]
    gelus = [ids_then[id(n)] for n in yax.query("//activation[@name='gelu']", ex.original)]
    assert len(relus) == len(gelus) == 2
    assert ex._diff["current"] == {str(i): "changed" for i in relus}
    assert ex._diff["original"] == {str(i): "changed" for i in gelus}
    ex.substitute("//module_call[@type='Dropout']", "identity")
    marks = ex._diff["current"]
    assert sorted(marks.values()).count("changed") >= 2 and "added" not in marks.values()
