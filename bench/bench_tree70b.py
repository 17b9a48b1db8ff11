"""The tree of Llama-2-70B in the browser (issue 26, item 3: a tree of any size).

Run: ``.venv/bin/python bench/bench_tree70b.py [--layers 80] [--rounds 3]``. Prints a table
and writes ``bench/results/tree70b.json``.

The explorer on bench/bench_structure70b.py's model (Llama-2-70B's config, parameters as
``jax.ShapeDtypeStruct``: 80 decoder layers, 1,526 call rows running 9,858 equations) in a real
JupyterLab and Debian's chromium, measured in the page (tests/e2e/scale.py, as the browser test
tests/e2e/test_tree_scale_e2e.py asserts them). Each round shows the explorer afresh (nothing
expanded, no equation loaded), then:

* "expand all" with the 80 layers unfolded: from the click to every row (calls and equations,
  11,384) laid out and the rows in sight painted, the equations fetched in one request;
  target <= 1 s;
* scrolling those rows for 2 s, twenty rows a frame: frames per second; target >= 50;
* a query keystroke to its highlight on screen (debounce included), on the expanded tree and
  with the layers folded again, median; target <= 150 ms;

and, on another fresh view, "expand all" with the layers folded (the ×80 row opens onto the first
layer's inside). Baseline: the first paint of the tree (``data-paint-ms``, the tree as it opens).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._report import report  # noqa: E402
from tests.e2e import scale  # noqa: E402
from tests.e2e.lab import Notebook, browser, jupyterlab, write_notebook  # noqa: E402

NEWEST = "[...document.querySelectorAll('.yax-explorer')].at(-1)"


def fresh(nb: Notebook) -> None:
    """Show the explorer again (cell 2): a new view, nothing expanded or loaded, the newest of the page."""
    nb.page.evaluate("() => document.querySelectorAll('.yax-explorer').forEach((el) => { el.dataset.seen = '1'; })")
    nb.run(2)
    nb.page.wait_for_function(f"() => !{NEWEST}.dataset.seen && {NEWEST}.dataset.ready === '1'", timeout=120_000)


def fold(nb: Notebook, on: bool) -> None:
    nb.page.evaluate(f"""(on) => {{
      const box = {NEWEST}.querySelector('.yax-fold-repeats');
      box.checked = on;
      box.dispatchEvent(new Event('change'));
    }}""", on)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    expand, expand_folded, fps, worst, keys_open, keys_folded, scrolls = [], [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        write_notebook(root / "tree70b.ipynb", scale.cells(a.layers))
        with jupyterlab(root) as url, browser() as b:
            nb = Notebook(b.new_page(viewport={"width": 1400, "height": 1000}), url, "tree70b.ipynb")
            opened = float(nb.run(0, timeout=1800).split("OPEN")[1].split()[0])
            nb.page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=120_000)
            paint = float(nb.page.evaluate(f"() => {NEWEST}.dataset.paintMs"))
            counts = nb.printed(1, "COUNTS")
            rows = counts["calls"] + counts["equations"]
            for i in range(a.rounds):
                fresh(nb)
                fold(nb, False)
                e = scale.expand_all(nb, rows)
                expand.append(e["ms"])
                s = scale.scroll(nb, 2.0)
                fps.append(s["fps"])
                scrolls.append(s)
                worst.append(s["worst_ms"])
                keys_open += scale.highlight(nb, rounds=1)
                fold(nb, True)
                keys_folded += scale.highlight(nb, rounds=1)
                fresh(nb)
                # folded, "expand all" shows the ×80 row and the first layer's inside: fewer rows, the same request
                shown = scale.expand_all(nb, None)
                expand_folded.append(shown)
                print(f"round {i + 1}: expand all {e['ms']:.0f} ms, {s['fps']:.1f} fps, "
                      f"highlight {statistics.median(keys_open[-4:]):.0f} ms", flush=True)
            errors = nb.errors
    out = [
        {"what": f"open in the kernel ({counts['calls']} call rows, {counts['equations']} equations)",
         "value": opened, "unit": "s", "target": None},
        {"what": "baseline: first paint of the tree", "value": paint, "unit": "ms", "target": None},
        {"what": f"expand all, unfolded ({rows} rows), median", "value": statistics.median(expand), "unit": "ms",
         "target": 1000},
        {"what": "expand all, unfolded, worst", "value": max(expand), "unit": "ms", "target": None},
        {"what": f"expand all, folded ({int(expand_folded[0]['rows'])} rows), median", "unit": "ms", "target": None,
         "value": statistics.median(x["ms"] for x in expand_folded)},
        {"what": "scroll the expanded tree, frames per second (worst round)", "value": min(fps), "unit": "fps",
         "target": 50},
        {"what": "scroll: longest frame", "value": max(worst), "unit": "ms", "target": None},
        {"what": "query keystroke -> highlight, expanded, median", "value": statistics.median(keys_open),
         "unit": "ms", "target": 150},
        {"what": "query keystroke -> highlight, folded, median", "value": statistics.median(keys_folded),
         "unit": "ms", "target": 150},
    ]
    report(out, ["what", "value", "unit", "target"], "bench/results/tree70b.json", runs=a.rounds, layers=a.layers,
           expand_ms=expand, expand_folded=expand_folded, scroll=scrolls, highlight_expanded_ms=keys_open,
           highlight_folded_ms=keys_folded, console_errors=errors)


if __name__ == "__main__":
    main()
