"""Keys typed in the explorer stay in it (issue 38): in JupyterLab and in Notebook 7, a click on a tree
row and then `d d`, `m`, `a`, `b` (the notebook's command-mode shortcuts: delete the cell, make it
markdown, insert cells) leave the notebook as it was, and Ctrl+Z / Ctrl+Shift+Z undo and redo the
explorer's change. Screenshots: ``artifacts/e2e/keys-<app>.png``."""

from __future__ import annotations

import pytest

from .lab import ARTIFACTS, Notebook, jupyterlab, write_notebook
from .test_notebook7_e2e import notebooks_own

pytestmark = pytest.mark.e2e

CELLS = [
    """import jax, jax.numpy as jnp, flax.linen as nn
from yax_widget import Explorer
m = nn.Sequential([nn.Dense(8), nn.gelu, nn.Dense(2)])
x = jnp.ones((2, 4))
ex = Explorer(m, m.init(jax.random.key(0), x), x)
ex.substitute("//activation", "ReLU")
ex""",
    "print('HISTORY', ex.session.index, len(ex.session.states) - 1)",
]


def _cells(page) -> list[str]:
    """Each cell's type, in order: what a leaked shortcut would change."""
    return page.evaluate("""() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')].map(
      (c) => c.classList.contains('jp-CodeCell') ? 'code' : c.classList.contains('jp-MarkdownCell') ? 'markdown' : 'raw')""")


def _keys_stay(nb: Notebook, name: str) -> None:
    page = nb.page
    nb.run(0)
    page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=120_000)
    root = page.locator(".yax-explorer").first
    before = _cells(page)
    assert before == ["code", "code"], before
    root.locator(".yax-row .yax-name", has_text="layers_0").click()  # a tree row has the focus
    assert page.evaluate("() => !!document.activeElement.closest('.yax-explorer .yax-tree')")
    for key in ("d", "d", "m", "a", "b", "x", "c", "v", "z", "Shift+M", "Enter", "Escape", "ArrowDown"):
        page.keyboard.press(key)
    page.wait_for_timeout(500)
    assert _cells(page) == before, f"{name}: a key reached the notebook: {_cells(page)}"
    assert root.count() == 1 and root.is_visible()
    # Ctrl+Z undoes the explorer's change, Ctrl+Shift+Z redoes it; the notebook's cells stay
    root.locator(".yax-row .yax-name", has_text="layers_0").click()
    page.keyboard.press("Control+z")
    root.locator(".yax-redo:not([disabled])").wait_for(timeout=60_000)
    assert root.locator(".yax-undo").is_disabled()
    assert _cells(page) == before
    assert "0 1" in nb.run(1)  # the kernel's explorer is back at the original
    before = _cells(page)  # running the last cell added one below it
    root.locator(".yax-row .yax-name", has_text="layers_0").click()
    page.keyboard.press("Control+Shift+z")
    root.locator(".yax-undo:not([disabled])").wait_for(timeout=60_000)
    assert _cells(page) == before
    assert "1 1" in nb.run(1)
    root.screenshot(path=str(ARTIFACTS / f"keys-{name}.png"))


def test_keys_stay_in_the_explorer_in_jupyterlab(lab):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with lab.notebook("keys.ipynb", CELLS) as nb, nb.failing("keys-lab"):
        _keys_stay(nb, "lab")
        assert nb.errors == [], nb.errors


def test_keys_stay_in_the_explorer_in_notebook_7(tmp_path, lab):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    write_notebook(tmp_path / "keys7.ipynb", CELLS)
    with jupyterlab(tmp_path, app="notebook") as url:
        context = lab.browser.new_context(viewport={"width": 1400, "height": 1000})
        try:
            nb = Notebook(context.new_page(), url, "keys7.ipynb", path="notebooks")
            with nb.failing("keys-notebook7"):
                _keys_stay(nb, "notebook7")
        finally:
            context.close()
        assert [e for e in nb.errors if not notebooks_own(e)] == [], nb.errors
