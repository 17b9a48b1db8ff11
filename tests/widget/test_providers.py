"""Row data providers (yax_widget/_providers.py): the Cost tab's numbers
against the same numbers written by hand from the model's own arrays and
shapes, the counts that cannot be known before running saying why, and a new
analysis added as a Python class only (a tab of its own, answered through the
``details`` request), on the plain `Session` (no widget)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cost_model import Net

import yax
from yax.internal import node_index
from yax_widget import Session
from yax_widget._protocol import answer
from yax_widget._providers import PROVIDERS, Details, RowData, register


@pytest.fixture(scope="module")
def session():
    m, x = Net(), jnp.ones((2, 4))
    s = Session(m, m.init(jax.random.key(0), x), x, warm=False)
    yield s
    s.close()


def _rows(s, node):
    reply = answer(s, {"type": "details", "rid": 1, "provider": "Cost", "id": node_index(s.mox).ids[id(node)]})
    assert reply["type"] == "ok", reply
    return {r[0]: r[1:] for r in reply["rows"]}, reply


def _nbytes(tree):
    return sum(np.asarray(a).nbytes for a in jax.tree_util.tree_leaves(tree))


def _size(tree):
    return sum(np.asarray(a).size for a in jax.tree_util.tree_leaves(tree))


def test_cost_of_a_layer_equals_the_count_by_hand(session):
    s, p = session, session.params["params"]
    inp = yax.query('//module_call[@path="Net/inp"]', s.mox)[0]
    rows, reply = _rows(s, inp)
    assert reply["heading"] == "module_call Net/inp" and reply["provider"] == "Cost"
    assert rows["FLOPs (matrix products, convolutions)"][0] == str(2 * 2 * 4 * 6)  # 2·m·n·k of x[2,4] @ W[4,6]
    assert rows["variables"] == [f"{_size(p['inp'])} elements", f"{_nbytes(p['inp'])} bytes (params)"]
    assert rows["outputs"][0] == f"{2 * 6 * 4} bytes"
    assert "runs" not in rows  # runs once
    dot = next(e for e in inp.walk() if isinstance(e, yax.Equation) and e.name == "dot_general")
    rows, _ = _rows(s, dot)
    assert rows["FLOPs (matrix products, convolutions)"] == [str(2 * 2 * 6 * 4), "2·2·6·4: one run"]


def test_a_scanned_layer_runs_once_a_step_and_holds_every_layer(session):
    s, p = session, session.params["params"]
    dense = yax.query('//module_call[@path="Net/layers/Dense_0"]', s.mox)[0]
    rows, _ = _rows(s, dense)
    assert rows["FLOPs (matrix products, convolutions)"][0] == str(2 * 2 * 6 * 6)
    assert rows["runs"][0] == "3"
    assert rows["FLOPs, every run"][0] == str(3 * 2 * 2 * 6 * 6)
    stacked = p["layers"]["Dense_0"]
    assert [a.shape[0] for a in jax.tree_util.tree_leaves(stacked)] == [3, 3]
    assert rows["variables"] == [f"{_size(stacked)} elements", f"{_nbytes(stacked)} bytes (params), 3 layers of a scanned stack"]


def test_what_is_known_only_when_it_runs_says_so(session):
    s = session
    top = yax.query('//module_call[@path="Net"]', s.mox)[0]
    rows, _ = _rows(s, top)
    assert rows["FLOPs (matrix products, convolutions)"][0] == "unknown"
    assert "`while` loop" in rows["FLOPs (matrix products, convolutions)"][1]
    assert rows["variables"][0] == f"{_size(s.params)} elements"  # the whole model's, counted once
    loop = next(e for e in s.mox.walk() if isinstance(e, yax.Equation) and e.name == "while")
    dot = next(e for _, body in loop.subs for e in body.walk() if isinstance(e, yax.Equation) and e.name == "dot_general")
    rows, _ = _rows(s, dot)
    assert rows["runs"][0] == "unknown" and "`while` loop" in rows["runs"][1]
    assert "FLOPs, every run" not in rows


def test_a_request_for_no_provider_or_no_node_is_refused(session):
    bad = answer(session, {"type": "details", "rid": 2, "provider": "Nope", "id": 0})
    assert bad["type"] == "error" and "`provider` must be one of 'Cost'" in bad["message"]
    bad = answer(session, {"type": "details", "rid": 3, "provider": "Cost", "id": 10**6})
    assert bad["type"] == "error"


def test_a_new_analysis_is_a_python_class_and_gets_a_tab():
    class Shapes(RowData):
        title = "Shapes"

        def details(self, mox, node, session=None):
            return Details(node.path, ["output", "shape"], [[f"{i}", str(v.shape)] for i, v in enumerate(node.outputs)])

    register(Shapes())
    try:
        m, x = Net(), jnp.ones((2, 4))
        s = Session(m, m.init(jax.random.key(0), x), x, warm=False)
        assert s.state["panes"] == ["Cost", "Shapes"]  # the front-end makes a tab of each
        node = yax.query('//module_call[@path="Net/inp"]', s.mox)[0]
        reply = answer(s, {"type": "details", "rid": 1, "provider": "Shapes", "id": node_index(s.mox).ids[id(node)]})
        assert reply["rows"] == [["0", "(2, 6)"]] and reply["columns"] == ["output", "shape"]
        s.close()
    finally:
        del PROVIDERS["Shapes"]
