"""A tree of any size (issue 26, item 3), end to end: Llama-2-70B's structure (80 decoder
layers, abstract parameters) in a real JupyterLab and Debian's chromium. The 80 layers fold
into one ×80 row that carries the highlight of all of them; unfolded and fully expanded
(11,000 rows with the equations), "expand all" takes at most 1 s, scrolling keeps 50 frames
per second (the best of up to three 2-second runs: the machine's load shows in a frame rate) and
a query's highlight is on screen within 150 ms (median of 8), each measured in the page
(tests/e2e/scale.py; bench/bench_tree70b.py reports the same numbers). Screenshots go to
``artifacts/e2e/tree70b-*.png``; any console error fails the test."""

from __future__ import annotations

import pytest

from . import scale
from .lab import Notebook

pytestmark = pytest.mark.e2e

EXPAND_ALL_MS = 1000
FPS = 50
HIGHLIGHT_MS = 150


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

    # scrolling the 11,000 rows: frames per second over 2 s, the rows in sight painted at every frame. The
    # frame rate measures the machine too (two cores shared with other test runs): the best of three tries
    tries = []
    for _ in range(3):
        tries.append(scale.scroll(nb, 2.0))
        print(f"scroll: {tries[-1]}")
        if tries[-1]["fps"] >= FPS:
            break
    sc = max(tries, key=lambda t: t["fps"])

    # a keystroke to its highlight on screen, on the fully expanded tree
    ms = scale.highlight(nb, rounds=2)
    print(f"highlight (ms): {ms}")
    assert all(x is not None for x in ms), ms
    nb.shot("tree70b-5-query-expanded")

    assert ex["ms"] <= EXPAND_ALL_MS, ex
    assert sc["fps"] >= FPS and all(t["missing"] == 0 for t in tries), tries
    assert scale.median(ms) <= HIGHLIGHT_MS, ms
    assert not nb.errors, nb.errors
