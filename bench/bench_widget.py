"""Explorer benchmarks (issue 5) in a real JupyterLab and Debian's chromium.

Run: ``.venv/bin/python bench/bench_widget.py [--layers 48] [--rounds 15]``.
Prints a table and writes ``bench/results/widget.json``. Targets (48-layer
Transformer unless noted):

* first paint of the tree <= 1 s after the cell runs: from the moment the
  kernel has built the explorer (printed by the cell) to the tree's first
  render in the page;
* keystroke -> highlight <= 150 ms median: from an ``input`` event in the
  query box (debounce included) to the highlight attribute changing;
* scrolling the fully expanded tree stays responsive: frame times while
  scrolling it from top to bottom;
* 12-layer model: a substitution shows its comparison within the XLA compile
  time + 0.5 s: from the ``drop`` event in the page to the frame after the
  comparison's histogram is in it, against the compile time of the modified
  model (``jax.jit(yax.to_function(ex.mox))``, measured afresh in the kernel
  afterwards). The original was compiled and measured in the background when
  the explorer opened, so the modified model is all a change has to compile.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.lab import Notebook, browser, jupyterlab, write_notebook  # noqa: E402
from tests.e2e.scale import HIGHLIGHT  # noqa: E402

SETUP = """import time, jax, jax.numpy as jnp, yax
from models import Transformer
from yax_widget import Explorer
def build(layers):
    m = Transformer(num_layers=layers, vocab=1024, d_model=768, num_heads=12, d_mlp=3072)  # the bench zoo's
    ids = jnp.arange(128, dtype=jnp.int32).reshape(1, 128) % 1024
    return m, jax.jit(m.init)(jax.random.key(0), ids), ids
"""

OPEN = """m, v, ids = build({layers})
mox = yax.make_mox(m.apply)(v, ids)
t0 = time.time(); ex = Explorer(mox, v, ids); print("BUILT", time.time() - t0, "AT", time.time())
ex"""

COMPILE = """f = jax.jit(yax.to_function(ex.mox))  # the model the drop made, compiled afresh as a user would
t0 = time.time(); c = f.lower(ex.params, ids).compile(); t1 = time.time()
jax.block_until_ready(c(ex.params, ids)); t2 = time.time()
print("COMPILE", t1 - t0, "FIRSTRUN", t2 - t1, "KERNEL", ex._comparison["seconds"],
      "REFMB", sum(x.nbytes for x in [*ex.session.worker.reference.outs, *ex.session.worker.reference.taps.values()]) / 2**20)"""

# Times a drop in the page: from the `drop` event to the frame after the histogram is in the DOM.
DROP_TIMER = """(idx) => {
  const root = document.querySelectorAll('.yax-explorer')[idx];
  window.__yaxDrop = {};
  root.querySelector('.yax-tree').addEventListener('drop', () => { window.__yaxDrop.drop = performance.now(); },
                                                   {capture: true, once: true});
  const obs = new MutationObserver(() => {
    if (root.querySelector('.yax-compare .yax-hist')) {
      obs.disconnect();
      requestAnimationFrame(() => { window.__yaxDrop.shown = performance.now(); });
    }
  });
  obs.observe(root, {childList: true, subtree: true});
}"""

SCROLL = """async () => {
  const root = document.querySelectorAll('.yax-explorer')[document.querySelectorAll('.yax-explorer').length - 1];
  const tree = root.querySelector('.yax-tree');
  const frames = [];
  let last = performance.now();
  tree.scrollTop = 0;
  while (tree.scrollTop + tree.clientHeight < tree.scrollHeight - 1) {
    tree.scrollTop += 400;
    await new Promise(requestAnimationFrame);
    const now = performance.now(); frames.push(now - last); last = now;
  }
  return {frames: frames.length, rows: root.querySelectorAll('.yax-row').length, height: tree.scrollHeight,
          median: frames.sort((a, b) => a - b)[frames.length >> 1], max: frames[frames.length - 1]};
}"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--small", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "widget.json"))
    a = ap.parse_args()
    rows: list[tuple[str, float, str]] = []
    result: dict = {"layers": a.layers}
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        wait = 'ex.session.worker.warmer.result(); print("WARM", time.time() - t0)'
        write_notebook(root / "bench.ipynb", [SETUP, OPEN.format(layers=a.layers), wait,
                                              OPEN.format(layers=a.small), wait, COMPILE])
        with jupyterlab(root) as url, browser() as b:
            page = b.new_page(viewport={"width": 1400, "height": 1000})
            nb = Notebook(page, url, "bench.ipynb")
            nb.run(0)
            print("set up; opening the explorer", flush=True)
            # first paint: kernel finished building the explorer -> tree rendered
            cell = page.locator(".jp-Notebook .jp-CodeCell").nth(1)
            cell.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Control+Enter")
            page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=600_000)
            painted = time.time()
            out = cell.locator(".jp-OutputArea").inner_text()
            built = float(out.split("AT")[1].split()[0])
            n_rows = len(page.evaluate("() => document.querySelector('.yax-explorer') && 1") and
                         page.locator(".yax-row").all())
            result["first_paint_s"] = painted - built
            rows.append(("first paint after the cell built the explorer", painted - built, "<= 1 s"))
            result["kernel_build_s"] = float(out.split("BUILT")[1].split()[0])
            rows.append(("  (kernel: Explorer(mox) build)", result["kernel_build_s"], ""))

            print(f"first paint {painted - built:.3f} s; {n_rows} rows in the DOM", flush=True)
            # keystroke -> highlight, once the background compile of the original has finished
            result["warm_48_s"] = float(nb.run(2).split("WARM")[1].split()[0])
            rows.append(("  (kernel: background compile of the original, from opening)", result["warm_48_s"], ""))
            times = []
            for i in range(a.rounds):
                t = page.evaluate(HIGHLIGHT, ['//module_call[@type="Dense"]', f'//module_call[@name="Block_{i % a.layers}"]'])
                times += t
            result["keystroke_ms"] = times
            rows.append(("keystroke -> highlight, median", statistics.median(times) / 1000, "<= 150 ms"))
            rows.append(("keystroke -> highlight, max", max(times) / 1000, ""))

            print(f"keystroke median {statistics.median(times):.1f} ms", flush=True)
            # expand everything, then scroll top to bottom
            page.evaluate(HIGHLIGHT, ["//module_call", "//*[@primitive='dot_general']"])
            sc = page.evaluate(SCROLL)
            result["scroll"] = sc
            rows.append((f"scroll, {sc['frames']} frames over {sc['height']} px: median frame", sc["median"] / 1000,
                         "responsive (< 50 ms)"))
            rows.append(("scroll: worst frame", sc["max"] / 1000, ""))
            rows.append(("  rows in the DOM after the first paint", f"{n_rows}", "virtualised"))

            print(f"scroll {sc}", flush=True)
            # substitution on the small model: drop -> comparison shown, vs compile time
            nb.run(3)
            result["warm_small_s"] = float(nb.run(4).split("WARM")[1].split()[0])
            second = page.locator(".yax-explorer").nth(1)
            second.wait_for()
            page.wait_for_function("() => document.querySelectorAll('.yax-explorer[data-ready=\"1\"]').length === 2")
            page.evaluate(HIGHLIGHT, ["//activation[@name='gelu']", "//activation[@name='gelu'][1]"])  # the newest
            target = second.get_attribute("data-match-ids").split(",")[0]
            page.evaluate(DROP_TIMER, 1)
            second.locator('.yax-palette-item[data-name="ReLU"]').drag_to(second.locator(f'.yax-row[data-id="{target}"]'))
            second.locator(".yax-compare .yax-hist").wait_for(timeout=600_000)
            page.wait_for_function("() => window.__yaxDrop.shown !== undefined")
            shown = page.evaluate("() => (window.__yaxDrop.shown - window.__yaxDrop.drop) / 1000")
            words = nb.run(5).split()
            k = {w: float(words[i + 1]) for i, w in enumerate(words[:-1]) if w.isupper() and w.isalpha()}
            result.update(substitution_shown_s=shown, compile_modified_s=k["COMPILE"], first_run_s=k["FIRSTRUN"],
                          kernel_compare_s=k["KERNEL"], reference_mib=k["REFMB"])
            rows.append((f"{a.small} layers: drop -> comparison shown", shown,
                         f"<= compile + 0.5 = {k['COMPILE'] + 0.5:.2f} s"))
            rows.append((f"  ({a.small} layers: XLA compile of the modified model, in the kernel)", k["COMPILE"], ""))
            rows.append((f"  ({a.small} layers: its first run, in the kernel)", k["FIRSTRUN"], ""))
            rows.append((f"  ({a.small} layers: the explorer's compare, in the kernel)", k["KERNEL"], ""))
            rows.append((f"  ({a.small} layers: the original's values kept by the explorer)", f"{k['REFMB']:.0f} MiB", ""))
            result["console_errors"] = nb.errors
    for name, v, target in rows:  # seconds, unless the value says its unit
        print(f"{v if isinstance(v, str) else f'{v:.3f} s':>12}  {name}  {target}")
    pathlib.Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(a.out).write_text(json.dumps(result, indent=2))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
