"""The explorer under hostile and unusual use: a failure while
showing a change leaves the explorer where the front-end was told it is, nothing
escapes the message handler, "copy as code" survives odd module and replacement
names, and a closed explorer lets go of its thread and its measured values. What one
request may cost is bounded (the files the buttons write), requests from several
threads run one at a time, and an explorer that fails to open leaves nothing behind."""

from __future__ import annotations

import gc
import itertools
import logging
import sys
import threading
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yax
from yax_widget import Explorer, Session, _payloads, _protocol
from yax_widget import _worker as worker_module
from yax_widget._protocol import answer

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
    with pytest.raises(yax.errors.NotInMox) as e:
        ex.substitute(stale, "ReLU")
    assert e.value.node is stale and e.value.tool == "Explorer" and "Dropout_0" in str(e.value)
    with pytest.raises(yax.errors.WrongType) as e:
        ex.substitute(3, "ReLU")
    assert e.value.found == "int"


def _workers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("yax-explorer")}


def test_closed_explorers_stop_their_thread_and_drop_their_values(model):
    before = _workers()
    opened = []
    for _ in range(3):
        ex = explorer(model)
        ex.substitute("//activation[@name='gelu']", "ReLU")  # compares: the worker runs
        assert ex.session.worker.reference is not None
        opened.append(ex)
    assert len(_workers() - before) == 3
    for ex in opened:
        ex.close()
        assert ex.session.worker.reference is None and ex.session.worker.pool is None
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
@pytest.mark.slow
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



# -- what one request may cost (issue 38, point 12) ---------------------------------------------------------------

def _small(**kw) -> Session:
    m = nn.Sequential([nn.Dense(8), nn.gelu, nn.Dense(2)])
    x = jnp.linspace(-1, 1, 12).reshape(3, 4)
    return Session(m, m.init(jax.random.key(0), x), x, **kw)


def test_the_buttons_write_a_file_once_per_state_and_at_most_max_writes(tmp_path, monkeypatch):
    """A repeated Save HTML or Export of what was written last answers with the file written
    (today 20 `snapshot` requests wrote 36 MiB), requests arriving together write one file, and one
    explorer's buttons write at most `MAX_WRITES` of each."""
    monkeypatch.chdir(tmp_path)
    s = _small()
    first = answer(s, {"rid": 0, "type": "snapshot"})
    assert first["type"] == "ok" and first["file"] == "Sequential_snapshot.html"
    for i in range(1, 6):
        assert answer(s, {"rid": i, "type": "snapshot"}) == {**first, "rid": i}
    assert "Sequential_snapshot.html" in s.state["status"]["message"] and "already" in s.state["status"]["message"]
    threads = [threading.Thread(target=answer, args=(s, {"rid": 9, "type": "snapshot", "view": {"scroll": 5}}))
               for _ in range(4)]  # arriving together: one is written, the others answered with it
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Sequential_snapshot.html", "Sequential_snapshot_2.html"]
    exported = answer(s, {"rid": 10, "type": "export"})
    assert exported["type"] == "ok" and answer(s, {"rid": 11, "type": "export"}) == {**exported, "rid": 11}
    assert len(list(tmp_path.iterdir())) == 2 + 4
    (tmp_path / "Sequential_snapshot.html").unlink()  # the file is gone: the same press writes it again
    assert answer(s, {"rid": 12, "type": "snapshot"})["file"] == "Sequential_snapshot.html"
    s.substitute("//activation", "ReLU")  # another model: written anew
    assert answer(s, {"rid": 13, "type": "snapshot"})["file"] == "Sequential_snapshot_3.html"
    assert answer(s, {"rid": 14, "type": "export"})["files"][0] == "yax_model_step1.jax_exported"
    monkeypatch.setattr(_protocol, "MAX_WRITES", 5)  # four written: the fifth is the last
    assert answer(s, {"rid": 15, "type": "snapshot", "view": {"scroll": 7}})["type"] == "ok"
    files = sorted(p.name for p in tmp_path.iterdir())
    refused = answer(s, {"rid": 16, "type": "snapshot", "view": {"scroll": 8}})
    assert refused["type"] == "error" and "5 snapshots" in refused["message"] and "save_html" in refused["message"]
    assert sorted(p.name for p in tmp_path.iterdir()) == files
    s.close()


# -- lifecycle (issue 38, point 14) ---------------------------------------------------------------------------------

def test_a_failed_explorer_leaves_no_widget_behind(monkeypatch):
    from ipywidgets.widgets import widget as registry

    unraisable: list = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    gc.collect()
    before = set(registry._instances)
    for _ in range(5):
        with pytest.raises(yax.errors.LossNotAFunction):
            Explorer(lambda x: x, jnp.ones(2), grad_of=3)
    gc.collect()
    assert set(registry._instances) - before == set()
    assert [f"{u.exc_type.__name__}: {u.exc_value}" for u in unraisable] == []


def test_close_lets_go_of_the_values_a_worker_measures_after_it(monkeypatch):
    started, release = threading.Event(), threading.Event()
    real = worker_module.measure

    def slow(*a, **k):
        started.set()
        release.wait(30)
        return real(*a, **k)

    monkeypatch.setattr(worker_module, "measure", slow)
    before = _workers()
    s = _small(warm=True)  # the worker measures the original at once
    assert started.wait(30)
    s.close()
    release.set()
    for t in _workers() - before:
        t.join(30)
    w = s.worker
    assert w.reference is None and w.refs == {} and w.current is None and w.base_values is None


def test_requests_on_one_session_run_one_at_a_time(monkeypatch):
    """A request arriving while another runs waits for it (a `values` request once raised `IndexError`
    in a storm of concurrent ones)."""
    s = _small()
    inside, release, order = threading.Event(), threading.Event(), []
    real_code, real_undo = _protocol.Code.run, _protocol.Undo.run

    def slow_code(self, session):
        order.append("code in")
        inside.set()
        release.wait(30)
        order.append("code out")
        return real_code(self, session)

    def undo(self, session):
        order.append("undo")
        return real_undo(self, session)

    monkeypatch.setattr(_protocol.Code, "run", slow_code)
    monkeypatch.setattr(_protocol.Undo, "run", undo)
    replies: list = []
    a = threading.Thread(target=lambda: replies.append(answer(s, {"rid": 1, "type": "code"})))
    b = threading.Thread(target=lambda: replies.append(answer(s, {"rid": 2, "type": "undo"})))
    a.start()
    assert inside.wait(30)
    b.start()
    time.sleep(0.3)
    assert order == ["code in"]  # the undo waits
    release.set()
    a.join(30)
    b.join(30)
    assert order == ["code in", "code out", "undo"] and [r["type"] for r in replies] == ["ok", "ok"]
    s.close()


def _storm(s: Session, requests: list[list[dict]], threads: bool) -> list[dict]:
    """Each list of ``requests`` sent in order, the lists from as many threads (or one after another)."""
    replies: list = [None] * sum(map(len, requests))
    rid = itertools.count()
    jobs = [[(next(rid), r) for r in rs] for rs in requests]

    def send(job):
        for i, r in job:
            reply = answer(s, {"rid": i, **r})
            reply.pop("seconds", None)
            replies[i] = reply

    if threads:
        ts = [threading.Thread(target=send, args=(job,)) for job in jobs]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
    else:
        for job in jobs:
            send(job)
    return replies


def test_requests_hammered_from_threads_answer_as_a_serial_run_does():
    """values, query and substitute requests from three threads at once: every reply and the state
    after them are those of the same requests sent one after another (the substitution puts GELU
    where GELU was, so that every order of them gives the same model, rows and values)."""
    def requests(s: Session) -> list[list[dict]]:
        ids = yax.internal.node_ids(s.mox)
        rows = [ids[id(n)] for n in s.mox.modules()]
        gelu = ids[id(yax.query("//activation", s.mox)[0])]
        s.add_replacement("gelu", jax.nn.gelu)  # what the node runs: every state is the same model
        return [[{"type": "values", "id": r} for r in rows * 4],
                [{"type": "query", "xpath": "//module_call"}, {"type": "query", "xpath": "//activation"}] * 6,
                [{"type": "substitute", "target": gelu, "name": "gelu"}] * 3]

    serial = _small()
    want = _storm(serial, requests(serial), threads=False)
    storm = _small()
    got = _storm(storm, requests(storm), threads=True)
    assert [r["type"] for r in want] == ["ok"] * len(want)
    assert got == want
    assert storm.state["history"] == serial.state["history"] and storm.mox.sig == serial.mox.sig
    for r in [yax.internal.node_ids(serial.mox)[id(n)] for n in serial.mox.modules()]:
        assert storm.inspector.row(storm.node(r))["outputs"] == serial.inspector.row(serial.node(r))["outputs"]
    serial.close()
    storm.close()


def test_the_nan_search_running_out_of_memory_says_what_to_try(monkeypatch):
    from yax._capture import nonfinite

    def exhausted(*a, **k):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4.00GiB.")

    monkeypatch.setattr(nonfinite, "model_jit", lambda fn, **kw: exhausted)  # the flagging program
    monkeypatch.setattr(nonfinite, "first_backward", exhausted)  # the backward pass's
    s = _small()
    args, kwargs = s.call_args()
    for grad_of in (None, lambda out: out.sum()):
        with pytest.raises(yax.errors.OutOfMemory) as e:
            yax.first_nonfinite(s.mox, *args, grad_of=grad_of, **kwargs)
        assert "fewer rows" in str(e.value) and "yax.capture" in str(e.value) and "4.00GiB" in str(e.value)
        assert isinstance(e.value.__cause__, jax.errors.JaxRuntimeError)
    reply = answer(s, {"rid": 1, "type": "nonfinite"})
    assert reply["type"] == "error" and "ran out of device memory" in reply["message"], reply
    assert "failed with" not in reply["message"]
    s.close()
