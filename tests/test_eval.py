"""eval_mox input checks, errors, and sharding; to_function under jit and jax.export."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import DENSE_MLP, traced
from models import KEY, MLP

import yax

pytestmark = pytest.mark.core


@pytest.fixture(scope="module")
def mlp():
    m, x = MLP(), jnp.ones((2, 4))
    v = m.init(jax.random.key(0), x)
    return m, v, x, yax.make_mox(m.apply)(v, x)


def test_wrong_shape_names_the_argument(mlp):
    m, v, x, mox = mlp
    with pytest.raises(yax.errors.InputsDiffer) as e:
        yax.eval_mox(mox, v, jnp.ones((3, 4)))
    assert (e.value.argument, e.value.kind, e.value.expected, e.value.found) == ("args[1]", "type", "f32[2,4]", "f32[3,4]")


def test_wrong_dtype_names_the_argument(mlp):
    m, v, x, mox = mlp
    with pytest.raises(yax.errors.InputsDiffer) as e:
        bad = jax.tree.map(lambda a: a, v)
        bad["params"]["Dense_0"]["bias"] = jnp.zeros(16, jnp.int32)
        yax.eval_mox(mox, bad, x)
    assert e.value.argument == "args[0]['params']['Dense_0']['bias']"
    assert (e.value.expected, e.value.found) == ("f32[16]", "i32[16]")


def test_numpy_float64_and_int64_are_taken_as_jax_jit_takes_them(mlp):
    """With x64 off, `jax.jit` computes a NumPy float64 argument in float32 (and int64 in int32);
    `eval_mox` takes what the traced function takes, and refuses only what differs after that."""
    m, v, x, mox = mlp
    v64 = jax.tree.map(lambda a: np.asarray(a, np.float64), v)
    x64 = np.asarray(x, np.float64)
    want = jax.jit(m.apply)(v64, x64)
    got = yax.eval_mox(mox, v64, x64)
    assert got.dtype == want.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(jax.jit(yax.to_function(mox))(v64, x64)), np.asarray(want))
    ids = yax.make_mox(lambda i: jnp.take(jnp.arange(10.0), i))(jnp.arange(3))
    assert float(yax.eval_mox(ids, np.arange(3, dtype=np.int64))[2]) == 2.0
    with pytest.raises(yax.errors.InputsDiffer) as e:
        yax.eval_mox(mox, v, x.astype(jnp.float16))  # a real change of dtype stays refused
    assert (e.value.expected, e.value.found) == ("f32[2,4]", "f16[2,4]")


def test_an_nnx_state_holding_a_numpy_float64_buffer():
    from flax import nnx

    class Scaled(nnx.Module):
        def __init__(self):
            self.lin = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
            self.scale = nnx.Variable(2.0 * np.ones((2,)))  # NumPy float64, as `nnx.split` hands it over

        def __call__(self, x):
            return self.lin(x) * self.scale[...]

    model, x = Scaled(), np.ones((1, 3))
    graphdef, state = nnx.split(model)
    mox = yax.make_mox(model)(x)
    out, _ = yax.eval_mox(mox, state, x)
    want = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))(state, x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))


def test_wrong_structure(mlp):
    m, v, x, mox = mlp
    with pytest.raises(yax.errors.InputsDiffer) as e:
        yax.eval_mox(mox, v, x, x)
    assert (e.value.argument, e.value.kind) == ("args", "structure")
    assert e.value.found == "3 elements were passed where 2 were traced"


def test_static_argument_changed():
    mox = yax.make_mox(lambda x, *, train: x * (2 if train else 3))(jnp.ones(2), train=True)
    assert (yax.eval_mox(mox, jnp.ones(2), train=True) == 2).all()
    with pytest.raises(yax.errors.InputsDiffer) as e:
        yax.eval_mox(mox, jnp.ones(2), train=False)
    assert (e.value.argument, e.value.kind, e.value.expected, e.value.found) == ("kwargs['train']", "static", True, False)


def test_non_array_where_array_was_traced(mlp):
    m, v, x, mox = mlp
    with pytest.raises(yax.errors.InputsDiffer) as e:
        yax.eval_mox(mox, v, "x")
    assert e.value.argument == "args[1]" and e.value.kind in ("structure", "not an array")


def test_eval_needs_the_root(mlp):
    *_, mox = mlp
    with pytest.raises(yax.errors.NotARootMox) as e:
        yax.eval_mox(mox.calls[0], jnp.ones((2, 4)))
    assert e.value.tool == "eval_mox" and e.value.found == "a `module_call` node"


def test_make_mox_errors():
    with pytest.raises(yax.errors.WrongType) as e:
        yax.make_mox(3)
    assert (e.value.argument, e.value.found) == ("fn", "int")
    with pytest.raises(yax.errors.CouldNotTrace) as e:
        yax.make_mox(lambda x: x.reshape(7))(jnp.ones(3))
    assert e.value.__cause__ is e.value.error and isinstance(e.value.error, TypeError) and not e.value.static


def test_original_mox_unchanged_by_eval(mlp):
    *_, mox = mlp
    before = str(mox)
    yax.eval_mox(mox, mlp[1], mlp[2])
    assert str(mox) == before


SHARDING = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import yax
    from models import MLP
    assert len(jax.devices()) == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
    m = MLP()
    x = jnp.arange(8 * 16 * 4, dtype=jnp.float32).reshape(8 * 16, 4) / 100
    v = m.init(jax.random.key(0), x)
    xs = jax.device_put(x, NamedSharding(mesh, P("data", None)))
    mox = yax.make_mox(m.apply)(v, xs)
    got = jax.jit(lambda v, x: yax.eval_mox(mox, v, x))(v, xs)
    want = jax.jit(m.apply)(v, xs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert got.sharding.is_equivalent_to(want.sharding, got.ndim), (got.sharding, want.sharding)
    assert len(got.sharding.device_set) == 8
    print("SHARDED-OK", got.sharding)
    """
)


def test_sharded_inputs_on_8_cpu_devices(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", SHARDING], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "SHARDED-OK" in r.stdout


def test_to_function_jit_lower_and_export():
    mox, fn, (params, ids), kw = traced("transformer")
    new, lp = yax.sub(DENSE_MLP, yax.LoRA(rank=2), mox, params=params, key=KEY)
    f = yax.to_function(new)
    lowered = jax.jit(lambda p, i: f(p, i, **kw)).lower(lp, ids)
    assert "dot_general" in lowered.as_text()
    exp = jax.export.export(jax.jit(lambda p, i: f(p, i, **kw)))(lp, ids)
    blob = exp.serialize()
    back = jax.export.deserialize(blob)  # what a server without yax does
    np.testing.assert_allclose(back.call(lp, ids), yax.eval_mox(new, lp, ids, **kw), rtol=1e-5, atol=1e-5)
