"""Requests from the front-end and their replies: query, fits, graph, expand;
malformed and hostile messages get one error reply and change nothing."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yax
from yax.internal import view

from .helpers import ask, explorer, snapshot


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
    # an invalid query reports its error in the reply and changes nothing: the query that ran stays, highlighted
    before = list(ex._matches)
    reply = ask(ex, rid=3, type="query", xpath="//[@")
    assert reply["type"] == "error" and "XPath" in reply["message"]
    assert ex._query_error == "" and ex._matches == before and ex._query == "//tanh"
    # a number is a count, not a highlight
    assert ask(ex, rid=4, type="query", xpath='count(//module_call[@type="Dense"])')["count"] == 12.0
    assert ex._query_error == "" and ex._matches == []
    # Python drives the UI the same way
    assert ex.query("//activation[@name='gelu']") == yax.query("//activation[@name='gelu']", ex.mox)
    assert len(ex._matches) == 2


def test_a_replacement_that_does_not_fit_is_refused_at_its_row(model):
    ex = explorer(model)
    ex.add_replacement("half", lambda x: x[..., : x.shape[-1] // 2])
    out = yax.query('//module_call[@name="out"]', ex.mox)[0]  # a Dense from 32 to 32 features
    i = view(ex.mox).ids[id(out)]
    fits = ask(ex, rid=1, type="fits", id=i)
    assert "GELU" in fits["fits"] and "identity" in fits["fits"] and "half" not in fits["fits"]
    assert "f32[2,8,16] but the node's is f32[2,8,32]" in fits["refused"]["half"]
    dense = yax.query('//module_call[@name="Dense_0"]', ex.mox)[0]  # 32 -> 64: no activation fits, LoRA does
    assert ask(ex, rid=1, type="fits", id=view(ex.mox).ids[id(dense)])["fits"] == ["LoRA r=4"]
    before = snapshot(ex)
    reply = ask(ex, rid=2, type="substitute", target=i, name="half")
    assert reply["type"] == "error" and "Nothing was changed" in reply["message"]
    # the front-end shows the reply's message at the row: no trait changes
    assert snapshot(ex) == before and ex.history == []


def test_goto_moves_to_a_state_of_the_history_and_keeps_the_later_ones(model):
    ex = explorer(model)
    ex.substitute("//activation[@name='gelu']", "ReLU")
    ex.substitute("//module_call[@type='Dropout']", "identity")
    states = [c.mox for c in ex.session.states]
    assert ask(ex, rid=1, type="goto", index=1)["type"] == "ok"
    assert ex.mox is states[1] and ex._history == {"items": ex._history["items"], "index": 1}
    assert len(yax.query("//activation[@name='relu']", ex.mox)) == 2
    assert ex.comparison is not None and not ex.comparison.allclose  # compared like an undo's state
    assert ask(ex, rid=2, type="goto", index=0)["type"] == "ok" and ex.mox is ex.original and ex.comparison is None
    assert ask(ex, rid=3, type="goto", index=2)["type"] == "ok" and ex.mox is states[2]
    before = snapshot(ex)
    for bad in (3, -1, True, "1", None):
        reply = ask(ex, rid=4, type="goto", index=bad)
        assert reply["type"] == "error" and "`index` must be a state of the history, 0 to 2" in reply["message"]
    assert snapshot(ex) == before


def test_compare_with_the_previous_step_shows_what_the_last_change_did(model):
    from .helpers import IDS

    ex = explorer(model)
    ex.substitute("//activation[@name='gelu']", "ReLU")
    ex.substitute("//activation[@name='relu']", "tanh")
    vs_original = ex.comparison
    assert ask(ex, rid=1, type="compare_base", base="previous")["type"] == "ok"
    assert ex._compare_base == "previous" and ex._comparison["base"] == "previous"
    prev, cur = ex.session.states[1], ex.session.states[2]
    want = yax.compare(prev.mox, cur.mox, prev.params, IDS, new_params=cur.params)
    got = ex.comparison
    assert [s.max_abs for s in got.outputs.values()] == [s.max_abs for s in want.outputs.values()]
    assert got.first_divergence == want.first_divergence and got.boundaries.keys() == want.boundaries.keys()
    assert [s.max_abs for s in got.outputs.values()] != [s.max_abs for s in vs_original.outputs.values()]
    # the first change's previous state is the original
    ex.undo()
    assert ex._comparison["base"] == "original" and not ex.comparison.allclose
    ex.redo()
    assert ex._comparison["base"] == "previous"
    assert ask(ex, rid=2, type="compare_base", base="original")["type"] == "ok"
    assert ex._comparison["base"] == "original" and ex.comparison.first_divergence == vs_original.first_divergence
    reply = ask(ex, rid=3, type="compare_base", base="last")
    assert reply["type"] == "error" and "`compare_with` takes \"original\", \"previous\"" in reply["message"]


def test_graph_and_expand(model):
    ex = explorer(model)
    block = yax.query('//module_call[@name="Block_1"]', ex.mox)[0]
    i = view(ex.mox).ids[id(block)]
    dot = ask(ex, rid=1, type="graph", id=i, depth=1)["dot"]
    assert dot == yax.to_dot(ex.mox, depth=1, root=block)
    assert ask(ex, rid=2, type="graph", id=None, depth=0)["dot"].startswith("digraph")
    # the pane's graph folds repeated layers unless asked not to, and opens the boxes it names
    assert ask(ex, rid=7, type="graph", id=None, depth=1)["dot"] == yax.to_dot(ex.mox, depth=1, fold=True)
    assert ask(ex, rid=8, type="graph", id=None, depth=1, fold=False)["dot"] == yax.to_dot(ex.mox, depth=1)
    opened = ask(ex, rid=9, type="graph", id=None, depth=1, open=[i])["dot"]
    assert opened == yax.to_dot(ex.mox, depth=1, fold=True, expand=[block])
    ln = yax.query('//module_call[@name="LayerNorm_0"]', ex.mox)[0]
    rows = ask(ex, rid=3, type="expand", id=view(ex.mox).ids[id(ln)])["rows"]
    assert [r[1] for r in rows] == [e.name for e in ln.equations]
    assert all(view(ex.mox).nodes[r[0]] is e for r, e in zip(rows, ln.equations))
    # "expand all": every call's equations in one reply, each as `expand` gives them
    calls = [view(ex.mox).ids[id(c)] for c in ex.mox.modules() if c.equations][:5]
    reply = ask(ex, rid=4, type="equations", ids=calls)["calls"]
    assert reply == [[i, ask(ex, rid=5, type="expand", id=i)["rows"]] for i in calls]
    assert ask(ex, rid=6, type="equations", ids=[])["calls"] == []


HOSTILE = [
    None, [], "query", 7, {}, {"type": "query"}, {"rid": "1", "type": "query", "xpath": "//*"},
    {"rid": True, "type": "undo"}, {"rid": 1}, {"rid": 1, "type": "__init__"}, {"rid": 1, "type": "_on_msg"},
    {"rid": 1, "type": "query", "xpath": 5}, {"rid": 1, "type": "query", "xpath": "/" * 5000},
    {"rid": 1, "type": "query", "xpath": "//*[re:test(@path, '(a+)+$')]"},
    {"rid": 1, "type": "expand", "id": -1}, {"rid": 1, "type": "expand", "id": 10**9},
    {"rid": 1, "type": "expand", "id": "0"}, {"rid": 1, "type": "expand", "id": 0},
    {"rid": 1, "type": "expand", "id": True}, {"rid": 1, "type": "fits", "id": 1.5},
    {"rid": 1, "type": "equations", "ids": 3}, {"rid": 1, "type": "equations", "ids": [1, -1]},
    {"rid": 1, "type": "equations", "ids": [True]}, {"rid": 1, "type": "equations", "ids": [0]},
    {"rid": 1, "type": "substitute", "target": 5, "name": "os.system"},
    {"rid": 1, "type": "substitute", "target": 5, "name": ["GELU"]},
    {"rid": 1, "type": "substitute", "target": "//*", "name": "GELU"},
    {"rid": 1, "type": "substitute", "target": 0, "name": "GELU"},
    {"rid": 1, "type": "substitute", "target": None, "name": "GELU"},
    {"rid": 1, "type": "substitute", "target": "query", "name": "GELU"},
    {"rid": 1, "type": "graph", "id": 0, "depth": 1}, {"rid": 1, "type": "graph", "id": None, "depth": 99},
    {"rid": 1, "type": "graph", "id": None, "depth": "1"},
    {"rid": 1, "type": "graph", "id": None, "depth": 1, "fold": "yes"},
    {"rid": 1, "type": "graph", "id": None, "depth": 1, "open": 3},
    {"rid": 1, "type": "graph", "id": None, "depth": 1, "open": [-1]},
    {"rid": 1, "type": "graph", "id": None, "depth": 1, "open": [0]},
    {"rid": 1, "type": "graph", "id": None, "depth": 1, "open": [True]},
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
