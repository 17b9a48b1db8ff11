"""The table and JSON every bench script ends with."""

from __future__ import annotations

import json
import os
import pathlib
import resource
import statistics
import time

import jax


def peak_mb() -> float:
    """This process's peak resident memory so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median_time(f, runs: int) -> float:
    """Median seconds of ``runs`` calls of ``f`` (its result waited for)."""
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        jax.block_until_ready(f())
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def timed(f):
    """``(seconds, f())``."""
    t = time.perf_counter()
    out = f()
    return time.perf_counter() - t, out


def report(rows: list[dict], cols: list[str], out: str, runs: int, **meta: object) -> None:
    """Print ``rows`` as a right-aligned table of ``cols`` and write them, with
    the machine and ``meta``, to the JSON file ``out``."""

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3f}"
        return "-" if v is None else str(v)

    table = [cols] + [[fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(cols))]
    for t in table:
        print("  ".join(c.rjust(w) for c, w in zip(t, widths)))
    meta = {"jax": jax.__version__, "devices": str(jax.devices()), "cpus": os.cpu_count(), "runs": runs, **meta}
    path = pathlib.Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {path}")
