"""How `yax.compare`'s cost grows with the model (issue 24, point 12).

Run: ``.venv/bin/python bench/bench_compare.py [--quick]``. Prints a table and writes
``bench/results/compare.json``. For each model: the baseline is compiling and running
the original and the modified model once each (``jax.jit`` of `yax.to_function`, cold);
``compare`` is one cold `yax.compare` of the two (every call boundary measured, inside
scans per step). Target: compare ≤ about 2× the baseline, on a MoX 1,000 calls deep
and a chain of 5,000 modules as on a Transformer. Peak memory is the process's
maximum resident set after each model (it only grows: read the increase).
"""

from __future__ import annotations

import argparse
import pathlib
import resource
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from deep import nested_calls  # noqa: E402
from models import KEY, ScannedTransformer, Transformer  # noqa: E402

import yax  # noqa: E402
from yax.internal import eager_is_cheaper  # noqa: E402


class Scale(nn.Module):
    """A module of one elementwise equation: chains of them fuse into one kernel."""

    @nn.compact
    def __call__(self, x):
        return x * self.param("w", nn.initializers.ones, x.shape[-1:])


class Chain(nn.Module):
    n: int

    @nn.compact
    def __call__(self, x):
        for _ in range(self.n):
            x = Scale()(x)
        return nn.relu(x)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cases(quick: bool):
    x = jnp.ones((2, 3))
    deep = nested_calls(300 if quick else 1000)
    yield f"nested calls, {300 if quick else 1000} deep", deep, yax.sub('//sin', jnp.cos, deep), (x,), {}
    n = 500 if quick else 5000
    m = Chain(n)
    p = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(p, x)
    yield f"chain of {n} modules", mox, yax.sub('//activation[@name="relu"]', jax.nn.gelu, mox), (p, x), {}
    for name, model in (("Transformer, 12 layers", Transformer(num_layers=12)),
                        ("scanned Transformer, 12 layers", ScannedTransformer(num_layers=12))):
        ids = jnp.arange(16).reshape(2, 8) % 64
        p = model.init(KEY, ids)
        kw = {"deterministic": True} if isinstance(model, Transformer) else {}
        mox = yax.make_mox(model.apply)(p, ids, **kw)
        yield name, mox, yax.sub('//activation[@name="gelu"]', jax.nn.relu, mox), (p, ids), kw


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller models")
    ap.add_argument("--out", default="bench/results/compare.json")
    a = ap.parse_args()
    rows = []
    for name, mox, new, args, kw in _cases(a.quick):
        t = time.perf_counter()
        for m in (mox, new):
            f = yax.to_function(m)
            jax.block_until_ready(jax.jit(lambda *a, f=f: f(*a, **kw))(*args))
        base = time.perf_counter() - t
        t = time.perf_counter()
        c = yax.compare(mox, new, *args, **kw)
        cmp = time.perf_counter() - t
        rows.append({"model": name, "calls": len(c.boundaries) + len(c.unavailable),
                     "compiled and ran both (s)": base, "compare (s)": cmp, "ratio": cmp / base,
                     "op by op": eager_is_cheaper(mox), "first divergence": (c.first_divergence or "")[-40:],
                     "peak RSS (MB)": _rss_mb()})
        print(rows[-1], flush=True)
    from _report import report

    report(rows, list(rows[0]), a.out, 1)


if __name__ == "__main__":
    main()
