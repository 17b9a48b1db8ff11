"""`compare` on an nnx model in train mode: the state
updates the call makes (BatchNorm's running statistics) are compared too, by
name, checked against the real modules; the parameters it hands back as they
came in are not."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import yax


class Net(nnx.Module):
    def __init__(self, rngs, act=nnx.gelu):
        self.fc1, self.bn, self.fc2 = nnx.Linear(8, 16, rngs=rngs), nnx.BatchNorm(16, rngs=rngs), nnx.Linear(16, 2, rngs=rngs)
        self.act = act

    def __call__(self, x):
        return self.fc2(self.bn(self.act(self.fc1(x))))


X = jax.random.normal(jax.random.key(1), (6, 8))


def real_update(act):
    """The running mean the real model holds after one train-mode call."""
    net = Net(nnx.Rngs(0), act=act)
    net.train()
    net(X)
    return np.asarray(net.bn.mean[...])


def test_train_mode_compares_the_state_updates_by_name():
    net = Net(nnx.Rngs(0))
    net.train()
    _, state = nnx.split(net)
    mox = yax.make_mox(net)(X)
    new, new_state = yax.sub('//activation[@name="gelu"]', jax.nn.relu, mox, params=state)
    c = yax.compare(mox, new, state, X, new_params=new_state)
    names = list(c.outputs)
    assert names[0] == "out[0]" and any("['bn']['mean']" in n for n in names) and any("['bn']['var']" in n for n in names)
    assert not any("kernel" in n or "bias" in n or "scale" in n for n in names), names  # handed back unchanged
    mean = next(n for n in names if "['bn']['mean']" in n)
    a, b = c.arrays[mean]
    np.testing.assert_allclose(a, real_update(nnx.gelu), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, real_update(nnx.relu), rtol=1e-5, atol=1e-6)
    assert c.outputs[mean].max_abs == float(np.max(np.abs(b - a))) > 0


def test_a_rewrite_adding_variables_pairs_the_updates_both_have():
    net = Net(nnx.Rngs(0))
    net.train()
    _, state = nnx.split(net)
    mox = yax.make_mox(net)(X)
    new, new_state = yax.sub('//module_call[@name="fc1"]', yax.LoRA(rank=2), mox, params=state,
                             key=jax.random.key(3))
    c = yax.compare(mox, new, state, X, new_params=new_state)
    assert c.allclose  # LoRA starts at zero: the output and the running statistics are the same
    assert len(c.outputs) == 3 and not any("lora" in n for n in c.outputs)


def test_eval_mode_compares_the_output_only():
    net = Net(nnx.Rngs(0))
    net.eval()
    _, state = nnx.split(net)
    mox = yax.make_mox(net)(X)
    new, new_state = yax.sub('//activation[@name="gelu"]', jnp.tanh, mox, params=state)
    assert list(yax.compare(mox, new, state, X, new_params=new_state).outputs) == ["out[0]"]
