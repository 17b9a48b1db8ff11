"""How yax compiles whole models: on XLA:CPU with the memory-minimising scheduler,
which changes when each operation runs, never what it computes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import yax
from yax import _jit
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


@pytest.mark.core  # the compile event is JAX's: checked on the oldest JAX too
@pytest.mark.skipif(_jit._malloc_trim() is None, reason="malloc_trim is glibc's")
def test_whole_model_programs_give_the_compilers_memory_back_before_they_run_and_nothing_else_does():
    def trims():
        return getattr(_jit._here, "trims", 0)

    x = jnp.arange(7.0)
    before = trims()
    jax.jit(lambda v: v * 3 + 1)(x)  # a user's own compile: left alone
    assert trims() == before
    f = model_jit(lambda v: jnp.sin(v) * 2)
    assert np.array_equal(f(x), jnp.sin(x) * 2)
    assert trims() == before + 1  # JAX's compile event seen, glibc's trim called, on the compiling thread
    f(x)  # compiled already: nothing to give back
    assert trims() == before + 1
    g = model_jit(lambda v: jnp.cos(v))
    g.lower(x).compile()  # `compare` compiles ahead of the call: the same
    assert trims() == before + 2
    jax.jit(lambda v: f(v) + 1)(x)  # inside another trace the outer compile is the user's
    assert trims() == before + 2
