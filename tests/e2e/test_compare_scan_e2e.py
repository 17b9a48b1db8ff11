"""The comparison inside a scanned stack, end to end: a linen LM written
as ``nn.scan(nn.remat(layer))``, its GELU dragged to ReLU in a real JupyterLab with Debian's
chromium. The compare pane names the GELU (as the tree now shows it: relu) at scan step 0 as
the first divergence; the stack's rows are coloured and tabulated with their steps; a NaN
planted in a layer's weight is found in its layer. Screenshots go to
``artifacts/e2e/scan-*.png``; any console error fails the test."""

from __future__ import annotations

import pytest

from .lab import ARTIFACTS, drag

pytestmark = pytest.mark.e2e


CELLS = [
    """import jax, jax.numpy as jnp, yax
from models import KEY, ScannedTransformer
from yax.internal import view
m = ScannedTransformer(num_layers=4)
ids = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 64
v = m.init(KEY, ids)
from yax_widget import Explorer
ex = Explorer(m, v, ids)
ex""",
    """c = ex.comparison
print("FIRST=" + str(c and c.first_divergence), "STEP=" + str(c and c.first_divergence_step),
      "GELU=" + ",".join(str(view(ex.mox).ids[id(n)]) for n in yax.query("//activation[@path='ScannedTransformer/layers/gelu']", ex.mox)),
      "INSIDE=" + str(len([k for k in (c.steps if c else {})])))""",
]


@pytest.fixture(scope="module")
def notebook(lab):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with lab.notebook("scan.ipynb", CELLS) as nb:
        yield nb


def test_scanned_stack_compared_in_the_browser(notebook):
    nb = notebook
    page = nb.page
    try:
        nb.run(0, timeout=300)
        page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=120_000)
        root = page.locator(".yax-explorer").first
        root.locator(".yax-query input").fill("//activation[@name='gelu']")
        page.wait_for_function("(el) => el.querySelector('.yax-count').textContent === '1 match'",
                               arg=root.element_handle())
        drag(page, root.locator(".yax-palette-item", has_text="ReLU").first, root.locator(".yax-query input"))
        page.wait_for_function(
            "(el) => el.querySelectorAll('.yax-history-item').length === 2 && !el.classList.contains('yax-busy')"
            " && el.querySelector('.yax-compare .yax-verdict')", arg=root.element_handle(), timeout=180_000)
        state = nb.run(1)
        assert "FIRST=ScannedTransformer/layers/gelu" in state and "STEP=(0,)" in state, state
        root.locator(".yax-tab", has_text="Compare").first.click()
        verdict = root.locator(".yax-compare .yax-verdict").inner_text()
        assert "first divergence: ScannedTransformer/layers/gelu (now relu) at scan step 0" in verdict, verdict
        table = root.locator(".yax-boundaries").inner_text()
        # the stack's 12 calls are rows of the table, each with its 4 steps
        assert table.count("×4") == 12, table
        assert "×4, from 0" in table
        gelu = state.split("GELU=")[1].split()[0]
        first = root.locator(f'.yax-boundary[data-id="{gelu}"]')
        assert "yax-first-row" in first.get_attribute("class")
        root.screenshot(path=str(ARTIFACTS / "scan-01-compare.png"))
        first.scroll_into_view_if_needed()
        root.locator(".yax-boundaries").screenshot(path=str(ARTIFACTS / "scan-01b-table.png"))
        # the tree colours the stack's rows (a border that is not transparent)
        row = root.locator(f'.yax-row[data-id="{gelu}"]')  # the stack is open: the first divergence is shown
        colour = row.evaluate("(e) => getComputedStyle(e).borderLeftColor")
        assert colour not in ("transparent", "rgba(0, 0, 0, 0)"), colour
        assert "◆ first divergence" in row.inner_text()
        assert "over 4 scan steps" in (row.get_attribute("title") or "")
        root.screenshot(path=str(ARTIFACTS / "scan-02-tree.png"))
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / "scan-failure.png"), full_page=True)
        print("console errors:", nb.errors)
        raise
    assert nb.errors == [], nb.errors
