"""Activations are exact: each node is named where it runs, and what an
activation computes is what the user's names and tables held when it was
traced, whatever ran before it or beside it (issue 37, points 2 and 11).

- An activation applied in a plain function after a module call
  (``jax.nn.relu(block.apply(v, x) - 0.5)``, the notebook's ``log_softmax``
  after a Hugging Face model) is the root's (``relu``), not the module's
  (``Block/relu``, the one inside it): one node per path, and a rewrite by
  path changes the one meant. Linen, nnx, Equinox and Hugging Face alike.
- A table patched by the user (``ACT2FN["relu"] = jax.nn.silu``) while another
  thread's trace has its entries pointed at yax's wrappers is theirs: the end
  of that trace must not put the old entry back (a replacement traced next
  came out as the unpatched model, silently, depending on how long the other
  trace ran), and no wrapper is left in a table. A table patched in place
  with an entry of another kind (same length, same dict) is read again, so a
  trace gives the tree a trace in a fresh process gives.
"""

import functools
import sys
import threading
import time

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx
from transformers import modeling_flax_utils

import yax
from yax import _activations

pytestmark = pytest.mark.core

ACT2FN = modeling_flax_utils.ACT2FN
X = jnp.linspace(-1.5, 1.5, 8).reshape(2, 4)
KEY = jax.random.key(0)


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def evaluated(mox, *args):
    """``eval_mox`` under one ``jax.jit``: one compile, not one per operation."""
    return jax.jit(lambda *a: yax.eval_mox(mox, *a))(*args)


def act_paths(mox):
    return [n.path for n in yax.query("//activation", mox)]


def check_outer_is_the_roots(mox, inner, outer, args, inner_fn, module_out):
    """``mox`` computes ``relu(module(x) - 0.5)`` with ``inner`` the module's own activation:
    the outer one is the root's, each path names one node, and a rewrite by path changes only it."""
    assert act_paths(mox) == [inner, outer]
    assert len(yax.query(f'//activation[@path="{inner}"]', mox)) == 1
    assert len(yax.query(f'//activation[@path="{outer}"]', mox)) == 1
    new = yax.sub(f'//activation[@path="{outer}"]', jax.nn.gelu, mox)
    close(evaluated(new, *args), jax.nn.gelu(module_out - 0.5))
    assert [n.name for n in yax.query("//activation", new)] == ["relu", "gelu"]
    new = yax.sub(f'//activation[@path="{inner}"]', jax.nn.gelu, mox)
    close(evaluated(new, *args), jax.nn.relu(inner_fn(jax.nn.gelu) - 0.5))
    assert [n.name for n in yax.query("//activation", new)] == ["gelu", "relu"]


# -- point 2: an activation after a module call in a plain function ----------------------------------------------

def test_linen_block_in_a_plain_function():
    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.relu(nn.Dense(3)(x))

    b = Block()
    v = b.init(KEY, X)
    mox = yax.make_mox(lambda v, x: jax.nn.relu(b.apply(v, x) - 0.5))(v, X)
    dense = nn.Dense(3).bind({"params": v["params"]["Dense_0"]})
    check_outer_is_the_roots(mox, "Block/relu", "relu", (v, X), lambda f: f(dense(X)), b.apply(v, X))


def test_nnx_module_in_a_plain_function():
    class NBlock(nnx.Module):
        def __init__(self):
            self.lin = nnx.Linear(4, 3, rngs=nnx.Rngs(0))

        def __call__(self, x):
            return nnx.relu(self.lin(x))

    m = NBlock()
    graphdef, state = nnx.split(m)
    mox = yax.make_mox(lambda s, x: jax.nn.relu(nnx.merge(graphdef, s)(x) - 0.5))(state, X)
    check_outer_is_the_roots(mox, "NBlock/relu", "relu", (state, X), lambda f: f(m.lin(X)), m(X))


def test_equinox_module_in_a_plain_function():
    class EBlock(eqx.Module):
        lin: eqx.nn.Linear

        def __init__(self):
            self.lin = eqx.nn.Linear(4, 3, key=KEY)

        def __call__(self, x):
            return jax.nn.relu(self.lin(x))

    m = EBlock()
    mox = yax.make_mox(lambda m, x: jax.nn.relu(jax.vmap(m)(x) - 0.5))(m, X)
    check_outer_is_the_roots(mox, "EBlock/relu", "relu", (m, X), lambda f: f(jax.vmap(m.lin)(X)), jax.vmap(m)(X))


def test_log_softmax_after_a_hugging_face_model_is_the_roots():
    """The notebook idiom: ``lambda params, ids: model(...)`` then ``log_softmax``."""
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=16)
    model = transformers.FlaxGPT2LMHeadModel(config, seed=0)
    ids = jnp.array([[5, 7, 11, 13, 2, 3]], dtype=jnp.int32)

    def fn(params, ids):
        return jax.nn.log_softmax(model(ids, params=params).logits)

    mox = yax.make_mox(fn)(model.params, ids)
    assert len(yax.query('//activation[@path="log_softmax"]', mox)) == 1
    assert not yax.query('//activation[@path="FlaxGPT2LMHeadModule/log_softmax"]', mox)
    inner = [p for p in act_paths(mox) if p != "log_softmax"]
    assert inner and all(p.startswith("FlaxGPT2LMHeadModule/") for p in inner)  # GPT-2's own gelu_new
    logits = jax.jit(lambda p, i: model(i, params=p).logits)(model.params, ids)
    close(evaluated(mox, model.params, ids), jax.nn.log_softmax(logits))
    new = yax.sub('//activation[@path="log_softmax"]', jax.nn.softmax, mox)
    close(evaluated(new, model.params, ids), jax.nn.softmax(logits))  # GPT-2's gelu_new untouched


# -- point 11: what an activation computes is what the tables held, whatever runs beside ---------------------------

class Block(nn.Module):
    """A layer that reads its activation from the table in ``setup``, as Hugging Face's layers do."""

    def setup(self):
        self.dense = nn.Dense(3)
        self.act = ACT2FN["relu"]

    def __call__(self, x):
        return self.act(self.dense(x))


class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(2, name="head")(Block(name="block")(x))


@pytest.fixture
def model():
    m = Model()
    v = m.init(KEY, X)
    p = v["params"]

    def by_hand(f):
        h = f(X @ p["block"]["dense"]["kernel"] + p["block"]["dense"]["bias"])
        return h @ p["head"]["kernel"] + p["head"]["bias"]

    return m, v, by_hand


def untouched():
    """The table and the public names hold what they held before any trace: no wrapper anywhere."""
    assert ACT2FN == dict(ORIGINAL) and all(ACT2FN[k] is f for k, f in ORIGINAL.items())
    assert jax.nn.relu is RELU and nn.relu is RELU
    for holder in (jax.nn, nn, ACT2FN):
        items = holder.items() if isinstance(holder, dict) else vars(holder).items()
        assert not [k for k, f in items if hasattr(f, "__yax_activation__")]
    assert _activations._during is None and not _activations._undo and not _activations._swaps


ORIGINAL = dict(ACT2FN)
RELU, SILU, TANH = jax.nn.relu, jax.nn.silu, jax.nn.tanh  # read outside any trace


class Held:
    """A trace in another thread held open (its names and table entries pointed at
    wrappers) until `release`: what the explorer's worker does while the user works."""

    def __init__(self):
        self._inside, self._go, self.error = threading.Event(), threading.Event(), None

        def f(x):
            self._inside.set()
            self._go.wait(30)
            return jax.nn.tanh(x)

        def run():
            try:
                yax.make_mox(f)(X)
            except BaseException as e:  # reported by `release`
                self.error = e

        self._thread = threading.Thread(target=run)
        self._thread.start()
        assert self._inside.wait(30)

    def release(self):
        self._go.set()
        self._thread.join(30)
        assert not self._thread.is_alive() and self.error is None


def replaced(m, v, rep):
    """``m``'s block replaced by ``rep`` (a root MoX of a block's ``apply``), evaluated."""
    mox = yax.make_mox(m.apply)(v, X)
    new = yax.sub(yax.query('//module_call[@type="Block"]', mox), rep, mox)
    return evaluated(new, v, X)


def test_a_patch_made_while_another_thread_traces_is_kept_and_traced(model):
    """The user patches the table while another thread's trace runs; that trace ends; the block
    traced next is the patched one (before: the end of the other trace put `relu` back, and the
    replacement silently computed the unpatched model)."""
    m, v, by_hand = model
    block_vars = {"params": v["params"]["block"]}
    held = Held()
    ACT2FN["relu"] = SILU  # the user's patch, made while the other trace runs
    try:
        held.release()
        assert ACT2FN["relu"] is SILU  # the end of the other trace left it alone
        rep = yax.make_mox(Block().apply)(block_vars, X)
    finally:
        ACT2FN["relu"] = ORIGINAL["relu"]
    assert [n.name for n in yax.query("//activation", rep)] == ["silu"]
    close(replaced(m, v, rep), by_hand(jax.nn.silu))
    untouched()


def test_a_patch_traced_beside_another_trace_is_kept_and_nothing_is_left_in_the_table(model):
    """Both traces run at once: the user's patched block joins the other trace; the user, who
    read the entry while the other trace ran (a wrapper), puts it back before that trace ends.
    When the last trace ends the table holds the original function, not a wrapper."""
    m, v, by_hand = model
    block_vars = {"params": v["params"]["block"]}
    held = Held()
    old = ACT2FN["relu"]  # read while the other trace runs: yax's wrapper of `relu`
    ACT2FN["relu"] = jax.nn.silu  # (also yax's wrapper, of `silu`, while that trace runs)
    try:
        rep = yax.make_mox(Block().apply)(block_vars, X)
    finally:
        ACT2FN["relu"] = old
        held.release()
    assert [n.name for n in yax.query("//activation", rep)] == ["silu"]
    close(replaced(m, v, rep), by_hand(jax.nn.silu))
    untouched()
    # a wrapper written back after every trace ended is put back as its function by the next trace
    held = Held()
    old = ACT2FN["relu"]
    held.release()
    ACT2FN["relu"] = old
    yax.make_mox(lambda x: x + 1)(X)
    untouched()


def test_a_table_patched_in_place_is_read_again(model):
    """The same dict, the same length, another entry: the tree is the one a fresh process gives
    (the node named by its key, as for any partial in the table), not one from a table read
    before the patch (which named it after the function)."""
    m, v, _ = model
    yax.make_mox(lambda x: jax.nn.relu(x))(X)  # the table read before the patch
    leaky = functools.partial(jax.nn.leaky_relu, negative_slope=0.25)
    ACT2FN["relu"] = leaky
    try:
        mox = yax.make_mox(m.apply)(v, X)
    finally:
        ACT2FN["relu"] = ORIGINAL["relu"]
    assert [(n.path, n.method, dict(n.attrs)) for n in yax.query("//activation", mox)] == [
        ("Model/block/relu", "leaky_relu", {"negative_slope": 0.25})]
    assert not yax.query('//activation[@name="leaky_relu"]', mox)
    untouched()


def test_patches_beside_concurrent_traces_stress(model):
    """A thread traces again and again (each trace holding the names patched for a few
    milliseconds) while the user patches the table, traces the block and restores the table,
    16 times: each block computes what the table held, and the table is the user's at the end,
    however the traces and patches fell. Bounded: a few seconds."""
    _, v, _ = model
    block_vars = {"params": v["params"]["block"]}
    stop, errors = threading.Event(), []

    def slow(x):
        time.sleep(0.004)  # the names stay patched meanwhile
        return jax.nn.gelu(x)

    def churn():
        try:
            while not stop.is_set():
                yax.make_mox(slow)(X)
                time.sleep(0.001)  # and none for a moment: the last trace to end undoes the patch
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=churn)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # threads hand over every 0.1 ms: patches and traces interleave finely
    thread.start()
    got = []
    try:
        for i in range(16):
            f = (SILU, TANH, RELU, jax.nn.sigmoid)[i % 4]
            ACT2FN["relu"] = f
            try:
                time.sleep(0.002 * (i % 3))  # the other thread's trace may end meanwhile
                rep = yax.make_mox(Block().apply)(block_vars, X)
            finally:
                ACT2FN["relu"] = ORIGINAL["relu"]
            got.append((f, [n.name for n in yax.query("//activation", rep)],
                        np.asarray(yax.eval_mox(rep, block_vars, X))))
    finally:
        stop.set()
        thread.join(60)
        sys.setswitchinterval(switch)
    assert not errors and not thread.is_alive()
    dense = nn.Dense(3).bind({"params": v["params"]["block"]["dense"]})
    wrong = [f.__name__ for f, names, out in got if names != [f.__name__] or not np.allclose(out, f(dense(X)), atol=1e-6)]
    assert not wrong, f"{len(wrong)} of {len(got)} blocks were traced with another activation than the table held"
    untouched()
