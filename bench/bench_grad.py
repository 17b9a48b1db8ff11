"""Gradients at nodes and the first non-finite gradient (issue 27) against plain
``jax.grad``: `yax.capture(..., grad_of=)` of every call (values and cotangents
in one program) and `yax.first_nonfinite(..., grad_of=)` (a flag per equation
input and step), each against one jitted ``jax.grad`` of the loss with respect
to the parameters; first call (trace + compile + run) and the median of
``--runs`` runs after it.

Run: ``.venv/bin/python bench/bench_grad.py [--layers 4] [--scan] [--runs 5]``.
Writes ``bench/results/grad.json``. The model: the tests' Transformer (vocab
256, d_model 256, 4 heads, d_mlp 1024), one batch of 2 x 128 tokens.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

import jax
import jax.numpy as jnp

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from models import Transformer  # noqa: E402

import yax  # noqa: E402
from bench._report import report, timed  # noqa: E402


def loss(out):
    return jnp.mean(out ** 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--scan", action="store_true")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    m = Transformer(vocab=256, d_model=256, num_heads=4, d_mlp=1024, num_layers=a.layers, scan=a.scan)
    ids = jnp.arange(256).reshape(2, 128) % 256
    params = m.init(jax.random.key(0), ids)
    mox = yax.make_mox(m.apply)(params, ids)
    grad = jax.jit(jax.grad(lambda p: loss(m.apply(p, ids))))
    cases = {
        "jax.grad (params)": lambda: grad(params),
        "capture(//module_call, grad_of)": lambda: yax.capture("//module_call", mox, params, ids, grad_of=loss),
        "first_nonfinite(grad_of)": lambda: yax.first_nonfinite(mox, params, ids, grad_of=loss),
    }
    rows = []
    for name, f in cases.items():
        first, _ = timed(lambda f=f: jax.block_until_ready(f()))
        steady = statistics.median(timed(lambda f=f: jax.block_until_ready(f()))[0] for _ in range(a.runs))
        rows.append({"what": name, "first_s": first, "steady_ms": 1e3 * steady})
    report(rows, ["what", "first_s", "steady_ms"], str(ROOT / "bench" / "results" / "grad.json"), a.runs, layers=a.layers, scan=a.scan)


if __name__ == "__main__":
    main()
