"""flax.nnx benchmarks (issue 6): tracing and jitted evaluation of nnx models.

Run: ``.venv/bin/python bench/bench_nnx.py [--quick]``. Prints a table and
writes ``bench/results/nnx.json``. The models are the nnx twins of the linen
zoo in ``bench_core.py`` (same sizes: d_model 768, 12 heads, MLP 3072, vocab
1024, 128 tokens). Targets:

* make_mox(model)(ids) / jax.make_jaxpr of the nnx split/merge function: <= 1.5x
  (both split the model first, both trace abstractly: no weights, no FLOPs)
* jit(eval_mox) / jit(split/merge function) steady-state run time (median): <= 1.02,
  with identical optimized-HLO op counts
"""

from __future__ import annotations

import argparse
import collections
import gc
import pathlib
import re
import statistics
import sys

import jax
import jax.numpy as jnp
from _report import median_time, report
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from nnx_models import CNN, MLP, Transformer  # noqa: E402

import yax  # noqa: E402


def zoo(quick: bool):
    layers = (2, 4) if quick else (12, 48)
    d = dict(vocab=1024, d_model=768, num_heads=12, d_mlp=3072)
    ids = jnp.arange(128, dtype=jnp.int32).reshape(1, 128) % 1024
    yield "mlp", lambda r: MLP(784, 512, 10, rngs=r), (jnp.ones((32, 784)),), False
    yield "cnn_bn", lambda r: CNN(rngs=r), (jnp.ones((8, 8, 8, 3)),), False
    yield f"transformer_{layers[0]}", lambda r: Transformer(num_layers=layers[0], **d, rngs=r), (ids,), False
    yield f"transformer_{layers[1]}", lambda r: Transformer(num_layers=layers[1], **d, rngs=r), (ids,), True



def hlo_ops(f, *args):
    text = jax.jit(f).lower(*args).compile().as_text()
    return collections.Counter(re.findall(r"= \S+ (\w[\w-]*)\(", text))


def pure(graphdef):
    """The function nnx code jits: state in, (out, state) out."""

    def f(state, *args):
        m = nnx.merge(graphdef, state)
        return m(*args), nnx.state(m)

    return f


def bench_model(name, make, args, runs, big):
    row = {"model": name}
    abstract = nnx.eval_shape(lambda: make(nnx.Rngs(0)))

    # Tracing, abstractly; both sides split the model and trace the pure function.
    def trace_jaxpr():
        graphdef, state = nnx.split(abstract)
        return jax.make_jaxpr(pure(graphdef))(state, *args)

    def trace_mox():
        return yax.make_mox(abstract)(*args)

    trace_jaxpr(), trace_mox()  # warm caches of both once
    n_trace = 5 if big else 9
    tj, tm = [], []
    for _ in range(n_trace):  # interleaved, to share machine noise; a collected heap for both
        gc.collect()
        tj.append(median_time(trace_jaxpr, 1))
        gc.collect()
        tm.append(median_time(trace_mox, 1))
    row["make_jaxpr_s"] = statistics.median(tj)
    row["make_mox_s"] = statistics.median(tm)
    row["trace_ratio"] = row["make_mox_s"] / row["make_jaxpr_s"]
    mox = trace_mox()
    row["mox_calls"] = sum(1 for _ in mox.modules())
    row["mox_nodes"] = sum(1 for _ in mox.walk())
    if big:
        return row

    model = make(nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    model_fn = jax.jit(pure(graphdef))
    evalj = jax.jit(lambda s, *a: yax.eval_mox(mox, s, *a))
    model_fn(state, *args), evalj(state, *args)
    ta, te = [], []
    for _ in range(runs):
        ta.append(median_time(lambda: model_fn(state, *args), 1))
        te.append(median_time(lambda: evalj(state, *args), 1))
    row["jit_model_ms"] = statistics.median(ta) * 1e3
    row["jit_eval_ms"] = statistics.median(te) * 1e3
    row["jit_ratio"] = row["jit_eval_ms"] / row["jit_model_ms"]
    row["same_hlo_ops"] = hlo_ops(pure(graphdef), state, *args) == hlo_ops(
        lambda s, *a: yax.eval_mox(mox, s, *a), state, *args)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small Transformers, few runs (a smoke test)")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "nnx.json"))
    opts = ap.parse_args()
    runs = 5 if opts.quick else opts.runs
    rows = []
    for name, make, args, big in zoo(opts.quick):
        rows.append(bench_model(name, make, args, runs, big))
        print(f"done {name}", file=sys.stderr)
    cols = ["model", "mox_calls", "mox_nodes", "make_jaxpr_s", "make_mox_s", "trace_ratio",
            "jit_model_ms", "jit_eval_ms", "jit_ratio", "same_hlo_ops"]

    report(rows, cols, opts.out, runs)


if __name__ == "__main__":
    main()
