"""Verifying a port (issue 40): Hugging Face's PyTorch GPT-2, BERT, Llama and ResNet against
their Flax classes with the same weights (tests/ports.py: tiny configs, random weights), and the
same Flax copies with a planted port bug. Per pair: the boundaries matched on each side, the
worst relative error among the faithful boundaries (in float32 epsilons), where each planted bug
is found first, and the seconds to record the PyTorch run (`Reference.from_torch`) and to compare
(`yax.compare` with the reference, cold: it compiles the model's capture once) against one
`jax.jit` run of the model, compiled cold (the baseline).

Run: ``.venv/bin/python bench/bench_port.py``. Prints a table and writes ``bench/results/port.json``.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from _report import report  # noqa: E402
from ports import FAMILIES, IDS, PIXELS, RESNET_NAMES, _torch, port  # noqa: E402

import yax  # noqa: E402

EPS = float(np.finfo(np.float32).eps)


def main() -> None:
    rows = []
    for family, f in FAMILIES.items():
        names = RESNET_NAMES if family == "resnet" else None
        for bug in [None, *f.bugs]:
            p = port(family, bug)
            pt = _torch(family)
            x = torch.tensor(PIXELS if f.inputs == "pixels" else IDS)
            extra = {} if family in ("bert", "resnet") else {"use_cache": False}
            t = time.perf_counter()
            yax.Reference.from_torch(pt, x, **extra)
            record = time.perf_counter() - t
            jax.clear_caches()
            t = time.perf_counter()
            jax.block_until_ready(jax.jit(yax.to_function(p.mox))(p.params, *p.inputs))
            baseline = time.perf_counter() - t
            jax.clear_caches()
            t = time.perf_counter()
            c = yax.compare(p.reference, p.mox, p.params, *p.inputs, names=names)
            seconds = time.perf_counter() - t
            m = c.matching
            faithful = [s for s in c.boundaries.values() if s.allclose]
            rows.append({
                "pair": family, "bug": bug or "-", "matched": len(m.calls),
                "model calls": len(m.calls) + len(m.only_model), "reference modules": len(m.calls) + len(m.only_reference),
                "weights": len(m.weights), "layouts": len(m.layouts),
                "worst faithful rel/eps": round(max(s.rel for s in faithful) / EPS, 2),
                "first divergence": c.first_divergence or "-",
                "its rel": None if c.first_divergence is None else f"{c.boundaries[c.first_divergence].rel:.3g}",
                "record s": round(record, 3), "compare s": round(seconds, 3), "jit run s": round(baseline, 3)})
    report(rows, ["pair", "bug", "matched", "model calls", "reference modules", "weights", "layouts",
                  "worst faithful rel/eps", "first divergence", "its rel", "record s", "compare s", "jit run s"],
           "bench/results/port.json", runs=1)


if __name__ == "__main__":
    main()
