"""Rewrite and compare benchmarks (issue 4) on the 48-layer Transformer.

Run: ``.venv/bin/python bench/bench_rewrite.py [--layers N]``. Prints a table
and writes ``bench/results/rewrite.json``. Targets:

* ``yax.sub`` replacing all 48x2 MLP Dense layers with LoRA adapters: <= 2 s
  excluding XLA compilation (the second run, whose jitted initialisers are
  compiled; the first run is reported too);
* ``yax.compare`` (one jitted computation of both models, with statistics at
  every module boundary) over compiling and running the two models once
  each: <= 1.10. Both sides are medians of three rounds after a warm-up,
and the baseline compiles each model the cheapest way (flat arguments).
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from models import Transformer  # noqa: E402

import yax  # noqa: E402
import yax.internal  # noqa: E402

DENSE_MLP = '//module_call[@type="Dense"][re:test(@path, "Block_\\d+/Dense_")]'


def timed(f):
    t = time.perf_counter()
    out = f()
    jax.block_until_ready(out)
    return time.perf_counter() - t, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=48)
    a = ap.parse_args()
    m = Transformer(num_layers=a.layers, vocab=1024, d_model=768, num_heads=12, d_mlp=3072)
    ids = jnp.arange(128, dtype=jnp.int32).reshape(1, 128) % 1024
    params = jax.block_until_ready(jax.jit(m.init)(jax.random.key(0), ids))  # not timed in the first sub
    mox = yax.make_mox(m.apply)(params, ids)
    rows = []

    t_first, (new, lp) = timed(lambda: yax.sub(DENSE_MLP, yax.LoRA(rank=8), mox, params=params,
                                                key=jax.random.key(1)))
    t_warm, (new, lp) = timed(lambda: yax.sub(DENSE_MLP, yax.LoRA(rank=8), mox, params=params,
                                               key=jax.random.key(1)))
    n = len(yax.query('//module_call[@type="LoRA"]', new))
    rows.append({"what": f"sub: {n} Dense -> LoRA, first run (target <= 1 s; the first query's view and 2 initialiser compiles included)", "seconds": t_first})
    rows.append({"what": f"sub: {n} Dense -> LoRA, compiled (target <= 2 s)", "seconds": t_warm})
    t_act, relu = timed(lambda: yax.sub('//*[@name="gelu"]', jax.nn.relu, mox))
    rows.append({"what": f"sub: {a.layers} gelu -> relu", "seconds": t_act})

    def run_once(mx, p):
        # compile and run a model once, as `yax.to_function` gives it to users
        return jax.jit(yax.to_function(mx))(p, ids)

    # Three rounds after a warm-up, medians reported, so neither side pays for warming JAX's caches.
    # "cold": compare's per-MoX program cache is cleared first, so both models compile, as in the
    # baseline; "original cached": a fresh rewrite against an original compared before (the widget's case).
    def cold(**kw):
        for m in (mox, new):
            yax.internal.compiled_programs(m).clear()
        return yax.compare(mox, new, params, ids, new_params=lp, **kw)

    def cached():
        yax.compare(mox, new, params, ids, new_params=lp)  # the original's program is now cached
        fresh, fp = yax.sub(DENSE_MLP, yax.LoRA(rank=8), mox, params=params, key=jax.random.key(1))
        t = time.perf_counter()
        jax.block_until_ready(yax.compare(mox, fresh, params, ids, new_params=fp).outputs)
        return time.perf_counter() - t

    times = collections.defaultdict(list)
    for rnd in range(4):
        for name, f in [("a", lambda: run_once(mox, params)), ("b", lambda: run_once(new, lp)),
                        ("cmp", cold), ("out", lambda: cold(boundaries=False))]:
            t, res = timed(f)
            if rnd:
                times[name].append(t)
            if name == "cmp":
                c = res
        if rnd:
            times["cached"].append(cached())
    t_a, t_b, t_cmp, t_out, t_cached = (statistics.median(times[k]) for k in ("a", "b", "cmp", "out", "cached"))
    rows.append({"what": "compile + run original once", "seconds": t_a})
    rows.append({"what": "compile + run LoRA model once", "seconds": t_b})
    rows.append({"what": f"compare, cold (both + {len(c.boundaries)} boundaries)", "seconds": t_cmp,
                 "ratio": t_cmp / (t_a + t_b)})
    rows.append({"what": "compare, cold, outputs only", "seconds": t_out, "ratio": t_out / (t_a + t_b)})
    rows.append({"what": "compare, original cached, fresh rewrite", "seconds": t_cached,
                 "ratio": t_cached / (t_a + t_b)})

    for r in rows:
        ratio = f"  ({r['ratio']:.3f}x of compiling and running both)" if "ratio" in r else ""
        print(f"{r['seconds']:9.3f} s  {r['what']}{ratio}")
    out = pathlib.Path(__file__).parent / "results" / "rewrite.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"jax": jax.__version__, "layers": a.layers, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
