"""Seeing inside (issue 13): the explorer's values pane and colouring, and
capturing every call boundary against one jitted forward.

Run: ``.venv/bin/python bench/bench_capture.py [--small 12] [--layers 48] [--runs 5]``.
Prints a table and writes ``bench/results/capture.json``. The models are the
bench zoo's Transformer (vocab 1024, d_model 768, 12 heads, d_mlp 3072, one
sequence of 128 tokens). Targets:

* ``--small`` layers: the values pane of a call row <= 200 ms after the first
  compile (the explorer's program captures and summarises every call once;
  a row's statistics, histogram and heatmap slice are then picked on the
  device and only they cross to the host; the kernel side of a selection);
* colouring the whole tree by a statistic <= 1 s;
* ``--layers`` layers: capturing every call boundary (`yax.capture` of all
  calls, values left on the device) against one ``jax.jit`` forward of the
  same MoX, compile excluded (median of ``--runs`` runs each).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from models import Transformer  # noqa: E402

import yax  # noqa: E402
from bench._report import median_time, report  # noqa: E402
from yax.internal import capturable_calls, node_ids  # noqa: E402
from yax_widget import Explorer  # noqa: E402
from yax_widget.internal import Boundaries, Static, programs  # noqa: E402


def build(layers: int):
    m = Transformer(num_layers=layers, vocab=1024, d_model=768, num_heads=12, d_mlp=3072)
    ids = jnp.arange(128, dtype=jnp.int32).reshape(1, 128) % 1024
    v = jax.jit(m.init)(jax.random.key(0), ids)
    return m, v, ids, yax.make_mox(m.apply)(v, ids)



def host_bytes(entry: dict) -> int:
    """Bytes of one row's summary that crossed to the host: counts, statistics,
    histogram and heatmap slice of each output."""
    return sum(4 * (5 + 5 + len(o["hist"]["counts"])) + (len(o["heat"]["values"]) if o["heat"] else 0)
               for o in entry["outputs"])


def explorer_rows(layers: int) -> list[dict]:
    _, v, ids, mox = build(layers)
    ex = Explorer(mox, v, ids, warm=False)
    calls = list(mox.modules())
    rows = []
    t = time.perf_counter()
    first = ex.session.inspector.row(calls[1])
    rows.append({"case": "values pane, first row (compiles the capture-and-summary program)", "layers": layers,
                 "ms": 1000 * (time.perf_counter() - t), "target": ""})
    each, sizes, full = [], [], []
    for c in calls[2:]:
        t = time.perf_counter()
        e = ex.session.inspector.row(c)
        each.append(1000 * (time.perf_counter() - t))
        sizes.append(host_bytes(e))
        full.append(sum(int(np.prod(o["shape"])) * 4 for o in e["outputs"]))
    rows.append({"case": f"values pane, each other call row: median ({len(each)} rows)", "layers": layers,
                 "ms": statistics.median(each), "target": "<= 200 ms"})
    rows.append({"case": "values pane, each other call row: max",
                 "layers": layers, "ms": max(each), "target": ""})
    t = time.perf_counter()
    for c in calls[2:]:
        ex.session.inspector.row(c)
    rows.append({"case": "values pane, a row selected again (kept): mean", "layers": layers,
                 "ms": 1000 * (time.perf_counter() - t) / len(calls[2:]), "target": ""})
    rows.append({"case": "bytes to the host per row: median (its outputs' size: median)", "layers": layers,
                 "ms": None, "target": f"{statistics.median(sizes):.0f} B ({statistics.median(full):.0f} B)"})
    for stat in ("norm", "zeros", "nonfinite"):
        t = time.perf_counter()
        ex.session.inspector.paint(stat)
        rows.append({"case": f"colour the tree by {stat} ({ex._overlay['rows']} calls)", "layers": layers,
                     "ms": 1000 * (time.perf_counter() - t), "target": "<= 1 s"})
    # colouring a model never seen: its program compiled, run and summarised from scratch
    ex2 = Explorer(yax.make_mox(Transformer(num_layers=layers, vocab=1024, d_model=768, num_heads=12,
                                            d_mlp=3072).apply)(v, ids), v, ids, warm=False)
    t = time.perf_counter()
    ex2.session.inspector.paint("norm")
    rows.append({"case": "colour the tree by norm, a model not seen before (compile included)", "layers": layers,
                 "ms": 1000 * (time.perf_counter() - t), "target": ""})
    del first
    return rows


def capture_rows(layers: int, runs: int) -> list[dict]:
    _, v, ids, mox = build(layers)
    calls = capturable_calls(mox)
    fwd = jax.jit(yax.to_function(mox))
    t = time.perf_counter()
    fwd.lower(v, ids).compile()
    compile_fwd = time.perf_counter() - t
    jax.block_until_ready(fwd(v, ids))
    t = time.perf_counter()
    jax.block_until_ready(yax.capture(calls, mox, v, ids))  # compiles
    compile_cap = time.perf_counter() - t
    forward = median_time(lambda: fwd(v, ids), runs)
    capture = median_time(lambda: yax.capture(calls, mox, v, ids), runs)
    _, got = yax.capture(calls, mox, v, ids)
    mib = sum(x.nbytes for x in jax.tree_util.tree_leaves(got)) / 2**20
    ex = Explorer(mox, v, ids, warm=False)
    t = time.perf_counter()
    Boundaries.run(mox, *ex.session.call_args())  # the measuring program itself, compiled and run
    compile_sum = time.perf_counter() - t
    prog = programs(mox)
    leaves, tree = jax.tree_util.tree_flatten((ex.session.call_args()[0], {}))
    static = Static(leaves, tree, mox)
    summary = median_time(lambda: prog.capture([leaves[i] for i in mox.dyn_in], static), runs)
    ids_ = node_ids(mox)
    assert len(prog.where) == len(calls) and all(ids_[id(c)] in prog.where for c in calls)
    return [
        {"case": "one jitted forward (compile excluded)", "layers": layers, "ms": 1000 * forward, "target": ""},
        {"case": f"capture every call boundary ({len(calls)} calls, {mib:.0f} MiB kept on the device)",
         "layers": layers, "ms": 1000 * capture, "target": f"x{capture / forward:.2f} the forward"},
        {"case": "the explorer's capture-and-summary program (what colouring and the pane run)", "layers": layers,
         "ms": 1000 * summary, "target": f"x{summary / forward:.2f} the forward"},
        {"case": "compile: forward / capture / capture-and-summary", "layers": layers, "ms": None,
         "target": f"{compile_fwd:.1f} s / {compile_cap:.1f} s / {compile_sum:.1f} s"},
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=12)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "capture.json"))
    a = ap.parse_args()
    rows = explorer_rows(a.small)
    print("explorer done", flush=True)
    rows += capture_rows(a.layers, a.runs)
    report(rows, ["case", "layers", "ms", "target"], a.out, a.runs)


if __name__ == "__main__":
    main()
