"""How yax compiles whole models: on XLA:CPU with the memory-minimising scheduler,
which changes when each operation runs, never what it computes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import yax
from yax.internal import model_jit


def _chain(ws, x):
    for w in ws:  # a bfloat16 weight in a float32 product: XLA:CPU makes a float32 copy of it
        x = jnp.tanh(x @ w.astype(jnp.float32))
    return x


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the scheduler option is XLA:CPU's")
def test_whole_model_programs_hold_one_widened_weight_at_a_time_and_compute_the_same_bits():
    ws = [jax.random.normal(jax.random.key(i), (512, 512), jnp.bfloat16) for i in range(8)]
    x = jax.random.normal(jax.random.key(9), (4, 512))
    plain = jax.jit(_chain).lower(ws, x).compile()
    ours = model_jit(_chain).lower(ws, x).compile()
    copy = 512 * 512 * 4
    # XLA's default scheduler makes all eight float32 copies first; ours makes each before its product
    assert plain.memory_analysis().temp_size_in_bytes >= 8 * copy
    assert ours.memory_analysis().temp_size_in_bytes <= 2 * copy
    assert np.array_equal(plain(ws, x), ours(ws, x))
    # and so does a MoX of it, measured by `compare` against itself: no difference, bit for bit
    mox = yax.make_mox(_chain)(ws, x)
    c = yax.compare(mox, mox, ws, x)
    assert all(s.max_abs == 0 for s in [*c.outputs.values(), *c.boundaries.values()])
