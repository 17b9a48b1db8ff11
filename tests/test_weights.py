"""yax.save_weights and yax.load_weights: round trips through a safetensors file for linen
variables, a Hugging Face Flax model, an nnx state with a PRNG key and a LoRA rewrite, each
checked against the model run on the original weights; every refusal names what it found."""

import sys

import flax
import jax
import jax.numpy as jnp
import ml_dtypes
import nnx_models
import numpy as np
import pytest
from flax import nnx
from models import CNN, KEY, MLP
from safetensors import safe_open

import yax
from yax.errors import WeightsDoNotFit

pytestmark = pytest.mark.core

X = jnp.linspace(-1, 1, 8).reshape(2, 4)
HINT = "rewrite the model the same way first (a LoRA rewrite adds `lora_a`/`lora_b`)"


def keys_and_metadata(path):
    with safe_open(path, "np") as f:
        return sorted(f.keys()), f.metadata()


def assert_same(got, want):
    """The same structure (container types included) and bit-identical leaves, held as jax arrays."""
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert isinstance(g, jax.Array)
        assert g.shape == w.shape and g.dtype == w.dtype
        if jnp.issubdtype(w.dtype, jax.dtypes.prng_key):
            g, w = jax.random.key_data(g), jax.random.key_data(w)
        np.testing.assert_array_equal(np.asarray(g).reshape(-1).view(np.uint8), np.asarray(w).reshape(-1).view(np.uint8))


def dense(features=3, dtype=jnp.float32):
    m = flax.linen.Dense(features, param_dtype=dtype)
    return m, m.init(KEY, X)


def test_linen_params_and_batch_stats_round_trip(tmp_path):
    m, x = CNN(), jax.random.normal(KEY, (2, 8, 8, 3))
    v = m.init(KEY, x)
    path = tmp_path / "cnn.safetensors"
    yax.save_weights(v, path)
    keys, meta = keys_and_metadata(path)
    assert keys == ["batch_stats/BatchNorm_0/mean", "batch_stats/BatchNorm_0/var", "params/BatchNorm_0/bias",
                    "params/BatchNorm_0/scale", "params/Conv_0/bias", "params/Conv_0/kernel",
                    "params/Dense_0/bias", "params/Dense_0/kernel"]
    assert meta == {"format": "yax.weights", "version": "1"}
    loaded = yax.load_weights(path, like=v)
    assert_same(loaded, v)
    np.testing.assert_array_equal(m.apply(loaded, x), m.apply(v, x))
    frozen = yax.load_weights(path, like=flax.core.freeze(v))  # like's container types come back
    assert isinstance(frozen, flax.core.FrozenDict)
    assert_same(frozen, flax.core.freeze(v))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, ml_dtypes.float8_e4m3fn])
def test_low_precision_leaves_round_trip_exactly(tmp_path, dtype):
    w = {"w": jax.random.normal(KEY, (3, 5)).astype(dtype), "f32": jnp.ones(2)}
    yax.save_weights(w, tmp_path / "w.safetensors")
    loaded = yax.load_weights(tmp_path / "w.safetensors", like=w)
    assert loaded["w"].dtype == dtype
    assert_same(loaded, w)


def test_strided_numpy_leaves_and_scalars_keep_their_values(tmp_path):
    w = {"t": np.arange(12.0, dtype=np.float32).reshape(3, 4).T, "s": np.float32(2.5), "z": jnp.zeros((0, 3))}
    yax.save_weights(w, tmp_path / "w.safetensors")
    loaded = yax.load_weights(tmp_path / "w.safetensors", like=w)
    np.testing.assert_array_equal(loaded["t"], w["t"])  # not the transposed array's memory order
    assert loaded["s"].shape == () and float(loaded["s"]) == 2.5
    assert loaded["z"].shape == (0, 3)


@pytest.mark.slow
def test_hugging_face_gpt2_params_give_the_same_logits(tmp_path):
    from thirdparty import case

    c = case("gpt2-wrapper")
    params, *inputs = c.args
    path = tmp_path / "gpt2.safetensors"
    yax.save_weights(params, path)
    keys, _ = keys_and_metadata(path)
    assert "transformer/h/0/attn/c_attn/kernel" in keys and "transformer/wte/embedding" in keys
    assert len(keys) == len(jax.tree_util.tree_leaves(params))
    loaded = yax.load_weights(path, like=params)
    assert_same(loaded, params)
    np.testing.assert_array_equal(c.fn(loaded, *inputs), c.fn(params, *inputs))


def test_nnx_state_with_a_prng_key_merges_into_the_same_model(tmp_path):
    m = nnx_models.CNN(rngs=nnx_models.rngs())
    m.train()  # dropout on: the output depends on the RngKey loaded back
    x = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
    graphdef, state = nnx.split(m)
    path = tmp_path / "cnn.safetensors"
    yax.save_weights(state, path)
    keys, meta = keys_and_metadata(path)
    assert {"conv/kernel", "bn/mean", "dropout/rngs/key", "dropout/rngs/count"} <= set(keys)
    [key] = [a for a in jax.tree_util.tree_leaves(state) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key)]
    impl = str(jax.random.key_impl(key))
    assert meta["key_arrays"] == f'{{"dropout/rngs/key": "{impl}"}}'

    loaded = yax.load_weights(path, like=state)
    assert isinstance(loaded, nnx.State)
    assert isinstance(loaded["dropout"]["rngs"]["key"], nnx.RngKey)
    assert_same(loaded, state)
    assert_same(yax.load_weights(path, like=nnx.state(m)), state)  # before calls change the state
    got = nnx.merge(graphdef, loaded)(x)
    other = nnx.merge(graphdef, jax.tree_util.tree_map(
        lambda a: jax.random.key(9) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a, state))(x)
    want = m(x)
    np.testing.assert_array_equal(got, want)
    assert not np.allclose(other, want)  # the key matters


def lora_model():
    m = MLP()
    v = m.init(KEY, X)
    mox = yax.make_mox(m.apply)(v, X)
    new, nv = yax.sub('//module_call[@type="Dense"]', yax.LoRA(rank=2), mox, params=v, key=jax.random.key(1))
    # B starts at zero, which would hide adapters that failed to load: give it values
    nv = jax.tree_util.tree_map_with_path(
        lambda kp, a: a + 0.1 if jax.tree_util.keystr(kp).endswith("['lora_b']") else a, nv)
    return m, v, new, nv


def test_lora_rewrite_round_trip(tmp_path):
    m, v, new, nv = lora_model()
    path = tmp_path / "lora.safetensors"
    yax.save_weights(nv, path)
    keys, _ = keys_and_metadata(path)
    assert "params/Dense_0/lora_a" in keys and "params/Dense_1/lora_b" in keys
    loaded = yax.load_weights(path, like=nv)
    assert_same(loaded, nv)
    np.testing.assert_array_equal(yax.eval_mox(new, loaded, X), yax.eval_mox(new, nv, X))
    assert not np.allclose(yax.eval_mox(new, loaded, X), m.apply(v, X))


def test_lora_weights_with_the_original_params_are_refused(tmp_path):
    _, v, _, nv = lora_model()
    yax.save_weights(nv, tmp_path / "lora.safetensors")
    with pytest.raises(WeightsDoNotFit) as e:
        yax.load_weights(tmp_path / "lora.safetensors", like=v)
    lora = ["params/Dense_0/lora_a", "params/Dense_0/lora_b", "params/Dense_1/lora_a", "params/Dense_1/lora_b"]
    assert e.value.extra == lora and e.value.missing == [] and e.value.mismatched == []
    msg = str(e.value)
    assert isinstance(e.value, yax.YaxInputError)
    assert "4 keys in the file that `like` lacks: " + ", ".join(f"`{k}`" for k in lora) in msg
    assert "Nothing was loaded." in msg and HINT in msg


def test_shape_mismatch_names_the_path_and_both_shapes(tmp_path):
    _, v = dense(3)
    yax.save_weights(v, tmp_path / "w.safetensors")
    with pytest.raises(WeightsDoNotFit) as e:
        yax.load_weights(tmp_path / "w.safetensors", like=dense(5)[1])
    msg = str(e.value)
    assert "2 leaves of another type: " in msg
    assert "`params/bias` is f32[3] in the file but f32[5] in `like`" in msg
    assert "`params/kernel` is f32[4,3] in the file but f32[4,5] in `like`" in msg
    assert HINT in msg


def test_dtype_mismatch_names_the_path_and_both_dtypes(tmp_path):
    _, v = dense(3)
    yax.save_weights(v, tmp_path / "w.safetensors")
    with pytest.raises(WeightsDoNotFit) as e:
        yax.load_weights(tmp_path / "w.safetensors", like=dense(3, jnp.bfloat16)[1])
    assert ("params/kernel", "bf16[4,3]", "f32[4,3]") in e.value.mismatched


def test_every_problem_is_listed_in_one_message(tmp_path):
    yax.save_weights({"a": jnp.ones(2), "b": jnp.ones(3), "gone": jnp.ones(1)}, tmp_path / "w.safetensors")
    like = {"a": jnp.ones(2), "b": jnp.ones(4, jnp.int32), "new": {"w": jnp.ones(1)}, "new2": jnp.ones(1)}
    with pytest.raises(WeightsDoNotFit) as e:
        yax.load_weights(tmp_path / "w.safetensors", like=like)
    msg = str(e.value)
    assert "2 of `like`'s keys missing from the file: `new/w`, `new2`" in msg
    assert "1 key in the file that `like` lacks: `gone`" in msg
    assert "1 leaf of another type: `b` is f32[3] in the file but i32[4] in `like`" in msg


def test_like_may_hold_shape_dtype_structs(tmp_path):
    m, v = dense(3)
    yax.save_weights(v, tmp_path / "w.safetensors")
    like = jax.eval_shape(m.init, KEY, X)
    assert isinstance(like["params"]["kernel"], jax.ShapeDtypeStruct)
    loaded = yax.load_weights(tmp_path / "w.safetensors", like=like)
    assert_same(loaded, v)
    np.testing.assert_array_equal(m.apply(loaded, X), m.apply(v, X))


def test_like_must_hold_arrays(tmp_path):
    yax.save_weights({"a": jnp.ones(2)}, tmp_path / "w.safetensors")
    with pytest.raises(yax.errors.CannotSaveLeaves) as e:
        yax.load_weights(tmp_path / "w.safetensors", like={"a": 2})
    assert (e.value.argument, e.value.problem, e.value.leaves) == ("like", "not arrays", ["a"])


def test_save_refuses_leaves_that_are_not_arrays(tmp_path):
    path = tmp_path / "w.safetensors"
    tree = {"w": jnp.ones(2), "n": 3, "s": "relu", "abstract": jax.ShapeDtypeStruct((2,), jnp.float32)}
    with pytest.raises(yax.YaxInputError) as e:
        yax.save_weights(tree, path)
    assert ("3 leaves of `params` are not arrays: `abstract` (a `jax.ShapeDtypeStruct` f32[2]), `n` (`int`), "
            "`s` (`str`). Try converting them with `jnp.asarray`") in str(e.value)
    assert not path.exists()


def test_save_refuses_two_leaves_with_one_key(tmp_path):
    with pytest.raises(yax.errors.CannotSaveLeaves) as e:
        yax.save_weights({"a/b": jnp.ones(1), "a": {"b": jnp.ones(1)}}, tmp_path / "w.safetensors")
    assert (e.value.argument, e.value.problem) == ("params", "same key")
    assert e.value.leaves == ["params['a']['b']", "params['a/b']"]


def test_save_refuses_dtypes_safetensors_cannot_store(tmp_path):
    with pytest.raises(yax.errors.CannotSaveLeaves) as e:
        yax.save_weights({"c": np.zeros(2, np.complex128)}, tmp_path / "w.safetensors")
    assert (e.value.argument, e.value.problem, e.value.leaves) == ("params", "dtype", ["c"])


def test_a_file_that_is_not_safetensors_is_refused(tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(yax.errors.BadWeightsFile) as e:
        yax.load_weights(path, like={})
    assert (e.value.path, e.value.problem) == (str(path), "not safetensors")


def test_without_safetensors_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    for call in (lambda: yax.save_weights({"a": jnp.ones(1)}, tmp_path / "w"),
                 lambda: yax.load_weights(tmp_path / "w", like={})):
        with pytest.raises(yax.errors.MissingDependency) as e:
            call()
        assert (e.value.package, e.value.install) == ("the `safetensors` package", "`pip install safetensors`")


def bits(a):
    """The bytes of an array as saved: NaN payloads and the sign of -0.0 included."""
    return np.ascontiguousarray(np.asarray(a)).reshape(-1).view(np.uint8)


WIDE = {"i64": np.array([2**40 + 3, -2**63, 2**63 - 1, -1], np.int64),
        "u64": np.array([2**40 + 3, 2**64 - 1, 2**63 + 5], np.uint64),
        "f64": np.array([0.1, 1e300, 5e-324, -0.0, np.nan, -np.inf], np.float64),
        "i32": np.array([2**31 - 1, -2**31], np.int32)}


@pytest.mark.parametrize("like_kind", ["numpy", "shape_dtype_struct"])
def test_64_bit_leaves_keep_their_values_with_x64_off(tmp_path, like_kind):
    """Issue 37.3: with x64 off JAX holds no 64-bit arrays. An int64 2**40+3 loaded as the int32 3 (uint64
    as uint32, float64 rounded to float32) after the dtype check had passed. Such leaves now come back as
    the NumPy arrays they were saved as: the dtype of `like`, every bit kept."""
    path = tmp_path / "w.safetensors"
    yax.save_weights(WIDE, path)
    like = WIDE if like_kind == "numpy" else {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in WIDE.items()}
    loaded = yax.load_weights(path, like=like)
    for k, want in WIDE.items():
        got = loaded[k]
        assert got.dtype == want.dtype and got.shape == want.shape, k
        np.testing.assert_array_equal(bits(got), bits(want), err_msg=k)
    assert isinstance(loaded["i64"], np.ndarray) and int(loaded["i64"][0]) == 2**40 + 3
    assert isinstance(loaded["i32"], jax.Array)  # what JAX holds stays a jax array
    loaded["i64"][0] = 0  # the caller's own array, not a view of the file's buffer
    assert int(yax.load_weights(path, like=like)["i64"][0]) == 2**40 + 3


def test_64_bit_leaves_are_jax_arrays_with_x64_on(tmp_path):
    path = tmp_path / "w.safetensors"
    with jax.enable_x64(True):
        saved = {k: jnp.asarray(v) for k, v in WIDE.items()}
        yax.save_weights(saved, path)
        loaded = yax.load_weights(path, like=saved)
        assert_same(loaded, saved)
    off = yax.load_weights(path, like=WIDE)  # the same file, read with x64 off
    for k, want in WIDE.items():
        np.testing.assert_array_equal(bits(off[k]), bits(want), err_msg=k)


def test_a_float64_scalar_beside_a_bfloat16_keeps_its_dtype(tmp_path):
    """The oracle's counterexample (tests/oracle/test_stats_weights_oracle.py): a float64 0-d array,
    x64 off, loaded as float32."""
    w = {"w": np.array(0, ml_dtypes.bfloat16), "b": np.array(0.0)}
    yax.save_weights(w, tmp_path / "w.safetensors")
    loaded = yax.load_weights(tmp_path / "w.safetensors", like=w)
    assert loaded["b"].dtype == np.float64 and loaded["b"].shape == () and isinstance(loaded["b"], np.ndarray)
    assert loaded["w"].dtype == jnp.bfloat16 and isinstance(loaded["w"], jax.Array)


# -- issue 38.10: the files themselves, as a careful user and an attacker find them --------------

def assert_sentence(e: BaseException, *parts: str) -> None:
    """A yax refusal said as a full sentence: each of ``parts`` in it, a "try" hint, a full stop."""
    msg = yax.errors.message(e)  # without the docs pointer of a specific class
    assert isinstance(e, yax.YaxInputError), (type(e), msg)
    assert msg.endswith(".") and ("Try " in msg or " try " in msg) and len(msg) < 800, msg
    for part in parts:
        assert part in msg, (part, msg)


def files_in(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("case", ["missing", "folder", "no folder", "int", "none"])
def test_a_path_that_is_no_file_is_refused_with_a_sentence(tmp_path, case):
    """A missing file raised FileNotFoundError, a folder OSError ("No such device"), a path of the wrong type
    TypeError: each is a `YaxInputError` naming the path, what it is, and what to try."""
    (tmp_path / "dir.safetensors").mkdir()
    path, load_says, save_says = {
        "missing": (tmp_path / "nope.safetensors", "no file", None),
        "folder": (tmp_path / "dir.safetensors", "is a folder", "is a folder"),
        "no folder": (tmp_path / "gone" / "w.safetensors", "no file", "does not exist"),
        "int": (3, "got `3` of type `int`", "got `3` of type `int`"),
        "none": (None, "of type `NoneType`", "of type `NoneType`"),
    }[case]
    with pytest.raises(yax.YaxError) as e:
        yax.load_weights(path, like={"a": jnp.ones(2)})
    assert_sentence(e.value, load_says, *([str(path)] if case not in ("int", "none") else []))
    if save_says is not None:
        with pytest.raises(yax.YaxError) as e:
            yax.save_weights({"a": jnp.ones(2)}, path)
        assert_sentence(e.value, save_says)
    assert files_in(tmp_path) == ["dir.safetensors"] and not any((tmp_path / "dir.safetensors").iterdir())


def promptly(call, fifo, seconds=10.0):
    """What ``call`` raised (None if nothing); fails if it took ``seconds`` or more. A call blocked opening the
    named pipe ``fifo`` holds the GIL, so no thread of this process can free it: a child process opens both
    ends of the pipe after ``seconds``, which ends the wait, and the test fails instead of hanging."""
    import subprocess
    import time

    free = subprocess.Popen([sys.executable, "-c", "import os, sys, time; time.sleep(float(sys.argv[2])); "
                             "fd = os.open(sys.argv[1], os.O_RDWR | os.O_NONBLOCK); time.sleep(5)",
                             str(fifo), str(seconds)])
    t, raised = time.perf_counter(), None
    try:
        call()
    except BaseException as e:  # noqa: BLE001 - what it raised is the result
        raised = e
    finally:
        took = time.perf_counter() - t
        free.kill()
        free.wait()
    assert took < seconds, f"waited {took:.0f} s for the other end of the named pipe {fifo}"
    return raised


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no named pipes here")
def test_a_named_pipe_is_refused_without_waiting_on_it(tmp_path):
    """A FIFO path hung `load_weights` (and `save_weights`) uninterruptibly, waiting for its other end."""
    import os

    fifo = tmp_path / "w.safetensors"
    os.mkfifo(fifo)
    e = promptly(lambda: yax.load_weights(fifo, like={"a": jnp.ones(2)}), fifo)
    assert_sentence(e, f"`{fifo}` is a named pipe", "not a regular file")
    e = promptly(lambda: yax.save_weights({"a": jnp.ones(2)}, fifo), fifo)
    assert_sentence(e, f"`{fifo}` is a named pipe")
    assert files_in(tmp_path) == ["w.safetensors"] and (tmp_path / "w.safetensors").is_fifo()


def with_key_arrays(path, key_arrays: str, dtype=np.uint32) -> None:
    from safetensors.numpy import save_file

    save_file({"w": np.arange(2, dtype=dtype)}, str(path),
              metadata={"format": "yax.weights", "version": "1", "key_arrays": key_arrays})


@pytest.mark.parametrize("key_arrays", ["{", "[1]", "[" * 100_000 + "]" * 100_000, '"fry"', '{"w": 3}',
                                        '{"w": ["fry"]}', '{"elsewhere": "fry"}', '{"w": null}'])
def test_malformed_key_arrays_metadata_is_refused(tmp_path, key_arrays):
    """It raised JSONDecodeError, AttributeError or RecursionError, or said "the data of `3` keys"."""
    path = tmp_path / "w.safetensors"
    with_key_arrays(path, key_arrays)
    with pytest.raises(yax.YaxError) as e:
        yax.load_weights(path, like={"w": jnp.ones(2, jnp.uint32)})
    assert_sentence(e.value, f"`{path}`", "`key_arrays`", "Nothing was loaded")


def test_a_null_key_implementation_does_not_make_a_uint32_leaf_a_key(tmp_path):
    """A hostile file's ``{"w": null}`` passed the checks as plain uint32 data, then was wrapped as a PRNG key
    of the default implementation: `like` asked for u32[2] and got key<fry>[]."""
    path = tmp_path / "w.safetensors"
    with_key_arrays(path, '{"w": null}')
    with pytest.raises(yax.errors.BadWeightsFile) as e:
        yax.load_weights(path, like={"w": jnp.ones(2, jnp.uint32)})
    assert (e.value.problem, e.value.detail) == (
        "key arrays", "`w` is marked as a PRNG key array of the implementation `null`, which names no implementation")


def test_a_top_level_metadata_key_is_refused_at_save(tmp_path):
    """safetensors keeps ``__metadata__`` for the file's metadata: a leaf of that key was written into a file
    that nothing can read ("duplicate field `__metadata__`")."""
    path = tmp_path / "w.safetensors"
    with pytest.raises(yax.YaxInputError) as e:
        yax.save_weights({"__metadata__": jnp.ones(2), "w": jnp.ones(1)}, path)
    assert_sentence(e.value, "`__metadata__`", "`params['__metadata__']`", "reserves")
    assert files_in(tmp_path) == []
    yax.save_weights({"__metadata__": {"w": jnp.ones(2)}}, path)  # below the top level it is any other key
    assert keys_and_metadata(path)[0] == ["__metadata__/w"]


def test_a_file_with_a_float8_entry_is_read_once(tmp_path):
    """A float8 entry made `load_weights` read the whole file a second time (`safetensors.deserialize` of its
    bytes): 400 MB of weights with one float8 bias peaked 40% higher. Each array is now read once: the
    memory allocated while loading stays near the size of the file."""
    import tracemalloc

    path = tmp_path / "w.safetensors"
    w = {"big": np.ones((1024, 2048), np.float32), "f8": np.ones(4, ml_dtypes.float8_e4m3fn)}
    yax.save_weights(w, path)
    size = path.stat().st_size
    yax.load_weights(path, like=w)  # compiles what JAX compiles once, outside the measurement
    tracemalloc.start()
    try:
        loaded = yax.load_weights(path, like=w)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert_same(loaded, {k: jnp.asarray(v) for k, v in w.items()})
    assert peak < 1.3 * size, (peak, size)


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_a_saved_file_has_the_mode_the_umask_gives(tmp_path, umask):
    """Files were created 0600 whatever the umask (safetensors' own mode): a file for another program or
    user was unreadable to them. A file that exists keeps its mode when it is replaced."""
    import os
    import stat

    old = os.umask(umask)
    try:
        yax.save_weights({"a": jnp.ones(2)}, tmp_path / "new.safetensors")
        (tmp_path / "old.safetensors").write_bytes(b"old")
        os.chmod(tmp_path / "old.safetensors", 0o640)
        yax.save_weights({"a": jnp.ones(2)}, tmp_path / "old.safetensors")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.safetensors").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE((tmp_path / "old.safetensors").stat().st_mode) == 0o640
    assert keys_and_metadata(tmp_path / "old.safetensors")[0] == ["a"]
    assert files_in(tmp_path) == ["new.safetensors", "old.safetensors"]


@pytest.mark.parametrize("raised", ["OSError", "SafetensorError"])
def test_a_failed_save_leaves_no_partial_file_and_the_retry_succeeds(tmp_path, monkeypatch, raised):
    """A full disk left a truncated file (and, saving over one, destroyed the old weights). The file is
    written beside its path and renamed when whole: on failure there is no new file, the old one is
    as it was, and the refusal says why."""
    import errno

    import safetensors
    import safetensors.numpy

    real = safetensors.numpy.save_file

    def full_disk(tensors, filename, metadata=None):
        with open(filename, "wb") as fh:
            fh.write(b"\0" * 100)  # what fitted
        if raised == "OSError":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    w = {"a": jnp.arange(3.0)}
    old = tmp_path / "old.safetensors"
    real({"a": np.zeros(3, np.float32)}, str(old), metadata={"format": "yax.weights", "version": "1"})
    before = old.read_bytes()
    monkeypatch.setattr(safetensors.numpy, "save_file", full_disk)
    for path in (tmp_path / "new.safetensors", old):
        with pytest.raises(yax.YaxError) as e:
            yax.save_weights(w, path)
        assert_sentence(e.value, f"`{path}`", "No space left on device", "Nothing was written")
    assert files_in(tmp_path) == ["old.safetensors"] and old.read_bytes() == before
    monkeypatch.setattr(safetensors.numpy, "save_file", real)
    for path in (tmp_path / "new.safetensors", old):
        yax.save_weights(w, path)
        assert_same(yax.load_weights(path, like=w), w)
    assert files_in(tmp_path) == ["new.safetensors", "old.safetensors"]
