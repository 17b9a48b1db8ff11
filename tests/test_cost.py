"""`yax.cost`: every call's cost in the compiled program, against XLA's own numbers and the
count by hand. The oracle (tests/oracle/test_cost_oracle.py) checks it on generated models."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from models import KEY, ScannedTransformer, Transformer

import yax
from yax.errors import NotARootMox, YaxInputError
from yax.internal import call_keys


def _xla(fn, *args):
    got = jax.jit(fn).lower(*args).compile().cost_analysis()
    return got[0] if isinstance(got, list) else got


def _abstract(tree):
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=getattr(a, "sharding", None)),
                                  tree)


def test_a_dense_costs_two_flops_a_multiply_add_and_one_an_element_of_its_bias():
    m, x = nn.Dense(32), jnp.ones((8, 64))
    v = m.init(KEY, x)
    c = yax.cost(yax.make_mox(m.apply)(v, x), v, x)
    assert c["Dense"].flops == 2 * 8 * 64 * 32 + 8 * 32
    assert c["Dense"].own["transcendentals"] == 0
    # the layer is the whole program: its bytes are all XLA counts (what the fusions read and write)
    assert c["Dense"].bytes_accessed == c.xla["bytes accessed"] >= 4 * (8 * 64 + 64 * 32 + 32 + 8 * 32)
    assert c.counted == {"flops": c.xla["flops"], "transcendentals": c.xla.get("transcendentals", 0.0),
                         "bytes_accessed": c.xla["bytes accessed"]}


@pytest.mark.parametrize("model", ["remat", "scan", "scanned"])
def test_totals_are_xlas_and_a_scanned_layer_counts_every_step(model):
    m = {"remat": Transformer(remat=True), "scan": Transformer(scan=True, num_layers=3),
         "scanned": ScannedTransformer(num_layers=3)}[model]
    ids = jnp.arange(16).reshape(2, 8) % 64
    v = m.init(KEY, ids)
    mox = yax.make_mox(m.apply)(v, ids)
    c = yax.cost(mox, v, ids)
    # the recount by XLA's rules is XLA's count, and the program is the one `jax.jit` compiles
    ref = _xla(m.apply, v, ids)
    assert c.counted["flops"] == c.xla["flops"] == ref["flops"]
    assert c.counted["transcendentals"] == c.xla["transcendentals"] == ref["transcendentals"]
    assert c.counted["bytes_accessed"] == c.xla["bytes accessed"]
    assert not c.unknown
    # a dense layer in a scanned stack runs once a layer: 2·m·n·k + bias, times the layers
    dense = [n for n in yax.query('//module_call[@type="Dense"]', mox) if n.attrs.get("features") == 64]
    keys = {id(n): k for k, n in call_keys(mox).items()}
    runs = 1 if model == "remat" else 3
    for n in dense:
        assert c.calls[keys[id(n)]].own["flops"] == runs * (2 * 16 * 32 * 64 + 16 * 64), n.path
    # every call's total is its own plus its calls'; the root's is every instruction's
    root = c.calls[""]
    attributed = sum(x.own["flops"] for x in c.calls.values()) + c.unattributed.own["flops"]
    assert root.total["flops"] == attributed
    if model != "remat":  # XLA counts a loop body once; yax every step
        assert root.total["flops"] > c.xla["flops"]


def test_abstract_arguments_cost_the_same_and_allocate_nothing():
    m, ids = Transformer(), jnp.arange(16).reshape(2, 8) % 64
    v = m.init(KEY, ids)
    mox = yax.make_mox(m.apply)(v, ids)
    concrete = yax.cost(mox, v, ids)
    abstract = yax.cost(mox, _abstract(v), jax.ShapeDtypeStruct(ids.shape, ids.dtype))
    assert {k: c.total for k, c in abstract.calls.items()} == {k: c.total for k, c in concrete.calls.items()}


def test_what_is_known_only_when_it_runs_says_why_and_is_never_zero():
    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Dense(8, name="first")(x)
            n = jnp.sum(x > 0).astype(jnp.int32)  # a trip count XLA cannot know
            y = jax.lax.fori_loop(0, n, lambda i, h: jnp.tanh(h), x)
            z = jax.lax.cond(x.sum() > 0, jnp.exp, jnp.sin, y)
            return nn.Dense(4, name="last")(z), jax.lax.top_k(z, 2)[0]

    m, x = Net(), jnp.ones((2, 8))
    v = m.init(KEY, x)
    c = yax.cost(yax.make_mox(m.apply)(v, x), v, x)
    assert c["Net/last"].flops == 2 * 2 * 8 * 4 + 2 * 4
    # XLA computes `first`'s bias add again in each fusion that reads it: the compiled program's count
    assert c["Net/first"].flops > 2 * 2 * 8 * 8 + 2 * 8
    net = c["Net"]
    assert net.flops is None and net.why
    table = c.table()
    assert "unknown*" in table and "* " in table
    # a custom call (top_k on CPU): XLA itself does not know its cost (its totals say -1)
    assert [op for _, op in c.unknown] == ["custom-call"] and c.counted is None
    assert "XLA does not know what a `custom-call` costs" in table
    # the view has no number for what is unknown, and says why
    assert [n.path for n in c.query("//module_call[@flops]")] == ["Net/first", "Net/last"]
    assert [n.path for n in c.query("//module_call[@cost_unknown]")] == ["Net"]


def test_summary_shows_the_compiled_columns_and_refuses_another_moxs_cost():
    m, x = nn.Dense(3), jnp.ones((2, 4))
    v = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(v, x)
    c = yax.cost(mox, v, x)
    lines = yax.summary(mox, cost=c).splitlines()
    assert lines[0].split()[-3:] == ["flops", "xla", "bytes"] or "xla flops" in lines[0]
    assert lines[1].split()[-2:] == [f"{2 * 2 * 4 * 3 + 2 * 3}", f"{int(c['Dense'].bytes_accessed)}"]
    other = yax.make_mox(m.apply)(v, x)
    with pytest.raises(YaxInputError):
        yax.summary(other, cost=c)
    with pytest.raises(NotARootMox):
        yax.cost(mox.children[0], v, x)


def _mesh():
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))


class _MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.relu(nn.Dense(64, name="up")(x))
        h = nn.Dense(32, name="down")(h)
        return nn.Dense(32, name="plain")(h)  # replicated: no call alike to compare it with


def _laid_out(v, rule):
    mesh = _mesh()
    specs = jax.tree_util.tree_map_with_path(lambda p, a: rule([getattr(k, "key", "") for k in p], a), v)
    return jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, s)),
                                  v, specs), mesh


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
def test_on_a_mesh_collectives_are_named_by_their_module():
    def rule(names, a):  # Megatron: `up` split by columns, `down` by rows
        if "kernel" in names:
            return P(None, "model") if "up" in names else P("model", None)
        return P("model") if "up" in names else P()

    m, x = _MLP(), jnp.ones((8, 32))
    v = m.init(KEY, x)
    vs, mesh = _laid_out(v, rule)
    xs = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P("data")))
    mox = yax.make_mox(m.apply)(v, x)
    c = yax.cost(mox, vs, xs)
    assert c.devices == 8
    ref = _xla(m.apply, vs, xs)
    assert c.counted["flops"] == c.xla["flops"] == ref["flops"] and c.agrees
    # per device: 4 rows of the batch, a quarter of `up`'s features
    assert c["_MLP/up"].flops == 2 * 4 * 32 * 16 + 4 * 16
    # the row-parallel `down` sums its partial products over `model`
    (ar,) = c["_MLP/down"].collectives
    assert ar.kind.startswith("all-reduce") and ar.runs == 1 and ar.bytes == 4 * 4 * 32
    assert ar.groups == "{{0,1,2,3},{4,5,6,7}}"
    assert c["_MLP/down"].total["collective_bytes"] == 4 * 4 * 32
    assert c["_MLP/up"].parameters == {"kernel": "P(None,'model')", "bias": "P('model')"}
    assert c["_MLP/plain"].parameters == {"kernel": "P('model',None)", "bias": "P()"}
    got = {n.path for n in c.query("//module_call[@collectives > 0]")}
    assert "_MLP/down" in got and got == {cc.path for cc in c.calls.values() if cc.collectives}
    assert not c.replicated  # `plain` has no calls alike to compare with


class _Blocks(nn.Module):
    @nn.compact
    def __call__(self, x):
        for i in range(3):
            h = nn.Dense(64, name=f"up_{i}")(x)
            x = x + nn.Dense(32, name=f"down_{i}")(nn.relu(h))
        return x


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
def test_a_layer_left_out_of_the_sharding_rule_is_named():
    def rule(names, a):
        if "up_1" in names:
            return P()  # the layer a sharding rule forgot
        if "kernel" in names:
            return P(None, "model") if any(n.startswith("up") for n in names) else P("model", None)
        return P()

    m, x = _Blocks(), jnp.ones((8, 32))
    v = m.init(KEY, x)
    vs, mesh = _laid_out(v, rule)
    xs = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P("data")))
    c = yax.cost(yax.make_mox(m.apply)(v, x), vs, xs)
    (r,) = c.replicated
    assert (r.path, r.name, r.axes, r.bytes, r.split) == ("_Blocks/up_1", "kernel", ("model",), 32 * 64 * 4, 32 * 16 * 4)
    assert r.peers == ("_Blocks/up_0", "_Blocks/up_2") and not r.gathered
    assert "`_Blocks/up_1`: its parameter `kernel` is laid out P(), held whole along `model`" in c.table()


class _Gathering(nn.Module):
    """A layer whose code asks for its whole kernel on every device (a sharding constraint
    left from a debugging session): XLA all-gathers the kernel every run."""

    @nn.compact
    def __call__(self, x):
        k = self.param("kernel", nn.initializers.lecun_normal(), (x.shape[-1], 16))
        k = jax.lax.with_sharding_constraint(k, NamedSharding(_mesh(), P()))
        return nn.Dense(16, name="next")(x @ k)


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (tests/conftest.py sets XLA_FLAGS)")
def test_a_parameter_gathered_whole_every_run_is_named():
    m, x = _Gathering(), jnp.ones((8, 32))
    v = m.init(KEY, x)
    vs, mesh = _laid_out(v, lambda names, a: P(None, "model") if len(a.shape) == 2 else P())
    xs = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P("data")))
    c = yax.cost(yax.make_mox(m.apply)(v, x), vs, xs)
    (g,) = [r for r in c.replicated if r.gathered]
    assert (g.path, g.name, g.split) == ("_Gathering", "kernel", 32 * 16 * 4), c.table()
    assert any(x.kind.startswith("all-gather") and x.shape == (32, 16) for x in c["_Gathering"].collectives)
    assert "all-gathers the whole of its parameter `kernel`" in c.table()


def test_layers_unrolled_get_a_note_and_each_call_counts_its_equations():
    class Deep(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(5):
                x = nn.Dense(8)(x)
            return x

    m, x = Deep(), jnp.ones((2, 8))
    v = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(v, x)
    c = yax.cost(mox, v, x)
    assert c.unrolled == [("Deep/Dense_0", "Deep/Dense_4", 5)]
    assert "5 identical calls, unrolled: XLA compiles each one; a scan over them" in c.table()
    dense = yax.query('//module_call[@path="Deep/Dense_0"]', mox)[0]
    assert c["Deep/Dense_0"].equations == sum(isinstance(n, yax.Equation) for n in dense.walk()) > 0
    # how long make_mox took to trace each call: the calls inside it are part of it
    deep = c["Deep"]
    assert deep.trace_seconds is not None and 0 < c["Deep/Dense_0"].trace_seconds <= deep.trace_seconds
    assert sum(c[f"Deep/Dense_{i}"].trace_seconds for i in range(5)) <= deep.trace_seconds
    assert c.calls[""].equations == sum(isinstance(n, yax.Equation) for n in mox.walk())
    # the program's memory as XLA states it (per module it is not attributed, and the table says so)
    assert c.memory["argument"] == 5 * (8 * 8 + 8) * 4 + 2 * 8 * 4 and c.memory["output"] == 2 * 8 * 4
    assert "not attributed (XLA's buffer assignment is not public)" in c.table()
    scanned = Transformer(scan=True, num_layers=4)
    ids = jnp.arange(16).reshape(2, 8) % 64
    sv = scanned.init(KEY, ids)
    assert not yax.cost(yax.make_mox(scanned.apply)(sv, ids), sv, ids).unrolled  # a scan: nothing to say


_CACHED = '''
import jax, jax.numpy as jnp, flax.linen as nn, yax

class Inner(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.relu(nn.Dense(8, name="d")(x))

class Wrapped(nn.Module):  # the same program as Flat, its calls numbered otherwise
    @nn.compact
    def __call__(self, x):
        return Inner(name="inner")(x)

class Flat(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.relu(nn.Dense(8, name="d")(x))

x = jnp.ones((2, 8))
for m in (Wrapped(), Flat()):
    v = m.init(jax.random.key(0), x)
    c = yax.cost(yax.make_mox(m.apply)(v, x), v, x)
    print({cc.path: cc.own["flops"] for cc in c.calls.values()})
'''


def test_a_persistent_compilation_cache_does_not_mix_up_the_modules(tmp_path):
    """JAX's persistent cache keys a program without its metadata: a program cached under the
    same name with its calls numbered otherwise came back naming the wrong calls (everything fell
    to the root). Run in a fresh interpreter: the cache is chosen at the first compile."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}
    out = subprocess.run([sys.executable, "-c", _CACHED], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    wrapped, flat = (eval(line) for line in out.stdout.strip().splitlines()[-2:])
    assert wrapped["Wrapped/inner/d"] == flat["Flat/d"] == 2 * 2 * 8 * 8 + 2 * 8
    assert wrapped["Wrapped/inner/relu"] == flat["Flat/relu"] == 2 * 8
    assert flat[""] == wrapped[""] == 0
