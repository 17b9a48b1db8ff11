"""The graph pane on a model of any size (issue 26, item 4): layout time by depth, folded and not.

Run: ``.venv/bin/python bench/bench_graph.py [--cap 60] [--no-browser]``. Prints a table and
writes ``bench/results/graph.json``. Target: the whole model's graph drawn in <= 2.5 s (from
the request to the drawn SVG) at every depth the pane offers (0-4).

Models: Llama-2-70B known by its structure alone (Hugging Face's ``FlaxLlamaForCausalLM`` from
its config, 80 layers, parameters from ``jax.eval_shape``, ``Explorer(model.module.apply, ...,
warm=False)`` as bench/bench_structure70b.py opens it), the test Transformer (2 layers) and a
12-layer one.

Two measurements:

* ``to_dot`` in this process (what the kernel does for a ``graph`` request), then Graphviz's
  layout of that DOT by the pane's own engine (js/src/panes/layout-engine.js, @viz-js/viz's
  WebAssembly) in Node, each graph in its own process stopped after ``--cap`` seconds (unfolded,
  the 70B graph at depth 4 takes Graphviz many minutes). ``guard``: the pane would not start
  that layout unasked (its weight, `graphSize` in js/src/panes/graph.js, is above the guard's).
* with the browser (default): the pane itself in JupyterLab and Debian's chromium, from the
  request to the frame with the SVG (``data-layout-ms``, laid out in the Web Worker), for the
  70B model at each depth, folded; unfolded, where the pane lays out without asking.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench._report import report, timed  # noqa: E402

TARGET = 2.5
GUARD = 2000  # GUARD_WEIGHT of js/src/panes/graph.js
DEPTHS = [0, 1, 2, 3, 4]

# lays out one DOT file with the pane's engine; prints {ms, nodes, edges, weight, guard}
NODE = """
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
const [engine, graph, file] = process.argv.slice(1);
const { layout } = await import(pathToFileURL(engine).href);
const { graphSize, GUARD_WEIGHT } = await import(pathToFileURL(graph).href);
const dot = readFileSync(file, "utf8");
await layout("digraph { a }"); // the WebAssembly instantiated, as in a warm worker
const t0 = performance.now();
await layout(dot);
const size = graphSize(dot);
console.log(JSON.stringify({ ms: performance.now() - t0, ...size, guard: size.weight > GUARD_WEIGHT }));
"""

SETUP = """import json, time, jax, jax.numpy as jnp, transformers
from yax_widget import Explorer
from models import Transformer
cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                               num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=4096)
model = transformers.FlaxLlamaForCausalLM(cfg, _do_init=False, dtype=jnp.bfloat16)
ids = jnp.zeros((1, 128), jnp.int32)
mask, pos = jnp.ones_like(ids), jnp.arange(128)[None]
abstract = jax.eval_shape(lambda: model.module.init(jax.random.key(0), ids, mask, pos))
ex = Explorer(model.module.apply, abstract, ids, mask, pos, warm=False)
ex"""

# in the page: choose a depth and fold; wait for the pane to come to rest; what it measured
DRAW = """async ([depth, fold]) => {
  const root = document.querySelector('.yax-explorer');
  const view = root.querySelector('.yax-graph-view');
  const before = view.dataset.drawn;
  const sel = root.querySelector('.yax-graph-depth');
  const box = root.querySelector('.yax-graph-fold');
  const changed = sel.value !== String(depth) || box.checked !== fold;
  if (box.checked !== fold) { box.checked = fold; box.dispatchEvent(new Event('change')); }
  if (sel.value !== String(depth)) { sel.value = String(depth); sel.dispatchEvent(new Event('change')); }
  if (!changed) return { ...view.dataset };
  const t0 = Date.now();
  while (view.dataset.drawn === before || view.dataset.state === 'busy') {
    if (Date.now() - t0 > 120000) return { state: 'timeout' };
    await new Promise((r) => setTimeout(r, 10));
  }
  return { ...view.dataset };
}"""


def llama70b():
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=8192, intermediate_size=28672,
                                   num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                                   max_position_embeddings=4096)
    model = transformers.FlaxLlamaForCausalLM(cfg, _do_init=False, dtype=jnp.bfloat16)
    ids = jnp.zeros((1, 128), jnp.int32)
    mask, pos = jnp.ones_like(ids), jnp.arange(128)[None]
    abstract = jax.eval_shape(lambda: model.module.init(jax.random.key(0), ids, mask, pos))
    from yax_widget import Explorer

    return Explorer(model.module.apply, abstract, ids, mask, pos, warm=False).mox


def transformer(layers: int, **kw):
    from models import Transformer

    import yax

    m = Transformer(num_layers=layers, **kw)
    ids = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 64
    return yax.make_mox(m.apply)(jax.eval_shape(m.init, jax.random.key(0), ids), ids)


def size(dot: str) -> dict:
    """`graphSize` of js/src/panes/graph.js, for graphs Node did not finish: boxes, edges, weight."""
    nodes = len(re.findall(r"^\s*n\d+ \[", dot, re.M))
    edges = sorted(((int(a), int(b)) for a, b in re.findall(r"^\s*n(\d+) -> n(\d+)", dot, re.M)), key=lambda e: e[1])
    rank: dict[int, int] = {}
    for a, b in edges:
        rank[b] = max(rank.get(b, 0), rank.get(a, 0) + 1)
    spans = sum(max(0, rank.get(b, 0) - rank.get(a, 0) - 1) for a, b in edges)
    return {"nodes": nodes, "edges": len(edges), "weight": nodes + len(edges) + spans}


def node_layout(dot: str, cap: float, tmp: pathlib.Path) -> dict:
    f = tmp / "graph.dot"
    f.write_text(dot)
    engine, graph = ROOT / "js/src/panes/layout-engine.js", ROOT / "js/src/panes/graph.js"
    try:
        done = subprocess.run(["node", "--input-type=module", "-e", NODE, str(engine), str(graph), str(f)],
                              capture_output=True, text=True, timeout=cap + 15, cwd=ROOT / "js")
    except subprocess.TimeoutExpired:
        return {"ms": None}
    if done.returncode:
        raise RuntimeError(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def browser_times(rows: list[dict]) -> None:
    from tests.e2e.lab import Notebook, browser, jupyterlab, write_notebook

    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        write_notebook(root / "graph.ipynb", [SETUP])
        with jupyterlab(root) as url, browser() as b:
            page = b.new_page(viewport={"width": 1400, "height": 1000})
            nb = Notebook(page, url, "graph.ipynb")
            nb.run(0, timeout=600)
            page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=120_000)
            page.locator('.yax-tab[data-tab="Graph"]').click()
            page.wait_for_function("() => document.querySelector('.yax-graph-view').dataset.state === 'ready'",
                                   timeout=120_000)
            for fold in (True, False):
                for d in DEPTHS:
                    got = page.evaluate(DRAW, [d, fold])
                    ready = got.get("state") == "ready"
                    rows.append({"what": "70B whole model, in chromium (request -> drawn)", "depth": d,
                                 "fold": fold, "nodes": int(got.get("nodes", 0)), "edges": int(got.get("edges", 0)),
                                 "weight": int(got.get("weight", 0)), "to_dot_s": None,
                                 "layout_s": int(got["graphvizMs"]) / 1000 if ready else None,
                                 "total_s": int(got["layoutMs"]) / 1000 if ready else None,
                                 "note": ("in the Web Worker" if got.get("worker") == "1" else "on the main thread")
                                 if ready else f"{got.get('state')}: the pane asks first",
                                 "target": TARGET})
                    print(rows[-1], flush=True)
            if nb.errors:
                print("console errors:", nb.errors)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cap", type=float, default=60.0, help="seconds before an unfolded layout is stopped")
    ap.add_argument("--no-browser", action="store_true")
    a = ap.parse_args()

    import yax

    t_open, big = timed(llama70b)
    models = [("70B whole model", big), ("test Transformer (2 layers)", transformer(2)),
              ("Transformer, 12 layers", transformer(12))]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, mox in models:
            for fold in (True, False):
                for d in DEPTHS:
                    yax.to_dot(mox, depth=d, fold=fold)  # the structure keys kept, as in an open explorer
                    t_dot, dot = timed(lambda mox=mox, d=d, fold=fold: yax.to_dot(mox, depth=d, fold=fold))
                    lay, n = node_layout(dot, a.cap, pathlib.Path(tmp)), size(dot)
                    ms = lay["ms"]
                    assert lay.get("weight", n["weight"]) == n["weight"], (lay, n)  # the pane's own count
                    rows.append({"what": f"{name}, Graphviz in Node", "depth": d, "fold": fold,
                                 "nodes": n["nodes"], "edges": n["edges"], "weight": n["weight"],
                                 "to_dot_s": t_dot, "layout_s": None if ms is None else ms / 1000,
                                 "total_s": None if ms is None else t_dot + ms / 1000,
                                 "note": " ".join(filter(None, [f"stopped after {a.cap:g} s" if ms is None else "",
                                                                "pane asks first" if n["weight"] > GUARD else ""])),
                                 "target": TARGET})
                    print(rows[-1], flush=True)
    if not a.no_browser:
        browser_times(rows)
    report(rows, ["what", "depth", "fold", "nodes", "edges", "weight", "to_dot_s", "layout_s", "total_s", "target", "note"],
           "bench/results/graph.json", runs=1, open_70b_s=round(t_open, 2), cap_s=a.cap, target_s=TARGET,
           measured=time.strftime("%Y-%m-%d %H:%M"))


if __name__ == "__main__":
    main()
