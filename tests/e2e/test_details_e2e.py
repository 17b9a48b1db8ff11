"""The row data providers' tabs, end to end: a real JupyterLab and kernel,
Debian's chromium driven by Playwright. The Cost tab of a scanned layer shows
the FLOPs, runs and variables counted by hand in a cell from the model's own
arrays; a row holding a `while` loop says its FLOPs are unknown and why; an
analysis registered in a cell (a Python class, no front-end code) gets a tab
of its own in the next explorer. Screenshots: ``artifacts/e2e/details-*.png``;
any console error fails."""

from __future__ import annotations

import pathlib

import pytest

from .lab import Notebook

pytestmark = pytest.mark.e2e

CELLS = [
    """import json, jax, jax.numpy as jnp, numpy as np, yax
from cost_model import Net
from yax_widget import Explorer

model, x = Net(), jnp.ones((2, 4))
params = model.init(jax.random.key(0), x)
ex = Explorer(model, params, x)
ex""",
    # 1: the row ids, and the counts by hand from the model's arrays
    """ids = yax.internal.node_ids(ex.mox)
dense = yax.query('//module_call[@path="Net/layers/Dense_0"]', ex.mox)[0]
k = params["params"]["layers"]["Dense_0"]["kernel"]
stack = params["params"]["layers"]["Dense_0"]
print("HAND=" + json.dumps({"dense": ids[id(dense)], "net": ids[id(ex.mox.calls[0])],
    "flops": 2 * x.shape[0] * k.shape[-2] * k.shape[-1], "runs": k.shape[0],
    "bytes": sum(np.asarray(a).nbytes for a in jax.tree_util.tree_leaves(stack))}))""",
    # 2: a new analysis, as a Python class only, shown by the next explorer
    """from yax_widget._providers import Details, RowData, register

class Shapes(RowData):
    title = "Shapes"
    def details(self, mox, node, session=None):
        return Details(f"outputs of {getattr(node, 'path', '') or node.name}", ["output", "shape", "dtype"],
                       [[str(i), str(tuple(v.shape)), str(v.dtype)] for i, v in enumerate(node.outputs)])

register(Shapes())
ex2 = Explorer(model, params, x)
ex2""",
    # 3: yax.cost of the model, by row: what the colouring by compiled FLOPs must show
    """cost = yax.cost(ex.mox, params, x)
keys = yax.internal.call_keys(ex.mox)
print("COST=" + json.dumps({str(ids[id(n)]): cost.calls[k].total["flops"] for k, n in keys.items()}))""",
]


@pytest.fixture(scope="module")
def notebook(lab):
    (lab.root / "cost_model.py").write_text((pathlib.Path(__file__).parents[1] / "cost_model.py").read_text())
    with lab.notebook("details.ipynb", CELLS) as nb:
        yield nb


def test_the_cost_tab_and_a_new_analysis(notebook):
    with notebook.failing("details"):
        _steps(notebook)
    assert not notebook.errors, notebook.errors


def _cells(root) -> dict[str, list[str]]:
    table = root.locator(".yax-details-pane:visible table.yax-details")
    table.wait_for(timeout=60_000)
    out = {}
    listed = "yax-details-list" in (table.get_attribute("class") or "")
    for tr in table.locator("tbody tr").all():
        if listed:  # label; value, with its explanation under it
            cells = [tr.locator("th").inner_text(), *[d.inner_text() for d in tr.locator("td > div").all()]]
        else:
            cells = [c.inner_text() for c in tr.locator("th, td").all()]
        out[cells[0]] = cells[1:]
    return out


def _steps(nb: Notebook) -> None:
    page = nb.page
    nb.run(0)
    root = page.locator(".yax-explorer").first
    page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=120_000)
    hand = nb.printed(1, "HAND")

    # the scanned layer: per run, how many runs, every run, its stacked variables
    tab = root.locator('.yax-tab[data-tab="Cost"]')
    assert tab.count() == 1
    root.locator(".yax-tree-bar input[type=search]").fill("Dense_0")
    row = root.locator(f'.yax-row[data-id="{hand["dense"]}"]')
    row.wait_for(timeout=30_000)
    row.click()
    tab.click()
    root.locator(".yax-details-head").filter(has_text="Net/layers/Dense_0").wait_for(timeout=60_000)
    cells = _cells(root)
    assert cells["FLOPs (matrix products, convolutions)"][0] == str(hand["flops"])
    assert cells["runs"][0] == str(hand["runs"])
    assert cells["FLOPs, every run"][0] == str(hand["flops"] * hand["runs"])
    assert cells["variables"][1].startswith(f"{hand['bytes']} bytes")
    nb.shot("details-1-scanned-layer")

    # the whole model holds a `while` loop: no number, and why
    root.locator(".yax-tree-bar input[type=search]").fill("")
    root.locator(f'.yax-row[data-id="{hand["net"]}"]').click()
    root.locator(".yax-details-head").filter(has_text="module_call Net").first.wait_for(timeout=60_000)
    page.wait_for_function("() => [...document.querySelectorAll('.yax-details-pane .yax-details-value')]"
                           ".some((td) => td.textContent === 'unknown')", timeout=60_000)
    cells = _cells(root)
    assert cells["FLOPs (matrix products, convolutions)"][0] == "unknown"
    assert "`while` loop" in cells["FLOPs (matrix products, convolutions)"][1]
    nb.shot("details-2-unknown")

    # colour the rows by the compiled program's FLOPs: each row's number is yax.cost's, and the
    # Cost tab gains the compiled rows
    root.locator("select.yax-colour").select_option("flops")
    page.wait_for_selector('.yax-values-bar[data-overlay="flops"]', timeout=120_000)
    want = nb.printed(3, "COST")
    legend = root.locator(".yax-ov-legend").inner_text()
    assert "FLOPs (compiled):" in legend and "per run, per device (1 device)" in legend, legend
    rows = root.locator(".yax-row:not(.yax-eq)")
    coloured = 0
    for i in range(rows.count()):
        r = rows.nth(i)
        value = want.get(r.get_attribute("data-id"))
        chip = r.locator(".yax-ov")
        if value is None:
            assert not chip.count() or "unknown" in chip.get_attribute("title")
            continue
        title = chip.get_attribute("title")
        assert float(title.split(": ")[1].replace(",", "")) == pytest.approx(value, rel=6e-3), title
        coloured += 1
    assert coloured >= 4
    # the Cost tab of the row selected before (Net) now shows the compiled rows too
    page.wait_for_function("() => [...document.querySelectorAll('.yax-details-pane th')]"
                           ".some((th) => th.textContent === 'FLOPs (XLA)')", timeout=60_000)
    assert _cells(root)["FLOPs (XLA)"][0] == f"{round(want[str(hand['net'])]):,}".replace(",", "_")
    nb.shot("details-4-compiled-flops")
    root.locator(".yax-tree-bar input[type=search]").fill("Dense_0")
    root.locator(f'.yax-row[data-id="{hand["dense"]}"]').click()
    root.locator(".yax-details-head").filter(has_text="Net/layers/Dense_0").wait_for(timeout=60_000)
    page.wait_for_function("() => [...document.querySelectorAll('.yax-details-pane th')]"
                           ".some((th) => th.textContent === 'FLOPs (XLA)')", timeout=60_000)
    cells = _cells(root)
    assert cells["FLOPs (XLA)"][0] == f"{round(want[str(hand['dense'])]):,}".replace(",", "_")
    assert cells["FLOPs (XLA)"][1].startswith("every run, as XLA counts")
    nb.shot("details-5-compiled-cost-tab")
    root.locator(".yax-tree-bar input[type=search]").fill("")

    # a provider registered in a cell: the next explorer has its tab, filled by the kernel
    nb.run(2)
    second = page.locator(".yax-explorer").nth(1)
    page.wait_for_function("() => document.querySelectorAll('.yax-explorer[data-ready=\"1\"]').length >= 2",
                           timeout=120_000)
    shapes = second.locator('.yax-tab[data-tab="Shapes"]')
    assert shapes.count() == 1 and root.locator('.yax-tab[data-tab="Shapes"]').count() == 0
    second.locator(".yax-tree-bar input[type=search]").fill("Dense_0")
    second.locator(f'.yax-row[data-id="{hand["dense"]}"]').click()
    shapes.click()
    second.locator(".yax-details-head").filter(has_text="outputs of Net/layers/Dense_0").wait_for(timeout=60_000)
    cells = _cells(second)
    assert cells == {"0": ["(2, 6)", "float32"]}
    second.screenshot(path=_artifact("details-3-new-analysis"))


def _artifact(name: str) -> str:
    from .lab import ARTIFACTS

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return str(ARTIFACTS / f"{name}.png")
