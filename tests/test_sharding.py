"""Sharded models: parameters laid out over a `jax.sharding.Mesh` of the 8 CPU devices
tests/conftest.py asks XLA for. JAX's own SPMD runs them; yax must keep every value
where it is. Each check compares with the real thing: `jax.jit(model.apply)` on the
same arrays (values and output shardings), `jax.grad` of the hand-written model, and
the statistics of the same model on one device."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from models import KEY, Transformer
from nnx_models import MLP as NnxMLP
from thirdparty import case

import yax
from yax.internal import ValueStats, call_keys, call_specs, node_ids, spread
from yax_widget import Explorer
from yax_widget._payloads import HEAT_MAX

# the explorer's tests are not core: yax_widget is tested on the newest JAX
pytestmark = [pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")]

DATA = jnp.arange(64, dtype=jnp.int32).reshape(4, 16) % 64  # batch 4: split 2 ways over `data`


def mesh(shape=(2, 4)) -> Mesh:
    return Mesh(np.array(jax.devices()[:8]).reshape(shape), ("data", "model"))


def _name(kp) -> str:
    last = [k for k in kp if not isinstance(k, jax.tree_util.GetAttrKey)][-1]
    return str(getattr(last, "key", getattr(last, "name", last)))


SPLIT = P(None, "model")  # the last axis over `model`


def laid_out(tree, m: Mesh, kernel=SPLIT, embedding=SPLIT):
    """Every 2-D kernel split by ``kernel``, embeddings by ``embedding``, the rest replicated."""
    def one(kp, x):
        name = _name(kp)
        spec = kernel if name == "kernel" and x.ndim == 2 else embedding if name == "embedding" else P()
        return jax.device_put(x, NamedSharding(m, spec))

    return jax.tree_util.tree_map_with_path(one, tree)


def batch(x, m: Mesh):
    return jax.device_put(x, NamedSharding(m, P("data")))


def spec(x) -> P:
    return x.sharding.spec


@pytest.fixture(scope="module")
def tf():
    """A Transformer sharded 2 × 4 (kernels over `model`, the batch over `data`) and its MoX."""
    m = mesh()
    model = Transformer()
    variables = laid_out(model.init(KEY, DATA), m)
    ids = batch(DATA, m)
    return model, variables, ids, yax.make_mox(model.apply)(variables, ids)


# -- evaluating ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.core
def test_eval_mox_equals_apply_and_lays_outputs_out_as_jit_of_apply(tf):
    model, v, ids, mox = tf
    want = jax.jit(model.apply)(v, ids)
    got = jax.jit(yax.to_function(mox))(v, ids)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert got.sharding == want.sharding and spec(got) == P("data")
    eager, plain = yax.eval_mox(mox, v, ids), model.apply(v, ids)  # op by op, as apply runs
    np.testing.assert_allclose(eager, plain, rtol=1e-6, atol=1e-6)
    assert eager.sharding == plain.sharding


@pytest.mark.core
def test_eval_mox_composes_with_vmap_and_grad_on_a_mesh_of_8():
    m = mesh((1, 8))
    model = nn.Sequential([nn.Dense(64), nn.gelu, nn.Dense(16)])
    x = jnp.linspace(-1, 1, 3 * 8 * 32).reshape(3, 8, 32)
    v = laid_out(model.init(KEY, x[0]), m)
    mox = yax.make_mox(model.apply)(v, x[0])
    got = jax.jit(jax.vmap(lambda x: yax.eval_mox(mox, v, x)))(x)
    want = jax.jit(jax.vmap(lambda x: model.apply(v, x)))(x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert got.sharding == want.sharding
    g = jax.jit(jax.grad(lambda v: yax.eval_mox(mox, v, x[0]).sum()))(v)
    w = jax.jit(jax.grad(lambda v: model.apply(v, x[0]).sum()))(v)
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(w)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert a.sharding == b.sharding


@pytest.mark.core
def test_gradients_through_the_sharded_rewritten_model_equal_those_of_the_hand_written_one(tf):
    model, v, ids, mox = tf
    relu = yax.sub('//activation[@name="gelu"]', jax.nn.relu, mox)

    def loss(f):
        return lambda v: jnp.mean(jax.nn.log_softmax(f(v, ids))[..., 0])

    got = jax.jit(jax.grad(loss(yax.to_function(relu))))(v)
    want = jax.jit(jax.grad(loss(Transformer(act=nn.relu).apply)))(v)
    for (kp, a), b in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(kp))
        assert a.sharding == b.sharding, jax.tree_util.keystr(kp)
    assert spec(got["params"]["Block_0"]["Dense_0"]["kernel"]) == P(None, "model")


# -- seeing inside ------------------------------------------------------------------------

@pytest.mark.core
def test_capture_and_patch_keep_values_on_the_devices(tf):
    model, v, ids, mox = tf
    out, acts = yax.capture('//module_call[@type="Dense"] | //activation', mox, v, ids)
    want = jax.jit(model.apply)(v, ids)
    assert out.sharding == want.sharding
    assert all(isinstance(x, jax.Array) and spread(x) for x in acts.values())
    ref_out, ref = yax.capture('//module_call[@type="Dense"] | //activation', mox, *jax.device_get((v, ids)))
    for k, x in acts.items():
        # split over devices, a contraction sums in another order: float32 rounding of the order of
        # the terms' scale, not of the (possibly much smaller) result (jax 0.9 on an AMD EPYC: 1.3e-6
        # at a value of 0.019 in a row of values up to 1.6)
        np.testing.assert_allclose(x, ref[k], rtol=1e-5, atol=1e-5 * float(np.abs(ref[k]).max()), err_msg=k)
    jitted = jax.jit(lambda v, ids: yax.capture("//activation", mox, v, ids))(v, ids)
    assert jitted[0].sharding == want.sharding
    ablate = yax.patch('//activation[@name="gelu"]', mox, lambda path, h, s: s * h)
    patched = ablate(0.0, v, ids)
    np.testing.assert_allclose(patched, ablate(0.0, *jax.device_get((v, ids))), rtol=1e-5, atol=1e-6)
    assert patched.sharding == want.sharding


def _fetches(monkeypatch) -> list[int]:
    """Sizes of the arrays brought to the host with `jax.device_get`, while any other
    transfer from the devices (`np.asarray` of a device array) raises."""
    sizes: list[int] = []
    real = jax.device_get

    def spy(x):
        out = real(x)
        sizes.extend(int(np.size(a)) for a in jax.tree_util.tree_leaves(out))
        return out

    monkeypatch.setattr(jax, "device_get", spy)
    return sizes


@pytest.fixture
def no_implicit_transfers(monkeypatch):
    old = jax.config.jax_transfer_guard_device_to_host
    jax.config.update("jax_transfer_guard_device_to_host", "disallow")  # every thread (the explorer's worker)
    try:
        yield _fetches(monkeypatch)
    finally:
        jax.config.update("jax_transfer_guard_device_to_host", old or "allow")


@pytest.mark.slow
@pytest.mark.core
def test_compare_reduces_sharded_values_where_they_are(tf, no_implicit_transfers):
    model, v, ids, mox = tf
    relu = yax.sub('//activation[@name="gelu"]', jax.nn.relu, mox)
    got = yax.compare(mox, relu, v, ids, grad_of=lambda out: out.mean())
    fetched = list(no_implicit_transfers)
    assert fetched and max(fetched) <= 7 * 4  # per boundary: 7 floats and 4 counts, one row (no scan)
    jax.config.update("jax_transfer_guard_device_to_host", "allow")
    want = yax.compare(mox, relu, *jax.device_get((v, ids)), grad_of=lambda out: out.mean())
    assert got.first_divergence == want.first_divergence == "Transformer/Block_0/gelu"
    assert list(got.boundaries) == list(want.boundaries)
    for part in ("outputs", "boundaries", "gradients"):
        for k, s in getattr(want, part).items():
            if "['key']['bias']" in k:  # softmax ignores it: its gradient is rounding noise, different on a mesh
                continue
            t = getattr(got, part)[k]
            assert (t.allclose, t.nonfinite, t.changed) == (s.allclose, s.nonfinite, s.changed), (part, k)
            for f in ("max_abs", "mean_abs", "rel", "cosine"):
                np.testing.assert_allclose(getattr(t, f), getattr(s, f), rtol=2e-4, atol=1e-6, err_msg=f"{part} {k} {f}")
    x, y = got.arrays["out"]
    assert spread(x) and spread(y)  # the outputs for plots stay where they are


@pytest.mark.core
def test_statistics_reduced_on_the_devices_equal_numpys():
    x = jnp.linspace(-3, 3, 8 * 64).reshape(8, 64)
    x = x.at[0, 0].set(jnp.nan).at[1, 2].set(jnp.inf).at[5, 7].set(-jnp.inf).at[3, 3].set(0.0)
    sharded = jax.device_put(x, NamedSharding(mesh(), P("data", "model")))
    f = yax.make_mox(lambda x: jnp.sin(x) * 1e20)(x)  # squares overflow float32
    for g in (f, yax.sub("//sin", jnp.cos, f), yax.sub("//sin", lambda x: jnp.where(x > 2, jnp.nan, x), f)):
        got, want = yax.compare(f, g, sharded), yax.compare(f, g, x)
        for k, s in want.outputs.items():
            t = got.outputs[k]
            assert (t.allclose, t.nonfinite, t.changed, t.undefined) == (s.allclose, s.nonfinite, s.changed, s.undefined)
            np.testing.assert_allclose([t.max_abs, t.mean_abs, t.rel, t.cosine], [s.max_abs, s.mean_abs, s.rel, s.cosine],
                                       rtol=1e-5)
    a, b = ValueStats.of(sharded), ValueStats.of(np.asarray(x))
    assert (a.type, a.nan, a.posinf, a.neginf, a.zeros, a.size) == (b.type, b.nan, b.posinf, b.neginf, b.zeros, b.size)
    np.testing.assert_allclose([a.min, a.max, a.mean, a.std], [b.min, b.max, b.mean, b.std], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.core
def test_compare_of_a_scanned_sharded_model_per_step():
    m = mesh()
    model = Transformer(scan=True, num_layers=3)
    v = model.init(KEY, DATA)
    sv, ids = laid_out(v, m, kernel=P()), batch(DATA, m)
    sv = jax.tree_util.tree_map_with_path(
        lambda kp, x: jax.device_put(x, NamedSharding(m, P(None, None, "model"))) if _name(kp) == "kernel" else x, sv)
    mox = yax.make_mox(model.apply)(sv, ids)
    assert "kernel=P(None,None,'model')" in yax.query('string((//module_call[@type="Dense"])[1]/@sharding)', mox)
    relu = yax.sub('//activation[@name="gelu"]', jax.nn.relu, mox)
    got, want = yax.compare(mox, relu, sv, ids), yax.compare(mox, relu, v, DATA)
    assert (got.first_divergence, got.first_divergence_step) == (want.first_divergence, want.first_divergence_step)
    assert got.stacks == want.stacks and got.steps.keys() == want.steps.keys()
    for k, rows in want.steps.items():
        for s, t in zip(rows, got.steps[k]):
            np.testing.assert_allclose(t.rel, s.rel, rtol=2e-4, atol=1e-6, err_msg=k)
            assert t.allclose == s.allclose


@pytest.mark.slow
@pytest.mark.core
def test_first_nonfinite_reduces_sharded_values_where_they_are(no_implicit_transfers):
    m = mesh()
    model = Transformer()
    v = model.init(KEY, DATA)
    p = v["params"]
    v = {"params": {**p, "embed": {"embedding": p["embed"]["embedding"].at[63].set(1e20)}}}  # overflows a LayerNorm
    ids = DATA.at[1, 3].set(63)
    sv, sids = laid_out(v, m), batch(ids, m)
    mox = yax.make_mox(model.apply)(sv, sids)
    got = yax.first_nonfinite(mox, sv, sids)
    # one flag per equation output, and statistics: less than any activation (4 × 16 × 32 entries)
    assert no_implicit_transfers and max(no_implicit_transfers) < DATA.size * 32
    jax.config.update("jax_transfer_guard_device_to_host", "allow")
    want = yax.first_nonfinite(mox, v, ids)
    assert (got.equation.name, got.path, got.step) == (want.equation.name, want.path, want.step)
    for a, b in zip((got.output, *got.inputs, *got.call_inputs), (want.output, *want.inputs, *want.call_inputs)):
        assert (a.type, a.nan, a.posinf, a.neginf, a.zeros, a.size) == (b.type, b.nan, b.posinf, b.neginf, b.zeros,
                                                                        b.size)
        np.testing.assert_allclose([a.min, a.max, a.mean, a.std], [b.min, b.max, b.mean, b.std], rtol=1e-3)


@pytest.mark.core
def test_first_nonfinite_names_the_layer_of_a_sharded_stack(no_implicit_transfers):
    model = Transformer(scan=True, num_layers=3)
    v = model.init(KEY, DATA)
    layers = v["params"]["layers"]
    dense = {**layers["Block_0"]["Dense_0"], "kernel": layers["Block_0"]["Dense_0"]["kernel"].at[1, 0, 0].set(jnp.nan)}
    v = {"params": {**v["params"], "layers": {"Block_0": {**layers["Block_0"], "Dense_0": dense}}}}
    m = mesh()
    sv = jax.tree_util.tree_map(lambda x: jax.device_put(x, NamedSharding(m, P(*([None] * (x.ndim - 1)), "model")))
                                if x.ndim == 3 else x, laid_out(v, m))
    mox = yax.make_mox(model.apply)(sv, batch(DATA, m))
    got = yax.first_nonfinite(mox, sv, batch(DATA, m))
    jax.config.update("jax_transfer_guard_device_to_host", "allow")
    want = yax.first_nonfinite(mox, v, DATA)
    assert got.equation is want.equation is None and (got.path, got.step) == (want.path, want.step)
    assert "Dense_0" in got.path and got.step == (1,) and got.output.nan == want.output.nan == 1


# -- rewriting ----------------------------------------------------------------------------

@pytest.mark.core
@pytest.mark.parametrize("kernel,a,b", [
    (P(None, "model"), P(None, None), P(None, "model")),   # split over outputs: lora_b follows
    (P("model", None), P("model", None), P(None, None)),   # split over inputs: lora_a follows
    (P("data", "model"), P("data", None), P(None, "model")),
])
def test_lora_places_its_adapters_like_the_kernel_it_adapts(tf, kernel, a, b):
    model, v, ids, _ = tf
    m = mesh()
    v = laid_out(jax.device_get(v), m, kernel=kernel)
    mox = yax.make_mox(model.apply)(v, ids)
    new, lp = yax.sub('//module_call[@type="Dense"]', yax.LoRA(rank=2), mox, params=v, key=jax.random.key(1))
    layer = lp["params"]["Block_0"]["Dense_0"]
    assert layer["kernel"] is v["params"]["Block_0"]["Dense_0"]["kernel"]  # kept, not moved
    assert (spec(layer["lora_a"]), spec(layer["lora_b"])) == (a, b)
    assert layer["lora_a"].sharding.mesh == layer["kernel"].sharding.mesh == m
    out = jax.jit(yax.to_function(new))(lp, ids)
    want = jax.jit(model.apply)(v, ids)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)  # lora_b starts at zero
    assert out.sharding == want.sharding
    # trained a little, then merged back: the kernel keeps its sharding, the function its values
    trained = jax.tree_util.tree_map_with_path(lambda kp, x: x + 0.01 if _name(kp) == "lora_b" else x, lp)
    merged, mp = yax.merge_lora(new, trained)
    assert spec(mp["params"]["Block_0"]["Dense_0"]["kernel"]) == kernel
    np.testing.assert_allclose(jax.jit(yax.to_function(merged))(mp, ids), jax.jit(yax.to_function(new))(trained, ids),
                               rtol=1e-4, atol=1e-5)
    assert f"lora_b={_text(b)}" in yax.query('string(//module_call[@type="LoRA"][1]/@sharding)', new)


def _text(s: P) -> str:
    return "P(" + ",".join("None" if e is None else repr(e) for e in s) + ")"


class Linear(nn.Module):
    """A dense layer of another name and layout: its weight is new to the model."""

    features: int

    @nn.compact
    def __call__(self, x):
        return x @ self.param("w", nn.initializers.lecun_normal(), (x.shape[-1], self.features))


@pytest.mark.core
def test_a_replacements_new_parameters_are_laid_out_like_the_replaced_layers(tf):
    model, v, ids, mox = tf
    new, nv = yax.sub('//module_call[@type="Dense"][@features=64]', Linear(64), mox, params=v,
                      key=jax.random.key(2), keep={})
    assert set(nv["params"]["Block_0"]["Dense_0"]) == {"w"}
    assert spec(nv["params"]["Block_0"]["Dense_0"]["w"]) == P(None, "model")  # (32, 64): like the kernel
    out = jax.jit(yax.to_function(new))(nv, ids)
    assert out.sharding == jax.jit(model.apply)(v, ids).sharding


# -- what queries and the explorer show ----------------------------------------------------

@pytest.mark.core
def test_sharding_is_a_queryable_attribute_of_each_call(tf):
    _, v, ids, mox = tf
    dense = yax.query('//module_call[@type="Dense"]', mox)
    assert yax.query('//*[contains(@sharding, "model")]', mox) == [
        n for n in mox.modules() if n.type in ("Dense", "Embed")]  # embed, 8 Dense, then embed.attend
    assert yax.query('string(//module_call[@path="Transformer/Block_0/Dense_0"]/@sharding)', mox) == \
        "kernel=P(None,'model') bias=P()"
    assert set(yax.query("//*[@sharding]/@sharding", mox)) == {
        "embedding=P(None,'model')", "kernel=P(None,'model') bias=P()"}
    assert call_specs(mox)[id(dense[0])] == "kernel=P(None,'model') bias=P()"


@pytest.mark.core
def test_an_unsharded_model_looks_unchanged(tf):
    model, v, ids, _ = tf
    host = jax.device_get(v)
    plain = yax.make_mox(model.apply)(host, DATA)
    replicated = yax.make_mox(model.apply)(laid_out(host, mesh(), kernel=P(), embedding=P()), DATA)
    for mox in (plain, replicated):
        assert mox.shardings == () and yax.query("//*[@sharding]", mox) == []
    assert yax.to_xml(plain) == yax.to_xml(replicated)


@pytest.mark.core
def test_nnx_model_on_a_mesh():
    m = mesh()
    model = NnxMLP(32, 64, 16, rngs=nnx.Rngs(0))
    state = laid_out(nnx.state(model), m)
    nnx.update(model, state)
    x = batch(jnp.linspace(-1, 1, 4 * 32).reshape(4, 32), m)
    mox = yax.make_mox(model)(x)
    graphdef = nnx.graphdef(model)
    want, _ = jax.jit(lambda s, x: (nnx.merge(graphdef, s)(x), 0))(state, x)
    got, _ = jax.jit(yax.to_function(mox))(state, x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert got.sharding == want.sharding
    assert yax.query("//*[@sharding]/@sharding", mox) == ["kernel=P(None,'model') bias=P()"] * 2
    new, ns = yax.sub('//module_call[@type="Linear"]', yax.LoRA(rank=2), mox, params=state)
    assert spec(ns["fc1"]["lora"]["lora_a"][...]) == P(None, None)
    assert spec(ns["fc1"]["lora"]["lora_b"][...]) == P(None, "model")
    assert yax.query("string(//module_call[@type='LoRA'][1]/@sharding)", new) == "lora_a=P(None,None) lora_b=P(None,'model')"
    out, _ = jax.jit(yax.to_function(new))(ns, x)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    assert out.sharding == want.sharding


@pytest.mark.core
def test_hugging_face_model_on_a_mesh():
    c = case("bert-wrapper")
    m = mesh()
    params, ids = laid_out(c.args[0], m), batch(c.args[1], m)
    mox = yax.make_mox(c.fn)(params, ids)
    want = jax.jit(c.fn)(params, ids)
    got = jax.jit(yax.to_function(mox))(params, ids)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert got.sharding == want.sharding
    assert yax.query('string(//module_call[@name="query"][1]/@sharding)', mox) == "kernel=P(None,'model') bias=P()"
    new, lp = yax.sub(c.row.qv, yax.LoRA(rank=2), mox, params=params, key=jax.random.key(1))
    q = lp["bert"]["encoder"]["layer"]["0"]["attention"]["self"]["query"]
    assert (spec(q["lora_a"]), spec(q["lora_b"])) == (P(None, None), P(None, "model"))
    out = jax.jit(yax.to_function(new))(lp, ids)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert out.sharding == want.sharding


@pytest.mark.slow
def test_the_explorer_shows_shardings_and_brings_only_summaries_to_the_host(no_implicit_transfers):
    m = mesh()
    model = Transformer(d_model=64, d_mlp=256)
    ids = jnp.arange(8 * 16, dtype=jnp.int32).reshape(8, 16) % 64
    v = laid_out(model.init(KEY, ids), m)
    ex = Explorer(model, v, batch(ids, m))
    rows = {r[3]: r for r in ex._tree["rows"] if r[3] in ("Dense_0", "LayerNorm_0", "embed")}
    assert rows["Dense_0"][14] == "kernel=P(None,'model') bias=P()" and rows["LayerNorm_0"][14] == ""
    ex.substitute('//activation[@name="gelu"]', "ReLU")
    assert ex.comparison.first_divergence == "Transformer/Block_0/gelu"
    relu = call_keys(ex.mox)["Transformer/Block_0/gelu"]
    assert relu.name == "relu" and ex._comparison["first_divergence_id"] == node_ids(ex.mox)[id(relu)]
    heat = ex._comparison["outputs"][0]["heat"]
    assert heat["rows"] == 16 and heat["cols"] == 64 and len(heat["diff"]) == 16 * 64 * 4
    stats = ex.values('//module_call[@path="Transformer/Block_0/Dense_0"]')["out"]
    assert ex.session.inspector.nonfinite()["found"] is False
    # statistics, histograms and heatmap slices only: a 2-D slice (16 × 256, every other column),
    # where the activations hold 8 × 16 × 256 entries
    assert stats.size == 8 * 16 * 256 and max(no_implicit_transfers) <= 16 * HEAT_MAX
    jax.config.update("jax_transfer_guard_device_to_host", "allow")
    _, acts = yax.capture('//module_call[@path="Transformer/Block_0/Dense_0"]', ex.mox, *jax.device_get((v, ids)))
    a = np.asarray(acts["Transformer/Block_0/Dense_0"], np.float64)
    np.testing.assert_allclose([stats.min, stats.max, stats.mean, stats.std], [a.min(), a.max(), a.mean(), a.std()],
                               rtol=1e-4)


def test_a_lora_drop_in_the_explorer_places_its_adapters_like_the_kernel():
    m = mesh()
    model = Transformer()
    ex = Explorer(model, laid_out(model.init(KEY, DATA), m), batch(DATA, m), warm=False)
    ex.substitute('//module_call[@path="Transformer/Block_0/Dense_0"]', "LoRA r=4")
    layer = ex.params["params"]["Block_0"]["Dense_0"]
    assert (spec(layer["lora_a"]), spec(layer["lora_b"])) == (P(None, None), P(None, "model"))
    row = next(r for r in ex._tree["rows"] if r[4] == "LoRA")
    assert row[14] == "lora_a=P(None,None) lora_b=P(None,'model') kernel=P(None,'model') bias=P()"
    assert ex.comparison.allclose
