"""Query and serialisation benchmarks (issue 3) on the 48-layer Transformer.

Run: ``.venv/bin/python bench/bench_query.py``. Prints a table, writes
``bench/results/query.json``. Targets: XML view <= 1 s; each query <= 20 ms
median once the view exists; dump_xml <= 2 s. The "elements" column counts
XML elements, matches, bytes, MoX nodes, DOT lines or edges, as fits the row.
"""

from __future__ import annotations

import copy
import io
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
from yax.internal import build_view  # noqa: E402

QUERIES = [
    '//module_call[@type="Dense"][@features=768]',
    '//module_call[@name="Block_3"]//module_call[@features=768]',
    '//*[@name="gelu"]',
    '//module_call[@type="SelfAttention"]/module_call[@name="query"]',
    'count(//module_call[@type="Dense"])',
    '//module_call[re:test(@path, "Block_[0-3]/")]',
    "//module_call[@params > 1000000]",
    '//module_call[@name="query"] | //module_call[@name="key"]',
    '//activation[@name="gelu"]/ancestor::module_call',
    '//module_call[@name="Dense_0"]/following-sibling::module_call',
    '(//module_call[@type="Dense"])[1]',
    '(//module_call[@type="Dense"])[last()]',
]


def timed(f, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main():
    m = Transformer(num_layers=48, vocab=1024, d_model=768, num_heads=12, d_mlp=3072)
    ids = jnp.zeros((1, 128), jnp.int32)
    av = jax.eval_shape(lambda: m.init(jax.random.key(0), ids))
    mox = yax.make_mox(m.apply)(av, ids)
    def fresh_view():  # the view and the precision pass it reads (cached per root: a new root each time)
        return build_view(copy.copy(mox))

    rows = [{"what": "xml view build", "seconds": timed(fresh_view, 5),
             "elements": sum(1 for _ in build_view(mox).tree.iter())}]
    yax.query("//mox", mox)  # the view now exists
    for q in QUERIES:
        yax.query(q, mox)
        r = yax.query(q, mox)
        rows.append({"what": q, "seconds": timed(lambda: yax.query(q, mox), 20),
                     "elements": len(r) if isinstance(r, list) else r})
    rows.append({"what": "dump_xml", "seconds": timed(lambda: yax.dump_xml(mox, io.BytesIO()), 3),
                 "elements": len(yax.to_xml(mox))})
    rows.append({"what": "dump_yson (binary)", "seconds": timed(lambda: yax.dump_yson(mox, io.BytesIO(), format="binary"), 3),
                 "elements": sum(1 for _ in mox.walk())})
    for what, kw in [("to_dot, whole model", {}), ("to_dot, depth=1", {"depth": 1}),
                     ("to_dot, one block with equations", {"root": '//module_call[@name="Block_0"]', "equations": True})]:
        dot = yax.to_dot(mox, **kw)
        rows.append({"what": what, "seconds": timed(lambda: yax.to_dot(mox, **kw), 3), "elements": dot.count("\n")})
        rows.append({"what": what.replace("to_dot", "to_svg (dot layout)"),
                     "seconds": timed(lambda: yax.to_svg(mox, timeout=600, **kw), 1), "elements": dot.count(" -> ")})
    for r in rows:
        print(f"{r['seconds'] * 1e3:9.2f} ms  {r['elements']!s:>9}  {r['what']}")
    out = pathlib.Path(__file__).parent / "results" / "query.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"jax": jax.__version__, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
