"""Every feature on nnx models of current architectures (tests/zoo_nnx.py):
trace, eval (values and the updated state) against the model, jit, grad, query,
an activation swap against the model built with the other activation, with
`compare` naming the swapped node, LoRA (starts equal, trains, merges), capture
and patch, and the explorer. Issue 41.

A model is entered as ``make_mox(model)(*args)`` (eval takes and returns its
state) or, for the Qwen3-style decoder, through the jitted ``forward(model,
cache, tokens)`` reference implementations give (eval takes the model itself)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import check_compiled_cost
from zoo_nnx import CASES

import yax

pytestmark = pytest.mark.slow  # the nnx zoo: the full command runs it

# The two decoders run on the oldest supported JAX too (``-m core``): one entered as the model, one
# through a jitted forward; the rest reach JAX the same ways.
OLDEST = {"llama-kv-cache", "qwen3-jitted-forward"}
by_case = pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.core] if n in OLDEST else []) for n in CASES], scope="module")


@functools.cache
def traced(name):
    """The case's target and arguments, and its MoX, traced once per process."""
    c = CASES[name]
    target, args = c.build(None)
    return c, target, args, yax.make_mox(target)(*args)


def flat(tree):
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def assert_close(got, want, rtol=1e-5, atol=1e-5):
    got, want = flat(got), flat(want)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=atol, err_msg=k)


def loss(out):
    return sum(jnp.mean(jnp.square(jnp.asarray(x, jnp.float32))) for x in jax.tree_util.tree_leaves(out)
               if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating))


def run_model(c, target, args):
    """What the model itself computes: ``(out, state after)`` (the state of a copy: the model is untouched)."""
    if c.functional:
        return target(*args), None
    m = nnx.clone(target)
    return m(*args), nnx.state(m)


def run_mox(c, mox, target, args, state=None):
    """The same through yax: ``(out, state after)``."""
    if c.functional:
        return yax.eval_mox(mox, *args), None
    return yax.eval_mox(mox, nnx.state(target) if state is None else state, *args)


def out_of(c, out):
    return out[0] if c.functional else out  # a forward returns (logits, cache)


@by_case
def test_eval_jit_and_grad_equal_the_model(name):
    c, target, args, mox = traced(name)
    want, want_state = run_model(c, target, args)
    got, got_state = run_mox(c, mox, target, args)
    assert_close(got, want)
    if not c.functional:  # what the call wrote (the KV cache, BatchNorm's statistics in train mode)
        assert_close(got_state, want_state)
        jitted = jax.jit(lambda s, *a: yax.eval_mox(mox, s, *a))(nnx.state(target), *args)
        assert_close(jitted, (want, want_state))
        graphdef, params, rest = nnx.split(target, nnx.Param, ...)
        grad = jax.jit(jax.grad(lambda p: loss(yax.eval_mox(mox, nnx.merge_state(p, rest), *args)[0])))(params)
        grad_want = jax.grad(lambda p: loss(nnx.merge(graphdef, p, rest, copy=True)(*args)))(params)
    else:
        jitted = jax.jit(lambda *a: yax.eval_mox(mox, *a))(*args)
        assert_close(jitted, want)
        model, *rest = args
        grad = jax.jit(jax.grad(lambda m: loss(out_of(c, yax.eval_mox(mox, m, *rest)))))(model)
        grad_want = jax.jit(jax.grad(lambda m: loss(out_of(c, target(m, *rest)))))(model)
    assert max(float(np.abs(v).max()) for v in flat(grad_want).values()) > 0
    assert_close(grad, grad_want, rtol=1e-4, atol=1e-6)


@by_case
def test_query_names_every_block_by_its_attribute_path(name):
    c, target, args, mox = traced(name)
    kind, n = c.calls
    paths = yax.query(f'//module_call[@type="{kind}"]/@path', mox)
    assert len(paths) == n and len(set(paths)) == n, paths  # each block its own path (`layers/0`, `layers/1`)
    first = paths[0]
    assert [x.path for x in yax.query(f'//module_call[@path="{first}"]', mox)] == [first]


@by_case
def test_activation_swap_equals_the_model_built_with_the_other_activation(name):
    c, target, args, mox = traced(name)
    acts = yax.query(f'//*[@name="{c.act}"]', mox)
    assert acts
    new = yax.sub(f'//*[@name="{c.act}"]', jax.nn.relu, mox)
    assert yax.query(f'count(//*[@name="{c.act}"])', new) == 0.0
    assert yax.query(f'count(//*[@name="{c.act}"])', mox) == len(acts)  # the original is untouched
    hand, hand_args = c.build(jax.nn.relu)
    want, _ = run_model(c, hand, hand_args)
    got, _ = run_mox(c, new, target, args)
    assert not np.allclose(out_of(c, got), out_of(c, run_model(c, target, args)[0]), atol=1e-4)
    assert_close(out_of(c, got), out_of(c, want), rtol=1e-4, atol=1e-5)
    params = args[0] if c.functional else nnx.state(target)
    rest = args[1:] if c.functional else args
    comparison = yax.compare(mox, new, params, *rest)
    assert not comparison.allclose
    assert comparison.first_divergence.split("#")[0] == acts[0].path, (comparison.first_divergence, acts[0].path)


@by_case
def test_lora_starts_equal_trains_and_merges(name):
    c, target, args, mox = traced(name)
    n = len(yax.query(c.layers, mox))
    assert n >= 2
    if c.functional:  # a function of the model holds no variables of its own: LoRA says to trace the model
        before = str(mox)
        with pytest.raises(yax.YaxRewriteError, match=r"trace the model itself \(`yax.make_mox\(model\)"):
            yax.sub(c.layers, yax.LoRA(rank=2), mox, params=args[0])
        assert str(mox) == before
        model, cache, tokens = args  # ... and on the model itself it works
        mox = yax.make_mox(model)(tokens, cache)
        target, args = model, (tokens, cache)
        c = dataclasses.replace(c, functional=False)
    new, lp = yax.sub(c.layers, yax.LoRA(rank=2), mox, params=nnx.state(target))
    adapters = '//module_call[@type="LoRA" or @type="LoRALinear"][not(ancestor::module_call[@type="LoRALinear"])]'
    assert len(yax.query(adapters, new)) == n  # (nnx's `LoRALinear` calls an `nnx.LoRA` of its own)

    def run(p):
        return yax.eval_mox(new, p, *args)[0]  # eval gives (out, state after)

    want = yax.eval_mox(mox, nnx.state(target), *args)[0]
    assert_close(run(lp), want, rtol=1e-6, atol=1e-6)  # lora_b starts at zero
    trained = jax.tree_util.tree_map_with_path(
        lambda kp, v: v + 0.2 if "lora_b" in jax.tree_util.keystr(kp) else v, lp)
    out = run(trained)
    assert not np.allclose(jax.tree_util.tree_leaves(out)[0], jax.tree_util.tree_leaves(want)[0], atol=1e-4)
    merged, mp = yax.merge_lora(new, trained)
    assert yax.query('count(//module_call[@type="LoRA" or @type="LoRALinear"])', merged) == 0.0
    assert_close(yax.eval_mox(merged, mp, *args)[0], out, rtol=1e-4, atol=1e-5)


@by_case
def test_capture_and_patch_reproduce_and_ablate_like_the_hand_modified_model(name):
    c, target, args, mox = traced(name)
    pattern = f'//*[@name="{c.act}"]'
    eval_args = args if c.functional else (nnx.state(target), *args)
    out, acts = yax.capture(pattern, mox, *eval_args)
    assert len(acts) >= 1 and all(np.abs(np.asarray(v)).max() > 0 for v in acts.values())
    same = yax.patch(pattern, mox)(acts, *eval_args)
    assert_close(same, out, rtol=0, atol=0)  # patched with its own values: exactly the model
    zeros = {k: jnp.zeros_like(v) for k, v in acts.items()}
    ablated = yax.patch(pattern, mox)(zeros, *eval_args)
    hand, hand_args = c.build(jnp.zeros_like)  # the model with that activation outputting zeros
    want, _ = run_model(c, hand, hand_args)
    assert_close(out_of(c, ablated if c.functional else ablated[0]), out_of(c, want), rtol=1e-4, atol=1e-5)


@by_case
def test_the_explorer_swaps_and_compares(name):
    from yax_widget import Explorer

    c, target, args, mox = traced(name)
    ex = Explorer(target, *args)
    try:
        assert str(ex.original) == str(mox)
        ex.substitute(f'//*[@name="{c.act}"]', "ReLU")
        first = yax.query(f'//*[@name="{c.act}"]', mox)[0].path
        assert ex.comparison is not None and not ex.comparison.allclose
        assert ex.comparison.first_divergence.split("#")[0] == first
        hand, hand_args = c.build(jax.nn.relu)
        want, _ = run_model(c, hand, hand_args)
        got = yax.eval_mox(ex.mox, *args) if c.functional else yax.eval_mox(ex.mox, ex.params, *args)
        assert_close(out_of(c, got if c.functional else got[0]), out_of(c, want), rtol=1e-4, atol=1e-5)
    finally:
        ex.close()


@by_case
def test_compiled_cost_is_xlas_and_names_every_call(name):
    c, target, args, mox = traced(name)
    mox_args = args if c.functional else (nnx.state(target), *args)
    cost = check_compiled_cost(mox, *mox_args)
    assert cost.calls[""].total["flops"] is None or cost.calls[""].total["flops"] > 0
