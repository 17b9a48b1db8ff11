"""The explorer's values: a row's statistics,
histogram and heatmap computed on the device; the tree painted by a
statistic; named batches that the values and the comparison use; the first
NaN. Every number is checked against numpy on the values `yax.capture`
gives (itself tested against Flax's own intermediates)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import ScannedTransformer

import yax
from yax.internal import capturable_calls, capture_keys, kept, node_ids
from yax_widget import Explorer
from yax_widget import _reduce as reduce_module

from .helpers import IDS, ask, explorer


def _numpy_stats(x: np.ndarray) -> dict:
    f = np.asarray(x, np.float64)
    fin = f[np.isfinite(f)]
    return {"min": fin.min(), "max": fin.max(), "mean": fin.mean(), "std": fin.std(), "norm": np.sqrt((fin ** 2).sum()),
            "zeros": int((f == 0).sum()), "nan": int(np.isnan(f).sum()), "finite": int(fin.size)}


def _check_entry(entry: dict, x: np.ndarray) -> None:
    want = _numpy_stats(x)
    for k in ("min", "max", "mean", "std", "norm"):
        np.testing.assert_allclose(entry[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert (entry["zeros"], entry["nan"], entry["finite"], entry["size"]) == (want["zeros"], want["nan"],
                                                                             want["finite"], x.size)
    counts = np.asarray(entry["hist"]["counts"])
    ref, _ = np.histogram(x[np.isfinite(x)], bins=len(counts), range=(entry["min"], entry["max"]))
    # the same bins as numpy's, but for values on a bin edge, rounded to the neighbouring bin
    assert counts.sum() == ref.sum() == want["finite"] and np.abs(counts - ref).sum() <= 4
    heat = entry["heat"]
    sl, k = (x, 0) if x.ndim == 2 else (x[None], 0) if x.ndim < 2 else (x.reshape(-1, *x.shape[-2:]), None)
    if k is None:  # the first 2-D slice holding a NaN or an Inf, else the first
        k = int(np.argmax(~np.isfinite(sl).reshape(len(sl), -1).all(axis=1)))
        sl = sl[k]
        assert heat["label"].endswith("[" + ", ".join(map(str, np.unravel_index(k, x.shape[:-2]))) + "]")
    sr, sc = heat["step"]
    np.testing.assert_array_equal(np.frombuffer(heat["values"], "<f4").reshape(heat["rows"], heat["cols"]),
                                  sl[::sr, ::sc].astype(np.float32))


def test_a_rows_values_are_its_captured_outputs_reduced_on_the_device(model):
    ex = explorer(model)
    m, v = model
    _, want = yax.capture(list(ex.mox.modules()), ex.mox, v, IDS)
    ids = node_ids(ex.mox)
    keys = capture_keys(ex.mox)
    rows = [n for n in ex.mox.modules()]
    before = (ex.mox, ex.params, ex.session.index, ex._query, list(ex._history["items"]))
    for node in rows[:12]:
        reply = ask(ex, rid=1, type="values", id=ids[id(node)])
        assert reply["type"] == "ok" and reply["id"] == ids[id(node)]
        shown = ex._values
        assert shown["id"] == ids[id(node)] and shown["key"] == keys[id(node)] and shown["batch"] == "example"
        leaves = jax.tree_util.tree_leaves(want[keys[id(node)]])
        assert [o["type"] for o in shown["outputs"]] == [yax.internal.type_str(x) for x in leaves]
        for entry, x in zip(shown["outputs"], leaves):
            _check_entry(entry, np.asarray(x))
            # heatmaps travel as bytes (binary buffers), never as JSON lists
            assert isinstance(entry["heat"]["values"], bytes)
    # looking changes nothing
    assert (ex.mox, ex.params, ex.session.index, ex._query, list(ex._history["items"])) == before


def test_rows_are_read_off_what_the_comparison_measured_and_selecting_again_is_served_from_the_cache(
        model, monkeypatch):
    ex = explorer(model)
    ids = node_ids(ex.mox)
    calls = list(ex.mox.modules())
    # the original's rows are read off its measurement (made once, when the explorer opens): no program
    ask(ex, rid=1, type="values", id=ids[id(calls[3])])
    assert kept(ex.mox, "widget.reduce") is None and ex.session.worker.reference is not None
    # a changed model's, off what its comparison measured: the model runs no second time
    ex.substitute('//activation[@name="gelu"]', "ReLU")
    monkeypatch.setattr(reduce_module.Boundaries, "run", lambda *a: pytest.fail("ran the model again"))
    calls = list(ex.mox.modules())
    ids = node_ids(ex.mox)
    for c in calls:
        ask(ex, rid=2, type="values", id=ids[id(c)])
    assert kept(ex.mox, "widget.reduce") is None
    # again: nothing runs on the device, the entry is the one kept
    shown = ex._values
    monkeypatch.setattr(reduce_module, "_summarize", lambda *a: pytest.fail("ran again"))
    ask(ex, rid=3, type="values", id=ids[id(calls[-1])])
    assert ex._values is shown
    # undone: the changed model's values are let go of, the original's read off its measurement again
    ex.undo()
    assert ex.session.worker.current is None
    ask(ex, rid=4, type="values", id=node_ids(ex.mox)[id(list(ex.mox.modules())[3])])


def test_equation_rows_and_their_values(model):
    ex = explorer(model)
    m, v = model
    eqn = next(n for n in ex.mox.walk() if isinstance(n, yax.Equation) and n.name == "dot_general")
    _, want = yax.capture(eqn, ex.mox, v, IDS)
    ask(ex, rid=1, type="values", id=node_ids(ex.mox)[id(eqn)])
    (entry,) = ex._values["outputs"]
    _check_entry(entry, np.asarray(next(iter(want.values()))))
    assert ex.values(eqn)["out"].min == pytest.approx(entry["min"])


def test_scanned_layers_give_values_stacked_over_the_steps():
    m = ScannedTransformer(num_layers=3)
    ids = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 64
    v = m.init(jax.random.key(0), ids)
    ex = Explorer(m, v, ids)
    layer = next(n for n in ex.mox.modules() if n.type == "DecoderLayer")
    stats = ex.session.inspector.row(layer)
    _, want = yax.capture(layer, ex.mox, v, ids)
    x = np.asarray(jax.tree_util.tree_leaves(want)[0])
    (entry, *_) = stats["outputs"]
    assert entry["steps"] == [3] and entry["shape"][0] == 3
    _check_entry(entry, x)


def test_colouring_paints_every_call_from_one_program(model):
    ex = explorer(model)
    m, v = model
    for changed in (False, True):  # the original: read off its measurement; a changed model: off its comparison's
        if changed:
            ex.substitute('//activation[@name="gelu"]', "ReLU")
        calls = capturable_calls(ex.mox)
        _, want = yax.capture(calls, ex.mox, ex.params, IDS)
        keys, ids = capture_keys(ex.mox), node_ids(ex.mox)
        for stat in ("norm", "zeros", "nonfinite"):
            assert ask(ex, rid=1, type="overlay", stat=stat)["type"] == "ok"
            o = ex._overlay
            assert o["stat"] == stat and o["rows"] == len(calls)
            assert set(o["values"]) == {str(ids[id(c)]) for c in calls}
            for c in calls:
                leaves = [np.asarray(x, np.float64).ravel() for x in jax.tree_util.tree_leaves(want[keys[id(c)]])]
                flat = np.concatenate(leaves)
                real = {"norm": np.sqrt((flat ** 2).sum()), "zeros": (flat == 0).mean(),
                        "nonfinite": (~np.isfinite(flat)).mean()}[stat]
                assert o["values"][str(ids[id(c)])] == pytest.approx(real, rel=1e-5, abs=1e-7)
            assert o["lo"] == min(o["values"].values()) and o["hi"] == max(o["values"].values())
        assert kept(ex.mox, "widget.reduce") is None  # neither ran again
    ask(ex, rid=2, type="overlay", stat="off")
    assert ex._overlay == {}
    assert ask(ex, rid=3, type="overlay", stat="mean")["type"] == "error" and ex._overlay == {}


def _same_boundaries(mox, args, kwargs=None) -> int:
    """The original's rows read off `compare`'s measurement equal those its program runs
    (names, types, shapes, scan steps, every statistic, each values pane); how many rows."""
    from yax.internal import measure, paired_outputs

    kwargs = kwargs or {}
    taps = measure(mox, args, kwargs, paired_outputs(mox, mox)[0]).taps
    read = reduce_module.Boundaries.measured(mox, taps)
    ran = reduce_module.Boundaries.run(mox, args, kwargs)
    assert read is not None and read.where == ran.where and read.more == ran.more
    for stat in ("norm", "zeros", "nonfinite"):
        a, b = read.stats(stat), ran.stats(stat)
        assert a.keys() == b.keys()
        for rid in a:
            assert a[rid] == pytest.approx(b[rid], rel=2e-6, abs=1e-30, nan_ok=True), (stat, rid)
    for rid in ran.where:
        (ea, _), (eb, _) = read.entries(rid), ran.entries(rid)
        for x, y in zip(ea, eb):
            assert x["heat"] == y["heat"] and x["hist"]["counts"] == y["hist"]["counts"]
            for k in ("min", "max", "finite", "nan", "posinf", "neginf", "zeros", "type", "shape", "steps"):
                assert x[k] == y[k], k
            for k in ("mean", "std", "norm"):
                assert x[k] == pytest.approx(y[k], rel=2e-6, abs=1e-30), k
    return len(ran.where)


@pytest.mark.slow
def test_the_originals_rows_read_off_its_measurement_are_those_its_program_runs():
    from thirdparty import IDS as HF_IDS
    from thirdparty import _hf

    gpt2 = _hf("gpt2")  # code nobody here wrote: tuples of outputs, None arguments
    mox = yax.make_mox(lambda p, i: gpt2(i, params=p))(gpt2.params, HF_IDS)
    assert _same_boundaries(mox, (gpt2.params, HF_IDS)) > 20
    # a scanned stack: each row's values stacked over the steps
    m, ids = ScannedTransformer(num_layers=3), jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 64
    v = m.init(jax.random.key(0), ids)
    assert _same_boundaries(yax.make_mox(m.apply)(v, ids), (v, ids)) > 5
    # bfloat16 values: float32 holds them exactly, the type shown is bfloat16
    half = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), v)
    hm = yax.make_mox(m.apply)(half, ids)
    assert _same_boundaries(hm, (half, ids)) > 5
    assert reduce_module.Boundaries.measured(hm, yax.internal.measure(
        hm, (half, ids), {}, yax.internal.paired_outputs(hm, hm)[0]).taps).where[
            node_ids(hm)[id(hm.children[0])]][0][2].startswith("bf16[")


class _Counts(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(x), (x * 10).astype(jnp.int32)  # an int32 output: float32 need not hold it exactly


def test_rows_float32_would_not_hold_exactly_are_run_not_read_off_the_measurement():
    m, x = _Counts(), jnp.linspace(-1, 1, 12).reshape(3, 4)
    v = m.init(jax.random.key(0), x)
    ex = Explorer(m, v, x, warm=False)
    from yax.internal import measure, paired_outputs

    assert reduce_module.Boundaries.measured(ex.mox, measure(ex.mox, (v, x), {}, paired_outputs(ex.mox, ex.mox)[0])
                                              .taps) is None
    ex.session.inspector.paint("norm")
    prog = kept(ex.mox, "widget.reduce")  # run: the int32 row shows its own values
    assert _agrees_with_capture(ex, (v, x)) == len(capturable_calls(ex.mox))
    # one program, traced (so compiled) once, for every row and the colouring. (Not jit's
    # `_cache_size()`: it read 0 once after this very program ran, in a worker of the full command.)
    assert prog.traces == 1 and prog.capture._cache_size() <= 1


class _Scaled(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(4)(x) * 1e20  # finite, but their squares overflow float32


class _Huge(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(2, name="small")(_Scaled(name="big")(x) / 1e20)


def test_the_norm_of_huge_finite_values_is_their_norm_not_inf():
    m, x = _Huge(), jnp.linspace(-1, 1, 12).reshape(3, 4)
    v = m.init(jax.random.key(0), x)
    ex = Explorer(m, v, x, warm=False)
    ex.session.inspector.paint("norm")
    _, got = yax.capture('//module_call[@name="big"]', ex.mox, v, x)
    want = np.sqrt((np.asarray(got["_Huge/big"], np.float64) ** 2).sum())
    big = node_ids(ex.mox)[id(yax.query('//module_call[@name="big"]', ex.mox)[0])]
    assert want > 1e20 and ex._overlay["values"][str(big)] == pytest.approx(want, rel=1e-5)


class _Tiny(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(2, name="small")(nn.Dense(4, name="tiny")(x) * 1e-25)  # their squares underflow float32


def test_the_norm_of_tiny_values_is_their_norm_not_zero():
    m, x = _Tiny(), jnp.linspace(-1, 1, 12).reshape(3, 4)
    v = m.init(jax.random.key(0), x)
    ex = Explorer(m, v, x, warm=False)
    ex.session.inspector.paint("norm")
    _, got = yax.capture('//module_call[@name="small"]', ex.mox, v, x)
    want = np.sqrt((np.asarray(got["_Tiny/small"], np.float64) ** 2).sum())
    small = node_ids(ex.mox)[id(yax.query('//module_call[@name="small"]', ex.mox)[0])]
    assert 0 < want < 1e-20 and ex._overlay["values"][str(small)] == pytest.approx(want, rel=1e-5, abs=0)
    ex.session.inspector.paint("zeros")  # not one of them is zero
    assert ex._overlay["values"][str(small)] == 0


class _LogNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(3, name="first")(x)
        return nn.Dense(2, name="second")(jnp.log(h))


def test_batches_switch_the_values_and_the_comparison():
    m = _LogNet()
    pos, neg = jnp.ones((2, 4)), -jnp.ones((2, 4))
    v = m.init(jax.random.key(0), pos)
    # log of a negative Dense output: whichever batch makes `first` negative gives NaN
    v = {"params": {**v["params"], "first": {"kernel": jnp.abs(v["params"]["first"]["kernel"]) + 0.1,
                                             "bias": jnp.zeros(3)}}}
    ex = Explorer(m, v, pos, batches={"positive": pos, "negative": neg})
    ex.sent = []
    ex.send = lambda content, buffers=None: ex.sent.append(content)
    # the example is the batch named `positive` (the same array), so it is not listed twice
    assert ex._batches == {"names": ["positive", "negative"], "current": "positive",
                           "inputs": [{"name": "x", "type": "f32[2,4]", "sharding": ""}]}
    second = ex.query("//module_call[@name='second']")[0]
    rid = node_ids(ex.mox)[id(second)]
    ask(ex, rid=1, type="values", id=rid)
    assert ex._values["outputs"][0]["nan"] == 0
    reply = ask(ex, rid=2, type="nonfinite")
    assert reply["found"] is False and "No NaN or Inf" in reply["message"] and "positive" in reply["message"]
    assert ask(ex, rid=3, type="batch", name="negative")["type"] == "ok"
    assert ex.batch == "negative" and ex._batches["current"] == "negative"
    # the pane showing `second` follows the batch: now every value is NaN
    out = ex._values["outputs"][0]
    assert ex._values["batch"] == "negative" and out["nan"] == out["size"] == 4 and out["min"] is None
    reply = ask(ex, rid=4, type="nonfinite")
    found = yax.first_nonfinite(ex.mox, v, neg)
    assert reply["found"] is True and "log" in reply["message"] and "negative" in reply["message"]
    assert reply["eq"] == node_ids(ex.mox)[id(found.equation)]
    assert reply["id"] == node_ids(ex.mox)[id(found.call)] if found.call is not None else reply["id"] is None
    ex.use_batch("positive")
    assert ex.session.args[1] is pos and ex.batch == "positive" and ex._values["outputs"][0]["nan"] == 0


def test_the_comparison_runs_on_the_batch_in_use(model):
    m, v = model
    other = (IDS + 7) % 64
    ex = explorer(model, batches={"tokens": IDS, "shifted": other})
    ex.substitute("//activation[@name='gelu']", "ReLU")
    on_tokens = ex.comparison.to_dict()
    assert on_tokens == yax.compare(ex.original, ex.mox, ex.params, IDS).to_dict()
    ask(ex, rid=1, type="batch", name="shifted")
    assert ex.comparison.to_dict() == yax.compare(ex.original, ex.mox, ex.params, other).to_dict() != on_tokens
    ask(ex, rid=2, type="batch", name="tokens")  # the original's values on `tokens` were kept
    assert ex.comparison.to_dict() == on_tokens


def test_bad_batches_are_refused_saying_why(model):
    m, v = model
    with pytest.raises(yax.errors.BatchDoesNotFit) as e:
        Explorer(m, v, IDS, batches={"long": jnp.zeros((2, 9), jnp.int32)})
    assert (e.value.batch, e.value.argument, e.value.expected, e.value.found) == ("long", "args[1]", "i32[2,8]", "i32[2,9]")
    with pytest.raises(yax.errors.BatchDoesNotFit) as e:
        Explorer(m, v, IDS, batches={"floats": jnp.zeros((2, 8))})
    assert (e.value.kind, e.value.found) == ("type", "f32[2,8]")
    with pytest.raises(yax.errors.WrongType) as e:
        Explorer(m, v, IDS, batches=[IDS])
    assert (e.value.argument, e.value.found) == ("batches", "list")
    ex = explorer(model)
    assert ex._batches == {"names": ["example"], "current": "example",
                           "inputs": [{"name": "ids", "type": "i32[2,8]", "sharding": ""}]}
    reply = ask(ex, rid=1, type="batch", name="nope")
    assert reply["type"] == "error" and "example" in reply["message"] and ex.batch == "example"
    with pytest.raises(yax.errors.NotOneNode) as e:
        ex.values("//module_call[@type='Block']")
    assert isinstance(e.value, yax.YaxInputError) and (e.value.tool, e.value.count) == ("values", 2)
    assert ask(ex, rid=2, type="values", id=10 ** 6)["type"] == "error"


def test_a_call_inside_a_loop_is_refused_with_the_reason():
    def f(x):
        def body(c):
            return nn.gelu(c) - 1.0

        return jax.lax.while_loop(lambda c: c.sum() > 0, body, x)

    mox = yax.make_mox(f)(jnp.ones(3))
    ex = Explorer(mox, jnp.ones(3))
    inside = next(n for n in mox.modules() if n.name == "gelu")
    assert inside not in capturable_calls(mox)
    with pytest.raises(yax.errors.CannotComeOut) as e:
        ex.values(inside)
    assert (e.value.node, e.value.holder) == (inside, "while")
    ex.session.inspector.paint("norm")  # the rest is painted; the call inside the loop has no colour
    assert str(node_ids(mox)[id(inside)]) not in ex._overlay["values"]


def test_the_nan_search_says_which_scan_step():
    m = ScannedTransformer(num_layers=3)
    ids = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 64
    v = m.init(jax.random.key(0), ids)
    p = v["params"]
    wi = {**p["layers"]["wi"], "bias": p["layers"]["wi"]["bias"].at[1].set(1e30)}  # layer 1 overflows later
    v = {"params": {**p, "layers": {**p["layers"], "wi": wi}}}
    ex = Explorer(m, v, ids)
    ex.sent = []
    ex.send = lambda content, buffers=None: ex.sent.append(content)
    reply = ask(ex, rid=1, type="nonfinite")
    found = yax.first_nonfinite(ex.mox, v, ids)
    assert found.step and reply["found"] is True and reply["step"] == list(found.step)
    assert f"at scan step {found.step[0]}" in reply["message"]
    assert reply["id"] == node_ids(ex.mox)[id(found.call)] and reply["eq"] == node_ids(ex.mox)[id(found.equation)]


def _agrees_with_capture(ex: Explorer, args: tuple) -> int:
    """Every capturable call's values pane and colouring agree with `yax.capture` on ``args``;
    returns how many rows were checked."""
    calls = capturable_calls(ex.mox)
    _, want = yax.capture(calls, ex.mox, *args)
    keys, ids = capture_keys(ex.mox), node_ids(ex.mox)
    ex.session.inspector.paint("zeros")
    for c in calls:
        leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(want[keys[id(c)]]) if hasattr(x, "dtype")]
        shown = ex.session.inspector.row(c)["outputs"]
        assert [o["type"] for o in shown] == [yax.internal.type_str(x) for x in leaves[:len(shown)]]
        for entry, x in zip(shown, leaves):
            _check_entry(entry, x)
        flat = np.concatenate([x.ravel() for x in leaves]) if leaves else np.zeros(0)
        got = ex._overlay["values"][str(ids[id(c)])]
        assert (got is None) if not flat.size else got == pytest.approx((flat == 0).mean(), abs=1e-7)
    return len(calls)


def test_values_on_a_hugging_face_model():
    from thirdparty import IDS, _hf

    model = _hf("gpt2")
    ex = Explorer(model, IDS, warm=False)
    assert _agrees_with_capture(ex, (model.params, IDS)) > 20


def test_values_on_an_nnx_model_with_batches():
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.fc1, self.fc2 = nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 2, rngs=rngs)

        def __call__(self, x):
            return self.fc2(nnx.relu(self.fc1(x)))

    x = jnp.linspace(-1, 1, 24).reshape(3, 8)
    ex = Explorer(Net(nnx.Rngs(0)), x, batches={"x": x, "minus x": -x}, warm=False)
    state = ex.session.args[0]
    assert ex._batches == {"names": ["x", "minus x"], "current": "x",
                           "inputs": [{"name": "x", "type": "f32[3,8]", "sharding": ""}]}
    assert _agrees_with_capture(ex, (state, x)) == 4  # Net, fc1, relu, fc2
    ex.use_batch("minus x")
    assert _agrees_with_capture(ex, (state, -x)) == 4


def test_without_example_inputs_every_values_request_says_so():
    ex = Explorer(yax.make_mox(lambda x: nn.gelu(x))(jnp.ones(3)))
    ex.sent = []
    ex.send = lambda content, buffers=None: ex.sent.append(content)
    gelu = node_ids(ex.mox)[id(next(ex.mox.modules()))]
    for msg in ({"type": "overlay", "stat": "norm"}, {"type": "nonfinite"}, {"type": "values", "id": gelu}):
        reply = ask(ex, rid=1, **msg)
        assert reply["type"] == "error" and "without example inputs" in reply["message"], (msg, reply)
    assert ex._overlay == {} and ex._values == {}


def test_a_nan_planted_in_a_scanned_weight_names_its_layer_and_selects_the_row_reading_it():
    m = ScannedTransformer(num_layers=4)
    ids = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 64
    v = m.init(jax.random.key(0), ids)
    p = v["params"]
    wi = {**p["layers"]["wi"], "kernel": p["layers"]["wi"]["kernel"].at[2, 0, 0].set(jnp.nan)}
    v = {"params": {**p, "layers": {**p["layers"], "wi": wi}}}
    found = yax.first_nonfinite(yax.make_mox(m.apply)(v, ids), v, ids)
    assert found.equation is None and found.path == "args[0]['params']['layers']['wi']['kernel']"
    assert found.step == (2,) and found.reader.name == "dot_general"
    assert found.call.path.endswith("layers/wi") and "layer 2" in str(found)
    ex = Explorer(m, v, ids)
    ex.sent = []
    ex.send = lambda content, buffers=None: ex.sent.append(content)
    reply = ask(ex, rid=1, type="nonfinite")
    ids_ = node_ids(ex.mox)
    by_id = {i: n for n in ex.mox.modules() for i in [ids_[id(n)]]}
    assert reply["found"] and reply["step"] == [2] and by_id[reply["id"]].path.endswith("layers/wi")
    assert "layer 2" in reply["message"] and "layers/wi" in reply["message"]
