"""Sweeps in one compile (issue 27): the layer × position activation-patching sweep of
notebooks/inside.ipynb as one ``jax.vmap``-ped, jitted call, against a Python loop of jitted calls
and a loop of eager ones.

The model is the notebook's: a Hugging Face ``FlaxGPT2LMHeadModel`` from a small config with random
weights (nothing downloaded), by default the notebook's own (3 blocks, d_model 32, 2 heads,
vocabulary 64, one prompt of 8 tokens); ``--layers 6 --embd 128 --heads 4 --vocab 512 --seq 16`` is
a larger one. The sweep restores the clean value of one layer's output (the token embedding, then
each block) at one position of the corrupted run and measures the logit difference: (layers + 1) ×
positions runs. ``repl(path, value, arg)`` picks the layer and position from ``arg``, so the sweep is
``jax.vmap`` over ``arg``. Rows:

* vmapped: ``jax.jit(jax.vmap(one))`` over every (layer, position) at once;
* vmapped by position: one patch per layer (the notebook's faster form), ``jax.vmap`` over the
  position only, in one ``jax.jit``: what lies below the patched layer does not depend on the
  position, so vmap leaves it unbatched and it runs once per layer instead of once per pair;
* jitted loop: ``jax.jit(one)`` called once per (layer, position) from Python;
* patched loop: the function ``yax.patch`` returns called once per pair (its program is jitted; the
  logit difference eager), as the notebook's first version of the sweep does;
* eager loop: ``one`` under ``jax.disable_jit()``, op by op; timed on ``--eager`` pairs only and
  extrapolated to the whole sweep (the table says so);
* the model alone, without yax: as many prompts as one batch against a loop of jitted calls, what
  batching can gain on this machine at all (on a CPU, little: one prompt already keeps it busy).

Steady state (after compile, median of ``--runs`` sweeps) and compile (lower + compile, ahead of
time) are measured apart. Target: vmapped >= 5x faster than the jitted loop.

    .venv/bin/python bench/bench_sweep.py [--layers 3] [--embd 32] [--heads 2] [--vocab 64] [--seq 8]
                                          [--runs 5] [--eager 4] [--out bench/results/sweep.json]

Prints a table and writes bench/results/sweep.json.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import yax  # noqa: E402
from bench._report import median_time, report  # noqa: E402


def build(layers: int, embd: int, seq: int, vocab: int = 512, heads: int = 4):
    """``(one, params, clean_values, layer, pos, n_layers, forward, ids, by_position)``: ``one(params,
    clean_values, layer, pos)`` is the logit difference of the corrupted run with the clean value
    restored at one layer and position; ``layer``, ``pos`` every pair of the sweep; ``forward(params,
    ids)`` the model alone (its logit difference per prompt); ``by_position(params, clean_values)``
    the whole grid, vmapped over the positions with one patch per layer."""
    from transformers import FlaxGPT2LMHeadModel, GPT2Config

    config = GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=embd, n_layer=layers, n_head=heads)
    model = FlaxGPT2LMHeadModel(config, seed=0)
    clean = (jnp.arange(seq, dtype=jnp.int32)[None] * 37 + 5) % vocab
    corrupt = clean.at[0, seq // 4].set(vocab - 1)  # one token changed
    mox = yax.make_mox(lambda params, ids: model(ids, params=params).logits)(model.params, clean)
    pattern = '//module_call[@name="wte"] | //module_call[@type="FlaxGPT2Block"]'
    _, clean_values = yax.capture(pattern, mox, model.params, clean)
    names = list(clean_values)

    def restore(path, out, a):  # the clean value at the chosen layer and position
        def put(h, c):
            hit = (a["layer"] == names.index(path)) & (jnp.arange(h.shape[1]) == a["pos"])[None, :, None]
            return jnp.where(hit, c, h)
        return jax.tree_util.tree_map(put, out, a["clean"][path])

    patched = yax.patch(pattern, mox, restore)

    def diff(logits):
        return logits[0, -1, 11] - logits[0, -1, 12]

    def one(params, clean_values, layer, pos):
        return diff(patched({"clean": clean_values, "layer": layer, "pos": pos}, params, corrupt))

    # the same grid with one patch per layer, vmapped over the position only: the layers below the
    # patched one do not depend on the position, so vmap leaves them unbatched (run once per layer)
    def put(path, out, a):
        return jax.tree_util.tree_map(
            lambda h, c: jnp.where((jnp.arange(h.shape[1]) == a["pos"])[None, :, None], c, h), out, a["clean"])

    at = {p: yax.patch(f'//module_call[@path="{p}"]', mox, put) for p in names}

    def by_position(params, clean_values):
        def row(p):  # every layer restored at position p, one run per layer
            return jnp.stack([diff(at[n]({"clean": clean_values[n], "pos": p}, params, corrupt)) for n in names])
        return jax.vmap(row)(jnp.arange(seq)).T.reshape(-1)

    layer, pos = np.divmod(np.arange(len(names) * seq, dtype=np.int32), seq)

    def forward(params, ids):
        logits = model(ids, params=params).logits
        return logits[:, -1, 11] - logits[:, -1, 12]

    return (one, model.params, clean_values, jnp.asarray(layer), jnp.asarray(pos), len(names), forward, corrupt,
            by_position)


def compiled(f, *args) -> float:
    """Seconds to lower and compile the jitted ``f`` for ``args`` (ahead of time: nothing runs)."""
    t = time.perf_counter()
    f.lower(*args).compile()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--embd", type=int, default=32)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--seq", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--eager", type=int, default=4, help="pairs the eager loop is timed on")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sweep.json"))
    a = ap.parse_args()
    one, params, vals, layer, pos, n_rows, forward, ids, by_position = build(a.layers, a.embd, a.seq, a.vocab, a.heads)
    n = int(layer.shape[0])
    pairs = list(zip(layer, pos))

    # as one would write them: jax.jit, the weights and clean values passed as arguments
    sweep = jax.jit(jax.vmap(one, in_axes=(None, None, 0, 0)))
    single = jax.jit(one)
    compile_v = compiled(sweep, params, vals, layer, pos)
    compile_j = compiled(single, params, vals, layer[0], pos[0])
    grid = sweep(params, vals, layer, pos)
    loop = jnp.stack([single(params, vals, i, t) for i, t in pairs])
    err = float(jnp.abs(grid - loop).max())
    assert np.allclose(grid, loop, rtol=1e-4, atol=1e-4), err
    vmapped = median_time(lambda: sweep(params, vals, layer, pos), a.runs)
    grouped = jax.jit(by_position)
    compile_g = compiled(grouped, params, vals)
    err_g = float(jnp.abs(grouped(params, vals) - loop).max())
    assert np.allclose(grouped(params, vals), loop, rtol=1e-4, atol=1e-4), err_g
    by_pos = median_time(lambda: grouped(params, vals), a.runs)
    jitted = median_time(lambda: [single(params, vals, i, t) for i, t in pairs], a.runs)

    # the leanest dispatch: compiled ahead of time, weights and clean values closed over
    lean = jax.jit(lambda i, t: one(params, vals, i, t)).lower(layer[0], pos[0]).compile()
    jax.block_until_ready(lean(layer[0], pos[0]))
    lean_loop = median_time(lambda: [lean(i, t) for i, t in pairs], a.runs)

    t = time.perf_counter()
    jax.block_until_ready(one(params, vals, layer[0], pos[0]))  # the patched program compiles on its first call
    compile_p = time.perf_counter() - t
    patched_loop = median_time(lambda: [one(params, vals, i, t) for i, t in pairs], a.runs)

    # the ceiling on this machine: the model alone, n prompts as one batch against n jitted calls
    fwd, batch = jax.jit(forward), jnp.tile(ids, (n, 1))
    jax.block_until_ready((fwd(params, ids), fwd(params, batch)))
    alone_batch = median_time(lambda: fwd(params, batch), a.runs)
    alone_loop = median_time(lambda: [fwd(params, ids) for _ in range(n)], a.runs)

    step = max(1, n // a.eager)
    subset = pairs[::step][: a.eager]
    with jax.disable_jit():
        jax.block_until_ready(one(params, vals, *subset[0]))  # op-by-op caches warmed
        eager_each = median_time(lambda: [one(params, vals, i, t) for i, t in subset],
                              max(1, a.runs // 2)) / len(subset)
    eager = eager_each * n

    def row(case, s, compile_s, note=""):
        return {"case": case, "runs": n, "sweep_ms": 1000 * s, "per_patch_ms": 1000 * s / n,
                "compile_s": compile_s, "vmapped_speedup": s / vmapped, "by_position_speedup": s / by_pos,
                "note": note}

    rows = [
        row("vmapped: jax.jit(jax.vmap(one)), one call", vmapped, compile_v, "target >= 5x the jitted loop"),
        row("vmapped by position, one patch per layer, one call", by_pos, compile_g,
            f"layers below the patch unbatched; max |diff| {err_g:.1e}"),
        row("jitted loop: jax.jit(one) per (layer, position)", jitted, compile_j, f"max |diff| {err:.1e}"),
        row("jitted loop, lean: AOT-compiled, weights closed over", lean_loop, None, "2 scalars per call"),
        row("patched loop: yax.patch's function per pair", patched_loop, compile_p, "first call"),
        row("eager loop: one() under jax.disable_jit()", eager, None,
            f"timed on {len(subset)} pairs, x{n / len(subset):.0f} extrapolated"),
        row(f"model alone (no yax): a batch of {n} prompts, one call", alone_batch, None,
            f"ceiling: x{alone_loop / alone_batch:.1f} the loop below"),
        row(f"model alone (no yax): {n} jitted calls", alone_loop, None, ""),
    ]
    report(rows, ["case", "runs", "sweep_ms", "per_patch_ms", "compile_s", "vmapped_speedup", "by_position_speedup",
                 "note"], a.out, a.runs,
           model=f"FlaxGPT2LMHeadModel n_layer={a.layers} n_embd={a.embd} n_head={a.heads} vocab={a.vocab} seq={a.seq}",
           grid=f"{n_rows} layers (wte + blocks) x {a.seq} positions")
    print(f"by position vs jitted loop: x{jitted / by_pos:.1f}, vmapped vs jitted loop: x{jitted / vmapped:.1f} "
          f"(target >= 5x), vs its lean form: x{lean_loop / vmapped:.1f}; "
          f"vs patched loop: "
          f"x{patched_loop / vmapped:.1f}; vs eager loop: x{eager / vmapped:.0f}")


if __name__ == "__main__":
    main()
