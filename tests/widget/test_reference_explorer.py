"""The explorer compares with a recorded run of another implementation (`yax.Reference`):
a PyTorch MLP holding the linen model's weights, recorded with forward hooks. With the
reference as the base, the original (and, after a change, the current model) are each
compared with it, one column each; refusals change nothing."""

from __future__ import annotations

import copy

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import yax
from yax_widget import Explorer, Session
from yax_widget._protocol import answer

X = jnp.linspace(-1, 1, 12).reshape(3, 4)
NAMES = {"0": "Sequential/layers_0", "1": "Sequential/gelu", "2": "Sequential/layers_2"}


def models():
    m = nn.Sequential([nn.Dense(8), nn.gelu, nn.Dense(2)])
    v = m.init(jax.random.key(0), X)
    pt = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(8, 2))
    with torch.no_grad():
        for i in (0, 2):
            p = v["params"][f"layers_{i}"]
            pt[i].weight.copy_(torch.tensor(np.asarray(p["kernel"]).T))
            pt[i].bias.copy_(torch.tensor(np.asarray(p["bias"])))
    return m, v, yax.Reference.from_torch(pt, torch.tensor(np.asarray(X)))


def test_a_session_compares_the_original_and_the_current_model_with_a_reference():
    m, v, ref = models()
    s = Session(m, v, X)
    assert s.add_reference(ref, "pytorch", names=NAMES) == "pytorch" and s.state["references"] == ["pytorch"]
    s.compare_with("pytorch")
    cs = s.comparisons
    assert cs.names == ("pytorch", "original") and cs.allclose and s.comparison is cs.against_first["original"]
    state = s.state["comparison"]
    assert state["base"] == "pytorch" and state["reference"] == "pytorch" and state["allclose"]
    assert [c["name"] for c in state["columns"]] == ["original"]
    assert state["matching"]["calls"] == 3 and state["matching"]["weights"] == 4 and state["matching"]["atol_scaled"]
    assert "(out, in) ↔ (in, out)" in " ".join(state["matching"]["layouts"])  # torch's Linear weight, transposed

    s.substitute('//activation[@name="gelu"]', "ReLU")
    cs = s.comparisons
    assert cs.names == ("pytorch", "original", "step 1")
    assert cs.first_divergence == {"original": None, "step 1": "Sequential/gelu"}
    cols = s.state["comparison"]["columns"]
    assert [(c["name"], c["current"]) for c in cols] == [("original", False), ("step 1", True)]
    assert cols[1]["first_divergence_id"] is not None and cols[0]["first_divergence_id"] is None
    # the same numbers as yax.compare_all by hand
    alone = yax.compare(ref, s.mox, *s.call_args()[0], names=NAMES)
    assert cs.against_first["step 1"].to_dict() == alone.to_dict()
    # more changes: the original and the last few states of the history, one column each
    for act in ("SiLU", "GELU (tanh)", "tanh", "identity", "ReLU"):
        s.substitute("//activation", act)
    assert s.comparisons.names == ("pytorch", "original", "step 3", "step 4", "step 5", "step 6")
    firsts = s.comparisons.first_divergence
    assert firsts["step 3"] is None and firsts["step 6"] == "Sequential/gelu"  # step 3 is GELU again (tanh in both)
    s.goto(1)
    s.undo()  # back at the original: compared with the reference still, one column
    assert s.comparisons.names == ("pytorch", "original") and s.state["comparison"]["allclose"]
    s.compare_with("original")
    assert s.comparisons is None and s.state["comparison"].get("columns") is None
    s.close()


def test_refusals_change_nothing():
    m, v, ref = models()
    s = Session(m, v, X)
    s.add_reference(ref, "pytorch", names=NAMES)
    before = copy.deepcopy(s.state)
    with pytest.raises(yax.errors.UnknownName) as e:
        s.compare_with("torch")
    assert (e.value.name, e.value.known) == ("torch", ["original", "previous", "pytorch"])
    with pytest.raises(yax.errors.WrongType) as e:
        s.add_reference({"0": np.ones(2)})
    assert (e.value.argument, e.value.found) == ("reference", "dict")
    with pytest.raises(yax.errors.CannotCompare) as e:
        s.add_reference(ref, "previous")
    assert (e.value.problem, e.value.found) == ("reserved name", "previous")
    reply = answer(s, {"rid": 1, "type": "compare_base", "base": "nope"})
    assert reply["type"] == "error" and "no state to compare with named 'nope'" in reply["message"]
    assert s.state == before
    assert answer(s, {"rid": 2, "type": "compare_base", "base": "pytorch"})["type"] == "ok"
    assert s.state["compare_base"] == "pytorch" and s.state["comparison"]["allclose"]
    s.close()


def test_an_explorer_with_abstract_parameters_says_it_cannot_compare_with_a_reference():
    m, v, ref = models()
    abstract = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), v)
    s = Session(m, abstract, X)
    s.add_reference(ref, "pytorch", names=NAMES)
    s.compare_with("pytorch")
    assert s.comparisons is None and "opened with abstract ones" in s.state["comparison"]["message"]
    s.close()


def test_the_explorer_widget_mirrors_the_references():
    m, v, ref = models()
    ex = Explorer(m, v, X)
    assert ex.add_reference(ref, names=NAMES) == "torch Sequential" and ex._references == ["torch Sequential"]
    ex.compare_with("torch Sequential")
    assert ex._compare_base == "torch Sequential" and ex._comparison["reference"] == "torch Sequential"
    ex.session.close()
