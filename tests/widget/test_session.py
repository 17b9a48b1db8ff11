"""The explorer's session without a widget: its commands, its state, and the
promises it keeps to a front-end that sends anything (closed sessions refuse,
refused requests change nothing, exports never replace a file unasked)."""

from __future__ import annotations

import ast
import copy
import os
import subprocess
import sys
import threading
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import yax
from yax.internal import misfit, node_ids
from yax_widget import Session
from yax_widget._palette import PartialFit
from yax_widget._protocol import REQUESTS, answer
from yax_widget._session import INITIAL_STATE, SessionClosed

X = jnp.linspace(-1, 1, 12).reshape(3, 4)


def mlp() -> tuple[nn.Module, dict]:
    m = nn.Sequential([nn.Dense(8), nn.gelu, nn.Dense(2)])
    return m, m.init(jax.random.key(0), X)


def session(**kw) -> Session:
    m, v = mlp()
    return Session(m, v, X, **kw)


def ask(s: Session, **content) -> dict:
    return answer(s, {"rid": 1, **content})


def frozen(s: Session):
    """What a refused request must leave as it was: the state and the model."""
    return copy.deepcopy(s.state), s.mox, s.params, s.index, len(s.states), s.selection


def test_the_session_runs_without_any_widget_library():
    code = (
        "import sys\n"
        "for m in ('anywidget', 'ipywidgets', 'traitlets', 'IPython', 'comm'): sys.modules[m] = None\n"
        "import jax, jax.numpy as jnp, flax.linen as nn\n"
        "from yax_widget import Session\n"
        "m = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)]); x = jnp.ones((1, 3))\n"
        "s = Session(m, m.init(jax.random.key(0), x), x)\n"
        "print(s.substitute('//activation', 'GELU (tanh)'), s.comparison.first_divergence, s.state['history']['index'])\n"
        "s.close()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["replaced", "1", "node(s)", "selected", "by", "//activation", "with", "GELU", "(tanh)",
                                  "Sequential/relu", "1"]


def test_on_change_is_told_every_change_of_the_state():
    mirror = copy.deepcopy(INITIAL_STATE)  # what the state starts as; every change after is told
    s = session(on_change=mirror.update)
    assert mirror == s.state
    s.query('//module_call[@type="Dense"]')
    s.substitute("//activation", "ReLU")
    s.inspector.paint("norm")
    s.inspector.show(s.node(s.state["matches"][0]))
    s.undo()
    s.use_batch("example")
    assert mirror == s.state
    assert len(s.state["matches"]) == 2 and s.state["values"]["id"] == s.state["matches"][0]
    assert s.state["history"] == {"items": ["replaced 1 node(s) selected by //activation with ReLU"], "index": 0}
    s.close()


def test_a_closed_session_refuses_every_command_and_starts_no_thread():
    s = session()
    s.substitute("//activation", "ReLU")
    s.close()
    before = {t for t in threading.enumerate() if t.name.startswith("yax-explorer")}
    state = frozen(s)
    replies = {
        "query": ask(s, type="query", xpath="//*"),
        "undo": ask(s, type="undo"), "redo": ask(s, type="redo"), "goto": ask(s, type="goto", index=0),
        "substitute": ask(s, type="substitute", target=1, name="ReLU"),
        "fits": ask(s, type="fits", id=1), "compare_base": ask(s, type="compare_base", base="previous"),
        "export": ask(s, type="export"), "snapshot": ask(s, type="snapshot"), "values": ask(s, type="values", id=1),
        "overlay": ask(s, type="overlay", stat="norm"), "batch": ask(s, type="batch", name="example"),
        "nonfinite": ask(s, type="nonfinite")}
    assert set(replies) | {"code", "expand", "equations", "graph", "source", "details"} == set(REQUESTS)
    for kind, reply in replies.items():
        assert reply["type"] == "error" and "closed" in reply["message"], (kind, reply)
    # reading what was done still answers
    assert ask(s, type="code")["type"] == "ok" and "yax.sub" in ask(s, type="code")["code"]
    assert ask(s, type="graph", depth=1)["type"] == "ok"
    assert ask(s, type="equations", ids=[1])["type"] == "ok"
    assert ask(s, type="source", id=1)["type"] == "ok"
    assert ask(s, type="details", provider="Cost", id=1)["type"] == "ok"
    for call in (lambda: s.undo(), lambda: s.query("//*"), lambda: s.substitute("//activation", "GELU (tanh)"),
                 lambda: s.use_batch("example"), lambda: s.values("//activation"), lambda: s.export("x"),
                 lambda: s.add_replacement("x", jax.nn.relu), lambda: s.compare_with("previous")):
        with pytest.raises(SessionClosed):
            call()
    time.sleep(0.1)
    assert {t for t in threading.enumerate() if t.name.startswith("yax-explorer")} <= before
    assert s.worker.pool is None and frozen(s)[1:] == state[1:] and s.state == state[0]
    assert s.history[0].description.startswith("replaced")  # the history stays readable


BAD = [
    {"type": "query"}, {"type": "query", "xpath": 3}, {"type": "query", "xpath": "//*["},
    {"type": "query", "xpath": "//*", "extra": 1}, {"type": "query", "xpath": "x" * 5000},
    {"type": "substitute", "target": 10**6, "name": "ReLU"}, {"type": "substitute", "target": 1, "name": "nope"},
    {"type": "substitute", "target": "query", "name": "ReLU"},  # no query ran
    {"type": "substitute", "target": 1.5, "name": "ReLU"}, {"type": "substitute", "target": True, "name": "ReLU"},
    {"type": "goto", "index": 7}, {"type": "goto", "index": "1"}, {"type": "compare_base", "base": "x"},
    {"type": "overlay", "stat": "max"}, {"type": "batch", "name": "nope"}, {"type": "values", "id": -1},
    {"type": "fits", "id": None}, {"type": "graph", "depth": 9}, {"type": "expand", "id": 0},
    {"type": "export", "stem": "/tmp/elsewhere"}, {"type": "nope"}, {"type": "undo", "index": 0},
    # the offer of a drop that fits some matches: ids of the query's matches only, with the query box
    {"type": "substitute", "target": 1, "name": "ReLU", "ids": [1]},
    {"type": "substitute", "target": "query", "name": "ReLU", "xpath": '//module_call[@type="Dense"]', "ids": []},
    {"type": "substitute", "target": "query", "name": "ReLU", "xpath": '//module_call[@type="Dense"]', "ids": [0]},
    {"type": "substitute", "target": "query", "name": "ReLU", "xpath": '//module_call[@type="Dense"]', "ids": "1"},
    {"type": "substitute", "target": "query", "name": "ReLU", "xpath": '//module_call[@type="Dense"]', "ids": [1, 1]},
]


@pytest.mark.parametrize("content", BAD, ids=lambda c: f"{c.get('type')}-{'-'.join(map(str, c))}"[:60])
def test_a_refused_request_changes_nothing(content):
    s = session()
    s.substitute("//activation", "ReLU")
    s.query('//module_call[@type="Dense"]')
    before = frozen(s)
    reply = ask(s, **content)
    assert reply["type"] == "error" and reply["rid"] == 1 and (reply["message"][0].isupper() or reply["message"][0] == "`"), reply
    assert reply["message"].rstrip().endswith((".", ")", "`")), reply["message"]
    after = frozen(s)
    assert after[0] == before[0] and after[1:] == before[1:]
    s.close()


def test_a_query_giving_a_number_is_refused_as_a_drop_target_with_a_sentence():
    s = session()
    with pytest.raises(yax.errors.NotNodes) as e:
        s.substitute("count(//*)", "ReLU")
    assert (e.value.xpath, e.value.found, e.value.tool) == ("count(//*)", 19.0, "the ReLU replacement")
    s.query("count(//*)")
    assert s.state["query_result"]["kind"] == "value"
    before = frozen(s)
    reply = ask(s, type="substitute", target="query", name="ReLU", xpath="count(//*)")
    assert reply["type"] == "error" and "gives the float 19.0, not nodes, so the ReLU replacement has nothing" in reply["message"]
    assert frozen(s)[1:] == before[1:]


def test_a_drop_on_a_query_box_showing_another_query_is_refused():
    s = session()
    s.query("//activation")
    reply = ask(s, type="substitute", target="query", name="ReLU", xpath="//activation[")
    assert reply["type"] == "error" and "did not run" in reply["message"] and not s.history
    reply = ask(s, type="substitute", target="query", name="ReLU", xpath="//activation")
    assert reply["type"] == "ok" and len(s.history) == 1


def test_a_drop_on_the_query_box_fitting_some_matches_offers_to_replace_just_those():
    from models import case_cnn_eval  # a BatchNorm, which linen LoRA refuses, and a Dense, which it adapts

    f, args, kw = case_cnn_eval()
    s = Session(f, *args, **kw)
    q = '//module_call[@type="Dense" or @type="BatchNorm"]'
    s.query(q)
    conv, dense = yax.query(q, s.mox)
    ids = node_ids(s.mox)
    before = frozen(s)
    reply = ask(s, type="substitute", target="query", name="LoRA r=4", xpath=q)
    assert reply["type"] == "error" and (reply["fits"], reply["matches"]) == ([ids[id(dense)]], 2)
    assert reply["message"].startswith(
        f"LoRA r=4 fits 1 of the 2 matches of `{q}`. The `BatchNorm` at `CNN/BatchNorm_0` is refused: `yax.LoRA` "
        "adapts a layer linear in one weight, but the module_call `BatchNorm_0` at `CNN/BatchNorm_0` has no weight "
        "of two or more axes (only `bias`, `scale`)."), reply["message"]
    assert reply["message"].endswith("Replace just the 1 that fits (the explorer offers it with a button; in Python, "
                                     "`explorer.substitute(error.fitting, 'LoRA r=4')`), or narrow the query. "
                                     "Nothing was changed.")
    assert reply["message"].count("Nothing was changed.") == 1
    after = frozen(s)
    assert after[0] == before[0] and after[1:] == before[1:]
    with pytest.raises(PartialFit) as e:  # the same from Python
        s.substitute(q, "LoRA r=4")
    assert e.value.fitting == [dense] and str(e.value) == reply["message"]
    # an offer naming a match that does not fit is checked again and refused with the menu's reason
    forged = ask(s, type="substitute", target="query", name="LoRA r=4", xpath=q, ids=[ids[id(conv)]])
    assert forged["type"] == "error" and forged["message"] == (  # the menu's reason, with its docs entry
        misfit(yax.LoRA(rank=4), conv, s.mox, params=s.params) + " (docs/errors.md#cannotadapt)")
    assert frozen(s)[1:] == before[1:]
    # the offer taken: one change, exactly `yax.sub` of the nodes that fit
    ok = ask(s, type="substitute", target="query", name="LoRA r=4", xpath=q, ids=reply["fits"])
    assert ok["type"] == "ok" and ok["description"] == "replaced CNN/Dense_0 with LoRA r=4" and len(s.history) == 1
    want, want_params = yax.sub([dense], yax.LoRA(rank=4), s.original, params=args[0],
                                key=jax.random.fold_in(jax.random.key(0), 1))
    assert str(s.mox) == str(want)
    assert jax.tree.structure(s.params) == jax.tree.structure(want_params)
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, s.params, want_params)))
    # the same computation, with an update that does something (`lora_b` starts at zero)
    bumped = jax.tree_util.tree_map_with_path(lambda p, x: x + 0.5 if "lora_b" in jax.tree_util.keystr(p) else x,
                                              want_params)
    got, ref = yax.eval_mox(s.mox, bumped, args[1], **kw), yax.eval_mox(want, bumped, args[1], **kw)
    np.testing.assert_array_equal(got, ref)
    assert not np.allclose(ref, f(*args, **kw))
    assert """yax.sub('//module_call[@path="CNN/Dense_0"]', yax.LoRA(), mox""" in s.code()  # replays that node
    s.close()


def test_a_list_of_nodes_is_replaced_in_one_change_that_names_exactly_them():
    s = session()
    d0, d1 = yax.query('//module_call[@type="Dense"]', s.mox)
    assert s.substitute([d0, d1], "LoRA r=4") == "replaced Sequential/layers_0 and Sequential/layers_2 with LoRA r=4"
    code = s.history[0].code
    pattern = ast.literal_eval(ast.parse(code).body[0].value.args[0])  # what "copy as code" replays
    assert " | " in pattern and yax.query(pattern, s.original) == [d0, d1]
    with pytest.raises(yax.errors.NotNodes) as e:
        s.substitute([], "ReLU")
    assert e.value.found == [] and isinstance(e.value, yax.YaxInputError)
    s.close()


def test_exports_never_replace_a_file_unasked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = session()
    s.substitute("//activation", "ReLU")
    first = ask(s, type="export")
    assert ask(s, type="export") == first  # pressed again, nothing changed: the files written, none written
    assert s.state["status"]["message"] == "already exported to yax_model_step1.jax_exported: nothing changed since"
    other = session()  # another explorer, whose step 1 has files of that name already
    other.substitute("//activation", "ReLU")
    second = ask(other, type="export")
    assert first["type"] == second["type"] == "ok"
    assert [os.path.basename(f) for f in first["files"]][0] == "yax_model_step1.jax_exported"
    assert [os.path.basename(f) for f in second["files"]][0] == "yax_model_step1_2.jax_exported"
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(f) for f in first["files"] + second["files"])
    assert other.state["status"]["message"].startswith("exported to yax_model_step1_2.jax_exported")
    other.close()
    readme = tmp_path / "yax_model_step1.README.md"
    text = readme.read_text()
    with pytest.raises(yax.YaxInputError, match=r"would replace .*yax_model_step1\.jax_exported.*overwrite=True"):
        s.export("yax_model_step1")
    assert readme.read_text() == text
    files = s.export("yax_model_step1", overwrite=True)
    assert len(files) == 4
    # nothing was written anywhere else
    assert len(os.listdir(tmp_path)) == 8


def test_a_failing_query_leaves_the_highlight_of_the_query_that_ran():
    s = session()
    s.query("//activation")
    before = frozen(s)
    with pytest.raises(yax.YaxQueryError):
        s.query("//activation[")
    assert frozen(s)[0] == before[0] and s.state["query"] == "//activation" and len(s.state["matches"]) == 1
    # an empty query clears the highlight
    assert s.query("") == [] and s.state["matches"] == [] and s.state["query"] == ""


def test_the_session_compares_and_shows_values_as_yax_does():
    s = session(batches={"twice": 2 * X})
    s.substitute("//activation", "ReLU")
    m, v = mlp()
    assert s.comparison.to_dict() == yax.compare(s.original, s.mox, v, X).to_dict()
    s.use_batch("twice")
    assert s.comparison.to_dict() == yax.compare(s.original, s.mox, v, 2 * X).to_dict()
    relu = yax.query("//activation", s.mox)[0]
    _, got = yax.capture(relu, s.mox, v, 2 * X)
    out = np.asarray(next(iter(got.values())))
    stats = s.values("//activation")["out"]
    assert stats.min == pytest.approx(out.min()) and stats.max == pytest.approx(out.max())
    s.close()


# -- batches re-added, compared with the previous state, interrupted (issue 37) -----------------

def _output(s: Session, xpath: str, *args) -> np.ndarray:
    """What ``xpath``'s one node of the current model gives on ``args``, captured without the session."""
    node = yax.query(xpath, s.mox)[0]
    _, got = yax.capture(node, s.mox, s.params, *args)
    return np.asarray(next(iter(got.values())))


def test_a_batch_added_again_under_its_name_is_measured_anew():
    s = session(batches={"b": 2 * X})
    s.substitute("//activation", "ReLU")
    rid = node_ids(s.mox)[id(yax.query("//activation", s.mox)[0])]
    s.use_batch("b")  # measured on 2 X: the comparison, the original's values, the row's values
    s.inspector.show(s.node(rid))
    s.inspector.paint("norm")
    s.use_batch("example")
    new = 5 * X + 1
    s.add_batch("b", new)
    s.use_batch("b")
    assert s.args[1] is new
    assert s.comparison.to_dict() == yax.compare(s.original, s.mox, s.params, new).to_dict()
    out = _output(s, "//activation", new)
    assert s.state["values"]["batch"] == "b"
    np.testing.assert_allclose(s.state["values"]["outputs"][0]["mean"], out.mean(), rtol=1e-5)
    np.testing.assert_allclose(s.state["overlay"]["values"][str(rid)], np.linalg.norm(out), rtol=1e-5)
    s.close()


def test_the_batch_in_use_added_again_is_shown_at_once():
    # found by the oracle (tests/oracle/test_session_walks.py): `add_batch("example", y)` on a fresh
    # session listed `y` as the example while the values and the comparison stayed on the old inputs
    s = session()
    s.substitute("//activation", "ReLU")
    rid = node_ids(s.mox)[id(yax.query("//activation", s.mox)[0])]
    s.inspector.show(s.node(rid))
    newer = -3 * X
    s.add_batch("example", newer)
    assert s.batch == "example" and s.batches == ["example"] and s.args[1] is newer
    assert s.comparison.to_dict() == yax.compare(s.original, s.mox, s.params, newer).to_dict()
    np.testing.assert_allclose(s.state["values"]["outputs"][0]["mean"], _output(s, "//activation", newer).mean(),
                               rtol=1e-5)
    s.close()


def test_compare_with_previous_measures_both_states_on_the_batch_in_use():
    s = session(batches={"b": 3 * X - 1})
    s.substitute("//activation", "ReLU")
    s.substitute("//activation", "tanh")
    s.compare_with("previous")  # the previous state measured on the example
    s.use_batch("b")
    before = s.states[1]
    want = yax.compare(before.mox, s.mox, before.params, 3 * X - 1, new_params=s.params)
    assert s.comparison.to_dict() == want.to_dict() and s.state["comparison"]["base"] == "previous"
    s.use_batch("example")
    s.compare_with("original")
    s.use_batch("b")
    s.compare_with("previous")  # the previous state's values on `b` were not measured yet
    assert s.comparison.to_dict() == want.to_dict()
    s.close()


class _Interrupt:
    """A stand-in for a function that raises KeyboardInterrupt on its ``n``-th call, then behaves."""

    def __init__(self, fn, n: int = 1):
        self.fn, self.n = fn, n

    def __call__(self, *a, **k):
        self.n -= 1
        if self.n == 0:
            raise KeyboardInterrupt
        return self.fn(*a, **k)


@pytest.mark.parametrize("where", ["measure", "comparison_state", "batch_changed"])
def test_an_interrupted_batch_switch_leaves_the_session_as_it_was(where, monkeypatch):
    from yax_widget import _payloads as payloads
    from yax_widget import _worker as worker_module

    s = session(batches={"b": 2 * X})
    s.substitute("//activation", "ReLU")
    rid = node_ids(s.mox)[id(yax.query("//activation", s.mox)[0])]
    s.inspector.show(s.node(rid))
    s.inspector.paint("norm")
    before = frozen(s), s.batch, s.args, s.comparison
    if where == "measure":
        monkeypatch.setattr(worker_module, "measure", _Interrupt(worker_module.measure))
    elif where == "comparison_state":
        monkeypatch.setattr(payloads, "comparison_state", _Interrupt(payloads.comparison_state))
    else:
        monkeypatch.setattr(s.inspector, "batch_changed", _Interrupt(s.inspector.batch_changed))
    with pytest.raises(KeyboardInterrupt):
        s.use_batch("b")
    assert (frozen(s), s.batch, s.args, s.comparison) == before and not s.state["status"]["busy"]
    monkeypatch.undo()
    s.use_batch("b")  # and it works next time
    assert s.comparison.to_dict() == yax.compare(s.original, s.mox, s.params, 2 * X).to_dict()
    np.testing.assert_allclose(s.state["values"]["outputs"][0]["mean"], _output(s, "//activation", 2 * X).mean(),
                               rtol=1e-5)
    s.close()


@pytest.mark.parametrize("where", ["measure", "comparison_state", "state"])
def test_an_interrupted_compare_with_leaves_the_session_as_it_was(where, monkeypatch):
    from yax_widget import _payloads as payloads
    from yax_widget import _worker as worker_module

    s = session()
    s.substitute("//activation", "ReLU")
    s.substitute("//activation", "tanh")
    before = frozen(s), s.comparison
    if where == "measure":
        monkeypatch.setattr(worker_module, "measure", _Interrupt(worker_module.measure))
    elif where == "comparison_state":
        monkeypatch.setattr(payloads, "comparison_state", _Interrupt(payloads.comparison_state))
    else:  # found by the oracle: interrupted after the base was set, before the comparison was shown
        monkeypatch.setattr(s, "_set", _Interrupt(s._set, 2))
    with pytest.raises(KeyboardInterrupt):
        s.compare_with("previous")
    assert (frozen(s), s.comparison) == before and s.state["compare_base"] == "original"
    assert not s.state["status"]["busy"]
    monkeypatch.undo()
    s.compare_with("previous")
    want = yax.compare(s.states[1].mox, s.mox, s.states[1].params, X, new_params=s.params)
    assert s.comparison.to_dict() == want.to_dict()
    s.close()


def test_an_interrupted_colouring_leaves_the_session_as_it_was(monkeypatch):
    s = session()
    s.substitute("//activation", "ReLU")
    rid = node_ids(s.mox)[id(yax.query("//activation", s.mox)[0])]
    s.inspector.show(s.node(rid))
    before = frozen(s), s.inspector.active
    # the gradient colouring shows the colours, then the selected row's values with their gradient
    monkeypatch.setattr(s, "show", _Interrupt(s.show, 2))
    with pytest.raises(KeyboardInterrupt):
        s.inspector.paint("grad", "sum")
    assert (frozen(s), s.inspector.active) == before and "grad" not in s.state["values"]
    monkeypatch.undo()
    s.inspector.paint("grad", "sum")
    assert s.state["overlay"]["stat"] == "grad" and "grad" in s.state["values"] and s.inspector.active is not None
    s.close()
