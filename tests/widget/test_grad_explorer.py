"""Attribution in the explorer (issue 27): the tree coloured by the gradient of a
scalar of the output (its norm, or gradient × activation), the gradient beside the
values in the Values tab, and the first NaN or Inf of the backward pass.

Every number is checked against an independent computation: the same model
written by hand in JAX with a zero added at each row's output, differentiated
with `jax.grad` with respect to those zeros."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import yax
from yax.internal import capturable_calls, node_ids
from yax_widget import Explorer
from yax_widget._reduce import MAX_OUTPUTS
from yax_widget._snapshot import View, snapshot_data

from .helpers import ask, recording


class Head(nn.Module):
    """An integer output: no gradient."""

    @nn.compact
    def __call__(self, h):
        return jnp.argmax(h, axis=-1)


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(6, name="a")(x)
        h = nn.tanh(h)
        nn.Dense(3, name="unused")(x)  # the scalar does not depend on it
        Head(name="head")(h)
        return nn.Dense(5, name="b")(h)


X = jax.random.normal(jax.random.key(1), (2, 3, 4))


def _setup(**kw):
    m = Net()
    v = m.init(jax.random.key(0), X)
    return recording(Explorer(m, v, X, warm=False, **kw)), v


def _by_hand(v, x, scalar):
    """The model written out, with a zero added at each row's output: the gradients of ``scalar``
    with respect to those zeros, and the outputs themselves."""
    p = v["params"]

    def run(d):
        a = x @ p["a"]["kernel"] + p["a"]["bias"] + d["a"]
        t = jnp.tanh(a) + d["tanh"]
        b = t @ p["b"]["kernel"] + p["b"]["bias"] + d["b"]
        out = b + d["root"]
        return out, {"a": a, "t": t, "b": b, "root": out}

    zeros = {"a": jnp.zeros((2, 3, 6)), "tanh": jnp.zeros((2, 3, 6)), "b": jnp.zeros((2, 3, 5)),
             "root": jnp.zeros((2, 3, 5))}
    grads = jax.grad(lambda d: scalar(run(d)[0]))(zeros)
    _, acts = run(zeros)
    return grads, {"a": acts["a"], "tanh": acts["t"], "b": acts["b"], "root": acts["root"]}


def _rows(ex) -> dict[str, int]:
    ids = node_ids(ex.mox)
    return {c.path: ids[id(c)] for c in capturable_calls(ex.mox)}


def test_the_colouring_is_the_gradient_norm_and_gradient_times_activation_of_each_row():
    ex, v = _setup()
    rows = _rows(ex)
    assert [s["name"] for s in ex._scalars] == ["logit", "sum"]  # no `grad_of`: no loss offered
    assert ask(ex, rid=1, type="overlay", stat="grad", scalar="logit")["type"] == "ok"
    o = ex._overlay
    out = yax.eval_mox(ex.mox, v, X)
    k = int(jnp.argmax(out[0, -1]))
    assert o["scalar"]["chosen"] == k
    assert o["scalar"]["label"] == f"d out[0, -1, {k}] (argmax) / d output of each row, batch `example`"
    np.testing.assert_allclose(o["scalar"]["value"], float(out[0, -1, k]), rtol=1e-6)
    grads, acts = _by_hand(v, X, lambda y: y[0, -1, k])
    where = {"Net/a": "a", "Net/tanh": "tanh", "Net/b": "b", "Net": "root"}
    for path, name in where.items():
        np.testing.assert_allclose(o["values"][str(rows[path])], float(jnp.linalg.norm(grads[name])), rtol=1e-5,
                                   err_msg=path)
    # no colour where no gradient was computed, and the tooltip's reason
    assert o["values"][str(rows["Net/unused"])] is None
    assert "does not change with its outputs" in o["why"][str(rows["Net/unused"])]
    assert o["values"][str(rows["Net/head"])] is None
    assert o["why"][str(rows["Net/head"])] == "a i32[2,3] output has no gradient"

    # gradient × activation: sum(g * output) per row, signed, for another scalar (the sum)
    assert ask(ex, rid=2, type="overlay", stat="gxa", scalar="sum")["type"] == "ok"
    o = ex._overlay
    assert o["scalar"]["label"] == "d sum(out) / d output of each row, batch `example`"
    grads, acts = _by_hand(v, X, jnp.sum)
    for path, name in where.items():
        np.testing.assert_allclose(o["values"][str(rows[path])], float(jnp.sum(grads[name] * acts[name])),
                                   rtol=1e-4, atol=1e-6, err_msg=path)
    assert o["lo"] == min(x for x in o["values"].values() if x is not None)

    # a logit given by index
    assert ask(ex, rid=3, type="overlay", stat="grad", scalar="logit", index=2)["type"] == "ok"
    assert ex._overlay["scalar"]["label"].startswith("d out[0, -1, 2] / d output")
    grads, _ = _by_hand(v, X, lambda y: y[0, -1, 2])
    np.testing.assert_allclose(ex._overlay["values"][str(rows["Net/a"])], float(jnp.linalg.norm(grads["a"])),
                               rtol=1e-5)
    bad = ask(ex, rid=4, type="overlay", stat="grad", scalar="logit", index=5)
    assert bad["type"] == "error" and "out of range" in bad["message"] and "0 to 4" in bad["message"]


def test_the_values_tab_shows_the_gradient_of_the_scalar_beside_the_values():
    ex, v = _setup()
    rows = _rows(ex)
    ask(ex, rid=1, type="values", id=rows["Net/a"])
    assert "grad" not in ex._values  # no gradient colouring: values only
    ask(ex, rid=2, type="overlay", stat="grad", scalar="logit", index=1)
    g = ex._values["grad"]  # the row shown gets its gradient with the colouring
    assert g["what"] == "out[0, -1, 1]" and g["label"].startswith("d out[0, -1, 1] / d output")
    grads, _ = _by_hand(v, X, lambda y: y[0, -1, 1])
    want = np.asarray(grads["a"], np.float64)
    e = g["outputs"][0]
    for stat, ref in (("min", want.min()), ("max", want.max()), ("mean", want.mean()), ("std", want.std()),
                      ("norm", np.sqrt((want ** 2).sum()))):
        np.testing.assert_allclose(e[stat], ref, rtol=1e-5, atol=1e-7, err_msg=stat)
    assert (e["nan"], e["posinf"], e["neginf"], e["zeros"], e["size"]) == (0, 0, 0, int((want == 0).sum()), 36)
    assert sum(e["hist"]["counts"]) == 36
    # an integer output says it has no gradient
    ask(ex, rid=3, type="values", id=rows["Net/head"])
    assert ex._values["grad"]["outputs"] == [{"name": "out", "type": "i32[2,3]", "shape": [2, 3],
                                              "why": "a i32[2,3] output has no gradient"}]
    # an equation's row: its own capture with the gradient
    eq = next(n for n in yax.query("//module_call[@name='a']//dot_general", ex.mox))
    ask(ex, rid=4, type="values", id=node_ids(ex.mox)[id(eq)])
    np.testing.assert_allclose(ex._values["grad"]["outputs"][0]["norm"], np.sqrt((want ** 2).sum()), rtol=1e-5)
    # colouring by a forward statistic: the gradient goes
    ask(ex, rid=5, type="overlay", stat="norm")
    assert "grad" not in ex._values


def test_grad_of_is_offered_and_is_the_default_scalar():
    def loss(out):
        return jnp.mean(out ** 2)

    ex, v = _setup(grad_of=loss)
    rows = _rows(ex)
    assert [s["name"] for s in ex._scalars] == ["loss", "logit", "sum"]
    ask(ex, rid=1, type="overlay", stat="grad")
    o = ex._overlay
    assert o["scalar"]["name"] == "loss" and o["scalar"]["label"].startswith("d loss(output) / d output")
    grads, _ = _by_hand(v, X, loss)
    np.testing.assert_allclose(o["values"][str(rows["Net/tanh"])], float(jnp.linalg.norm(grads["tanh"])), rtol=1e-5)


def test_requests_naming_a_scalar_are_checked():
    ex, _ = _setup()
    for msg, says in (({"stat": "grad", "scalar": "loss"}, "without `grad_of`"),
                      ({"stat": "grad", "scalar": "mean"}, "`scalar` must be one of"),
                      ({"stat": "grad", "scalar": "sum", "index": 3}, "`index` must go with"),
                      ({"stat": "grad", "scalar": "logit", "index": -1}, "`index` must go with"),
                      ({"stat": "grad", "scalar": "logit", "index": True}, "`index` must go with")):
        reply = ask(ex, rid=1, type="overlay", **msg)
        assert reply["type"] == "error" and says in reply["message"], (msg, reply)
    assert ex._overlay == {}
    reply = ask(ex, rid=2, type="nonfinite", scalar="logit", index="1")
    assert reply["type"] == "error"


class Planted(nn.Module):
    """Finite forward, a NaN gradient: sqrt at 0."""

    @nn.compact
    def __call__(self, h):
        return jnp.sqrt(nn.relu(h))


class Sick(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(6, name="a")(x)
        h = Planted(name="planted")(h)
        return nn.Dense(5, name="b")(h)


def test_the_backward_nan_search_selects_the_row_whose_rule_gave_the_first_nan():
    m = Sick()
    v = m.init(jax.random.key(0), X)
    ex = recording(Explorer(m, v, X, warm=False))
    assert bool(jnp.isfinite(yax.eval_mox(ex.mox, v, X)).all())
    fwd = ask(ex, rid=1, type="nonfinite")
    assert fwd["found"] is False
    reply = ask(ex, rid=2, type="nonfinite", scalar="sum")
    assert reply["type"] == "ok" and reply["found"] is True, reply
    ids = node_ids(ex.mox)
    planted = next(c for c in capturable_calls(ex.mox) if c.path == "Sick/planted")
    found = yax.first_nonfinite(ex.mox, v, X, grad_of=lambda out: out.sum())
    assert found.equation.name == "sqrt" and found.call is planted
    assert reply["id"] == ids[id(planted)] and reply["eq"] == ids[id(found.equation)]
    # relu's rule drops sqrt's Inf: every gradient is finite, and the message says so first
    assert found.masked and reply["masked"] is True
    assert reply["message"].startswith("No non-finite gradient: every gradient is finite. A non-finite cotangent "
                                       "comes from the backward pass of `sqrt` in `Sick/planted`")
    assert "masked before it reaches the gradients: the backward pass of `custom_jvp_call` in " \
           "`Sick/planted/relu` (relu)" in reply["message"]
    assert reply["message"].endswith("(batch `example`, gradient of sum(out))")
    # the colouring of the same scalar says where NaN or Inf gradients were left out (relu's output: sqrt's
    # rule sent Inf where it is 0; relu's own rule sends 0 there, so `a`'s gradient is finite)
    ask(ex, rid=3, type="overlay", stat="grad", scalar="sum")
    relu = next(c for c in capturable_calls(ex.mox) if c.path == "Sick/planted/relu")
    assert "NaN or Inf in its gradient left out" in ex._overlay["why"][str(ids[id(relu)])]
    assert str(ids[id(next(c for c in capturable_calls(ex.mox) if c.path == "Sick/a"))]) not in ex._overlay["why"]
    # and how many, for the visible mark on the row: the count the tooltip gives, rows with none left out
    said = int(ex._overlay["why"][str(ids[id(relu)])].split(" NaN")[0].replace(",", ""))
    assert ex._overlay["nonfinite"][str(ids[id(relu)])] == said > 0
    assert all(n > 0 and "NaN or Inf" in ex._overlay["why"][r] for r, n in ex._overlay["nonfinite"].items())


class Trap(nn.Module):
    """The where trap: a NaN that reaches the gradient of ``scale`` (0, so ``h`` is 0 and log's rule gives 0/0)."""

    @nn.compact
    def __call__(self, h):
        h = jnp.tanh(h) ** 2 * self.param("scale", nn.initializers.zeros, ())
        return jnp.where(h > 0, jnp.log(h), 0.0)


class Trapped(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(5, name="b")(Trap(name="trap")(nn.Dense(6, name="a")(x)))


def test_the_backward_nan_search_names_the_rule_whose_nan_reaches_the_gradient():
    m = Trapped()
    v = m.init(jax.random.key(0), X)
    ex = recording(Explorer(m, v, X, warm=False))
    reply = ask(ex, rid=1, type="nonfinite", scalar="sum")
    assert reply["type"] == "ok" and reply["found"] is True and reply["masked"] is False, reply
    assert reply["message"].startswith("The first non-finite gradient comes from the backward pass of `log` in "
                                       "`Trapped/trap`")
    trap = next(c for c in capturable_calls(ex.mox) if c.path == "Trapped/trap")
    assert reply["id"] == node_ids(ex.mox)[id(trap)]


def test_a_finite_gradient_is_said_so():
    ex, _ = _setup()
    reply = ask(ex, rid=1, type="nonfinite", scalar="logit")
    assert reply["found"] is False
    assert reply["message"] == ("No NaN or Inf in the gradient: every gradient of out[0, -1, argmax] is finite on "
                                "the batch `example`.")


def test_the_snapshot_records_the_gradient_colouring_and_the_values_gradient():
    ex, _ = _setup()
    rows = _rows(ex)
    ask(ex, rid=1, type="overlay", stat="gxa", scalar="logit")
    data = snapshot_data(ex.session, View(selected=rows["Net/b"], tab="Values"))
    assert data["state"]["_overlay"]["stat"] == "gxa"
    assert data["state"]["_overlay"]["scalar"]["name"] == "logit"
    assert data["state"]["_values"]["grad"]["outputs"][0]["norm"] is not None
    assert [s["name"] for s in data["state"]["_scalars"]] == ["logit", "sum"]


@pytest.mark.parametrize("kind", ["logit", "sum"])
def test_a_pytree_output_takes_its_logits(kind):
    """Hugging Face outputs carry `.logits`; other pytrees: their first floating array."""
    from yax_widget._gradients import Scalar

    class Out:
        def __init__(self, logits):
            self.logits = logits

    x = jnp.arange(12.0).reshape(1, 3, 4)
    s = Scalar(kind)
    assert float(s(Out(x))) == (11.0 if kind == "logit" else float(x.sum()))
    assert float(s({"ids": jnp.arange(3), "y": x})) == float(s(Out(x)))
    with pytest.raises(yax.YaxInputError, match="no floating array"):
        s({"ids": jnp.arange(3)})


@pytest.mark.parametrize("name", ["gpt2-wrapper", "scanned-module"])
def test_the_gradient_colouring_of_third_party_models_is_capture_with_grad_of(name):
    """On models nobody here wrote (Hugging Face GPT-2 through its wrapper; the scanned, rematerialised
    Transformer, whose layers give their gradients per step), each row's gradient norm and
    gradient × activation are those of `yax.capture(..., grad_of=)` (itself checked against
    `jax.grad` on these models in tests/test_grad.py)."""
    from thirdparty import case

    c = case(name)
    mox = yax.make_mox(c.fn)(*c.args)
    ex = recording(Explorer(mox, *c.args, warm=False))
    assert ask(ex, rid=1, type="overlay", stat="grad", scalar="logit")["type"] == "ok"
    norms = ex._overlay
    assert ask(ex, rid=2, type="overlay", stat="gxa", scalar="logit")["type"] == "ok"
    gxa = ex._overlay
    out = yax.eval_mox(mox, *c.args)
    logits = getattr(out, "logits", out)
    k = int(jnp.argmax(logits[0, -1]))
    assert norms["scalar"]["chosen"] == k

    def scalar(o):
        return getattr(o, "logits", o)[0, -1, k]

    calls = capturable_calls(mox)
    _, values, grads = yax.capture(calls, mox, *c.args, grad_of=scalar)
    keys, ids = yax.internal.capture_keys(mox), node_ids(mox)
    checked = 0
    for call in calls:
        shown = list(zip(jax.tree_util.tree_leaves(grads[keys[id(call)]]),
                         jax.tree_util.tree_leaves(values[keys[id(call)]])))[:MAX_OUTPUTS]  # a row's outputs shown
        pairs = [(np.asarray(g, np.float64), np.asarray(x, np.float64)) for g, x in shown
                 if jnp.issubdtype(x.dtype, jnp.floating)]
        got = norms["values"][str(ids[id(call)])]
        if not pairs or not any(np.any(g) for g, _ in pairs):
            assert got is None, call.path  # no gradient: no number, the tooltip says why
            continue
        want = np.sqrt(sum((g ** 2).sum() for g, _ in pairs))
        assert got == pytest.approx(want, rel=1e-4), call.path
        assert gxa["values"][str(ids[id(call)])] == pytest.approx(sum((g * x).sum() for g, x in pairs),
                                                                  rel=1e-3, abs=1e-5), call.path
        checked += 1
    assert checked > 10
