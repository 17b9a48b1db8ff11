"""The explorer on models nobody here wrote: Hugging Face Flax
classes from small configs and an nnx model. What the fits menu offers is what
a drop does; an unchanged output is drawn as unchanged; the query box's text
follows the model; the wrapper object's parameters are the explorer's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import yax
from yax.internal import view
from yax_widget import Explorer, _payloads

from .helpers import ask


def wire(ex: Explorer) -> Explorer:
    ex.sent = []
    ex.send = lambda content, buffers=None: ex.sent.append(content)
    return ex


def node_id(ex: Explorer, xpath: str) -> int:
    return view(ex.mox).ids[id(yax.query(xpath, ex.mox)[0])]


@pytest.fixture(scope="module")
def gpt2():
    from thirdparty import IDS, _hf

    return _hf("gpt2"), IDS


def test_the_wrapper_object_is_traced_with_its_parameters_as_an_argument(gpt2):
    model, ids = gpt2
    ex = wire(Explorer(model, ids, warm=False))
    assert ex.params is model.params and ex.mox.name == "FlaxGPT2LMHeadModel"
    ex.add_replacement("LoRA r=2", yax.LoRA(rank=2))
    ex.add_replacement("ReLU-ish", jax.nn.relu)
    # lm_head is the tied embedding: the menu refuses LoRA there, saying why, and so does a drop
    head = node_id(ex, '//module_call[@name="lm_head"]')
    menu = ask(ex, rid=1, type="fits", id=head)
    assert "LoRA r=2" not in menu["fits"] and "tied" in menu["refused"]["LoRA r=2"]
    reply = ask(ex, rid=2, type="substitute", target=head, name="LoRA r=2")
    assert reply["type"] == "error" and "tied" in reply["message"] and len(ex.history) == 0
    # every item the menu offers on an MLP layer is taken by a drop, and no refused one is
    fc = node_id(ex, '//module_call[@name="c_fc"]')
    menu = ask(ex, rid=3, type="fits", id=fc)
    for name in ex.session.items:
        before = len(ex.history)
        reply = ask(ex, rid=4, type="substitute", target=fc, name=name)
        assert (reply["type"] == "ok") == (name in menu["fits"]), (name, reply)
        if reply["type"] == "ok":
            ex.undo()
        assert len(ex.history) == before


def test_a_module_replacement_on_the_wrapper_keeps_its_variables_in_the_explorer_params():
    from thirdparty import IDS, _hf

    model = _hf("bert")
    ex = wire(Explorer(model, IDS, warm=False))
    ex.add_replacement("LoRA r=2", yax.LoRA(rank=2))
    q = node_id(ex, '//module_call[@name="query"]')
    assert "LoRA r=2" in ask(ex, rid=1, type="fits", id=q)["fits"]
    assert ask(ex, rid=2, type="substitute", target=q, name="LoRA r=2")["type"] == "ok"
    assert ex.comparison.allclose  # LoRA starts bit-equal
    flat = jax.tree_util.tree_leaves_with_path(ex.params)
    assert any("lora" in jax.tree_util.keystr(p).lower() for p, _ in flat)
    # the unchanged output is drawn as unchanged: no range is made up
    out = ex._comparison["outputs"][0]
    assert out["max_abs"] == 0 and out["hist"]["lo"] == out["hist"]["hi"] == 0
    assert out["hist"]["n"] == sum(out["hist"]["counts"]) and out["hist"]["nonfinite"] == 0


def test_nnx_decider_menu_and_drop_agree():
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.fc1, self.fc2 = nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 2, rngs=rngs)

        def __call__(self, x):
            return self.fc2(nnx.gelu(self.fc1(x)))

    ex = wire(Explorer(Net(nnx.Rngs(0)), jnp.ones((3, 8)), warm=False))
    ex.add_replacement("LoRA", lambda path, node: nnx.LoRALinear(
        node.attrs["in_features"], node.attrs["out_features"], lora_rank=2, rngs=nnx.Rngs(1)))
    for name in ("fc1", "gelu"):
        i = node_id(ex, f'//*[@name="{name}"]')
        offered = "LoRA" in ask(ex, rid=1, type="fits", id=i)["fits"]
        reply = ask(ex, rid=2, type="substitute", target=i, name="LoRA")
        assert offered == (reply["type"] == "ok") == (name == "fc1"), (name, reply)


def test_histogram_and_heatmap_say_what_they_show():
    x = np.zeros((2, 300, 10), np.float32)
    y = x.copy()
    y[1, 5, 5] = 6.0   # the largest difference lies outside the first slice
    y[0, 1, 1] = 2.0
    stats = yax.Stats(max_abs=6.0, mean_abs=0.0, rel=1.0, cosine=0.0, allclose=False)
    out = _payloads._output("out", stats, x, y)
    assert (out["hist"]["lo"], out["hist"]["hi"]) == (0.0, 6.0)
    heat = out["heat"]
    assert heat["label"] == "out[0]" and heat["step"] == [3, 1] and heat["whole"] is False
    same = _payloads._output("out", stats, x, x)["hist"]
    assert same["lo"] == same["hi"] == 0.0 and sum(same["counts"]) == x.size  # not widened to ±0.5


def test_query_result_names_what_a_query_returned(model):
    from .helpers import explorer

    ex = explorer(model)
    ask(ex, rid=1, type="query", xpath="count(//module_call)")
    assert ex._query_result["kind"] == "value" and ex._query_result["value"] == float(len(
        yax.query("//module_call", ex.mox)))
    ask(ex, rid=2, type="query", xpath="//*/@path")
    r = ex._query_result
    assert r["kind"] == "values" and r["count"] > 20 and len(r["values"]) == 20 and "Transformer" in r["values"]
    ask(ex, rid=3, type="query", xpath='//module_call[@type="Dense"][@features=99]')
    r = ex._query_result
    assert r == {"kind": "nodes", "count": 0, "explain": r["explain"]} and "stops matching" in r["explain"]
    ask(ex, rid=4, type="query", xpath="//activation[@name='gelu']")
    assert ex._query_result == {"kind": "nodes", "count": 2}
    # replacing every match: the count follows the model (nothing left to highlight)
    ex.substitute("query", "ReLU")
    assert ex._matches == [] and ex._query_result["kind"] == "nodes" and ex._query_result["count"] == 0
    assert "explain" in ex._query_result
    ex.undo()
    assert ex._query_result == {"kind": "nodes", "count": 2} and len(ex._matches) == 2
    # back at the original, the status no longer reports the undone change's comparison
    assert ex._status == {"busy": False, "message": ""} and ex._comparison == {}
    ask(ex, rid=5, type="query", xpath="  ")
    assert ex._query_result == {}


def test_copy_as_code_runs_as_pasted(shell, model):
    """The script makes `mox` and `params` as the explorer was opened (with the names typed in
    `%yax`, or the usual ones for `Explorer(...)`), then applies the changes: pasted, it runs."""
    from thirdparty import IDS as ids
    from thirdparty import _hf

    m, v = model
    shell.run_line_magic("load_ext", "yax_widget")
    shell.user_ns.update(net=m, weights=v, tokens=ids % 64)
    ex = shell.run_line_magic("yax", "net weights tokens")
    ex.substitute("//activation[@name='gelu']", "ReLU")
    ns = {"net": m, "weights": v, "tokens": ids % 64}
    exec(ex.code(), ns)  # noqa: S102 - the script the user would paste
    assert str(ns["mox"]) == str(ex.mox)
    hf = _hf("bert")
    ex = Explorer(hf, ids, warm=False)
    ex.add_replacement("LoRA r=2", yax.LoRA(rank=2))
    ex.substitute('//module_call[@name="query"]', "LoRA r=2")
    code = ex.code()
    assert "what was given to Explorer(...)" in code, code
    ns = {"model": hf, "batch": ids}
    exec(code, ns)  # noqa: S102
    assert str(ns["mox"]) == str(ex.mox)
    assert jax.tree_util.tree_structure(ns["params"]) == jax.tree_util.tree_structure(ex.params)


def test_an_nnx_model_in_train_mode_compares_its_state_updates_too():
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.fc1, self.bn = nnx.Linear(8, 16, rngs=rngs), nnx.BatchNorm(16, rngs=rngs)

        def __call__(self, x):
            return self.bn(nnx.gelu(self.fc1(x)))

    net = Net(nnx.Rngs(0))
    net.train()
    ex = wire(Explorer(net, jax.random.normal(jax.random.key(1), (6, 8)), warm=False))
    ex.substitute("//activation[@name='gelu']", "ReLU")
    names = [o["name"] for o in ex._comparison["outputs"]]
    assert names[0] == "out[0]" and any("['bn']['mean']" in n for n in names), names
    assert not any("kernel" in n for n in names)  # parameters come back as they went in: not compared
    mean = next(o for o in ex._comparison["outputs"] if "['bn']['mean']" in o["name"])
    assert mean["max_abs"] > 0 and mean["hist"]["n"] == 16
