"""The explorer's colourings by the compiled program's cost (yax_widget/_costs.py) and the Cost
tab's compiled rows, on the plain `Session`: every row's number is `yax.cost`'s for the current
model, structure-only mode (abstract parameters) included; what is not known says why."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from cost_model import Net

import yax
from yax.internal import call_keys, node_ids
from yax_widget import Session
from yax_widget._protocol import answer


def _paint(s, stat):
    reply = answer(s, {"type": "overlay", "rid": 1, "stat": stat})
    assert reply["type"] == "ok", reply
    return s.state["overlay"]


def _by_row(mox, cost, q):
    ids = node_ids(mox)
    return {str(ids[id(n)]): cost.calls[k].total[q] for k, n in call_keys(mox).items()}


def _cost_rows(s, rid):
    reply = answer(s, {"type": "details", "rid": 2, "provider": "Cost", "id": rid})
    assert reply["type"] == "ok", reply
    return {r[0]: r[1:] for r in reply["rows"]}


def test_rows_coloured_by_compiled_flops_and_bytes_are_yax_cost():
    m, x = Net(), jnp.ones((2, 4))
    v = m.init(jax.random.key(0), x)
    s = Session(m, v, x, warm=False)
    try:
        layer = yax.query('//module_call[@path="Net/layers/Dense_0"]', s.mox)[0]
        rid = node_ids(s.mox)[id(layer)]
        assert _cost_rows(s, rid)["compiled (XLA)"][0] == "not compiled yet"  # nothing compiled unasked
        want = yax.cost(s.mox, v, x)
        o = _paint(s, "flops")
        assert o["values"] == _by_row(s.mox, want, "flops") and o["label"] == "FLOPs (compiled)"
        assert o["values"][str(rid)] == 3 * (2 * 2 * 6 * 6 + 2 * 6)  # 3 layers: product, bias
        assert o["lo"] == min(o["values"].values()) and o["per"].startswith("per run, per device")
        assert _paint(s, "bytes")["values"] == _by_row(s.mox, want, "bytes_accessed")
        comm = _paint(s, "comm")
        assert set(comm["values"].values()) == {0.0}  # one device: nothing to send
        rows = _cost_rows(s, rid)  # the Cost tab now has the compiled numbers
        assert rows["FLOPs (XLA)"][0] == f"{3 * (2 * 2 * 6 * 6 + 2 * 6):,}".replace(",", "_")
        eqs = sum(isinstance(n, yax.Equation) for n in layer.walk())
        assert rows["equations inside"][0] == str(eqs) and "traced in " in rows["equations inside"][1]
        # a substitution makes another model: its colouring is compiled again
        relu = yax.query('//activation[@name="relu"]', s.mox)[0]
        reply = answer(s, {"type": "substitute", "rid": 3, "target": node_ids(s.mox)[id(relu)], "name": "GELU (tanh)"})
        assert reply["type"] == "ok", reply
        o = _paint(s, "flops")
        assert o["values"] == _by_row(s.mox, yax.cost(s.mox, v, x), "flops")
    finally:
        s.close()


def test_structure_only_mode_is_coloured_by_cost_without_any_array():
    class Big(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(4096)(nn.Dense(4096)(x))

    m = Big()
    x = jax.ShapeDtypeStruct((8, 4096), jnp.float32)
    v = jax.eval_shape(m.init, jax.random.key(0), x)
    s = Session(m, v, x, warm=False)
    try:
        assert s.abstract
        o = _paint(s, "flops")
        ids = node_ids(s.mox)
        dense = yax.query('//module_call[@type="Dense"]', s.mox)
        assert [o["values"][str(ids[id(n)])] for n in dense] == [2 * 8 * 4096 * 4096 + 8 * 4096] * 2
        # the colourings by values still say plainly that they need arrays
        reply = answer(s, {"type": "overlay", "rid": 2, "stat": "norm"})
        assert reply["type"] == "error" and "concrete parameters" in reply["message"]
    finally:
        s.close()


def test_a_loop_without_a_known_trip_count_says_why():
    class Loop(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Dense(4)(x)
            n = jnp.sum(h > 0).astype(jnp.int32)
            return jax.lax.fori_loop(0, n, lambda i, c: jnp.tanh(c) @ jnp.ones((4, 4)), h)

    m, x = Loop(), jnp.ones((2, 4))
    s = Session(m, m.init(jax.random.key(0), x), x, warm=False)
    try:
        o = _paint(s, "flops")
        root = str(node_ids(s.mox)[id(s.mox.calls[0])])
        assert o["values"][root] is None and "trip count" in o["why"][root]
        rows = _cost_rows(s, int(root))
        assert rows["FLOPs (XLA)"][0] == "unknown" and "trip count" in rows["FLOPs (XLA)"][1]
    finally:
        s.close()


@pytest.mark.parametrize("stat", ["flops", "bytes", "comm"])
def test_the_colouring_request_takes_the_cost_stats(stat):
    from yax_widget._protocol import Overlay

    Overlay(stat).check()
