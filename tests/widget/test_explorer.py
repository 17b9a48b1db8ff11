"""The explorer's Python side: its state and API (substitute, undo/redo, the
background measurement), bad arguments, nnx models. The requests it answers are
tested in test_protocol.py, what it sends in test_payloads.py; the browser end of
the widget in tests/e2e/."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import yax
from yax.internal import compiled_programs
from yax_widget import Explorer

from .helpers import IDS, ask, explorer


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


def test_the_original_is_measured_once_in_the_background(model):
    ex = explorer(model, warm=True)
    ex.session.worker.warmer.result(timeout=120)
    ref = ex.session.worker.reference  # the original's outputs and boundary values on the example inputs
    assert ex.session.worker.warmer.done() and compiled_programs(ex.original) and ref is not None and len(ref.taps) > 20
    ex.substitute("//activation[@name='gelu']", "ReLU")
    ex.substitute("//module_call[@type='Dropout']", "identity")
    assert ex.session.worker.reference is ref  # a change runs only the modified model
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


def test_bad_explorer_arguments():
    with pytest.raises(yax.errors.NotARootMox) as e:
        mox = yax.make_mox(lambda x: nn.gelu(x))(jnp.ones(3))
        Explorer(mox.modules().__next__())
    assert e.value.tool == "Explorer"
    with pytest.raises(yax.errors.WrongType) as e:
        Explorer(42)
    assert (e.value.argument, e.value.found) == ("target", "int") and "its `apply`" in str(e.value)
    ex = Explorer(yax.make_mox(jnp.sin)(jnp.ones(3)))
    assert ex._comparison == {"message": "no example inputs to compare on"}
    with pytest.raises(yax.errors.BadArgument) as e:
        ex.add_replacement("", jax.nn.relu)
    assert isinstance(e.value, yax.YaxInputError) and (e.value.argument, e.value.value) == ("name", "")
    with pytest.raises(yax.errors.WrongType) as e:
        ex.add_replacement("three", 3)
    assert (e.value.argument, e.value.found) == ("three", "int")
    with pytest.raises(yax.errors.UnknownName) as e:
        ex.substitute("//*", "nope")
    assert (e.value.kind, e.value.name) == ("replacement", "nope") and "nope" not in e.value.known


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


def test_the_explorer_compares_inside_a_scanned_stack():
    from models import KEY, ScannedTransformer

    from yax_widget._payloads import comparison_state

    m = ScannedTransformer(num_layers=4)
    ids = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 64
    v = m.init(KEY, ids)
    ex = Explorer(m, v, ids)
    ex.substitute("//activation[@name='gelu']", "ReLU")
    c = ex.comparison
    assert (c.first_divergence, c.first_divergence_step) == ("ScannedTransformer/layers/gelu", (0,))
    state = comparison_state(c, ex.mox, 1.0)
    node_of = {i: n for n in ex.mox.modules() for i in [yax.internal.node_ids(ex.mox)[id(n)]]}
    inside = [node_of[int(k)] for k, b in state["boundaries"].items() if "steps" in b]
    # every call of the stack's body has a row in the table, coloured, with its 4 steps
    assert len(inside) == len([n for n in ex.mox.modules() if n.path.startswith("ScannedTransformer/layers")]) == 12
    assert all(state["boundaries"][str(k)]["steps"] == [4] for k in state["boundaries"] if "steps" in state["boundaries"][k])
    assert node_of[state["first_divergence_id"]].name == "relu"
    assert state["first_divergence"] == "ScannedTransformer/layers/gelu (now relu) at scan step 0"


def test_the_explorer_compares_gradients_when_given_a_loss():
    from yax_widget._payloads import comparison_state

    m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)])
    x = jax.random.normal(jax.random.key(1), (3, 5))
    p = m.init(jax.random.key(0), x)

    def loss(out):
        return (out ** 2).sum()

    ex = Explorer(m, p, x, grad_of=loss)
    ex.substitute("//activation[@name='relu']", "GELU (tanh)")
    g = ex.comparison.gradients
    assert g == yax.compare(ex.original, ex.mox, p, x, grad_of=loss).gradients
    assert not g["['params']['layers_0']['kernel']"].allclose and not ex.comparison.allclose
    rows = comparison_state(ex.comparison, ex.mox, 1.0)["gradients"]
    assert len(rows) == 4 and rows[0]["rel"] >= rows[-1]["rel"]
    with pytest.raises(yax.errors.LossNotAFunction) as e:
        Explorer(m, p, x, grad_of="loss")
    assert (e.value.tool, e.value.found) == ("Explorer", "str")
