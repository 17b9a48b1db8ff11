"""The explorer's export: the rewritten
model runs without yax from the files it writes, on a Hugging Face model (whose
output class `jax.export` cannot serialise) and an nnx model (whose state is no
dict); the README written beside them says how to call it, naming the inputs in
the user's order and spelling, and calling it that way gives the model's answer:
a T5 opened with keyword inputs is called with those keywords."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import yax
from yax_widget import Explorer

from .helpers import ask


def load(files: list[str]):
    f = jax.export.deserialize(open(files[0], "rb").read())
    p = np.load(files[1])
    return f, [p[k] for k in p.files]


def test_a_rewritten_hugging_face_model_runs_from_its_export(tmp_path, monkeypatch):
    from thirdparty import IDS, _hf

    ex = Explorer(_hf("gpt2"), IDS, warm=False)
    ex.sent = []
    ex.send = lambda content, buffers=None: ex.sent.append(content)
    ex.substitute("//activation[@name='gelu_new']", "ReLU")
    monkeypatch.chdir(tmp_path)
    reply = ask(ex, rid=1, type="export")  # the front-end's button: files next to the notebook
    assert reply["type"] == "ok" and reply["files"] == ["yax_model_step1.jax_exported", "yax_model_step1.params.npz",
                                                        "yax_model_step1.README.md", "yax_model_step1.manifest.json"]
    assert all(b > 0 for b in reply["bytes"])
    assert ex._status["message"].startswith("exported to yax_model_step1.jax_exported (")
    f, params = load(reply["files"])
    (logits,) = f.call(*params, IDS)
    want = yax.eval_mox(ex.mox, ex.params, IDS).logits  # the rewritten model, as yax runs it
    np.testing.assert_allclose(logits, want, rtol=1e-6, atol=1e-6)
    original = yax.eval_mox(ex.original, ex.session.states[0].params, IDS).logits
    assert not np.allclose(logits, original)  # the export is the rewritten model, not the original


def test_an_nnx_model_with_lora_runs_from_its_export(tmp_path):
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.fc1, self.fc2 = nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 2, rngs=rngs)

        def __call__(self, x):
            return self.fc2(nnx.gelu(self.fc1(x)))

    x = jax.random.normal(jax.random.key(1), (3, 8))
    ex = Explorer(Net(nnx.Rngs(0)), x, warm=False)
    ex.substitute("//*[@name='fc1']", "LoRA r=4")
    files = ex.export(tmp_path / "net")
    names = list(np.load(files[1]).files)
    assert any("lora" in n.lower() for n in names), names
    f, params = load(files)
    out = f.call(*params, x)
    want = jax.tree_util.tree_leaves(yax.eval_mox(ex.mox, ex.params, x))
    assert len(out) == len(want)
    for a, b in zip(out, want):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert jnp.asarray(out[0]).shape == (3, 2)


# -- the README beside the files: what a user reads, then runs --------------------------

def run_as_the_readme_says(files: list[str], **inputs) -> tuple[list, dict]:
    """Run the README's snippet exactly as written, from the folder holding the files, with
    the user's inputs bound to the names the README gives them; its ``outputs``, and the manifest."""
    scope, manifest = readme_scope(files, **inputs)
    return scope["outputs"], manifest


def readme_scope(files: list[str], **inputs) -> tuple[dict, dict]:
    """The variables of the README's snippet after it ran (`run_as_the_readme_says`), and the manifest."""
    readme = pathlib.Path(next(f for f in files if f.endswith(".README.md")))
    manifest = json.loads(pathlib.Path(next(f for f in files if f.endswith(".manifest.json"))).read_text())
    code = readme.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    names = [i["name"] for i in manifest["inputs"]]
    assert names == list(inputs), (names, list(inputs))  # named and ordered as the user gave them
    scope = {i["variable"]: inputs[i["name"]] for i in manifest["inputs"]}  # the names the README shows
    assert all(f"`{v}`" in readme.read_text() for v in scope)
    with contextlib.chdir(readme.parent):
        exec(code, scope)
    return scope, manifest


@contextlib.contextmanager
def t5_on_this_jax():
    """transformers' Flax T5 calls ``jnp.clip(x, a_max=...)``, a keyword JAX 0.10 no longer takes
    (``max=``): its module gets `jnp` with the old spelling of the same function, nothing else."""
    from transformers.models.t5 import modeling_flax_t5 as home

    class Jnp:
        def __getattr__(self, name):
            return getattr(jnp, name)

        @staticmethod
        def clip(x, a_min=None, a_max=None):
            return jnp.clip(x, a_min, a_max)

    home.jnp, before = Jnp(), home.jnp
    try:
        yield
    finally:
        home.jnp = before


@pytest.fixture(scope="module")
def t5():
    import transformers
    from thirdparty import DEC, IDS

    config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                                   num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16)
    with t5_on_this_jax():
        model = transformers.FlaxT5ForConditionalGeneration(config, seed=0, dtype=jnp.float32, _do_init=True)
        want = model(input_ids=IDS, decoder_input_ids=DEC).logits  # the real thing
        ex = Explorer(model, input_ids=IDS, decoder_input_ids=DEC, warm=False)
    return ex, IDS, DEC, want


def test_a_t5_opened_with_keyword_inputs_is_called_by_their_names(t5, tmp_path):
    ex, ids, dec, want = t5
    swapped = yax.eval_mox(ex.original, ex.params, input_ids=dec, decoder_input_ids=ids).logits
    assert not np.allclose(swapped, want, atol=1e-3)  # the two inputs have one type: only their names tell them apart
    # the original, exported and called as its README says, is the Hugging Face model
    outputs, manifest = run_as_the_readme_says(ex.export(tmp_path / "t5"), input_ids=ids, decoder_input_ids=dec)
    assert [(i["passed"], i["type"]) for i in manifest["inputs"]] == [("keyword", "i32[2,8]")] * 2
    assert manifest["outputs"][0]["path"] == ".logits"
    np.testing.assert_allclose(outputs[0], want, rtol=1e-5, atol=1e-5)
    # after a change: the rewritten model, as yax runs it
    ex.substitute("//activation[@name='relu']", "GELU (tanh)")
    outputs, _ = run_as_the_readme_says(ex.export(tmp_path / "t5_gelu"), input_ids=ids, decoder_input_ids=dec)
    rewritten = yax.eval_mox(ex.mox, ex.params, input_ids=ids, decoder_input_ids=dec).logits
    np.testing.assert_allclose(outputs[0], rewritten, rtol=1e-5, atol=1e-5)
    assert not np.allclose(outputs[0], want, atol=1e-3)
    # the old flat call, inputs in any order, is refused rather than silently answering
    exported = jax.export.deserialize((tmp_path / "t5_gelu.jax_exported").read_bytes())
    npz = np.load(tmp_path / "t5_gelu.params.npz")
    with pytest.raises(ValueError, match="same pytree structure"):
        exported.call(*[npz[k] for k in npz.files], ids, dec)
    ex.undo()


def test_a_positional_linen_model_is_called_by_its_parameter_name(tmp_path):
    from models import MLP

    m, x = MLP(), jnp.linspace(-1, 1, 8).reshape(2, 4)
    v = m.init(jax.random.key(0), x)
    ex = Explorer(m, v, x, warm=False)
    outputs, manifest = run_as_the_readme_says(ex.export(tmp_path / "mlp"), x=x)  # `MLP.__call__(self, x)`
    assert manifest["inputs"] == [{"name": "x", "variable": "x", "passed": "positional", "type": "f32[2,4]",
                                   "shape": [2, 4], "dtype": "float32"}]
    np.testing.assert_allclose(outputs[0], m.apply(v, x), rtol=1e-6, atol=1e-6)
    ex.substitute("//activation", "tanh")
    outputs, _ = run_as_the_readme_says(ex.export(tmp_path / "mlp_tanh"), x=x)
    np.testing.assert_allclose(outputs[0], yax.eval_mox(ex.mox, ex.params, x), rtol=1e-6, atol=1e-6)


def test_positional_inputs_keep_their_order_and_python_values_are_fixed(tmp_path):
    """Two inputs of one shape, whose order matters, and a keyword that is a Python value
    (traced as a constant): the README names both inputs as the function does, in order, and
    says the constant is fixed; a dict input stays a dict."""
    def f(a, b, batch, *, scale):
        return {"diff": (a - b) * scale, "sum": batch["x"] + batch["y"]}

    a, b = jnp.arange(6.0).reshape(2, 3), jnp.ones((2, 3))
    batch = {"y": jnp.full((3,), 2.0), "x": jnp.arange(3.0)}
    ex = Explorer(f, a, b, batch, scale=3.0, warm=False)
    files = ex.export(tmp_path / "f")
    outputs, manifest = run_as_the_readme_says(files, a=a, b=b, batch=batch)
    assert [i["name"] for i in manifest["inputs"]] == ["a", "b", "batch"]
    assert manifest["inputs"][2]["as"] == "pytree" and manifest["fixed"] == [
        {"name": "scale", "passed": "keyword", "value": "3.0"}]
    assert "`scale` = `3.0`" in pathlib.Path(files[1]).read_text()
    assert [o["path"] for o in manifest["outputs"]] == ["['diff']", "['sum']"]
    np.testing.assert_allclose(outputs[0], (a - b) * 3.0)
    np.testing.assert_allclose(outputs[1], batch["x"] + batch["y"])


def test_a_keyword_python_value_of_a_model_is_fixed_in_the_export(tmp_path):
    """`forward(params, ids, deterministic=True)`: the boolean is no input of the export."""
    from models import case_wrapper

    fn, (v, ids), kwargs = case_wrapper()
    ex = Explorer(fn, v, ids, **kwargs, warm=False)
    outputs, manifest = run_as_the_readme_says(ex.export(tmp_path / "lm"), ids=ids)
    assert manifest["fixed"] == [{"name": "deterministic", "passed": "keyword", "value": "True"}]
    np.testing.assert_allclose(outputs[0], fn(v, ids, **kwargs), rtol=1e-5, atol=1e-5)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Batch:  # a class `jax.export` cannot serialise
    a: jax.Array
    b: jax.Array


def test_an_input_of_a_registered_class_is_passed_as_the_list_the_readme_writes(tmp_path):
    def f(batch, c):
        return batch.a * 2 + batch.b - c

    batch, c = Batch(jnp.ones(3), jnp.arange(3.0)), jnp.full((3,), 0.5)
    ex = Explorer(f, batch, c, warm=False)
    files = ex.export(tmp_path / "f")
    outputs, manifest = run_as_the_readme_says(files, batch=batch, c=c)
    assert manifest["call"] == "outputs = exported.call([batch.a, batch.b], c)"
    np.testing.assert_allclose(outputs[0], f(batch, c))


def test_an_nnx_model_with_random_state_runs_from_its_readme(tmp_path):
    """Dropout's RNG keys live in the state: the `.npz` holds their key data, the README wraps them."""
    from nnx_models import case_transformer_dropout

    model, (ids,), _ = case_transformer_dropout()
    ex = Explorer(model, ids, warm=False)
    outputs, manifest = run_as_the_readme_says(ex.export(tmp_path / "lm"), ids=ids)
    assert manifest["params_key_data"]
    want = jax.tree_util.tree_leaves(jax.jit(yax.to_function(ex.mox))(ex.params, ids))
    assert len(outputs) == len(want)
    for a, b in zip(outputs, want):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


# -- issue 38.11: what the export writes, as a careful user and an attacker find it --------------

def bits(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a)).reshape(-1).view(np.uint8)


class LowPrecision(nn.Module):
    """A first layer whose parameters are of ``dtype`` (computing in float32), then a float32 one."""

    dtype: Any

    @nn.compact
    def __call__(self, x):
        return nn.Dense(2)(nn.relu(nn.Dense(5, dtype=jnp.float32, param_dtype=self.dtype)(x)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_low_precision_parameters_load_as_the_readme_says_bit_for_bit(tmp_path, dtype):
    """bfloat16 parameters went into the `.npz` as `|V2` arrays (NumPy has no bfloat16), which the README's own
    snippet handed to the function, and JAX refused. The snippet, run as written, now gives the parameters
    back bit for bit, and the function called with them gives the model's answer."""
    m = LowPrecision(getattr(jnp, dtype))
    x = jnp.linspace(-1, 1, 12).reshape(3, 4)
    v = m.init(jax.random.key(0), x)
    v = jax.tree_util.tree_map(lambda a: a if a.dtype == jnp.float32 else (a + 0.3).astype(a.dtype), v)
    ex = Explorer(m, v, x, warm=False)
    files = ex.export(tmp_path / "m")
    scope, manifest = readme_scope(files, x=x)
    want = jax.tree_util.tree_leaves(ex.params)
    assert [a.dtype for a in scope["params"]] == [a.dtype for a in want] and dtype in {str(a.dtype) for a in want}
    for got, w in zip(scope["params"], want):
        np.testing.assert_array_equal(bits(got), bits(w))
    np.testing.assert_allclose(scope["outputs"][0], m.apply(v, x), rtol=1e-6, atol=1e-6)
    assert list(manifest["params_bits"].values()) == [dtype] * 2  # programs reading the manifest are told too


def test_a_failed_write_leaves_no_file_and_the_retry_succeeds(tmp_path, monkeypatch):
    """A full disk left a truncated `.params.npz` (and the function beside it), and the retry was refused because
    the files existed. Each file is written under another name and all are renamed once all are whole: a
    failure leaves nothing, says why as a refusal (the button's reply too), and the retry writes them all."""
    import errno

    from models import MLP

    m, x = MLP(), jnp.linspace(-1, 1, 8).reshape(2, 4)
    ex = Explorer(m, m.init(jax.random.key(0), x), x, warm=False)
    ex.sent = []
    ex.send = lambda content, buffers=None: ex.sent.append(content)
    real = np.savez

    def savez(file, *args, **kwds):  # what fitted on the disk, then no more
        file.write(b"PK\x03\x04" + b"\0" * 4096)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", savez)
    with pytest.raises(yax.YaxError) as e:
        ex.export(tmp_path / "mlp")
    msg = str(e.value)
    assert isinstance(e.value, yax.YaxInputError) and "No space left on device" in msg and "Nothing was written" in msg
    assert f"`{tmp_path / 'mlp'}." in msg and msg.endswith(".")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.chdir(tmp_path)
    reply = ask(ex, rid=1, type="export")  # the button: a refusal, not a crash
    assert reply["type"] == "error" and "No space left on device" in reply["message"], reply
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(np, "savez", real)
    files = ex.export(tmp_path / "mlp")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(pathlib.Path(f).name for f in files)
    outputs, _ = run_as_the_readme_says(files, x=x)
    np.testing.assert_allclose(outputs[0], m.apply(ex.params, x), rtol=1e-6, atol=1e-6)
    assert ask(ex, rid=2, type="export")["files"][0] == "yax_model_step0.jax_exported"


def test_a_300_character_stem_is_refused_with_a_sentence(tmp_path):
    """It raised a bare OSError ("File name too long") after the export had been computed."""
    from models import MLP

    m, x = MLP(), jnp.linspace(-1, 1, 8).reshape(2, 4)
    ex = Explorer(m, m.init(jax.random.key(0), x), x, warm=False)
    with pytest.raises(yax.YaxInputError) as e:
        ex.export(tmp_path / ("m" * 300))
    msg = str(e.value)
    assert "bytes long" in msg and "at most" in msg and "Try a shorter name." in msg, msg
    assert list(tmp_path.iterdir()) == []
