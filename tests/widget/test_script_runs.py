"""Copy as code, pasted into a fresh Jupyter kernel, makes the explorer's current model: for
every way the explorer opens (a linen module with and without static keywords, a MoX, an nnx
module, Hugging Face wrappers given keyword inputs, a JAX function, and `%yax` for each).

One real python3 kernel (this venv's) runs every case in turn. The kernel holds the same small
models, built from the same seeds, in a module ``zoo``; for each case its namespace is reset, the
names the script's comment lists are defined (and nothing else), the script runs as pasted, and
the kernel prints what ``yax.eval_mox(mox, params, ...)`` computes, compared here with the
explorer's current model."""

from __future__ import annotations

import json
import re
import sys
import types

import jax
import numpy as np
import pytest

import yax
from yax_widget import Explorer

pytestmark = pytest.mark.slow  # fresh kernels

# The user's objects, built identically here and in the kernel.
ZOO = '''
import json
import jax, jax.numpy as jnp, numpy as np, flax.linen as nn, transformers, yax
from flax import nnx

class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(2)(nn.gelu(nn.Dense(8)(x)))

class NormedMLP(nn.Module):  # `train` is static and has no usable default: a script without it fails
    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.BatchNorm(use_running_average=not train)(nn.Dense(8)(x))
        return nn.Dense(2)(nn.gelu(x))

class Net(nnx.Module):
    def __init__(self, rngs):
        self.fc1, self.fc2 = nnx.Linear(4, 8, rngs=rngs), nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        return self.fc2(nnx.gelu(self.fc1(x)))

def fn(x):
    return jax.nn.gelu(x @ jnp.linspace(-1.0, 1.0, 12).reshape(4, 3))

x = jnp.linspace(-2.0, 2.0, 12).reshape(3, 4)
mlp, normed = MLP(), NormedMLP()
mlp_vars, normed_vars = mlp.init(jax.random.key(0), x), normed.init(jax.random.key(1), x, train=False)
mlp_mox = yax.make_mox(mlp)(mlp_vars, x)
net = Net(nnx.Rngs(0))
gpt = transformers.FlaxGPT2LMHeadModel(transformers.GPT2Config(
    vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=8), seed=0)
bart = transformers.FlaxBartForConditionalGeneration(transformers.BartConfig(
    vocab_size=50, d_model=16, max_position_embeddings=8, encoder_layers=1, decoder_layers=1,
    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32), seed=0)
ids = jnp.arange(8).reshape(1, 8) * 7 % 50
dec = ids[:, :4]
x2, ids5 = x[:2], ids[:, :5]  # what `x[:2]` and `ids[:, :5]` give, under a name
clip = transformers.FlaxCLIPModel(transformers.CLIPConfig(
    text_config=dict(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, max_position_embeddings=8),
    vision_config=dict(image_size=32, patch_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2), projection_dim=8), seed=0)
pix = jnp.linspace(-1.0, 1.0, 2 * 3 * 32 * 32).reshape(2, 3, 32, 32)
tokens, mask = jnp.tile(ids, (2, 1)), jnp.ones((2, 8), jnp.int32).at[1, 6:].set(0)

def inputs(text):
    """The positional and keyword inputs written as ``text`` (``"x, train=False"``), from this zoo."""
    return eval(f"(lambda *a, **k: (a, k))({text})", globals())

def dump(out):
    return json.dumps([np.asarray(leaf, np.float64).tolist() for leaf in jax.tree_util.tree_leaves(out)])
'''

# (how it opens: `Explorer` arguments or a `%yax` line, the names the user has -> zoo objects,
#  the inputs `eval_mox` runs on after the parameters)
CASES = [
    # `Explorer(...)`: the names its caller bound to what it was given
    ("Explorer(mlp, mlp_vars, x)", {"mlp": "mlp", "mlp_vars": "mlp_vars", "x": "x"}, "x"),
    ("Explorer(normed, normed_vars, x, train=False)",
     {"normed": "normed", "normed_vars": "normed_vars", "x": "x"}, "x, train=False"),
    ("Explorer(mlp_mox, mlp_vars, x)", {"mlp_mox": "mlp_mox", "mlp_vars": "mlp_vars"}, "x"),
    ("Explorer(net, x)", {"net": "net", "x": "x"}, "x"),
    ("Explorer(gpt, input_ids=ids)", {"gpt": "gpt", "ids": "ids"}, "input_ids=ids"),
    ("Explorer(bart, input_ids=ids, decoder_input_ids=dec)", {"bart": "bart", "ids": "ids", "dec": "dec"},
     "input_ids=ids, decoder_input_ids=dec"),
    ("Explorer(clip, input_ids=tokens, pixel_values=pix, attention_mask=mask)",
     {"clip": "clip", "tokens": "tokens", "pix": "pix", "mask": "mask"},
     "input_ids=tokens, pixel_values=pix, attention_mask=mask"),
    ("Explorer(fn, x)", {"fn": "fn", "x": "x"}, "x"),
    ("Explorer(fn, x=x)", {"fn": "fn", "x": "x"}, "x=x"),
    # an input no name holds (`x[:2]`): the usual names, and the comment says to use your own
    ("Explorer(mlp, mlp_vars, x[:2])", {"model": "mlp", "variables": "mlp_vars", "batch": "x2"}, "x2"),
    ("Explorer(gpt, input_ids=ids[:, :5])", {"model": "gpt", "input_ids": "ids5"}, "input_ids=ids5"),
    ("%yax mlp mlp_vars x", {"mlp": "mlp", "mlp_vars": "mlp_vars", "x": "x"}, "x"),
    ("%yax model weights batch[:2] train=False", {"model": "normed", "weights": "normed_vars", "batch": "x"},
     "x[:2], train=False"),
    ("%yax m v x", {"m": "mlp_mox", "v": "mlp_vars"}, "x"),
    ("%yax net x", {"net": "net", "x": "x"}, "x"),
    ("%yax gpt input_ids=ids", {"gpt": "gpt", "ids": "ids"}, "input_ids=ids"),
    ("%yax model input_ids=ids decoder_input_ids=ids[:, :4]", {"model": "bart", "ids": "ids"},
     "input_ids=ids, decoder_input_ids=dec"),
    ("%yax f xs", {"f": "fn", "xs": "x"}, "x"),
]


class Kernel:
    """A python3 Jupyter kernel of this venv. Cells are queued (`submit`) while this process goes on,
    so the kernel's work overlaps the explorers'; `outputs` waits for them all."""

    def __init__(self):
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(kernel_name="python3")
        self.cells: dict[str, tuple[str, str]] = {}  # msg_id -> (what it is for, the code)

    def submit(self, code: str, label: str) -> str:
        msg_id = self.kc.execute(code, stop_on_error=False)
        self.cells[msg_id] = (label, code)
        return msg_id

    def outputs(self, timeout: float = 120) -> dict[str, str]:
        """Each cell's stdout, by msg_id; fails with the first error's traceback and its cell."""
        out = {m: "" for m in self.cells}
        busy = set(self.cells)
        while busy:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            parent, c = msg["parent_header"].get("msg_id"), msg["content"]
            if parent not in out:
                continue
            if msg["msg_type"] == "stream" and c["name"] == "stdout":
                out[parent] += c["text"]
            elif msg["msg_type"] == "error":
                label, code = self.cells[parent]
                trace = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(c["traceback"]))
                pytest.fail(f"{label}: the kernel failed on\n{code}\n\n{trace}")
            elif msg["msg_type"] == "status" and c["execution_state"] == "idle":
                busy.discard(parent)
        return out

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def _listed(code: str) -> list[str]:
    comment = next(line for line in code.splitlines() if line.startswith("# `"))
    return re.findall(r"`([^`]+)`", comment.split(":")[0])


def test_copy_as_code_runs_in_a_fresh_kernel(shell):
    kernel = Kernel()
    try:
        # the zoo as a module, so that `%reset` leaves it and each case gets only the names it lists
        first = kernel.submit(f"import sys, types\nzoo = types.ModuleType('zoo')\nexec({ZOO!r}, zoo.__dict__)\n"
                              "sys.modules['zoo'] = zoo\nprint(sys.executable)", "the zoo")
        zoo = types.ModuleType("zoo")
        exec(ZOO, zoo.__dict__)  # noqa: S102 - the test's own models
        shell.run_line_magic("load_ext", "yax_widget")
        wanted = {}
        for opened, names, inputs in CASES:
            if opened.startswith("%yax"):
                shell.user_ns.update({k: v for k, v in vars(zoo).items() if not k.startswith("_")})
                shell.user_ns.update({n: getattr(zoo, z) for n, z in names.items()})
                ex = shell.run_line_magic("yax", opened[len("%yax "):])
            else:
                ex = eval(opened, {**vars(zoo), "Explorer": Explorer})  # noqa: S307
            ex.substitute("//activation", "ReLU")
            assert not ex.comparison.allclose, opened  # the change shows in the numbers
            code = ex.code()
            assert _listed(code) == list(names), f"{opened}: the comment lists other names than the script's\n{code}"
            assert ("use your names" in code) == ("[" in opened and not opened.startswith("%yax")), code
            assert ("names given to Explorer(...)" in code) == ("use your names" not in code and opened.startswith("Explorer"))
            # a namespace holding only the user's names the comment lists, then the script as pasted
            kernel.submit("%reset -f\n" + "\n".join(f"from zoo import {z} as {n}" for n, z in names.items()), opened)
            kernel.submit(code, opened)
            params = [ex.params] if ex.session.has_params else []
            check = kernel.submit(f"import zoo\nprint(zoo.dump(yax.eval_mox(mox, {'params, ' if params else ''}"
                                  f"*zoo.inputs({inputs!r})[0], **zoo.inputs({inputs!r})[1])))", opened)
            args, kwargs = zoo.inputs(inputs)
            wanted[check] = (opened, code, [np.asarray(leaf, np.float64) for leaf in jax.tree_util.tree_leaves(
                yax.eval_mox(ex.mox, *params, *args, **kwargs))])
            ex.close()
        outputs = kernel.outputs()
    finally:
        kernel.close()
    assert outputs[first].strip() == sys.executable  # the kernel runs this venv's python
    for check, (opened, code, want) in wanted.items():
        got = json.loads(outputs[check])
        assert len(got) == len(want), opened
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6, err_msg=f"{opened}\n{code}")
