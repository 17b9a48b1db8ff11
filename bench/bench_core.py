"""Core benchmarks (issue 2): tracing, jitted and eager evaluation, memory.

Run: ``.venv/bin/python bench/bench_core.py [--quick]``. Prints a table and
writes ``bench/results/core.json``. Targets:

* make_mox / make_jaxpr time on the 12-layer Transformer: <= 1.5x
* jit(eval_mox) / jit(apply) steady-state run time (median of 50): <= 1.02,
  with identical optimized-HLO op counts
* eager eval_mox / eager apply: <= 1.2x
* memory of the MoX of the 48-layer Transformer: reported
"""

from __future__ import annotations

import argparse
import collections
import gc
import pathlib
import re
import statistics
import sys
import tracemalloc

import jax
import jax.numpy as jnp
from _report import median_time, report

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from models import CNN, MLP, Transformer  # noqa: E402

import yax  # noqa: E402

KEY = jax.random.key(0)


def zoo(quick: bool):
    layers = (2, 4) if quick else (12, 48)
    d = dict(vocab=1024, d_model=768, num_heads=12, d_mlp=3072)
    ids = jnp.arange(128, dtype=jnp.int32).reshape(1, 128) % 1024
    yield "mlp", MLP((512, 512, 10)), (jnp.ones((32, 784)),), {}
    yield "cnn_bn", CNN(), (jnp.ones((8, 32, 32, 3)),), {"train": False}
    yield f"transformer_{layers[0]}", Transformer(num_layers=layers[0], **d), (ids,), {}
    yield f"transformer_{layers[1]}", Transformer(num_layers=layers[1], **d), (ids,), {}
    yield f"transformer_{layers[0]}_scan", Transformer(num_layers=layers[0], scan=True, **d), (ids,), {}



def hlo_ops(f, *args):
    text = jax.jit(f).lower(*args).compile().as_text()
    return collections.Counter(re.findall(r"= \S+ (\w[\w-]*)\(", text))


def bench_model(name, model, args, kwargs, runs, big):
    abstract_vars = jax.eval_shape(lambda: model.init(KEY, *args, **kwargs))
    fn = model.apply
    row = {"model": name}

    # Tracing, abstractly (ShapeDtypeStruct variables: no FLOPs, no weights).
    def trace_jaxpr():
        return jax.make_jaxpr(lambda v, *a: fn(v, *a, **kwargs))(abstract_vars, *args)

    def trace_mox():
        return yax.make_mox(fn)(abstract_vars, *args, **kwargs)

    trace_jaxpr(), trace_mox()  # warm caches of both once
    n_trace = 3 if big else 5
    row["make_jaxpr_s"] = median_time(trace_jaxpr, n_trace)
    row["make_mox_s"] = median_time(trace_mox, n_trace)
    row["trace_ratio"] = row["make_mox_s"] / row["make_jaxpr_s"]

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    mox = trace_mox()
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    row["mox_memory_mb"] = sum(s.size_diff for s in after.compare_to(before, "filename")) / 2**20
    row["mox_calls"] = sum(1 for _ in mox.modules())
    row["mox_nodes"] = sum(1 for _ in mox.walk())
    if big:
        return row

    variables = model.init(KEY, *args, **kwargs)
    apply = jax.jit(lambda v, *a: fn(v, *a, **kwargs))
    evalj = jax.jit(lambda v, *a: yax.eval_mox(mox, v, *a, **kwargs))
    apply(variables, *args), evalj(variables, *args)
    # interleave to share machine noise
    ta, te = [], []
    for _ in range(runs):
        ta.append(median_time(lambda: apply(variables, *args), 1))
        te.append(median_time(lambda: evalj(variables, *args), 1))
    row["jit_apply_ms"] = statistics.median(ta) * 1e3
    row["jit_eval_ms"] = statistics.median(te) * 1e3
    row["jit_ratio"] = row["jit_eval_ms"] / row["jit_apply_ms"]
    row["same_hlo_ops"] = hlo_ops(lambda v, *a: fn(v, *a, **kwargs), variables, *args) == hlo_ops(
        lambda v, *a: yax.eval_mox(mox, v, *a, **kwargs), variables, *args
    )

    n_eager = 5
    fn(variables, *args, **kwargs), yax.eval_mox(mox, variables, *args, **kwargs)
    tea, tee = [], []
    for _ in range(n_eager):
        tea.append(median_time(lambda: fn(variables, *args, **kwargs), 1))
        tee.append(median_time(lambda: yax.eval_mox(mox, variables, *args, **kwargs), 1))
    row["eager_apply_ms"] = statistics.median(tea) * 1e3
    row["eager_eval_ms"] = statistics.median(tee) * 1e3
    row["eager_ratio"] = row["eager_eval_ms"] / row["eager_apply_ms"]
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small Transformers, few runs (a smoke test)")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "core.json"))
    opts = ap.parse_args()
    runs = 5 if opts.quick else opts.runs
    rows = []
    for name, model, args, kwargs in zoo(opts.quick):
        big = name.startswith("transformer_") and name.split("_")[1] in ("48", "4") and "scan" not in name
        rows.append(bench_model(name, model, args, kwargs, runs, big))
        print(f"done {name}", file=sys.stderr)
    cols = ["model", "mox_calls", "mox_nodes", "make_jaxpr_s", "make_mox_s", "trace_ratio", "mox_memory_mb",
            "jit_apply_ms", "jit_eval_ms", "jit_ratio", "same_hlo_ops", "eager_apply_ms", "eager_eval_ms",
            "eager_ratio"]

    report(rows, cols, opts.out, runs)


if __name__ == "__main__":
    main()
