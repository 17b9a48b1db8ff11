"""Requests from the front-end and their replies: query, fits, graph, expand;
malformed and hostile messages get one error reply and change nothing."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yax
from yax.internal import view
from yax_widget._payloads import EQUATION_NAMES

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
    assert "GELU (tanh)" in fits["fits"] and "identity" in fits["fits"] and "half" not in fits["fits"]
    assert "f32[2,8,16] but the node's is f32[2,8,32]" in fits["refused"]["half"]
    dense = yax.query('//module_call[@name="Dense_0"]', ex.mox)[0]  # 32 -> 64: no activation fits, LoRA does
    # (and the precision policy: a Dense computes in bfloat16 under it)
    assert ask(ex, rid=1, type="fits", id=view(ex.mox).ids[id(dense)])["fits"] == ["LoRA r=4", "bfloat16 compute"]
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
    assert reply["type"] == "error" and "no state to compare with named 'last' (known: 'original', 'previous')" in reply["message"]


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
    expand = ask(ex, rid=3, type="expand", id=view(ex.mox).ids[id(ln)])
    assert expand["columns"] == list(EQUATION_NAMES)  # the positions of the rows' columns, by name
    rows = [dict(zip(expand["columns"], r, strict=True)) for r in expand["rows"]]
    assert [r["primitive"] for r in rows] == [e.name for e in ln.equations]
    assert all(view(ex.mox).nodes[r["id"]] is e for r, e in zip(rows, ln.equations))
    # "expand all": every call's equations in one reply, each as `expand` gives them
    calls = [view(ex.mox).ids[id(c)] for c in ex.mox.modules() if c.equations][:5]
    several = ask(ex, rid=4, type="equations", ids=calls)
    assert several["columns"] == list(EQUATION_NAMES)
    assert several["calls"] == [[i, ask(ex, rid=5, type="expand", id=i)["rows"]] for i in calls]
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
    {"rid": 1, "type": "substitute", "target": 5, "name": ["GELU (tanh)"]},
    {"rid": 1, "type": "substitute", "target": "//*", "name": "GELU (tanh)"},
    {"rid": 1, "type": "substitute", "target": 0, "name": "GELU (tanh)"},
    {"rid": 1, "type": "substitute", "target": None, "name": "GELU (tanh)"},
    {"rid": 1, "type": "substitute", "target": "query", "name": "GELU (tanh)"},
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
    st.sampled_from(["rid", "type", "id", "xpath", "target", "name", "depth", "ids", "open", "fold", "index",
                     "base"]),
    st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.text(max_size=30),
              st.sampled_from(["query", "expand", "fits", "undo", "redo", "code", "graph", "GELU (tanh)",
                               "equations", "goto", "source", "compare_base", 10**30, -(2**63)]),
              st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)),
))
@pytest.mark.slow
def test_random_messages_always_get_one_reply(model, content):
    ex = _FUZZ.setdefault("ex", explorer(model))
    n = len(ex.sent)
    ex._on_msg(ex, content, [])
    assert len(ex.sent) == n + 1 and ex.sent[-1]["type"] in ("ok", "error")
    assert "failed with" not in ex.sent[-1].get("message", "")  # refused with a sentence, never a bug's report
    assert ex.mox is ex.original or ex.history  # changes only through a valid substitute


_FUZZ: dict = {}


_HOSTILE_VALUES = st.one_of(
    st.none(), st.booleans(), st.text(max_size=12), st.sampled_from([10**30, -(10**30), 2**63, 2**31, -1, 1.5]),
    st.lists(st.one_of(st.integers(), st.text(max_size=3), st.none()), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers() | st.text(max_size=3), max_size=2),
    st.sampled_from([[[]], [{}], {"expanded": {}}, {"tab": ["Values"]}, {"depth": 10**30}, {"selected": [1]},
                     {"filter": {}}, {"scroll": "top"}, {"only": None}]))


@st.composite
def _hostile_requests(draw):
    """A request of every kind that has fields, each field left out or replaced by a list, a dict,
    None, a huge number or a string (or, for a snapshot's ``view``, a view with such fields)."""
    import dataclasses

    from yax_widget._protocol import REQUESTS

    kind = draw(st.sampled_from(sorted(k for k, r in REQUESTS.items() if dataclasses.fields(r))))
    fields = [f.name for f in dataclasses.fields(REQUESTS[kind])]
    content = {"rid": 1, "type": kind}
    for name in fields:
        if draw(st.booleans()):
            content[name] = draw(_HOSTILE_VALUES)
    return content


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_hostile_requests())
def test_fields_of_the_wrong_type_are_refused_with_a_sentence(tmp_path, monkeypatch, content):
    """Every field of every request kind, given a list, a dict, None, a huge number or a string
    where it expects something else, is refused with a sentence (a `RequestError` or the session's
    own refusal), never answered with "the request failed with TypeError…" (a bug in yax)."""
    from yax_widget._protocol import answer

    monkeypatch.chdir(tmp_path)  # a valid snapshot writes here
    s = _FIELDS.get(tmp_path)
    if s is None:
        _FIELDS.clear()
        s = _FIELDS[tmp_path] = _small_session()
    reply = answer(s, copy.deepcopy(content))
    assert reply["type"] in ("ok", "error") and reply["rid"] == 1
    if reply["type"] == "error":
        assert "failed with" not in reply["message"] and "bug" not in reply["message"], (content, reply)
        assert reply["message"].rstrip().endswith((".", ")", "`")), (content, reply)


_FIELDS: dict = {}


def _small_session():
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from yax_widget import Session

    m = nn.Sequential([nn.Dense(8), nn.gelu, nn.Dense(2)])
    x = jnp.linspace(-1, 1, 12).reshape(3, 4)
    return Session(m, m.init(jax.random.key(0), x), x)


def test_an_equations_request_answers_each_call_once(model):
    """Repeated ids are answered once (100,000 of one id cost 27 s, 545 MB and a 140 MB reply)."""
    import time

    ex = explorer(model)
    calls = [view(ex.mox).ids[id(c)] for c in ex.mox.modules() if c.equations][:3]
    t = time.perf_counter()
    reply = ask(ex, rid=1, type="equations", ids=[calls[1], *calls, *calls * 33_000])
    assert reply["type"] == "ok" and [i for i, _ in reply["calls"]] == [calls[1], calls[0], calls[2]]
    assert time.perf_counter() - t < 5
    assert reply["calls"][0] == [calls[1], ask(ex, rid=2, type="expand", id=calls[1])["rows"]]
    # so are a graph's boxes to open and a snapshot's open rows
    assert ask(ex, rid=3, type="graph", id=None, depth=1, open=[calls[0]] * 1000)["dot"] == ask(
        ex, rid=4, type="graph", id=None, depth=1, open=[calls[0]])["dot"]
    from yax_widget._snapshot import View

    v = View.parse({"expanded": [calls[2], calls[0], calls[2]] * 1000, "equations": [calls[1]] * 1000})
    assert v.expanded == (calls[2], calls[0]) and v.equations == (calls[1],)
