"""The explorer's Python side: state, message handlers (also malformed and
hostile messages), copy-as-code, and the %yax magic. The browser end of the
widget is tested in tests/e2e/."""

from __future__ import annotations

import copy

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ipywidgets.widgets.widget import _remove_buffers
from models import Transformer

import yax
from yax.internal import compiled_programs, view
from yax_widget import Explorer

IDS = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 64


@pytest.fixture(scope="module")
def model():
    m = Transformer(num_layers=2)
    return m, m.init(jax.random.key(0), IDS)


def explorer(model, **kw) -> Explorer:
    m, v = model
    ex = Explorer(m, v, IDS, **kw)
    ex.sent = []
    ex.send = lambda content, buffers=None: ex.sent.append(content)  # the comm's transport only
    return ex


def ask(ex: Explorer, **content) -> dict:
    ex._on_msg(ex, content, [])
    return ex.sent[-1]


def snapshot(ex: Explorer):
    return ex.mox, ex.params, len(ex._states), ex._index, ex._query, list(ex._matches), ex._tree["version"]


def test_tree_rows_are_the_call_nodes_with_their_parents(model):
    ex = explorer(model)
    nodes = view(ex.mox).nodes
    rows = ex._tree["rows"]
    assert [nodes[r[0]].path for r in rows] == [n.path for n in ex.mox.modules()]
    by_id = {r[0]: r for r in rows}
    for r in rows:
        node = nodes[r[0]]
        assert (r[2], r[3], r[4]) == (node.kind, node.name, node.type)
        assert r[8] == node.num_params
        if r[1] >= 0:  # the parent row is the nearest enclosing call
            parent = nodes[r[1]]
            assert node.path.startswith(parent.path) and r[1] in by_id
        else:
            assert node.path == "Transformer"
    dense = next(r for r in rows if r[4] == "Dense")
    assert "features=" in dense[5] and dense[6].startswith("f32[") and dense[9] > 0
    # the row shows what differs from the defaults; the tooltip text has every field
    assert "use_bias" not in dense[5] and "use_bias=True" in dense[10] and "features=" in dense[10]


def test_query_highlights_exactly_what_yax_query_returns(model):
    ex = explorer(model)
    xp = '//module_call[@type="Dense"][@features=64]'
    reply = ask(ex, rid=1, type="query", xpath=xp)
    want = yax.query(xp, ex.mox)
    assert reply == {"type": "ok", "rid": 1, "count": 2}
    assert ex._matches == [view(ex.mox).ids[id(n)] for n in want]
    assert ex.selection == want and ex._query == xp
    # equations are highlighted too
    ask(ex, rid=2, type="query", xpath="//tanh")
    assert len(ex._matches) == 2 and all(type(n).__name__ == "Equation" for n in ex.selection)
    # an invalid query reports its error and keeps the last good highlight
    before = list(ex._matches)
    reply = ask(ex, rid=3, type="query", xpath="//[@")
    assert reply["type"] == "error" and "XPath" in reply["message"]
    assert ex._query_error == reply["message"] and ex._matches == before
    # a number is a count, not a highlight
    assert ask(ex, rid=4, type="query", xpath='count(//module_call[@type="Dense"])')["count"] == 12.0
    assert ex._query_error == "" and ex._matches == []
    # Python drives the UI the same way
    assert ex.query("//activation[@name='gelu']") == yax.query("//activation[@name='gelu']", ex.mox)
    assert len(ex._matches) == 2


def test_substitute_by_row_compares_and_keeps_the_original(model):
    ex = explorer(model)
    original, params = ex.mox, ex.params
    gelu = yax.query("//activation[@name='gelu']", ex.mox)[0]
    reply = ask(ex, rid=1, type="substitute", target=view(ex.mox).ids[id(gelu)], name="ReLU")
    assert reply["type"] == "ok" and "Block_0/gelu" in reply["description"]
    assert ex.original is original and ex._states[0].params is params
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
    rows = {r[0]: r for r in ex._tree["rows"]}
    assert set(map(int, state["boundaries"])) <= set(rows)
    assert ex._diff["current"] and ex._diff["original"]
    assert ex._history == {"items": [reply["description"]], "index": 1}


def test_substitute_the_query_matches_with_a_module(model):
    ex = explorer(model)
    ex.add_replacement("LoRA r=2", yax.LoRA(rank=2))
    ex.query('//module_call[@type="Dense"][@features=64]')
    reply = ask(ex, rid=1, type="substitute", target="query", name="LoRA r=2")
    assert reply["type"] == "ok"
    assert [n.type for n in yax.query('//module_call[re:test(@path, "Block_\\d/Dense_0$")]', ex.mox)] == ["LoRA"] * 2
    lora = ex.params["params"]["Block_0"]["Dense_0"]
    assert lora["lora_a"].shape == (32, 2) and "kernel" in lora
    # LoRA starts at B = 0: the model is unchanged until trained
    assert ex.comparison.allclose and ex.comparison.first_divergence is None
    np.testing.assert_allclose(yax.eval_mox(ex.mox, ex.params, IDS), yax.eval_mox(ex.original, model[1], IDS),
                               rtol=1e-6, atol=1e-6)
    # the query runs again on the new model: no Dense of 64 features is left
    assert ex.selection == yax.query(ex._query, ex.mox) == [] and ex._matches == []


def test_a_replacement_that_does_not_fit_is_refused_at_its_row(model):
    ex = explorer(model)
    ex.add_replacement("half", lambda x: x[..., : x.shape[-1] // 2])
    out = yax.query('//module_call[@name="out"]', ex.mox)[0]  # a Dense from 32 to 32 features
    i = view(ex.mox).ids[id(out)]
    fits = ask(ex, rid=1, type="fits", id=i)
    assert "GELU" in fits["fits"] and "identity" in fits["fits"] and "half" not in fits["fits"]
    assert "f32[2,8,16] but the node's is f32[2,8,32]" in fits["refused"]["half"]
    dense = yax.query('//module_call[@name="Dense_0"]', ex.mox)[0]  # 32 -> 64: no activation fits
    assert ask(ex, rid=1, type="fits", id=view(ex.mox).ids[id(dense)])["fits"] == []
    before = snapshot(ex)
    reply = ask(ex, rid=2, type="substitute", target=i, name="half")
    assert reply["type"] == "error" and "Nothing was changed" in reply["message"]
    assert ex._notice["id"] == i and ex._notice["message"] == reply["message"]
    assert snapshot(ex) == before and ex.history == []


def test_the_original_is_measured_once_in_the_background(model):
    ex = explorer(model, warm=True)
    ex._warmer.result(timeout=120)
    ref = ex._reference  # the original's outputs and boundary values on the example inputs
    assert ex._warmer.done() and compiled_programs(ex.original) and ref is not None and len(ref.taps) > 20
    ex.substitute("//activation[@name='gelu']", "ReLU")
    ex.substitute("//module_call[@type='Dropout']", "identity")
    assert ex._reference is ref  # a change runs only the modified model
    assert ex.comparison.first_divergence == "Transformer/Block_0/gelu"
    # the same verdicts and numbers as comparing from scratch
    assert ex.comparison.to_dict() == yax.compare(ex.original, ex.mox, ex.params, IDS).to_dict()


def test_undo_redo_and_history(model):
    ex = explorer(model)
    ex.substitute("//activation[@name='gelu']", "ReLU")
    ex.substitute("//activation[@name='relu']", "SiLU")
    third = ex.mox
    assert [c.description for c in ex.history] == [
        "replaced 2 node(s) selected by //activation[@name='gelu'] with ReLU",
        "replaced 2 node(s) selected by //activation[@name='relu'] with SiLU"]
    assert ask(ex, rid=1, type="undo")["type"] == "ok"
    assert len(ex.history) == 1 and ex._history["index"] == 1 and len(ex._history["items"]) == 2
    ask(ex, rid=2, type="undo")
    assert ex.mox is ex.original and ex.comparison is None and ex._comparison == {}
    ask(ex, rid=3, type="undo")  # at the original: nothing happens
    assert ex.mox is ex.original
    ask(ex, rid=4, type="redo")
    ask(ex, rid=5, type="redo")
    assert ex.mox is third
    ex.undo()
    ex.substitute("//activation[@name='relu']", "tanh")  # a new change drops the redo branch
    assert [c.description[-4:] for c in ex.history] == ["ReLU", "tanh"] and len(ex._history["items"]) == 2


def test_copy_as_code_reproduces_the_current_model(model):
    m, v = model
    ex = explorer(model)
    ex.add_replacement("LoRA", yax.LoRA(rank=2, alpha=2.0))
    ex.substitute(yax.query('//module_call[@name="Dense_1"]', ex.mox)[1], "LoRA")
    ex.substitute("//activation[@name='gelu']", "SiLU")
    code = ask(ex, rid=1, type="code")["code"]
    assert "yax.LoRA(rank=2, alpha=2.0)" in code and "jax.nn.silu" in code
    ns = {"mox": yax.make_mox(m.apply)(v, IDS), "params": v}
    exec(code, ns)
    np.testing.assert_array_equal(yax.eval_mox(ns["mox"], ns["params"], IDS), yax.eval_mox(ex.mox, ex.params, IDS))
    assert str(ns["mox"]) == str(ex.mox)
    # functions create no variables: no key in their code
    fn_only = explorer(model)
    fn_only.substitute("//activation[@name='gelu']", "SiLU")
    assert "KEY" not in fn_only.code() and "jax.nn.silu, mox, params=params)" in fn_only.code()


def test_graph_and_expand(model):
    ex = explorer(model)
    block = yax.query('//module_call[@name="Block_1"]', ex.mox)[0]
    i = view(ex.mox).ids[id(block)]
    dot = ask(ex, rid=1, type="graph", id=i, depth=1)["dot"]
    assert dot == yax.to_dot(ex.mox, depth=1, root=block)
    assert ask(ex, rid=2, type="graph", id=None, depth=0)["dot"].startswith("digraph")
    ln = yax.query('//module_call[@name="LayerNorm_0"]', ex.mox)[0]
    rows = ask(ex, rid=3, type="expand", id=view(ex.mox).ids[id(ln)])["rows"]
    assert [r[1] for r in rows] == [e.name for e in ln.equations]
    assert all(view(ex.mox).nodes[r[0]] is e for r, e in zip(rows, ln.equations))


HOSTILE = [
    None, [], "query", 7, {}, {"type": "query"}, {"rid": "1", "type": "query", "xpath": "//*"},
    {"rid": True, "type": "undo"}, {"rid": 1}, {"rid": 1, "type": "__init__"}, {"rid": 1, "type": "_on_msg"},
    {"rid": 1, "type": "query", "xpath": 5}, {"rid": 1, "type": "query", "xpath": "/" * 5000},
    {"rid": 1, "type": "query", "xpath": "//*[re:test(@path, '(a+)+$')]"},
    {"rid": 1, "type": "expand", "id": -1}, {"rid": 1, "type": "expand", "id": 10**9},
    {"rid": 1, "type": "expand", "id": "0"}, {"rid": 1, "type": "expand", "id": 0},
    {"rid": 1, "type": "expand", "id": True}, {"rid": 1, "type": "fits", "id": 1.5},
    {"rid": 1, "type": "substitute", "target": 5, "name": "os.system"},
    {"rid": 1, "type": "substitute", "target": 5, "name": ["GELU"]},
    {"rid": 1, "type": "substitute", "target": "//*", "name": "GELU"},
    {"rid": 1, "type": "substitute", "target": 0, "name": "GELU"},
    {"rid": 1, "type": "substitute", "target": None, "name": "GELU"},
    {"rid": 1, "type": "substitute", "target": "query", "name": "GELU"},
    {"rid": 1, "type": "graph", "id": 0, "depth": 1}, {"rid": 1, "type": "graph", "id": None, "depth": 99},
    {"rid": 1, "type": "graph", "id": None, "depth": "1"},
]


@pytest.mark.parametrize("content", HOSTILE, ids=range(len(HOSTILE)))
def test_malformed_messages_get_an_error_and_change_nothing(model, content):
    ex = explorer(model)
    before = snapshot(ex)
    ex._on_msg(ex, copy.deepcopy(content), [])
    reply = ex.sent[-1]
    if reply["type"] == "ok":  # only harmless reads may succeed
        assert content["type"] in ("query", "expand")
        if content["type"] == "query":
            assert ex._query == content["xpath"]
            return
    else:
        assert reply["type"] == "error" and reply["message"].endswith((".", ")")) and len(reply["message"]) > 20
    assert snapshot(ex) == before


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(
    st.sampled_from(["rid", "type", "id", "xpath", "target", "name", "depth"]),
    st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.text(max_size=30),
              st.sampled_from(["query", "expand", "fits", "undo", "redo", "code", "graph", "GELU"]),
              st.lists(st.integers(), max_size=3)),
))
def test_random_messages_always_get_one_reply(model, content):
    ex = _FUZZ.setdefault("ex", explorer(model))
    n = len(ex.sent)
    ex._on_msg(ex, content, [])
    assert len(ex.sent) == n + 1 and ex.sent[-1]["type"] in ("ok", "error")
    assert ex.mox is ex.original or ex.history  # changes only through a valid substitute


_FUZZ: dict = {}


def test_bad_explorer_arguments():
    with pytest.raises(yax.YaxInputError, match="root MoX"):
        mox = yax.make_mox(lambda x: nn.gelu(x))(jnp.ones(3))
        Explorer(mox.modules().__next__())
    with pytest.raises(yax.YaxTraceError):
        Explorer(42)
    ex = Explorer(yax.make_mox(jnp.sin)(jnp.ones(3)))
    assert ex._comparison == {"message": "no example inputs to compare on"}
    with pytest.raises(yax.YaxInputError, match="non-empty string"):
        ex.add_replacement("", jax.nn.relu)
    with pytest.raises(yax.YaxInputError, match="must be a function"):
        ex.add_replacement("three", 3)
    with pytest.raises(yax.YaxInputError, match="No replacement is registered"):
        ex.substitute("//*", "nope")


def test_plain_function_explorer():
    def f(x):
        return jax.nn.relu(x @ jnp.ones((3, 3))).sum(-1)

    x = jnp.arange(6.0).reshape(2, 3) - 2
    ex = Explorer(f, x)
    assert [r[3] for r in ex._tree["rows"]] == ["relu"]
    ex.substitute("//activation", "identity")
    assert ex.params is None and ex.code().endswith("mox = yax.sub('//activation', jax.nn.identity, mox)")
    np.testing.assert_allclose(yax.eval_mox(ex.mox, x), (x @ jnp.ones((3, 3))).sum(-1))
    ex.add_replacement("Double it!", lambda x: 2 * x)
    ex.substitute(ex.mox.modules().__next__(), "Double it!")
    assert "# `double_it`: the replacement registered as 'Double it!'; define it first\nmox = yax.sub(" in ex.code()
    assert ex.code().endswith(", double_it, mox)")
    ns = {"mox": yax.make_mox(f)(x), "double_it": lambda x: 2 * x}
    exec(ex.code(), ns)
    np.testing.assert_array_equal(yax.eval_mox(ns["mox"], x), yax.eval_mox(ex.mox, x))
    assert not ex.comparison.allclose


def test_a_comparison_failing_at_run_time_is_reported_and_the_change_stands():
    def boom(x):
        raise RuntimeError("the host callback broke")

    def fragile(x):  # fits (abstractly), fails only when XLA runs it
        return jax.pure_callback(boom, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    x = jnp.arange(6.0).reshape(2, 3)
    ex = Explorer(lambda x: jax.nn.relu(x).sum(-1), x)
    ex.sent = []
    ex.send = lambda content, buffers=None: ex.sent.append(content)
    ex.add_replacement("fragile", fragile)
    ex.query("//activation")
    reply = ask(ex, rid=1, type="substitute", target="query", name="fragile")
    assert reply["type"] == "ok" and len(ex.history) == 1 and ex.comparison is None
    msg = ex._comparison["message"]
    assert msg.startswith("The comparison failed with") and msg.endswith("RuntimeError: the host callback broke")
    assert len(msg) < 500  # the first and last lines of the error, not a whole traceback
    assert ex._status == {"busy": False, "message": "comparison failed"}
    ex.undo()  # and the explorer goes on working
    assert ex.mox is ex.original and ex._comparison == {}


# -- the %yax magic ---------------------------------------------------------------

@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    return InteractiveShell.instance()


def test_magic(shell, model):
    from IPython.core.error import UsageError

    shell.run_line_magic("load_ext", "yax_widget")
    shell.run_line_magic("reload_ext", "yax_widget")  # loading twice is harmless
    m, v = model
    shell.user_ns.update(model=m, variables=v, batch=IDS)
    ex = shell.run_line_magic("yax", "model variables batch --query '//module_call[@type=\"Dense\"]'")
    assert isinstance(ex, Explorer) and len(ex.selection) == 12
    assert shell.run_line_magic("yax", "model variables batch[:1]").mox.invars[-1].shape == (1, 8)
    for line, msg in [("", "needs a model"), ("nope", "could not evaluate `nope`"), ("model --query", "needs an XPath"),
                      ("model variables batch --depth 3", "no option --depth"), ("model 'x", "quotes"),
                      ("model variables batch --query '//['", "XPath")]:
        with pytest.raises(UsageError, match=msg):
            shell.run_line_magic("yax", line)


# -- flax.nnx models ------------------------------------------------------------------

def test_nnx_explorer_and_magic(shell):
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.fc1, self.fc2 = nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 2, rngs=rngs)

        def __call__(self, x):
            return self.fc2(nnx.gelu(self.fc1(x)))

    net, x = Net(nnx.Rngs(0)), jnp.ones((3, 8))
    ex = Explorer(net, x, warm=False)
    assert [r[3] for r in ex._tree["rows"]] == ["Net", "fc1", "gelu", "fc2"]
    assert [n.path for n in ex.query('//module_call[@type="Linear"]')] == ["Net/fc1", "Net/fc2"]
    ex.add_replacement("LoRA", lambda path, node: nnx.LoRALinear(
        node.attrs["in_features"], node.attrs["out_features"], lora_rank=2, rngs=nnx.Rngs(1)), code="lora")
    ex.substitute("query", "LoRA")
    assert [n.type for n in ex.query('//module_call[@path="Net/fc2"]')] == ["LoRALinear"]
    out, _ = yax.eval_mox(ex.mox, ex.params, x)
    merged = nnx.merge(ex.mox.graphdef, ex.params)
    np.testing.assert_allclose(out, merged(x), rtol=1e-6)
    assert ex.comparison.outputs and "lora" in ex.code()
    ex.substitute("//activation", "ReLU")
    assert ex.comparison.first_divergence == "Net/gelu" and not ex.comparison.allclose
    np.testing.assert_allclose(yax.eval_mox(ex.mox, ex.params, x)[0],
                               merged.fc2(jax.nn.relu(merged.fc1(x))), rtol=1e-6)
    assert type(net.fc1).__name__ == "Linear"  # the user's model is untouched
    shell.run_line_magic("load_ext", "yax_widget")
    shell.user_ns.update(net=net, x=x)
    assert shell.run_line_magic("yax", "net x --query //activation").selection[0].name == "gelu"


def test_a_script_exiting_during_the_background_compile_exits_cleanly():
    import subprocess
    import sys

    code = "import jax.numpy as jnp; from yax_widget import Explorer; Explorer(jnp.sin, jnp.ones(3), warm=True)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
