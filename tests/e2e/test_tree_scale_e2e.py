"""A tree of any size (issue 26, item 3), end to end: Llama-2-70B's structure (80 decoder
layers, abstract parameters) in a real JupyterLab and Debian's chromium. The 80 layers fold
into one ×80 row that carries the highlight of all of them; unfolded and fully expanded
(11,000 rows with the equations), "expand all" lays every row out with only those in sight in
the DOM, scrolling paints the rows in sight at every frame, and a query's highlight comes on
screen. The time of each (expand all, frames per second, keystroke to highlight: measured in the
page, tests/e2e/scale.py) is printed and written to ``artifacts/e2e/tree70b-timings.json``; the
targets (<= 1 s, >= 50 fps, <= 150 ms) are checked by bench/bench_tree70b.py on a quiet machine,
not here: this test shares two cores with another test process, and a frame rate measures the
machine as much as the tree (CI measured 38-42 fps beside a JAX compile, 58-60 alone).
Screenshots go to ``artifacts/e2e/tree70b-*.png``; any console error fails the test."""

from __future__ import annotations

import json

import pytest

from . import scale
from .lab import ARTIFACTS, Notebook

pytestmark = pytest.mark.e2e

# the rows a view of 1000 px holds (22 px each, treerow.js) and the overscan on both sides (treeview.js): the DOM
# holds about 40 of the 11,000 rows; a tree that was not virtualised would hold them all
MAX_ROWS_IN_DOM = 80


@pytest.fixture(scope="module")
def notebook(lab):
    with lab.notebook("tree70b.ipynb", scale.cells(80)) as nb:
        yield nb


def test_the_70b_tree_folds_expands_scrolls_and_highlights_in_time(notebook):
    with notebook.failing("tree70b"):
        _steps(notebook)


def _row(root, name: str):
    return root.locator(".yax-row", has=root.page.locator(f'.yax-name:text-is("{name}")')).first


def _steps(nb: Notebook) -> None:
    page = nb.page
    nb.run(0, timeout=600)
    page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=120_000)
    root = page.locator(".yax-explorer").first
    counts = nb.printed(1, "COUNTS")
    layers, paths = counts["layers"], counts["paths"]
    assert len(layers) == 80 and len(counts["keys"]) == 1  # the 80 layers are alike: one structure key

    # the layers fold into one row ×80, named by its first and last, opening onto the first's inside
    _row(root, "layers").locator(".yax-toggle").click()
    folded = root.locator(".yax-row.yax-folded").first
    folded.wait_for()
    assert folded.get_attribute("data-id") == str(layers[0])
    assert folded.locator(".yax-name").inner_text() == "0 … 79"
    assert folded.locator(".yax-fold").inner_text() == "×80"
    assert f"80 calls alike, folded: {paths[0]} … {paths[-1]}" in folded.get_attribute("title")
    assert root.locator(".yax-row.yax-folded").count() == 1
    folded.locator(".yax-toggle").click()
    _row(root, "self_attn").wait_for()
    nb.shot("tree70b-1-folded")

    # a query matching in every layer, then in one: the rows standing for them say how many match
    root.locator(".yax-query input").fill('//module_call[@name="q_proj"]')
    page.wait_for_function("() => (document.querySelector('.yax-explorer').dataset.matchIds || '').split(',')"
                           ".length === 80", timeout=60_000)
    q = _row(root, "q_proj")  # the way to the row standing for them is opened
    q.locator(".yax-fold-hits").wait_for()
    assert q.locator(".yax-fold-hits").inner_text() == "80 of 80 match" and "yax-match" in q.get_attribute("class")
    root.locator(".yax-query input").fill('//module_call[@name="mlp"][../@name="17"]')
    page.wait_for_function("() => (document.querySelector('.yax-explorer').dataset.matchIds || '').split(',')"
                           ".length === 1", timeout=60_000)
    mlp = _row(root, "mlp")
    assert mlp.locator(".yax-fold-hits").inner_text() == "1 of 80 match"
    nb.shot("tree70b-2-query-folded")
    # the next match is the one in layer 17: stepping there unfolds the layers and selects it
    root.locator(".yax-next-match").click()
    selected = root.locator(".yax-row.yax-selected")
    selected.wait_for()
    assert root.locator(".yax-row.yax-folded").count() == 0
    assert selected.locator(".yax-name").inner_text() == "mlp" and "yax-match" in selected.get_attribute("class")
    assert _row(root, "17").count() == 1
    nb.shot("tree70b-3-match-unfolded")

    # every call on its own row: "fold ×N" off; then "expand all", equations included
    root.locator(".yax-fold-repeats").uncheck()
    root.locator(".yax-query input").fill("")
    page.wait_for_function("() => !document.querySelector('.yax-explorer').dataset.matchIds", timeout=60_000)
    expected = counts["calls"] + counts["equations"]
    assert expected > 11_000
    ex = scale.expand_all(nb, expected)
    print(f"expand all: {ex}")
    assert ex["ms"] is not None and ex["equations"] > 0, ex
    root.locator(".yax-tree").evaluate("(el) => { el.scrollTop = el.scrollHeight / 2; }")
    page.wait_for_timeout(200)
    nb.shot("tree70b-4-expanded")

    # scrolling the 11,000 rows twenty a frame for 2 s: the rows in sight painted at every frame
    sc = scale.scroll(nb, 2.0)
    print(f"scroll: {sc}")

    # a keystroke to its highlight on screen, on the fully expanded tree
    ms = scale.highlight(nb, rounds=2)
    print(f"highlight (ms): {ms}")
    assert all(x is not None for x in ms), ms
    nb.shot("tree70b-5-query-expanded")

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "tree70b-timings.json").write_text(json.dumps({"expand_all": ex, "scroll": sc, "highlight_ms": ms},
                                                               indent=2))
    assert ex["rows"] == expected and ex["in_dom"] <= MAX_ROWS_IN_DOM, ex
    assert sc["frames"] > 0 and sc["missing"] == 0 and sc["rows_in_dom"] <= MAX_ROWS_IN_DOM, sc
    assert sc["height"] >= expected * scale.ROW_H, sc  # the scrolled tree is all 11,000 rows tall
    assert not nb.errors, nb.errors
