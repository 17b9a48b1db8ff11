"""Sweeps in one compile: `jax.vmap` over the argument of `yax.patch`'s function runs a whole
activation-patching sweep (every layer × position) as one call, and gives what the loop of single
patched calls gives: values and gradients, on a linen stack, on one in ``nn.scan`` (by the step, and
by arrays stacked along the scan axis) and on Hugging Face's Flax GPT-2."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import CASES

import yax
from yax.internal import capture_programs

CLEAN = jnp.array([[5, 9, 13, 21, 33, 2, 8, 40], [7, 1, 3, 50, 4, 6, 10, 12]])
CORRUPT = CLEAN.at[:, 3].set(60)  # the same prompts with token 3 changed


def close(a, b, atol=1e-5):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=atol), a, b)


def logit_diff(logits):
    return (logits[:, -1, 11] - logits[:, -1, 12]).sum()


def grid_of(n_layers: int, n_pos: int):
    """Every (layer, position) pair, flattened: the batch axis of the sweep."""
    layer, pos = np.divmod(np.arange(n_layers * n_pos), n_pos)
    return jnp.asarray(layer), jnp.asarray(pos)


def restorer(layers: list[str]):
    """``repl(path, value, arg)``: the clean value at ``arg``'s layer and position, the corrupted
    value elsewhere (a call returning a pytree has each leaf restored)."""

    def restore(path, out, a):
        def put(h, c):
            hit = (a["layer"] == layers.index(path)) & (jnp.arange(h.shape[1]) == a["pos"])[:, None]
            return jnp.where(hit, c, h)

        return jax.tree_util.tree_map(put, out, a["clean"][path])

    return restore


def restore_step(path, h, a, step):
    """Inside ``nn.scan``: the scan step is the layer; ``a["clean"]`` is stacked along it."""
    (i,) = step
    hit = (i == a["layer"]) & (jnp.arange(h.shape[1]) == a["pos"])[:, None]
    return jnp.where(hit, a["clean"][i], h)


@functools.cache
def setup(name: str):
    """``(one, params, clean, n_layers, n_pos, mox, hi)``: ``one(params, clean, layer, pos)`` is the
    logit difference of the corrupted run with ``clean`` restored at one layer and position; ``hi``
    is the clean run's."""
    fn, (params, _), kwargs = CASES[name]()
    mox = yax.make_mox(fn)(params, CLEAN, **kwargs)
    if name == "transformer_scan":  # one node, called once per step: the steps are the layers
        pattern = '//module_call[@path="Transformer/layers/Block_0"]'
        _, values = yax.capture(pattern, mox, params, CLEAN, **kwargs)
        clean = values["Transformer/layers/Block_0"]
        patched, n_layers = yax.patch(pattern, mox, restore_step), clean.shape[0]
    else:
        layers = ["Transformer/embed", "Transformer/Block_0", "Transformer/Block_1"]
        pattern = " | ".join(f'//module_call[@path="{p}"][@method="__call__"]' for p in layers)
        _, clean = yax.capture(pattern, mox, params, CLEAN, **kwargs)
        patched, n_layers = yax.patch(pattern, mox, restorer(layers)), len(layers)

    def one(params, clean, layer, pos):
        return logit_diff(patched({"clean": clean, "layer": layer, "pos": pos}, params, CORRUPT, **kwargs))

    return one, params, clean, n_layers, CLEAN.shape[1], mox, logit_diff(fn(params, CLEAN, **kwargs))


@pytest.mark.core
@pytest.mark.parametrize("name", ["transformer", "transformer_scan"])
def test_the_vmapped_sweep_is_the_loop_of_single_patches(name):
    one, params, clean, n_layers, n_pos, mox, hi = setup(name)
    layer, pos = grid_of(n_layers, n_pos)
    traces = [p.traces for k, p in capture_programs(mox).items() if k[2] == "fn"]
    swept = jax.jit(jax.vmap(one, in_axes=(None, None, 0, 0)))(params, clean, layer, pos)
    # the whole sweep (layers × positions runs) traced the patched program at most once
    assert sum(p.traces for k, p in capture_programs(mox).items() if k[2] == "fn") <= sum(traces) + 1
    loop = [one(params, clean, int(i), int(t)) for i, t in zip(layer, pos)]
    close(swept, jnp.stack(loop))
    grid = np.asarray(swept).reshape(n_layers, n_pos)
    lo = one(params, clean, -1, -1)  # nothing restored: the corrupted run
    close(grid[-1], np.r_[np.full(n_pos - 1, lo), hi], atol=1e-4)  # the last layer: only its last position counts
    assert not np.allclose(grid[:, 3], lo, atol=1e-3)  # restoring the changed token changes the answer
    if name == "transformer":  # causal: positions before the changed token never saw it
        close(grid[:, :3], np.full((n_layers, 3), lo), atol=1e-4)


@pytest.mark.core
def test_vmap_over_arrays_stacked_along_the_scan_axis():
    # without `repl`, a node inside a scan takes arrays stacked along the scan axis (as `capture`
    # gives them); a batch of such stacks under `jax.vmap` is a sweep of whole replacements
    fn, (params, _), kwargs = CASES["transformer_scan"]()
    mox = yax.make_mox(fn)(params, CLEAN, **kwargs)
    key = "Transformer/layers/Block_0"
    patched = yax.patch(f'//module_call[@path="{key}"]', mox)
    _, clean = yax.capture(f'//module_call[@path="{key}"]', mox, params, CLEAN, **kwargs)
    _, corrupt = yax.capture(f'//module_call[@path="{key}"]', mox, params, CORRUPT, **kwargs)
    n_layers, n_pos = clean[key].shape[0], CLEAN.shape[1]
    layer, pos = grid_of(n_layers, n_pos)
    hit = (jnp.arange(n_layers)[None, :, None, None, None] == layer[:, None, None, None, None]) & (
        jnp.arange(n_pos)[None, None, None, :, None] == pos[:, None, None, None, None])
    stacks = jnp.where(hit, clean[key], corrupt[key])  # (layers × positions, steps, batch, seq, d)

    def one(stack):
        return logit_diff(patched({key: stack}, params, CORRUPT, **kwargs))

    swept = jax.jit(jax.vmap(one))(stacks)
    close(swept, jnp.stack([one(s) for s in stacks]))
    close(one(corrupt[key]), logit_diff(fn(params, CORRUPT, **kwargs)))  # the corrupted stack: nothing changed


@pytest.mark.slow
@pytest.mark.core
@pytest.mark.parametrize("name", ["transformer", "transformer_scan"])
def test_grad_through_a_vmapped_patch_is_the_grad_of_the_loop(name):
    one, params, clean, n_layers, n_pos, *_ = setup(name)
    layer, pos = grid_of(n_layers, n_pos)
    grad_one = jax.jit(jax.grad(one, argnums=(0, 1)))  # by the weights and by the patch argument
    loop = [grad_one(params, clean, i, t) for i, t in zip(layer, pos)]

    # the gradient of the vmapped sweep's total is the sum of the loop's gradients
    def total(params, clean):
        return jax.vmap(one, in_axes=(None, None, 0, 0))(params, clean, layer, pos).sum()

    summed = jax.tree_util.tree_map(lambda *g: sum(g), *loop)
    close(jax.jit(jax.grad(total, argnums=(0, 1)))(params, clean), summed, atol=1e-4)
    # and vmap of the gradient gives each patch's own
    each = jax.jit(jax.vmap(jax.grad(one, argnums=(0, 1)), in_axes=(None, None, 0, 0)))(params, clean, layer, pos)
    close(each, jax.tree_util.tree_map(lambda *g: jnp.stack(g), *loop), atol=1e-4)


@pytest.mark.slow
def test_the_vmapped_sweep_on_hugging_face_gpt2():
    # the notebook's recipe (notebooks/inside.ipynb): GPT-2 blocks return tuples
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=3, n_head=2)
    model = transformers.FlaxGPT2LMHeadModel(config, seed=0)
    mox = yax.make_mox(lambda params, ids: model(ids, params=params).logits)(model.params, CLEAN)
    pattern = '//module_call[@name="wte"] | //module_call[@type="FlaxGPT2Block"]'
    _, clean = yax.capture(pattern, mox, model.params, CLEAN)
    layers = list(clean)
    patched = yax.patch(pattern, mox, restorer(layers))

    def one(layer, pos):
        return logit_diff(patched({"clean": clean, "layer": layer, "pos": pos}, model.params, CORRUPT))

    layer, pos = grid_of(len(layers), CLEAN.shape[1])
    swept = jax.jit(jax.vmap(one))(layer, pos).reshape(len(layers), -1)
    close(swept, jnp.stack([one(int(i), int(t)) for i, t in zip(layer, pos)]).reshape(len(layers), -1), atol=1e-4)
    hi, lo = logit_diff(model(CLEAN).logits), logit_diff(model(CORRUPT).logits)
    close(swept[0, 3], hi, atol=1e-4)  # the changed token's embedding restored: the clean answer
    close(swept[-1, -1], hi, atol=1e-4)  # the last block's last position carries all of it too
    close(swept[:, :3], jnp.full((len(layers), 3), lo), atol=1e-4)

    # the faster form for deep models: one patch per layer, vmapped over the position only; what lies
    # below the patched layer does not depend on the position and stays unbatched
    def put(path, out, a):
        return jax.tree_util.tree_map(lambda h, c: jnp.where((jnp.arange(h.shape[1]) == a["pos"])[:, None], c, h),
                                      out, a["clean"])

    at = {p: yax.patch(f'//module_call[@path="{p}"]', mox, put) for p in layers}

    @jax.jit
    def by_position(clean):
        def row(p):
            return jnp.stack([logit_diff(at[n]({"clean": clean[n], "pos": p}, model.params, CORRUPT)) for n in layers])
        return jax.vmap(row)(jnp.arange(CLEAN.shape[1])).T

    close(by_position(clean), swept, atol=1e-4)
