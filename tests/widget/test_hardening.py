"""The explorer under hostile and unusual use: a failure while
showing a change leaves the explorer where the front-end was told it is, nothing
escapes the message handler, "copy as code" survives odd module and replacement
names, and a closed explorer lets go of its thread and its measured values."""

from __future__ import annotations

import logging
import threading
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yax
from yax_widget import Explorer, _payloads, _protocol

from .helpers import ask, explorer, snapshot


def _fail(*a, **k):
    raise RuntimeError("the payload builder broke")


def test_a_change_that_cannot_be_shown_is_rolled_back(model, monkeypatch):
    ex = explorer(model)
    ex.query("//activation")
    before = snapshot(ex), dict(ex._tree), dict(ex._history)
    monkeypatch.setattr(_payloads, "tree", _fail)
    reply = ask(ex, rid=1, type="substitute", target="query", name="ReLU")
    assert reply["type"] == "error" and "RuntimeError: the payload builder broke" in reply["message"]
    assert (snapshot(ex), ex._tree, ex._history) == before and ex.history == []
    monkeypatch.undo()
    assert ask(ex, rid=2, type="substitute", target="query", name="ReLU")["type"] == "ok"
    changed = snapshot(ex)
    assert ask(ex, rid=3, type="undo")["type"] == "ok" and ex.session.index == 0
    monkeypatch.setattr(_payloads, "tree", _fail)
    reply = ask(ex, rid=4, type="redo")  # the change cannot be shown: the explorer stays at the original
    assert reply["type"] == "error" and ex.session.index == 0 and ex._history["index"] == 0 and ex._tree["version"] == 0
    assert ex.mox is ex.original and ex.selection == yax.query("//activation", ex.original)
    monkeypatch.undo()
    assert ask(ex, rid=5, type="redo")["type"] == "ok" and snapshot(ex) == changed


def test_a_query_failing_while_a_change_is_shown_keeps_the_change(model, monkeypatch):
    ex = explorer(model)
    ex.query("//activation")
    real = yax.query

    def broken(xpath, mox, **kw):
        if mox is not ex.original:
            raise TypeError("a bug in a query")
        return real(xpath, mox, **kw)

    import yax_widget._explorer as explorer_module

    monkeypatch.setattr(explorer_module.yax, "query", broken)
    assert ask(ex, rid=1, type="substitute", target=yax.internal.view(ex.mox).ids[id(ex.selection[0])],
               name="ReLU")["type"] == "ok"
    assert len(ex.history) == 1 and ex._history["index"] == 1 and ex._tree["version"] == 1
    assert "TypeError: a bug in a query" in ex._query_error and ex._matches == []
    assert ask(ex, rid=2, type="undo")["type"] == "ok" and ex.session.index == 0 and ex._query_error == ""


def test_nothing_escapes_the_message_handler(model, monkeypatch, caplog):
    ex = explorer(model)

    def bug(self, session):
        raise KeyError("bug")

    monkeypatch.setattr(_protocol.Code, "run", bug)
    with caplog.at_level(logging.ERROR, logger="yax_widget"):
        ex._on_msg(ex, {"rid": 7, "type": "code"}, [])  # returns: ipykernel would print a traceback otherwise
    assert ex.sent[-1]["type"] == "error" and ex.sent[-1]["rid"] == 7 and "KeyError" in ex.sent[-1]["message"]
    assert "request 'code' failed" in caplog.text and "KeyError: 'bug'" in caplog.text


class Quoted(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Dense(3, name="a/b")(x)
        return nn.gelu(nn.Dense(3, name="q\"x'y")(x))


def test_copy_as_code_survives_quotes_in_paths_and_odd_replacement_names():
    m, x = Quoted(), jnp.ones((1, 2))
    v = m.init(jax.random.key(0), x)
    ex = Explorer(m, v, x)
    quoted = next(n for n in ex.mox.modules() if "'" in n.path)
    names = ["class", "exec", "jax", "1st", "my relu", "my-relu", "ReLU!", "½"]
    for name in names:
        ex.add_replacement(name, lambda x: jnp.maximum(x, 0))
    assert len({ex.session.items[n].ident for n in names}) == len(names)
    for name in ["class", "exec", "1st", "my relu", "my-relu", "½"]:
        ex.substitute(quoted if name == "class" else "//activation", name)
        ex.undo()
    ex.substitute(quoted, "exec")
    ex.substitute("//activation", "my-relu")
    code = ex.code()
    assert "[@path=concat(" in code and "exec_, mox" in code and "my_relu_2, mox" in code
    ns = {"model": m, "variables": v, "batch": x}  # the names the script makes `mox` and `params` from
    for name in names:
        ident = ex.session.items[name].ident
        assert ident.isidentifier() and ident not in ("class", "exec", "jax") and not hasattr(__builtins__, ident)
        ns[ident] = lambda x: jnp.maximum(x, 0)
    exec(compile(code, "<copy as code>", "exec"), ns)
    assert str(ns["mox"]) == str(ex.mox)


def test_a_node_of_another_model_is_refused_by_name(model):
    ex = explorer(model)
    ex.substitute("//module_call[@type='Dropout']", "identity")
    stale = yax.query("//module_call[@type='Dropout']", ex.original)[0]  # replaced: not in the current model
    with pytest.raises(yax.YaxInputError, match="Dropout_0` is not a node of the explorer's current model"):
        ex.substitute(stale, "ReLU")
    with pytest.raises(yax.YaxInputError, match="got a `int`"):
        ex.substitute(3, "ReLU")


def _workers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("yax-explorer")}


def test_closed_explorers_stop_their_thread_and_drop_their_values(model):
    before = _workers()
    opened = []
    for _ in range(3):
        ex = explorer(model)
        ex.substitute("//activation[@name='gelu']", "ReLU")  # compares: the worker runs
        assert ex.session._reference is not None
        opened.append(ex)
    assert len(_workers() - before) == 3
    for ex in opened:
        ex.close()
        assert ex.session._reference is None and ex.session._pool is None
        assert ex.history and ex.mox is not ex.original  # what was done stays readable
    deadline = time.monotonic() + 30
    while _workers() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _workers() - before


HOSTILE_XPATHS = [
    "//comment()", "//self::node()", "re:match(//@path, '(\\w+)')", 're:test(@path, "(")', "re:replace()",
    "//*[", "\x00", '//*[@name="' + "'" * 3 + '"]', "/" * 3999, "count(//*)", "string(//@path)",
    're:test("' + "a" * 40 + '!", "^(a|aa)+$")',
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(
    st.builds(lambda q: {"type": "query", "xpath": q}, st.sampled_from(HOSTILE_XPATHS) | st.text(max_size=20)),
    st.sampled_from([{"type": "undo"}, {"type": "redo"}, {"type": "code"},
                     {"type": "substitute", "target": "query", "name": "ReLU"},
                     {"type": "substitute", "target": "query", "name": "identity"}]),
), min_size=1, max_size=8))
def test_the_explorer_always_says_where_it_is(model, messages):
    """Whatever the front-end sends, it gets one reply per request, and after an error
    the explorer is where it was; the traits always show the current state."""
    ex = _EX.setdefault("ex", explorer(model))
    old_timeout = yax._xpath.TIMEOUT
    yax._xpath.TIMEOUT = 0.5  # the backtracking query is stopped quickly
    try:
        for i, msg in enumerate(messages):
            n, state = len(ex.sent), (ex.mox, ex.session.index, len(ex.session.states))
            ex._on_msg(ex, {"rid": i, **msg}, [])
            assert len(ex.sent) == n + 1
            reply = ex.sent[-1]
            assert reply["rid"] == i and reply["type"] in ("ok", "error")
            if reply["type"] == "error":
                assert (ex.mox, ex.session.index, len(ex.session.states)) == state
                assert reply["message"].endswith((".", ")")) and len(reply["message"]) < 2000
            assert ex._history["index"] == ex.session.index == ex._tree["version"]
            assert len(ex._history["items"]) == len(ex.session.states) - 1
    finally:
        yax._xpath.TIMEOUT = old_timeout


_EX: dict = {}


def test_the_explorer_opens_and_changes_a_model_thousands_of_calls_deep():
    from deep import nested_calls

    ex = Explorer(nested_calls(2100))  # no example inputs: nothing to compile
    ex.sent = []
    ex.send = lambda content, buffers=None: ex.sent.append(content)
    assert len(ex._tree["rows"]) == 2100 and ex._tree["rows"][-1][1] == ex._tree["rows"][-2][0]
    for i, msg in enumerate([{"type": "query", "xpath": "//sin"}, {"type": "expand", "id": 2100},
                             {"type": "fits", "id": 2101}, {"type": "graph", "id": None, "depth": 8},
                             {"type": "substitute", "target": "query", "name": "ReLU"}, {"type": "code"},
                             {"type": "undo"}, {"type": "redo"}]):
        assert ask(ex, rid=i, **msg)["type"] == "ok", ex.sent[-1]
    assert ex.history and yax.query("count(//sin)", ex.mox) == 0.0

