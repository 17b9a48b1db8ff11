"""make_mox + eval_mox against the real thing, for every test model."""

import collections
import gc
import re
import weakref

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import CASES, MLP, Transformer

import yax

pytestmark = pytest.mark.core


def close(a, b, tol=1e-5):
    return jax.tree.all(jax.tree.map(lambda x, y: np.allclose(x, y, rtol=tol, atol=tol), a, b))


def same_structure(a, b):
    return jax.tree.structure(a) == jax.tree.structure(b)


@pytest.fixture(scope="module")
def traced():
    cache = {}

    def get(name):
        if name not in cache:
            fn, args, kwargs = CASES[name]()
            cache[name] = (fn, args, kwargs, yax.make_mox(fn)(*args, **kwargs))
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(CASES))
def test_eval_matches_original(name, traced):
    fn, args, kwargs, mox = traced(name)
    want = fn(*args, **kwargs)
    got = yax.eval_mox(mox, *args, **kwargs)
    assert same_structure(want, got)
    assert close(want, got)


@pytest.mark.parametrize("name", sorted(CASES))
def test_jit_eval_matches_original(name, traced):
    fn, args, kwargs, mox = traced(name)
    want = fn(*args, **kwargs)
    got = jax.jit(lambda *a: yax.eval_mox(mox, *a, **kwargs))(*args)
    assert close(want, got)


def _float_loss(out):
    return sum(jnp.sum(x.astype(jnp.float32) ** 2) for x in jax.tree.leaves(out)
               if jnp.issubdtype(x.dtype, jnp.floating))


@pytest.mark.parametrize("name", sorted(set(CASES) - {"plain_fn"}))
def test_grad_matches_original(name, traced):
    fn, args, kwargs, mox = traced(name)
    if name == "control_flow":  # while_loop is forward-differentiable only, in JAX itself
        tangent = jax.tree.map(jnp.ones_like, args[0])

        def diff(f):
            return jax.jvp(lambda a0: _float_loss(f(a0, *args[1:], **kwargs)), (args[0],), (tangent,))[1]
    else:
        def diff(f):
            return jax.grad(lambda a0: _float_loss(f(a0, *args[1:], **kwargs)))(args[0])
    want = diff(fn)
    got = diff(lambda *a, **k: yax.eval_mox(mox, *a, **k))
    assert close(want, got, tol=1e-4)  # float32 sums of large gradients


def test_vmap_of_eval():
    m, x = MLP(), jnp.ones((2, 4))
    v = m.init(jax.random.key(0), x)
    mox = yax.make_mox(m.apply)(v, x)
    xs = jax.random.normal(jax.random.key(1), (5, 2, 4))
    want = jax.vmap(lambda x: m.apply(v, x))(xs)
    got = jax.vmap(lambda x: yax.eval_mox(mox, v, x))(xs)
    assert close(want, got)


def test_tree_mirrors_modules(traced):
    *_, mox = traced("transformer")
    calls = [(m.kind, m.path, m.method) for m in mox.modules()]
    assert calls[0] == ("module_call", "Transformer", "__call__")
    assert ("module_call", "Transformer/Block_1/SelfAttention_0/query", "__call__") in calls
    # private helpers are their own, clearly marked calls on the same path
    assert calls.count(("method_call", "Transformer/Block_0/SelfAttention_0", "_split_heads")) == 3
    # tied embeddings: the same module called with a second method
    assert ("module_call", "Transformer/embed", "attend") in calls
    gelus = [m for m in mox.modules() if m.kind == "activation" and m.name == "gelu"]
    assert [g.path for g in gelus] == ["Transformer/Block_0/gelu", "Transformer/Block_1/gelu"]
    softmax = [m for m in mox.modules() if m.name == "softmax"]
    assert softmax[0].attrs == {"axis": -1}
    dense = next(m for m in mox.modules() if m.path == "Transformer/Block_0/Dense_0")
    assert dense.type == "Dense" and dense.attrs["features"] == 64
    assert dense.num_params == 32 * 64 + 64
    assert dense.in_shapes == [(2, 8, 32)] and dense.out_shapes == [(2, 8, 64)]
    assert dense.out_dtypes == [jnp.float32]
    assert not dense.is_ephemeral and mox.is_ephemeral
    assert mox.calls[0].num_params == sum(x.size for x in jax.tree.leaves(traced("transformer")[1][0]))


def test_scan_shows_one_node_with_body_calls(traced):
    *_, mox = traced("transformer_scan")
    scans = [n for n in mox.walk() if isinstance(n, yax.Equation) and n.name == "scan"]
    assert len(scans) == 1 and scans[0].params["length"] == 3
    (_, body), = scans[0].subs
    body_paths = [m.path for m in body.modules()]
    assert body_paths[:2] == ["Transformer/layers", "Transformer/layers/Block_0"]
    # the body's module is one layer; its parameters are one slice of the stack
    assert body.calls[0].num_params == 8544


def test_remat_vmap_jit_lifted(traced):
    *_, mox = traced("lifted")
    paths = {m.path: m for m in mox.modules()}
    assert {"Lifted/JitDense_0", "Lifted/VmapDense_0", "Lifted/CheckpointDense_0"} <= set(paths)
    prims = collections.Counter(n.name for n in mox.walk() if isinstance(n, yax.Equation))
    assert prims["jit"] >= 1 and prims["remat2"] + prims.get("checkpoint", 0) >= 1
    assert not prims["optimization_barrier"]  # markers never reach the MoX
    *_, rm = traced("transformer_remat")
    assert any(m.path == "Transformer/CheckpointBlock_0/Dense_0" for m in rm.modules())


def test_shared_module_called_twice_has_two_call_nodes(traced):
    fn, args, _, mox = traced("shared")
    calls = [m for m in mox.modules() if m.path == "Shared/shared"]
    assert len(calls) == 3 and len({id(c) for c in calls}) == 3
    assert all(c.num_params == 30 for c in calls)
    assert len(jax.tree.leaves(args[0])) == 2  # one set of parameters


def test_methods_setup_sequential(traced):
    *_, mox = traced("method")
    assert [m.path for m in mox.modules()] == ["SetupMLP", "SetupMLP/dense1"]
    assert mox.calls[0].method == "encode"
    *_, seq = traced("sequential")
    assert [(m.kind, m.name) for m in seq.modules()] == [
        ("module_call", "Sequential"), ("module_call", "layers_0"), ("activation", "relu"),
        ("module_call", "layers_2")]
    *_, two = traced("two_methods")
    assert [(m.kind, m.method) for m in two.modules()] == [
        ("module_call", "__call__"), ("method_call", "encode"), ("module_call", "__call__"),
        ("method_call", "decode"), ("module_call", "__call__")]


def test_batchnorm_train_returns_updated_state(traced):
    fn, args, kwargs, mox = traced("cnn_train")
    out, state = yax.eval_mox(mox, *args, **kwargs)
    want_out, want_state = fn(*args, **kwargs)
    assert set(state) == {"batch_stats"}
    assert close(state, want_state)
    assert not close(state["batch_stats"], args[0]["batch_stats"])  # really updated


def test_sow_and_rngs(traced):
    fn, args, kwargs, mox = traced("sow")
    _, inter = yax.eval_mox(mox, *args, **kwargs)
    assert inter["intermediates"]["h"][0].shape == (2, 6)
    fn, args, kwargs, mox = traced("rngs")
    a = yax.eval_mox(mox, *args, **kwargs)
    b = yax.eval_mox(mox, *args, rngs={"dropout": jax.random.key(7), "noise": jax.random.key(2)})
    assert not np.allclose(a, b)  # the key really flows in
    assert close(b, fn(*args, rngs={"dropout": jax.random.key(7), "noise": jax.random.key(2)}))


def test_custom_derivatives_and_control_flow_are_kept(traced):
    *_, mox = traced("control_flow")
    prims = {n.name for n in mox.walk() if isinstance(n, yax.Equation)}
    assert {"cond", "while", "scan", "custom_jvp_call"} <= prims
    *_, mox = traced("custom_grads")
    prims = {n.name for n in mox.walk() if isinstance(n, yax.Equation)}
    assert "custom_vjp_call" in prims or "custom_vjp_call_jaxpr" in prims
    assert [n.name for n in mox.modules() if n.kind == "activation"] == ["relu", "gelu"]


def test_tracing_is_abstract():
    m = Transformer(num_layers=1)
    ids = jax.ShapeDtypeStruct((2, 8), jnp.int32)
    variables = jax.eval_shape(lambda: m.init(jax.random.key(0), jnp.zeros((2, 8), jnp.int32)))
    mox = yax.make_mox(m.apply)(variables, ids)
    assert mox.outputs[0].shape == (2, 8, 64)
    # and the MoX then runs on real values
    v = m.init(jax.random.key(0), jnp.zeros((2, 8), jnp.int32))
    real = jnp.ones((2, 8), jnp.int32)
    assert close(yax.eval_mox(mox, v, real), m.apply(v, real))


def test_unbound_module_means_apply():
    m, x = MLP(), jnp.ones((2, 4))
    v = m.init(jax.random.key(0), x)
    assert close(yax.eval_mox(yax.make_mox(m)(v, x), v, x), m.apply(v, x))


def test_nothing_left_patched_after_trace_or_failure():
    import flax.linen as fnn

    before = (jax.nn.gelu, fnn.gelu, fnn.relu, jax.nn.softmax)

    class Boom(nn.Module):
        act: object = nn.gelu

        @nn.compact
        def __call__(self, x):
            self.act(nn.Dense(3)(x))
            raise ValueError("boom")

    x = jnp.ones((1, 2))
    v = MLP().init(jax.random.key(0), x)
    yax.make_mox(MLP().apply)(v, x)
    with pytest.raises(yax.errors.CouldNotTrace) as e:
        yax.make_mox(Boom().apply)({"params": {"Dense_0": {"kernel": jnp.ones((2, 3)), "bias": jnp.ones(3)}}}, x)
    assert type(e.value.error) is ValueError and e.value.error.args == ("boom",)
    assert (jax.nn.gelu, fnn.gelu, fnn.relu, jax.nn.softmax) == before
    assert Boom.act is nn.gelu
    # and plain Flax still works without markers
    assert "optimization_barrier" not in str(jax.make_jaxpr(MLP().apply)(v, x))


def test_activation_held_in_a_field_is_a_node():
    class Act(nn.Module):
        act: object = nn.gelu

        @nn.compact
        def __call__(self, x):
            return self.act(nn.Dense(3)(x))

    m, x = Act(), jnp.ones((1, 2))
    v = m.init(jax.random.key(0), x)
    mox = yax.make_mox(m.apply)(v, x)
    assert [n.name for n in mox.modules() if n.kind == "activation"] == ["gelu"]
    assert close(yax.eval_mox(mox, v, x), m.apply(v, x))


def test_jitted_eval_compiles_to_the_same_hlo(traced):
    fn, args, kwargs, mox = traced("transformer")

    def ops(f):
        text = jax.jit(f).lower(*args).compile().as_text()
        return collections.Counter(re.findall(r"= \S+ (\w[\w-]*)\(", text))

    assert ops(lambda *a: yax.eval_mox(mox, *a, **kwargs)) == ops(lambda *a: fn(*a, **kwargs))


def test_equal_constants_are_held_once():
    """Per-layer constant tables (Hugging Face Llama's rotary sin/cos) are held
    once, numpy tables and jax arrays alike; tables that differ in one byte,
    or in the sign of a zero, stay apart."""

    def table(flip=False, neg_zero=False):
        t = np.sin(np.arange(4096, dtype=np.float32) / 7).reshape(64, 64)
        if flip:
            t[-1, -1] += 1
        if neg_zero:
            t[0, 0] = -0.0
        return t

    on_device = [jax.device_put(table() * 2) for _ in range(6)]  # equal jax arrays, distinct objects

    class Layer(nn.Module):
        i: int
        flip: bool = False
        neg_zero: bool = False

        @nn.compact
        def __call__(self, x):
            return nn.Dense(64)(x) * table(self.flip, self.neg_zero) + on_device[self.i]

    class Stack(nn.Module):
        @nn.compact
        def __call__(self, x):
            for i in range(4):
                x = Layer(i)(x)
            x = Layer(4, flip=True)(x)
            return Layer(5, neg_zero=True)(x)

    m, x = Stack(), jnp.ones((64, 64))
    v = m.init(jax.random.key(0), x)
    mox = yax.make_mox(m.apply)(v, x)
    closed = jax.make_jaxpr(m.apply)(v, x)
    assert len(closed.consts) == len(mox.consts) == 12  # every constant keeps its variable
    assert len({id(c) for c in closed.consts}) == 12
    # the numpy table, the flipped one, the -0.0 one, and the jax array
    assert len({id(c) for c in mox.consts}) == 4
    assert sum(isinstance(c, jax.Array) for c in {id(c): c for c in mox.consts}.values()) == 1
    flipped = [c for c in mox.consts if np.asarray(c)[-1, -1] == table(flip=True)[-1, -1]]
    assert len(flipped) == 1
    assert close(yax.eval_mox(mox, v, x), m.apply(v, x), tol=0)
    assert close(jax.jit(lambda *a: yax.eval_mox(mox, *a))(v, x), m.apply(v, x), tol=1e-6)



class _Tally:
    """Calls made, and the count of calls made each time a cycle was freed."""

    def __init__(self):
        self.made, self.freed = 0, []


class _Litter(nn.Module):
    """Each call leaves a reference cycle behind, which only the cyclic
    collector frees."""

    tally: _Tally

    @nn.compact
    def __call__(self, x):
        class Node:
            pass

        n, tally = Node(), self.tally
        n.me = n
        weakref.finalize(n, lambda: tally.freed.append(tally.made))
        tally.made += 1
        return nn.Dense(4)(x)


class _Litterbox(nn.Module):
    tally: _Tally

    @nn.compact
    def __call__(self, x):
        for _ in range(40):
            x = _Litter(self.tally)(x)
        return x


def _litter_trace():
    tally = _Tally()
    m = _Litterbox(tally)
    x = jnp.ones((2, 4))
    variables = m.init(jax.random.key(0), x)
    gc.collect()
    tally.made, tally.freed = 0, []
    return m, variables, x, tally


def test_trace_pauses_the_collector_and_leaves_it_as_found():
    m, variables, x, tally = _litter_trace()
    assert gc.isenabled()
    mox = yax.make_mox(m.apply)(variables, x)
    assert gc.isenabled()
    assert all(n == 40 for n in tally.freed), f"collected during the trace, after call {min(tally.freed)}"
    gc.collect()
    assert len(tally.freed) == 40 and len(list(mox.modules())) == 81

    gc.disable()  # paused by the caller: stays paused, also after a failed trace
    try:
        yax.make_mox(m.apply)(variables, x)
        assert not gc.isenabled()
        with pytest.raises(yax.YaxTraceError):
            yax.make_mox(m.apply)(variables, jnp.ones((2, 5)))
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(yax.YaxTraceError):
        yax.make_mox(m.apply)(variables, jnp.ones((2, 5)))
    assert gc.isenabled()


def test_paused_trace_collects_past_the_young_limit(monkeypatch):
    """What a paused trace leaves waiting is bounded: past the limit, the young
    generation is collected on the way, and the cycles of earlier calls go."""
    import yax._trace

    m, variables, x, tally = _litter_trace()
    monkeypatch.setattr(yax._trace, "_YOUNG_LIMIT", 2000)
    yax.make_mox(m.apply)(variables, x)
    assert tally.freed and min(tally.freed) < 40
