"""The explorer's export (issue 14, point 13): the rewritten model runs without
yax from the files it writes, on a Hugging Face model (whose output class
`jax.export` cannot serialise) and an nnx model (whose state is no dict)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
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
    assert reply["type"] == "ok" and reply["files"] == ["yax_model_step1.jax_exported", "yax_model_step1.params.npz"]
    assert all(b > 0 for b in reply["bytes"])
    assert ex._status["message"].startswith("exported to yax_model_step1.jax_exported (")
    f, params = load(reply["files"])
    (logits,) = f.call(*params, IDS)
    want = yax.eval_mox(ex.mox, ex.params, IDS).logits  # the rewritten model, as yax runs it
    np.testing.assert_allclose(logits, want, rtol=1e-6, atol=1e-6)
    original = yax.eval_mox(ex.original, ex._states[0].params, IDS).logits
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
