"""The tree of a 70B model in the browser: the notebook opening Llama-2-70B's structure
(`jax.ShapeDtypeStruct` parameters, as bench/bench_structure70b.py does) and what
test_tree_scale_e2e.py asserts and bench/bench_tree70b.py reports, each measured in the
page with `performance.now()`:

* `EXPAND_ALL`: a click on "expand all" until every row, equations included (1,526 calls and
  9,858 equations for 80 layers), is laid out and painted;
* `SCROLL`: the fully expanded tree scrolled for a while, a jump of `step` pixels (20 rows) every
  animation frame: frames per second, the longest frame, and the frames whose rows in sight were
  not painted by the end of the frame (``missing``);
* `HIGHLIGHT`: from the query box's ``input`` event (its 40 ms debounce included) to the
  highlight on screen (`data-match-ids` is set once the matched rows are painted).
"""

from __future__ import annotations

from .lab import Notebook

ROW_H = 22  # px, treerow.js's ROW_H

OPEN = """import json, time, jax, jax.numpy as jnp, transformers, yax
from yax_widget import Explorer
cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_hidden_layers={layers},
                               num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=4096)
model = transformers.FlaxLlamaForCausalLM(cfg, _do_init=False, dtype=jnp.bfloat16)
ids = jnp.zeros((1, 128), jnp.int32)
mask, pos = jnp.ones_like(ids), jnp.arange(128)[None]
abstract = jax.eval_shape(lambda: model.module.init(jax.random.key(0), ids, mask, pos))
t0 = time.perf_counter()
ex = Explorer(model.module.apply, abstract, ids, mask, pos, warm=False)
print("OPEN", time.perf_counter() - t0)
ex"""

# what the page must show: the rows (calls) and the equations they run, the decoder layers' ids
COUNTS = """rows = [dict(zip(ex._tree["columns"], r)) for r in ex._tree["rows"]]
layers = [r for r in rows if r["type"] == "FlaxLlamaDecoderLayer"]
nodes = yax.internal.view(ex.mox).nodes
print("COUNTS=" + json.dumps({"calls": len(rows), "equations": sum(r["neq"] for r in rows),
                              "layers": [r["id"] for r in layers], "paths": [nodes[r["id"]].path for r in layers],
                              "keys": sorted({r["fold"] for r in layers})}))"""

EXPAND_ALL = """async ([expected, h]) => {
  const root = [...document.querySelectorAll('.yax-explorer')].at(-1);  // the newest view
  const spacer = root.querySelector('.yax-spacer');
  const want = `${expected * h}px`;
  root.querySelector('.yax-tree').scrollTop = 0;  // the top: the first calls' equations are in sight
  await new Promise((r) => requestAnimationFrame(r));
  const t0 = performance.now();
  root.querySelector('.yax-expand-all').click();
  // every row laid out (`expected`: null when not known), and the rows in sight painted with their equations
  while ((expected !== null && spacer.style.height !== want) || !root.querySelector('.yax-row.yax-eq')) {
    if (performance.now() - t0 > 60000) return {ms: null, height: spacer.style.height};
    await new Promise((r) => requestAnimationFrame(r));
  }
  await new Promise((r) => requestAnimationFrame(r));  // and the frame that shows them
  return {ms: performance.now() - t0, rows: parseFloat(spacer.style.height) / h,
          in_dom: root.querySelectorAll('.yax-row').length, equations: root.querySelectorAll('.yax-row.yax-eq').length};
}"""

SCROLL = """async ([seconds, step, h]) => {
  const root = [...document.querySelectorAll('.yax-explorer')].at(-1);  // the newest view
  const tree = root.querySelector('.yax-tree');
  tree.scrollTop = 0;
  await new Promise((r) => requestAnimationFrame(r));
  const t0 = performance.now();
  let last = t0, frames = 0, worst = 0, missing = 0;
  const work = [];  // per frame: from its animation callbacks to the task after it (the paint's JS, style, layout)
  while (last - t0 < seconds * 1000) {
    tree.scrollTop = (tree.scrollTop + step) % (tree.scrollHeight - tree.clientHeight);
    await new Promise((r) => requestAnimationFrame(r));
    const now = performance.now();
    worst = Math.max(worst, now - last);
    last = now;
    frames += 1;
    // the rows in sight were painted for this scroll position (the view is virtualised: they must follow):
    // looked at once the frame is done (a task after it), as a jump wider than the rows painted beyond the
    // view would show a frame late
    await new Promise((r) => setTimeout(r, 0));
    work.push(performance.now() - now);
    const top = Math.floor(tree.scrollTop / h);
    if (!root.querySelector(`.yax-row[style*="top: ${top * h}px"]`)) missing += 1;
  }
  work.sort((a, b) => a - b);
  return {fps: frames / ((last - t0) / 1000), frames, worst_ms: worst, missing,
          work_median_ms: work[work.length >> 1], work_max_ms: work[work.length - 1],
          rows_in_dom: root.querySelectorAll('.yax-row').length, height: tree.scrollHeight};
}"""

HIGHLIGHT = """async (queries) => {
  const root = [...document.querySelectorAll('.yax-explorer')].at(-1);  // the newest view
  const input = root.querySelector('.yax-query input');
  const once = (q) => new Promise((resolve) => {
    const before = root.dataset.matchIds;
    const t0 = performance.now();
    const obs = new MutationObserver(() => {
      if (root.dataset.matchIds !== before) { obs.disconnect(); resolve(performance.now() - t0); }
    });
    obs.observe(root, {attributes: true, attributeFilter: ['data-match-ids']});
    input.value = q;
    input.dispatchEvent(new Event('input', {bubbles: true}));
    setTimeout(() => { obs.disconnect(); resolve(null); }, 60000);
  });
  const out = [];
  for (const q of queries) {
    out.push(await once(q));
    await new Promise((r) => setTimeout(r, 100));  // as a user typing the next query would
  }
  return out;
}"""

# alternating, so that each changes the highlight: a projection in every layer, one layer's MLP, its norms
QUERIES = ['//module_call[@name="q_proj"]', '//module_call[@name="mlp"][../@name="17"]',
           '//module_call[@name="o_proj"]', '//module_call[@type="FlaxLlamaRMSNorm"][../@name="42"]']


def cells(layers: int = 80) -> list[str]:
    """Opening the explorer, the counts, and the explorer shown again (a fresh view: nothing expanded or
    loaded yet; the measurements run on the newest view of the page)."""
    return [OPEN.format(layers=layers), COUNTS, "ex"]


def expand_all(nb: Notebook, expected_rows: int | None) -> dict:
    """Click "expand all" on a view whose equations are not loaded yet; ``expected_rows``: how many rows
    it must lay out (None: until the equations are painted, as with the layers folded)."""
    return nb.page.evaluate(EXPAND_ALL, [expected_rows, ROW_H])


def scroll(nb: Notebook, seconds: float = 2.0, step: int = 20 * ROW_H) -> dict:
    return nb.page.evaluate(SCROLL, [seconds, step, ROW_H])


def highlight(nb: Notebook, rounds: int = 2) -> list[float]:
    """Milliseconds from typing each of `QUERIES` (``rounds`` times) to its highlight on screen."""
    return nb.page.evaluate(HIGHLIGHT, QUERIES * rounds)
