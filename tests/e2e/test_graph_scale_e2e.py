"""A graph of any size (issue 26, item 4) end to end: the Graph tab of Llama-2-70B known by its
structure alone (Hugging Face's FlaxLlamaForCausalLM from its config, 80 layers, parameters from
`jax.eval_shape`), in a real JupyterLab and Debian's chromium. The 80 decoder layers are drawn once
(×80); each depth lays out in at most 2.5 s, from the request to the drawn SVG, as the page measures
it, off the main thread (a Web Worker); the drawing opens fitted to the pane; a double-click opens
the folded box; a click selects its row; unfolded, the graph too large to lay out quickly is not
laid out but offered smaller, and laid out anyway it leaves the page responsive and can be stopped. Screenshots: ``artifacts/e2e/graph70b-*.png``."""

from __future__ import annotations

import json

import pytest

from . import scale
from .lab import Notebook

pytestmark = pytest.mark.e2e

TARGET_MS = 2500

CELLS = [
    # 0: the structure explorer of Llama-2-70B (as bench/bench_structure70b.py builds it)
    scale.OPEN.format(layers=80),
    # 1: the row ids of the first and the last decoder layer, and of the first one's attention
    """from yax.internal import view
node = lambda path: view(ex.mox).ids[id(yax.query(f'//module_call[@path="{path}"]', ex.mox)[0])]
L = "FlaxLlamaForCausalLMModule/model/layers/"
print("IDS=" + json.dumps({"first": node(L + "0"), "last": node(L + "79"), "attn": node(L + "0/self_attn")}))""",
]


@pytest.fixture(scope="module")
def notebook(lab):
    with lab.notebook("graph70b.ipynb", CELLS) as nb:
        yield nb


def test_graph_of_a_70b_model(notebook):
    with notebook.failing("graph70b"):
        _steps(notebook)


def _drawn(page, root, before: int | None = None) -> dict:
    """Wait for the pane's next drawing (or its guard); what the page measured."""
    page.wait_for_function(
        """([el, before]) => { const v = el.querySelector('.yax-graph-view');
             return ['ready', 'guard', 'error'].includes(v.dataset.state) && v.dataset.drawn !== String(before); }""",
        arg=[root.element_handle(), before], timeout=120_000)
    return root.locator(".yax-graph-view").evaluate("(v) => ({...v.dataset})")


def _fits(root) -> None:
    """The drawing lies inside the pane."""
    view = root.locator(".yax-graph-view").bounding_box()
    svg = root.locator(".yax-graph-stage svg").bounding_box()
    assert svg["width"] > 50 and svg["height"] > 50, svg
    assert view["x"] - 1 <= svg["x"] and svg["x"] + svg["width"] <= view["x"] + view["width"] + 1, (svg, view)
    assert view["y"] - 1 <= svg["y"] and svg["y"] + svg["height"] <= view["y"] + view["height"] + 1, (svg, view)


def _steps(nb: Notebook) -> None:
    page = nb.page
    nb.run(0, timeout=300)
    root = page.locator(".yax-explorer").first
    page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=120_000)
    out = nb.run(1)
    rows = json.loads(next(x for x in out.splitlines() if x.startswith("IDS="))[4:])
    depth = root.locator(".yax-graph-depth")

    # the whole model (no row selected), at every depth the pane offers, folded
    root.locator('.yax-tab[data-tab="Graph"]').click()
    seen = _drawn(page, root)
    times = {}
    for d in range(5):
        if d != 1:  # depth 1 is what the tab opened with
            depth.select_option(str(d))
            seen = _drawn(page, root, seen.get("drawn"))
        assert seen["state"] == "ready", seen
        assert seen["worker"] == "1", seen  # laid out in the Web Worker, not on the page's thread
        times[d] = int(seen["layoutMs"])
        _fits(root)
        if d == 3:
            # the 80 decoder layers: one box, its id the first layer's row, its tooltip the range
            fold = root.locator(".yax-graph-stage g.node.yax-fold")
            assert fold.count() == 1
            assert "layers 0–79 ×80 : FlaxLlamaDecoderLayer" in fold.text_content()
            assert fold.get_attribute("data-row") == str(rows["first"])
            assert fold.locator("title").text_content() == (
                "80 identical calls, drawn once: FlaxLlamaForCausalLMModule/model/layers/0 … "
                "FlaxLlamaForCausalLMModule/model/layers/79\ndouble-click to open it")
            assert root.locator(".yax-graph-stage g.node").count() < 12
            nb.shot("graph70b-depth3")
    print("layout ms by depth (folded):", times)
    assert all(ms <= TARGET_MS for ms in times.values()), times

    # a click on the ×80 box selects the first layer's row; the graph stays as it is
    depth.select_option("3")
    seen = _drawn(page, root, seen.get("drawn"))
    fold = root.locator(".yax-graph-stage g.node.yax-fold")
    fold.locator("text").first.click()
    page.wait_for_function("(id) => document.querySelector('.yax-row.yax-selected')?.dataset.id === id",
                           arg=str(rows["first"]))
    page.wait_for_timeout(300)
    assert root.locator(".yax-graph-view").get_attribute("data-drawn") == seen["drawn"]  # nothing drawn again
    assert root.locator(".yax-graph-what").inner_text() == "the whole model"
    nb.shot("graph70b-picked")

    # a double-click opens it in place: the first layer's insides, still drawn once for all 80
    fold.locator("text").first.dblclick()
    seen = _drawn(page, root, seen.get("drawn"))
    assert seen["state"] == "ready" and int(seen["layoutMs"]) <= TARGET_MS, seen
    cluster = root.locator(".yax-graph-stage g.cluster.yax-fold")
    assert cluster.count() == 1 and cluster.get_attribute("data-row") == str(rows["first"])
    assert "FlaxLlamaForCausalLMModule/model/layers/0–79 ×80 : FlaxLlamaDecoderLayer" in cluster.text_content()
    attn = root.locator(f'.yax-graph-stage g.node[data-row="{rows["attn"]}"]')
    assert attn.count() == 1 and "yax-more" in attn.get_attribute("class")
    _fits(root)
    nb.shot("graph70b-opened")
    # and a box inside it selects its row
    attn.locator("text").first.click()
    page.wait_for_function("(id) => document.querySelector('.yax-row.yax-selected')?.dataset.id === id",
                           arg=str(rows["attn"]))

    # unfolded, depth 3 would take Graphviz a long time (80 layers each fed the mask and positions):
    # not laid out; the pane says how large it is and offers to fold
    root.locator(".yax-graph-fold").uncheck()
    seen = _drawn(page, root, seen.get("drawn"))
    assert seen["state"] == "guard", seen
    guard = root.locator(".yax-graph-guard").inner_text()
    assert "boxes and" in guard and "Graphviz could take minutes" in guard, guard
    assert int(seen["nodes"]) > 80
    nb.shot("graph70b-guard")
    # laid out anyway, Graphviz works in the worker: the page keeps drawing frames; "stop" ends it
    root.locator(".yax-guard-anyway").click()
    page.wait_for_function("(el) => el.querySelector('.yax-graph-view').dataset.state === 'busy'"
                           " && !el.querySelector('.yax-graph-stop').hidden", arg=root.element_handle())
    page.wait_for_timeout(500)  # the worker has the graph
    gaps = page.evaluate("""async () => { const gaps = []; let last = performance.now();
        for (let i = 0; i < 20; i++) { await new Promise(requestAnimationFrame);
          const now = performance.now(); gaps.push(now - last); last = now; }
        return gaps; }""")
    assert max(gaps) < 250, gaps
    assert root.locator(".yax-graph-view").get_attribute("data-state") == "busy"  # still laying out
    nb.shot("graph70b-laying-out")
    root.locator(".yax-graph-stop").click()
    seen = _drawn(page, root, seen.get("drawn"))
    assert seen["state"] == "guard" and "The layout was stopped." in root.locator(".yax-graph-guard").inner_text()
    root.locator(".yax-guard-fold").click()
    seen = _drawn(page, root, seen.get("drawn"))
    assert seen["state"] == "ready" and root.locator(".yax-graph-fold").is_checked()

    # unfolded at depth 2 the layers are inside one box: as fast as folded
    root.locator(".yax-graph-fold").uncheck()
    seen = _drawn(page, root, seen.get("drawn"))
    depth.select_option("2")
    seen = _drawn(page, root, seen.get("drawn"))
    assert seen["state"] == "ready" and int(seen["layoutMs"]) <= TARGET_MS, seen
    assert nb.errors == [], nb.errors
