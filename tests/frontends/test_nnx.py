"""flax.nnx: make_mox / eval_mox / queries / sub / compare / replace_modules,
each checked against the real nnx model (a clone called in place)."""

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from nnx_models import IDS, MLP, NNX_CASES, Block, Shared, Transformer, rngs

import yax

pytestmark = pytest.mark.core


def plain(x):
    return jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x


def close(a, b, tol=1e-5):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    return jax.tree.all(jax.tree.map(lambda x, y: np.allclose(plain(x), plain(y), rtol=tol, atol=tol), a, b))


def real(model, *args, **kwargs):
    """What calling the model does: its output and its state afterwards."""
    m = nnx.clone(model)
    out = m(*args, **kwargs)
    return out, nnx.state(m)


@pytest.fixture(scope="module")
def traced():
    cache = {}

    def get(name):
        if name not in cache:
            model, args, kwargs = NNX_CASES[name]()
            cache[name] = (model, args, kwargs, yax.make_mox(model)(*args, **kwargs))
        return cache[name]

    return get


# -- evaluation ---------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(NNX_CASES))
def test_eval_matches_model(name, traced):
    model, args, kwargs, mox = traced(name)
    graphdef, state = nnx.split(model)
    assert mox.graphdef == graphdef
    got = yax.eval_mox(mox, state, *args, **kwargs)
    assert close(got, real(model, *args, **kwargs))
    jitted = jax.jit(lambda s, *a: yax.eval_mox(mox, s, *a, **kwargs))(state, *args)
    assert close(jitted, got)


@pytest.mark.parametrize("name", sorted(NNX_CASES))
def test_grad_matches_model(name, traced):
    model, args, kwargs, mox = traced(name)
    graphdef, state = nnx.split(model)
    leaves, tree = jax.tree.flatten(state)
    idx = [i for i, x in enumerate(leaves) if jnp.issubdtype(x.dtype, jnp.floating)]

    def loss(f):
        def go(floats):
            full = list(leaves)
            for i, x in zip(idx, floats):
                full[i] = x
            out, _ = f(jax.tree.unflatten(tree, full))
            return jnp.sum(out.astype(jnp.float32) ** 2)
        return jax.grad(go)([leaves[i] for i in idx])

    def model_fn(s):
        m = nnx.merge(graphdef, s)
        return m(*args, **kwargs), nnx.state(m)

    want = loss(model_fn)
    got = loss(lambda s: yax.eval_mox(mox, s, *args, **kwargs))
    assert close(got, want, tol=1e-4)
    assert any(float(jnp.abs(g).sum()) > 0 for g in got)


def test_vmap_of_eval():
    model = MLP(rngs=rngs())
    graphdef, state = nnx.split(model)
    mox = yax.make_mox(model)(jnp.ones((2, 4)))
    xs = jax.random.normal(jax.random.key(1), (5, 2, 4))

    def model_fn(s, x):
        m = nnx.merge(graphdef, s)
        return m(x), nnx.state(m)

    want = jax.vmap(model_fn, in_axes=(None, 0))(state, xs)
    got = jax.vmap(lambda s, x: yax.eval_mox(mox, s, x), in_axes=(None, 0))(state, xs)
    assert close(got, want) and got[0].shape == (5, 2, 8)
    # per-example states too: the state's leaves mapped along with the inputs
    states = jax.tree.map(lambda a: jnp.stack([a, 2 * a, -a, a, a]), state)
    want = jax.vmap(model_fn)(states, xs)
    assert close(jax.vmap(lambda s, x: yax.eval_mox(mox, s, x))(states, xs), want)


def test_batchnorm_train_updates_statistics_like_the_model(traced):
    model, args, _, mox = traced("cnn_train")
    _, state = nnx.split(model)
    out, new = yax.eval_mox(mox, state, *args)
    want_out, want = real(model, *args)
    assert close(out, want_out) and close(new, want)
    assert not np.allclose(new["bn"]["mean"][...], state["bn"]["mean"][...])  # really updated
    # in eval mode the statistics are read, not written
    model, args, _, mox = traced("cnn_eval")
    _, state = nnx.split(model)
    _, new = yax.eval_mox(mox, state, *args)
    assert close(new, state)


def test_dropout_uses_and_advances_the_rng_state(traced):
    model, args, _, mox = traced("transformer_dropout")
    _, state = nnx.split(model)
    out, new = yax.eval_mox(mox, state, *args)
    want_out, want = real(model, *args)
    assert close(out, want_out) and close(new, want)
    count = lambda s: int(s["blocks"][0]["drop1"]["rngs"]["count"][...])  # noqa: E731
    assert count(new) == count(state) + 1  # each Dropout holds a stream forked from `rngs`
    # running again from the new state draws new masks, exactly as the model does
    out2, _ = yax.eval_mox(mox, new, *args)
    m = nnx.clone(model)
    m(*args)
    assert close(out2, m(*args)) and not np.allclose(out2, out)
    # and with dropout off the outputs are deterministic
    off = nnx.clone(model)
    off.eval()
    assert not np.allclose(out, off(*args))


def test_model_is_not_changed_by_tracing():
    model, args, _ = NNX_CASES["cnn_train"]()
    before = nnx.split(model)
    yax.make_mox(model)(*args)
    after = nnx.split(model)
    assert before[0] == after[0] and close(before[1], after[1])
    assert all("_pytree__yax_call" not in vars(m) for _, m in nnx.iter_modules(model))


def test_functional_style_and_bound_methods():
    model, (x,), _ = NNX_CASES["sequential"]()
    graphdef, state = nnx.split(model)

    def forward(state, x):
        m = nnx.merge(graphdef, state)
        return m(x), nnx.state(m)

    mox = yax.make_mox(forward)(state, x)
    assert [(n.kind, n.path, n.method) for n in mox.modules()] == [
        ("module_call", "Classifier", "__call__"), ("method_call", "Classifier", "encode"),
        ("module_call", "Classifier/body", "__call__"), ("module_call", "Classifier/body/layers/0", "__call__"),
        ("activation", "Classifier/body/relu", "relu"), ("module_call", "Classifier/body/layers/2", "__call__"),
        ("module_call", "Classifier/norm", "__call__")]
    assert mox.graphdef is None  # the function's own arguments: (state, x) -> (out, state)
    assert close(yax.eval_mox(mox, state, x), real(model, x))
    enc = yax.make_mox(model.encode)(x)
    assert [(n.kind, n.path, n.method) for n in enc.modules()][:2] == [
        ("module_call", "Classifier", "encode"), ("module_call", "Classifier/body", "__call__")]
    out, _ = yax.eval_mox(enc, state, x)
    assert np.allclose(out, model.encode(x))


def test_tracing_is_abstract():
    abstract = nnx.eval_shape(lambda: Transformer(num_layers=1, rngs=rngs()))
    mox = yax.make_mox(abstract)(jax.ShapeDtypeStruct((2, 8), jnp.int32))
    assert mox.outputs[0].shape == (2, 8, 64)
    model = Transformer(num_layers=1, rngs=rngs())
    _, state = nnx.split(model)
    assert close(yax.eval_mox(mox, state, IDS), real(model, IDS))


def test_jitted_eval_compiles_to_the_same_hlo(traced):
    model, args, _, mox = traced("transformer")
    graphdef, state = nnx.split(model)

    def ops(f):
        text = jax.jit(f).lower(state, *args).compile().as_text()
        return collections.Counter(re.findall(r"= \S+ (\w[\w-]*)\(", text))

    def model_fn(s, *a):
        m = nnx.merge(graphdef, s)
        return m(*a), nnx.state(m)

    assert ops(lambda s, *a: yax.eval_mox(mox, s, *a)) == ops(model_fn)


# -- the tree and queries ---------------------------------------------------------------

def test_paths_types_attributes_and_params(traced):
    model, _, _, mox = traced("transformer")
    calls = [(m.kind, m.path, m.method) for m in mox.modules()]
    assert calls[:3] == [("module_call", "Transformer", "__call__"), ("module_call", "Transformer/embed", "__call__"),
                         ("module_call", "Transformer/blocks/0", "__call__")]
    assert ("module_call", "Transformer/blocks/1/attn/query", "__call__") in calls
    assert ("module_call", "Transformer/embed", "attend") in calls  # tied output embedding
    assert not any(m == "_split_heads" for *_, m in calls)  # private helpers stay inside their call
    gelus = [m.path for m in mox.modules() if m.kind == "activation" and m.name == "gelu"]
    assert gelus == ["Transformer/blocks/0/gelu", "Transformer/blocks/1/gelu"]  # held in `self.act`
    softmax = [m for m in mox.modules() if m.name == "softmax"]
    assert len(softmax) == 2 and softmax[0].attrs == {"axis": -1}
    fc1 = next(m for m in mox.modules() if m.path == "Transformer/blocks/0/fc1")
    assert fc1.type == "Linear" and fc1.module_type is nnx.Linear
    assert fc1.attrs["in_features"] == 32 and fc1.attrs["out_features"] == 64 and fc1.attrs["use_bias"] is True
    assert fc1.num_params == 32 * 64 + 64 and fc1.scope == ("blocks", "0", "fc1")
    assert fc1.var_tree["kernel"].shape == (32, 64)
    assert fc1.in_shapes == [(2, 8, 32)] and fc1.out_shapes == [(2, 8, 64)]
    total = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert mox.calls[0].num_params == total
    drop = next(m for m in mox.modules() if m.type == "Dropout")
    assert drop.attrs["rate"] == 0.0 and "rngs" not in drop.attrs


def test_queries_return_exact_nodes(traced):
    _, _, _, mox = traced("transformer")
    big = yax.query("//module_call[@params > 2000]", mox)
    assert [n.path for n in big] == [
        "Transformer", "Transformer/embed", "Transformer/blocks/0", "Transformer/blocks/0/attn",
        "Transformer/blocks/0/fc1", "Transformer/blocks/0/fc2", "Transformer/blocks/1",
        "Transformer/blocks/1/attn", "Transformer/blocks/1/fc1", "Transformer/blocks/1/fc2",
        "Transformer/embed"]
    assert [n.method for n in big][-1] == "attend"
    q = yax.query('//module_call[@type="Linear"][@out_features=64]', mox)
    assert [n.path for n in q] == ["Transformer/blocks/0/fc1", "Transformer/blocks/1/fc1"]
    assert yax.query('//module_call[@path="Transformer/blocks/0/attn/query"]/@in_features', mox) == ["32"]
    assert yax.query('count(//activation[@name="gelu"])', mox) == 2.0
    _, _, _, mha = traced("transformer_mha_rms")
    attn = yax.query('//module_call[@type="MultiHeadAttention"]', mha)
    assert [n.path for n in attn] == ["Transformer/blocks/0/attn", "Transformer/blocks/1/attn"]
    assert attn[0].attrs["num_heads"] == 4 and attn[0].attrs["in_features"] == 32
    assert yax.query('count(//module_call[@type="RMSNorm"])', mha) == 4.0
    assert "module_call[path=Transformer/blocks/0/fc1 type=Linear in_features=32 out_features=64" in str(mox)


def test_scan_over_layers_shows_one_body(traced):
    _, _, _, mox = traced("transformer_scan")
    scans = [n for n in mox.walk() if isinstance(n, yax.Equation) and n.name == "scan"]
    assert len(scans) == 1 and scans[0].params["length"] == 3
    (_, body), = scans[0].subs
    paths = [m.path for m in body.modules() if m.kind == "module_call"]
    assert paths[:3] == ["ScanTransformer/blocks", "ScanTransformer/blocks/norm1", "ScanTransformer/blocks/attn"]
    one_layer = sum(x.size for x in jax.tree.leaves(nnx.state(Block(32, 4, 64, rngs=rngs()), nnx.Param)))
    assert body.calls[0].num_params == one_layer


def test_remat_vmap_jit_inside_models(traced):
    _, _, _, mox = traced("lifted")
    prims = collections.Counter(n.name for n in mox.walk() if isinstance(n, yax.Equation))
    assert prims["jit"] >= 1 and prims["remat2"] + prims.get("checkpoint", 0) >= 1
    assert not prims["optimization_barrier"]  # markers never reach the MoX
    assert [m.path for m in mox.modules()] == ["Lifted", "Lifted/a", "Lifted/b", "Lifted/c"]
    _, _, _, rm = traced("transformer_remat")
    assert any(m.path == "Transformer/blocks/1/fc2" for m in rm.modules())


def test_shared_module_called_three_times(traced):
    model, _, _, mox = traced("shared")
    calls = [m for m in mox.modules() if m.type == "Linear"]
    assert len(calls) == 3 and len({c.path for c in calls}) == 1 and len({id(c) for c in calls}) == 3
    assert all(c.num_params == 30 for c in calls)
    assert len(jax.tree.leaves(nnx.state(model))) == 2  # one set of parameters


def test_classes_restored_even_when_tracing_fails():
    originals = {c: dict(vars(c)) for c in (nnx.Linear, nnx.Module, nnx.Sequential, nnx.LayerNorm)}
    acts = (jax.nn.gelu, nnx.gelu, nnx.relu, jax.nn.softmax)

    class Boom(nnx.Module):
        def __init__(self):
            self.lin = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
            self.act = nnx.gelu

        def __call__(self, x):
            self.act(self.lin(x))
            raise ValueError("boom")

    boom_call = Boom.__call__
    model = Boom()
    with pytest.raises(yax.errors.CouldNotTrace) as e:
        yax.make_mox(model)(jnp.ones((1, 2)))
    assert type(e.value.error) is ValueError and e.value.error.args == ("boom",)
    graphdef, state = nnx.split(model)
    with pytest.raises(yax.errors.CouldNotTrace) as e:  # functional style: the closure's objects
        yax.make_mox(lambda x: model(x))(jnp.ones((1, 2)))
    assert type(e.value.error) is ValueError and e.value.error.args == ("boom",)
    assert Boom.__call__ is boom_call
    assert {c: dict(vars(c)) for c in originals} == originals
    assert (jax.nn.gelu, nnx.gelu, nnx.relu, jax.nn.softmax) == acts
    assert model.act is nnx.gelu and all("_pytree__yax_call" not in vars(m) for _, m in nnx.iter_modules(model))
    assert nnx.split(model)[0] == graphdef
    # and plain nnx code runs without markers
    assert "optimization_barrier" not in str(jax.make_jaxpr(lambda x: model.lin(x))(jnp.ones((1, 2))))


# -- sub and compare -------------------------------------------------------------------

FC = '//module_call[@type="Linear"][re:test(@path, "fc\\d$")]'


def lora_for(path, node):
    return nnx.LoRALinear(node.attrs["in_features"], node.attrs["out_features"], lora_rank=4,
                          rngs=nnx.Rngs(len(path)))


def test_sub_activation_matches_hand_modified_model(traced):
    model, args, _, mox = traced("transformer")
    _, state = nnx.split(model)
    new, new_state = yax.sub('//activation[@name="gelu"]', jax.nn.relu, mox, params=state)
    # no nnx model computes a function put in: the graphdef is gone rather than silently the old model
    assert new_state is state and new.graphdef is None and mox.graphdef is not None
    with pytest.raises(yax.errors.NnxCannotReplace) as e:
        yax.sub(FC, lora_for, new, params=state)
    assert e.value.problem == "graphdef gone"
    hand = Transformer(act=nnx.relu, rngs=rngs())
    assert close(yax.eval_mox(new, state, *args), real(hand, *args))
    assert yax.query('count(//activation[@name="relu"])', new) == 2.0
    assert yax.query('count(//activation[@name="gelu"])', mox) == 2.0  # the original is untouched
    c = yax.compare(mox, new, state, *args)
    assert c.first_divergence == "Transformer/blocks/0/gelu" and not c.allclose


def test_sub_lora_returns_the_new_state_and_graphdef(traced):
    model, args, _, mox = traced("transformer")
    _, state = nnx.split(model)
    before = jax.tree.map(lambda x: x, state)
    new, new_state = yax.sub(FC, lora_for, mox, params=state)
    assert close(state, before)  # inputs untouched
    lora = [n for n in new.modules() if n.kind == "module_call" and n.type == "LoRALinear"]
    assert [n.path for n in lora] == ["Transformer/blocks/0/fc1", "Transformer/blocks/0/fc2",
                                      "Transformer/blocks/1/fc1", "Transformer/blocks/1/fc2"]
    fc1 = new_state["blocks"][0]["fc1"]
    leaf = lambda v: jax.tree.leaves(v)[0]  # noqa: E731
    assert leaf(fc1["kernel"]) is leaf(state["blocks"][0]["fc1"]["kernel"])  # kept, the very same array
    assert fc1["lora"]["lora_a"][...].shape == (32, 4) and isinstance(fc1["lora"]["lora_a"], nnx.LoRAParam)
    # the graphdef and state are the rewritten model
    rewritten = nnx.merge(new.graphdef, new_state)
    assert type(rewritten.blocks[1].fc2) is nnx.LoRALinear and type(rewritten.blocks[0].norm1) is nnx.LayerNorm
    assert close(yax.eval_mox(new, new_state, *args), real(rewritten, *args))
    # lora_b starts at zero: same outputs as before; a trained adapter changes them like the real model
    assert yax.compare(mox, new, state, *args, new_params=new_state).allclose
    trained = jax.tree.map(lambda x: x, new_state)
    trained["blocks"][0]["fc1"]["lora"]["lora_b"][...] = jnp.full((4, 64), 0.05)
    out, _ = yax.eval_mox(new, trained, *args)
    assert close(out, real(nnx.merge(new.graphdef, trained), *args)[0])
    assert not np.allclose(out, real(model, *args)[0])
    # gradients reach the adapters, as in the real rewritten model
    g = jax.grad(lambda s: jnp.sum(yax.eval_mox(new, s, *args)[0] ** 2), allow_int=True)(trained)
    g_real = nnx.grad(lambda m: jnp.sum(m(*args) ** 2))(nnx.merge(new.graphdef, trained))
    assert np.allclose(g["blocks"][0]["fc1"]["lora"]["lora_a"][...],
                       nnx.state(g_real)["blocks"][0]["fc1"]["lora"]["lora_a"][...], atol=1e-4)
    c = yax.compare(mox, new, state, *args, new_params=trained)
    assert c.first_divergence == "Transformer/blocks/0/fc1"


def test_sub_threads_state_updates_of_the_replacement(traced):
    model, args, _, mox = traced("cnn_train")
    _, state = nnx.split(model)
    bn = nnx.BatchNorm(8, momentum=0.5, rngs=nnx.Rngs(3))
    new, new_state = yax.sub('//module_call[@type="BatchNorm"]', bn, mox, params=state)
    rewritten = nnx.merge(new.graphdef, new_state)
    assert rewritten.bn.momentum == 0.5
    out, after = yax.eval_mox(new, new_state, *args)
    want_out, want = real(rewritten, *args)
    assert close(out, want_out) and close(after, want)
    assert not np.allclose(after["bn"]["mean"][...], new_state["bn"]["mean"][...])


def test_sub_removes_dropout_for_inference(traced):
    model, args, _, mox = traced("transformer_dropout")
    _, state = nnx.split(model)
    new, _ = yax.sub('//module_call[@type="Dropout"]', lambda x: x, mox, params=state)
    off = nnx.clone(model)
    off.eval()
    assert np.allclose(yax.eval_mox(new, state, *args)[0], off(*args), atol=1e-5)


def test_sub_refusals_leave_inputs_untouched(traced):
    model, args, _, mox = traced("transformer")
    _, state = nnx.split(model)
    text, before = str(mox), jax.tree.map(lambda x: x, state)
    with pytest.raises(yax.errors.DoesNotFit) as e:
        yax.sub('//module_call[@path="Transformer/blocks/0/fc1"]', nnx.Linear(32, 16, rngs=nnx.Rngs(0)), mox,
                params=state)
    assert (e.value.index, e.value.found, e.value.expected) == (0, "f32[2,8,16]", "f32[2,8,64]")
    with pytest.raises(yax.errors.NeedsParams) as e:
        yax.sub(FC, lora_for, mox)
    assert e.value.tool == "sub"
    with pytest.raises(yax.errors.WrongNodeKind) as e:
        yax.sub('//activation[@name="gelu"]', nnx.Linear(64, 64, rngs=nnx.Rngs(0)), mox, params=state)
    assert e.value.node.kind == "activation" and e.value.accepts == "can replace module calls"
    _, _, _, shared = traced("shared")
    _, sstate = nnx.split(NNX_CASES["shared"]()[0])
    with pytest.raises(yax.errors.PartlyMatchedModule) as e:
        yax.sub(yax.query('//module_call[@type="Linear"]', shared)[:1], nnx.Linear(5, 5, rngs=nnx.Rngs(1)),
                shared, params=sstate)
    assert (e.value.calls, e.value.matched) == (3, 1)
    _, _, _, scan = traced("transformer_scan")
    scan_text, scan_state = str(scan), nnx.split(NNX_CASES["transformer_scan"]()[0])[1]
    with pytest.raises(yax.errors.NnxCannotReplace) as e:
        yax.sub('//module_call[@type="Linear"][@out_features=64]', lambda path, node: Counting(32, 64), scan,
                params=scan_state)
    assert (e.value.problem, e.value.found) == ("updates", ("count", "scan"))
    assert str(mox) == text and close(state, before) and str(scan) == scan_text
    assert close(scan_state, nnx.split(NNX_CASES["transformer_scan"]()[0])[1])


class Count(nnx.Variable):
    pass


class Counting(nnx.Module):
    """A Linear that counts its calls: a replacement that updates its state."""

    def __init__(self, n_in, n_out):
        self.fc = nnx.Linear(n_in, n_out, rngs=nnx.Rngs(0))
        self.count = Count(jnp.zeros((), jnp.int32))

    def __call__(self, x):
        self.count.value += 1
        return self.fc(x)


def test_sub_inside_jit_vmap_remat(traced):
    """New variables of a replacement called inside `nnx.jit`, `nnx.vmap` and
    `nnx.remat` bodies are passed down to them; the result is the rewritten model."""
    model, args, _, mox = traced("lifted")
    _, state = nnx.split(model)
    new, new_state = yax.sub('//module_call[@type="Linear"]', yax.LoRA(rank=2), mox, params=state)
    assert yax.query('count(//module_call[@type="LoRALinear"])', new) == 3.0
    assert close(yax.eval_mox(new, new_state, *args)[0], model(*args))  # LoRA starts equal
    bumped = jax.tree_util.tree_map_with_path(
        lambda kp, x: x + 0.1 if "lora_b" in jax.tree_util.keystr(kp) else x, new_state)
    want = real(nnx.merge(new.graphdef, bumped), *args)
    assert close(yax.eval_mox(new, bumped, *args), want)
    assert close(jax.jit(lambda s: yax.eval_mox(new, s, *args))(bumped), want)
    assert not close(want[0], model(*args))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["transformer_scan", "transformer_scan_remat"])
def test_lora_in_nnx_scan_trains_and_merges(name, traced):
    """LoRA inside `nnx.scan` (and `nnx.remat` in it): the adapters are stacked
    per layer like the layers' own variables, three optax steps change only
    them and lower the loss, and `merge_lora` folds them back."""
    import optax

    model, (ids,), _, mox = traced(name)
    _, state = nnx.split(model)
    new, new_state = yax.sub('//module_call[@type="Linear"]', yax.LoRA(rank=2), mox, params=state)
    merged_model = nnx.merge(new.graphdef, new_state)
    assert isinstance(merged_model.blocks.fc1, nnx.LoRALinear)  # nnx's, with LoRA's `alpha / rank`
    assert merged_model.blocks.fc1.lora.lora_a.get_value().shape == (3, 32, 2)
    assert close(yax.eval_mox(new, new_state, ids)[0], model(ids))
    lora, rest = nnx.split_state(new_state, nnx.LoRAParam, ...)

    def loss(lo):
        logits = yax.eval_mox(new, nnx.merge_state(lo, rest), ids)[0]
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    opt = optax.adam(1e-2)
    lo, opt_state, first = lora, opt.init(lora), loss(lora)
    for _ in range(3):
        grads = jax.grad(loss)(lo)
        updates, opt_state = opt.update(grads, opt_state, lo)
        lo = optax.apply_updates(lo, updates)
    assert loss(lo) < first
    trained = nnx.merge_state(lo, rest)
    assert close(nnx.split_state(trained, nnx.LoRAParam, ...)[1], rest)  # nothing but the adapters moved
    assert not close(lo, lora)
    out = yax.eval_mox(new, trained, ids)[0]
    assert close(out, nnx.merge(new.graphdef, trained)(ids))
    base, base_state = yax.merge_lora(new, trained)
    assert yax.query('count(//module_call[@type="LoRALinear"])', base) == 0.0
    assert jax.tree.structure(base_state) == jax.tree.structure(state)
    assert close(yax.eval_mox(base, base_state, ids)[0], out, tol=1e-4)
    assert close(nnx.merge(base.graphdef, base_state)(ids), out, tol=1e-4)


def test_sub_shared_module_all_calls_share_the_new_variables(traced):
    model, args, _, mox = traced("shared")
    _, state = nnx.split(model)
    new, new_state = yax.sub('//module_call[@type="Linear"]', lambda path, node: nnx.LoRALinear(
        5, 5, lora_rank=2, rngs=nnx.Rngs(1)), mox, params=state)
    assert len(jax.tree.leaves(new_state)) == 4
    rewritten = nnx.merge(new.graphdef, new_state)
    assert rewritten.layer is rewritten.alias
    assert close(yax.eval_mox(new, new_state, *args), real(rewritten, *args))


# -- replace_modules: surgery on the live object -------------------------------------------

def test_replace_modules_on_a_copy():
    model = Transformer(rngs=rngs())
    before = nnx.split(model)
    seen = []

    def factory(path, module):
        seen.append(path)
        if path.endswith("blocks/1/fc2"):
            return module  # keep this one
        return nnx.LoRALinear(module.in_features, module.out_features, lora_rank=2, rngs=nnx.Rngs(7))

    new = yax.replace_modules(model, FC, factory, IDS)
    assert seen == ["Transformer/blocks/0/fc1", "Transformer/blocks/0/fc2", "Transformer/blocks/1/fc1",
                    "Transformer/blocks/1/fc2"]
    assert type(new.blocks[0].fc1) is nnx.LoRALinear and type(new.blocks[1].fc2) is nnx.Linear
    assert type(model.blocks[0].fc1) is nnx.Linear  # the original is untouched
    after = nnx.split(model)
    assert before[0] == after[0] and close(before[1], after[1])
    assert new.blocks[0].attn is not model.blocks[0].attn  # a copy, not shared with the original
    # the new model is a plain nnx model: it runs, and yax traces it like any other
    mox = yax.make_mox(new)(IDS)
    assert yax.query('count(//module_call[@type="LoRALinear"])', mox) == 3.0
    assert close(yax.eval_mox(mox, nnx.split(new)[1], IDS), real(new, IDS))


def test_replace_modules_instance_shared_and_errors():
    model = Shared(rngs=rngs())
    new = yax.replace_modules(model, '//module_call[@type="Linear"]', nnx.Linear(5, 5, use_bias=False,
                                                                                rngs=nnx.Rngs(2)), jnp.ones((2, 5)))
    assert new.layer is new.alias and new.layer.bias is None and model.layer.bias is not None
    mlp = MLP(rngs=rngs())
    x = jnp.ones((2, 4))
    with pytest.raises(yax.errors.DoesNotFit) as e:
        yax.replace_modules(mlp, '//module_call[@type="Linear"]', nnx.Linear(4, 3, rngs=nnx.Rngs(0)), x)
    assert (e.value.node.path, e.value.index, e.value.found, e.value.expected) == ("MLP/fc1", 0, "f32[2,3]", "f32[2,16]")
    with pytest.raises(yax.errors.NotTraceable) as e:
        yax.replace_modules(mlp, '//module_call[@type="Linear"]', lambda path, m: nnx.Linear(7, 16, rngs=nnx.Rngs(0)),
                            x)
    assert e.value.node.path == "MLP/fc1"
    with pytest.raises(yax.errors.WrongNodeKind) as e:
        yax.replace_modules(mlp, '//activation', nnx.Linear(16, 16, rngs=nnx.Rngs(0)), x)
    assert (e.value.node.kind, e.value.node.name) == ("activation", "relu")
    with pytest.raises(yax.errors.NnxCannotReplace) as e:
        yax.replace_modules(mlp, '//module_call[@type="Linear"]', lambda path, m: jax.nn.relu, x)
    assert (e.value.problem, e.value.node.path) == ("not a module", "MLP/fc1") and e.value.found == "custom_jvp"
    with pytest.raises(yax.errors.NnxCannotReplace) as e:
        scan, args, _ = NNX_CASES["transformer_scan"]()
        yax.replace_modules(scan, '//module_call[@type="Linear"][@out_features=64]',
                            nnx.Linear(32, 64, rngs=nnx.Rngs(0)), *args)
    assert e.value.problem == "stacked" and e.value.node.type == "Linear"
    assert type(mlp.fc1) is nnx.Linear and mlp.fc1.out_features == 16


def test_a_key_holding_a_slash_is_the_name_and_scope():
    """A module under an ``nnx.Dict`` key ``"a/b"``: the node's name is the key, its scope
    the keys down to it, so a query by name finds it and `sub` puts LoRA there."""

    class M(nnx.Module):
        def __init__(self):
            self.heads = nnx.Dict({"a/b": nnx.Linear(4, 3, rngs=nnx.Rngs(0))})

        def __call__(self, x):
            return self.heads["a/b"](x)

    m, x = M(), jnp.ones((2, 4))
    mox = yax.make_mox(m)(x)
    (node,) = yax.query('//module_call[@name="a/b"]', mox)
    assert node.path == "M/heads/a/b" and node.scope == ("heads", "a/b")
    new, state = yax.sub(node, yax.LoRA(rank=2), mox, params=nnx.state(m), key=jax.random.key(1))
    assert state["heads"]["a/b"]["lora"]["lora_b"][...].shape == (2, 3)
    np.testing.assert_allclose(yax.eval_mox(new, state, x)[0], m(x), rtol=1e-6)


def _bridged():
    """An nnx model holding a linen `Dense` through Flax's `ToNNX` bridge, initialised, and its input."""
    import flax.linen as nn
    from flax.nnx import bridge

    x = jnp.linspace(-1, 1, 6).reshape(2, 3)

    class Outer(nnx.Module):
        def __init__(self, rngs):
            self.dense = bridge.ToNNX(nn.Dense(4), rngs=rngs)
            self.lin = nnx.Linear(4, 2, rngs=rngs)

        def __call__(self, x):
            return self.lin(nnx.relu(self.dense(x)))

    model = Outer(nnx.Rngs(0))
    bridge.lazy_init(model.dense, x)
    return model, x


def test_flax_bridge_models_trace_evaluate_query_and_rewrite():
    """Flax's own bridge: a linen module inside nnx (`ToNNX`, nested and at the root) and an nnx
    module inside linen (`ToLinen`). The path stamp never reaches what the bridge reads as
    variables (it failed with "Cannot infer collection name from value: (1, 'Outer/dense', ...)")."""
    import flax.linen as nn
    from flax.nnx import bridge

    model, x = _bridged()
    mox = yax.make_mox(model)(x)
    _, state = nnx.split(model)
    out, _ = yax.eval_mox(mox, state, x)
    np.testing.assert_allclose(out, model(x), rtol=1e-6)
    assert [n.path for n in yax.query('//module_call[@type="Dense"]', mox)] == ["Outer/dense/Dense"]
    new, new_state = yax.sub("//activation", jax.nn.gelu, mox, params=state)
    kernel, bias = model.dense.kernel[...], model.dense.bias[...]
    want = model.lin(jax.nn.gelu(x @ kernel + bias))  # the hand-written model with GELU
    np.testing.assert_allclose(yax.eval_mox(new, new_state, x)[0], want, rtol=1e-5, atol=1e-6)
    assert not any(k.startswith("_pytree__yax") for k in vars(model.dense))  # the stamp is gone after

    root = bridge.ToNNX(nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)]), rngs=nnx.Rngs(1))
    bridge.lazy_init(root, x)
    rmox = yax.make_mox(root)(x)
    np.testing.assert_allclose(yax.eval_mox(rmox, nnx.split(root)[1], x)[0], root(x), rtol=1e-6)
    assert len(yax.query('//module_call[@type="Dense"]', rmox)) == 2

    class Linen(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(2)(nn.relu(bridge.ToLinen(nnx.Linear, args=(3, 4))(x)))

    m = Linen()
    v = m.init(jax.random.key(0), x)
    lmox = yax.make_mox(m.apply)(v, x)
    np.testing.assert_allclose(yax.eval_mox(lmox, v, x), m.apply(v, x), rtol=1e-6)
    assert [n.type for n in yax.query('//module_call[@type="Linear"]', lmox)] == ["Linear"]
    # Flax's own helper inside the bridge's call is part of that call, not a row of its own (issue 41)
    assert yax.query("count(//method_call)", lmox) == 0.0 and "_update_variables" not in yax.summary(lmox)


def test_flax_bridge_models_open_in_the_explorer_and_bridge_modules_are_replacements():
    """The explorer on a model holding `ToNNX`, a swap made in it; `ToNNX` replacing an nnx
    layer and `ToLinen` replacing a linen one (each keeps the layer's weights: same names, shapes)."""
    import flax.linen as nn
    from flax.nnx import bridge

    from yax.internal import view
    from yax_widget import Explorer

    model, x = _bridged()
    ex = Explorer(model, x)
    sent = []
    ex.send = lambda content, buffers=None: sent.append(content)
    assert [r[3:5] for r in ex._tree["rows"]] == [["Outer", "Outer"], ["dense", "ToNNX"], ["Dense", "Dense"],
                                                  ["relu", "relu"], ["lin", "Linear"]]
    relu = yax.query("//activation", ex.mox)[0]
    ex._on_msg(ex, {"rid": 1, "type": "substitute", "target": view(ex.mox).ids[id(relu)], "name": "GELU (tanh)"}, [])
    assert sent[-1]["type"] == "ok"
    assert ex._comparison["first_divergence"] == "Outer/relu (now gelu)"
    want = model.lin(jax.nn.gelu(model.dense(x)))
    np.testing.assert_allclose(yax.eval_mox(ex.mox, nnx.state(model), x)[0], want, rtol=1e-5, atol=1e-6)

    mox, state = yax.make_mox(model)(x), nnx.state(model)
    to_nnx = bridge.ToNNX(nn.Dense(2, use_bias=False), rngs=nnx.Rngs(3))
    bridge.lazy_init(to_nnx, jnp.ones((2, 4)))
    new, ns = yax.sub('//module_call[@type="Linear"]', to_nnx, mox, params=state)
    assert [n.type for n in yax.query('//module_call[@name="lin"]', new)] == ["ToNNX"]
    kernel = model.lin.kernel[...]
    np.testing.assert_allclose(yax.eval_mox(new, ns, x)[0], jax.nn.relu(model.dense(x)) @ kernel, rtol=1e-5, atol=1e-6)

    class Linen(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.relu(nn.Dense(4, name="inner")(x))
            return nn.Dense(2, name="head")(h)

    m = Linen()
    v = m.init(jax.random.key(0), x)
    lmox = yax.make_mox(m.apply)(v, x)
    new, nv = yax.sub('//module_call[@name="inner"]', bridge.ToLinen(nnx.Linear, args=(3, 4)), lmox, params=v,
                      key=jax.random.key(2))
    assert [n.type for n in yax.query('//module_call[@name="inner"]', new)] == ["ToLinen"]
    np.testing.assert_allclose(yax.eval_mox(new, nv, x), m.apply(v, x), rtol=1e-6)  # the Dense's weights, kept
    bumped = jax.tree_util.tree_map(lambda a: a + 1.0, nv)
    k, b = bumped["params"]["inner"]["kernel"], bumped["params"]["inner"]["bias"]
    hk, hb = bumped["params"]["head"]["kernel"], bumped["params"]["head"]["bias"]
    np.testing.assert_allclose(yax.eval_mox(new, bumped, x), jax.nn.relu(x @ k + b) @ hk + hb, rtol=1e-5, atol=1e-5)


def test_a_bridge_inside_a_bridge_has_true_paths_and_counts_and_says_what_it_cannot_swap():
    """nnx -> ToNNX(linen module holding a ToLinen(nnx.Linear)): the linen tree's calls nest under
    the bridge that applies it (they were `Outer/ToLinen_0`), the variables ToNNX keeps in a dict
    attribute are counted, and the nnx layer ToLinen builds on each call is refused by name."""
    import flax.linen as nn
    from flax.nnx import bridge

    from yax_widget import Explorer

    x = jnp.linspace(-1, 1, 6).reshape(2, 3)

    class LinenWithNnx(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.relu(bridge.ToLinen(nnx.Linear, args=(3, 4))(x))

    class Outer(nnx.Module):
        def __init__(self, rngs):
            self.inner = bridge.ToNNX(LinenWithNnx(), rngs=rngs)
            self.head = nnx.Linear(4, 2, rngs=rngs)

        def __call__(self, x):
            return self.head(self.inner(x))

    m = Outer(nnx.Rngs(0))
    bridge.lazy_init(m.inner, x)
    mox, state = yax.make_mox(m)(x), nnx.state(m)
    np.testing.assert_allclose(yax.eval_mox(mox, state, x)[0], m(x), rtol=1e-6)
    assert [n.path for n in yax.query("//module_call", mox)] == [
        "Outer", "Outer/inner", "Outer/inner/LinenWithNnx", "Outer/inner/LinenWithNnx/ToLinen_0",
        "Outer/inner/LinenWithNnx/ToLinen_0/Linear", "Outer/head"]
    inner = yax.query('//module_call[@type="ToNNX"]', mox)[0]
    assert (inner.num_params, mox.calls[0].num_params) == (16, 26)  # 3*4+4 inside the bridge, +4*2+2
    gelu, gs = yax.sub("//activation", jax.nn.gelu, mox, params=state)
    k, b = state["inner"]["ToLinen_0"]["kernel"][...], state["inner"]["ToLinen_0"]["bias"][...]
    np.testing.assert_allclose(yax.eval_mox(gelu, gs, x)[0], m.head(jax.nn.gelu(x @ k + b)), rtol=1e-5, atol=1e-6)
    built = '//module_call[@path="Outer/inner/LinenWithNnx/ToLinen_0/Linear"]'
    with pytest.raises(yax.errors.NnxCannotReplace) as e:
        yax.sub(built, nnx.Linear(3, 4, rngs=nnx.Rngs(1)), mox, params=state)
    assert (e.value.problem, e.value.node.path) == ("not held", "Outer/inner/LinenWithNnx/ToLinen_0/Linear")
    node = yax.query(built, mox)[0]
    assert "does not hold as an attribute" in yax.internal.misfit(nnx.Linear(3, 4, rngs=nnx.Rngs(1)), node, mox,
                                                                  params=state)
    half, hs = yax.mixed_precision(mox, {**yax.default_policy, built: None}, params=state)
    assert yax.query('//module_call[@name="head"]/@compute', half) == ["bfloat16"]
    ex = Explorer(m, x)
    assert [r[3] for r in ex._tree["rows"]] == ["Outer", "inner", "LinenWithNnx", "ToLinen_0", "Linear",
                                                "relu", "head"]  # no row for Flax's own `_update_variables`


# -- issue 41 point 7: rewrites of a model that is one layer (`nnx.Linear` traced as the model) ---

def test_a_root_nnx_layer_takes_lora_mixed_precision_and_replace_modules_as_a_root_linen_dense_does():
    import flax.linen as nn

    x = jax.random.normal(jax.random.key(1), (2, 4))
    layer = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    state = nnx.state(layer)
    mox = yax.make_mox(layer)(x)
    dense = nn.Dense(3)  # the same layer in linen, the same weights: the reference
    v = {"params": {"kernel": state["kernel"][...], "bias": state["bias"][...]}}
    lmox = yax.make_mox(dense.apply)(v, x)

    new, ns = yax.sub("//module_call", yax.LoRA(rank=2), mox, params=state)
    assert type(nnx.merge(new.graphdef, ns)).__name__ == "LoRALinear"  # the adapter is the model now
    np.testing.assert_array_equal(yax.eval_mox(new, ns, x)[0], layer(x))
    b = 0.3 * jax.random.normal(jax.random.key(2), ns["lora"]["lora_b"][...].shape)
    ns["lora"]["lora_b"][...] = b
    want = layer(x) + x @ ns["lora"]["lora_a"][...] @ b * (4.0 / 2)  # by hand: alpha / rank
    np.testing.assert_allclose(yax.eval_mox(new, ns, x)[0], want, rtol=1e-5, atol=1e-6)
    merged, ms = yax.merge_lora(new, ns)
    assert type(nnx.merge(merged.graphdef, ms)) is nnx.Linear
    np.testing.assert_allclose(yax.eval_mox(merged, ms, x)[0], want, rtol=1e-5, atol=1e-6)

    half, hs = yax.mixed_precision(mox, params=state)
    lhalf = yax.mixed_precision(lmox)
    assert yax.query("//module_call/@compute", half) == yax.query("//module_call/@compute", lhalf) == ["bfloat16"]
    np.testing.assert_array_equal(yax.eval_mox(half, hs, x)[0], yax.eval_mox(lhalf, v, x))

    general = yax.replace_modules(layer, "//module_call", lambda path, m: nnx.LinearGeneral(4, 3, rngs=nnx.Rngs(5)), x)
    assert type(general) is nnx.LinearGeneral and type(layer) is nnx.Linear  # the original is untouched
