"""A snapshot anyone can open, end to end: in a real JupyterLab the explorer
shows a comparison, a row's values, open equations and a colouring; the Save
HTML button writes ``Transformer_snapshot.html`` next to the notebook; that file,
opened from disk in a fresh browser context with the network cut off, shows the
same rows and the same numbers, the history and a banner, with the kernel's
controls disabled. Screenshots: ``artifacts/e2e/snapshot-*.png``; any console
error fails."""

from __future__ import annotations

import pytest

import yax

from .lab import ARTIFACTS, Notebook

pytestmark = pytest.mark.e2e


CELLS = [
    """import jax, jax.numpy as jnp
from models import Transformer
from yax_widget import Explorer
model = Transformer(num_layers=2)
ids = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 60
ex = Explorer(model, model.init(jax.random.key(0), ids), ids)
ex.substitute("//activation", "ReLU")
ex""",
]

SENTENCE = "This page is a snapshot saved by `save_html`, so it cannot"


@pytest.fixture(scope="module")
def notebook(lab):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with lab.notebook("snap.ipynb", CELLS) as nb:
        yield nb


def test_the_saved_page_shows_the_explorer_without_kernel_or_network(notebook, lab):
    with notebook.failing("snapshot"):
        _steps(notebook, lab)


def _row(root, name: str):
    return root.locator(".yax-row", has=root.page.locator(f'.yax-name:text-is("{name}")')).first


def _shown(root) -> dict:
    """What the explorer shows that the snapshot must show the same: rows, values, comparison, history."""
    page = root.page
    tab = lambda t: (root.locator(f'.yax-tab[data-tab="{t}"]').click(), page.wait_for_timeout(100))  # noqa: E731
    rows = root.locator(".yax-row").evaluate_all(
        "rs => rs.map(r => [r.dataset.id, r.querySelector('.yax-name').textContent, r.className.includes('yax-selected'),"
        " r.querySelector('.yax-ov')?.title ?? null])")
    tab("Values")
    values = [root.locator(".yax-values-head").inner_text(),
              root.locator(".yax-values td[data-stat]").all_inner_texts()]
    tab("Compare")
    compare = [root.locator(".yax-verdict").inner_text(), root.locator(".yax-compare table.yax-stats").first.inner_text(),
               root.locator(".yax-boundaries").inner_text()]
    tab("Diff")
    diff = root.locator(".yax-diff .yax-diff-row").all_inner_texts()
    tab("History")
    history = root.locator(".yax-history-item").all_inner_texts()
    return {"rows": rows, "values": values, "compare": compare, "diff": diff, "history": history}


def _steps(nb: Notebook, lab) -> None:
    page = nb.page
    nb.run(0)
    page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=120_000)
    root = page.locator(".yax-explorer").first
    root.locator(".yax-verdict").wait_for(timeout=120_000)  # the change's comparison

    # the live explorer: a selected row's values, a call's equations open, the rows coloured by norm
    _row(root, "Block_0").click()
    root.locator('.yax-tab[data-tab="Values"]').click()
    root.locator(".yax-values .yax-values-output").first.wait_for(timeout=120_000)
    _row(root, "Dense_0").locator(".yax-toggle").click()
    page.wait_for_selector(".yax-row.yax-eq", timeout=60_000)
    root.locator("select.yax-colour").select_option("norm")
    page.wait_for_selector('.yax-values-bar[data-overlay="norm"]', timeout=120_000)
    live = _shown(root)
    root.locator('.yax-tab[data-tab="Values"]').click()
    assert any(r[1] == "dot_general" for r in live["rows"]) and any(r[3] for r in live["rows"])
    assert [r[1] for r in live["rows"] if r[2]] == ["Block_0"]

    # Save HTML asks nothing: the status says where the file went
    root.locator("button.yax-save-html").click()
    page.wait_for_function("() => document.querySelector('.yax-status')?.textContent.startsWith('saved ')",
                           timeout=120_000)
    status = root.locator(".yax-status").inner_text()
    name = status.split(" ")[1]
    assert name == "Transformer_snapshot.html", status
    root.screenshot(path=str(ARTIFACTS / "snapshot-1-live.png"))
    path = lab.root / name
    size = path.stat().st_size
    print(f"snapshot of the test Transformer: {size / 2**20:.2f} MiB")

    # the file, in a new context: no kernel, and every request but the file's own is refused
    context = lab.browser.new_context(viewport={"width": 1400, "height": 900})
    refused: list[str] = []

    def route(r):
        if r.request.url.startswith(("file:", "blob:", "data:")):
            r.continue_()
        else:
            refused.append(r.request.url)
            r.abort()

    try:
        context.route("**/*", route)
        context.set_offline(True)
        snap = context.new_page()
        errors: list[str] = []
        snap.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        snap.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        snap.goto(path.as_uri())
        snap.wait_for_selector('.yax-explorer[data-snapshot="ready"]', timeout=60_000)
        page_root = snap.locator(".yax-explorer")
        page_root.locator(".yax-values .yax-values-output").first.wait_for(timeout=10_000)
        snap.screenshot(path=str(ARTIFACTS / "snapshot-2-values.png"))
        seen = _shown(page_root)
        snap.screenshot(path=str(ARTIFACTS / "snapshot-3-history.png"))
        # the same rows in the same order (the page is taller: it shows more of them), selection and colours
        assert seen["rows"][:len(live["rows"])] == live["rows"]
        assert seen["values"] == live["values"] and seen["compare"] == live["compare"]
        assert seen["history"] == live["history"] == ["original", "replaced 4 node(s) selected by //activation with ReLU"]
        assert seen["diff"] == live["diff"] and any("relu" in d for d in seen["diff"])

        banner = page_root.locator(".yax-snapshot-banner").inner_text()
        assert banner.startswith(f"Snapshot of Transformer, saved by yax {yax.__version__} on ") and "read-only" in banner
        for selector in (".yax-query input", "button.yax-undo", "button.yax-export", "button.yax-save-html",
                         "select.yax-colour", "button.yax-find-nan", "button.yax-replace"):
            control = page_root.locator(selector).first
            assert control.is_disabled(), selector
            assert control.get_attribute("title").startswith(SENTENCE), selector
        assert page_root.locator(".yax-palette-item").first.get_attribute("draggable") == "false"

        # browsing works where the kernel answered beforehand (Graphviz runs from the page); elsewhere the
        # page says why it cannot
        page_root.locator('.yax-tab[data-tab="Graph"]').click()
        page_root.locator(".yax-graph-view svg").wait_for(timeout=30_000)
        assert page_root.locator(".yax-graph-view svg g.node").count() > 3
        page_root.locator('.yax-tab[data-tab="Compare"]').click()
        assert page_root.locator("select.yax-compare-base").is_disabled()
        eqs = page_root.locator(".yax-row.yax-eq").count()
        _row(page_root, "Dense_1").locator(".yax-toggle").click()  # its equations were recorded
        snap.wait_for_function("(n) => document.querySelectorAll('.yax-row.yax-eq').length > n", arg=eqs)
        page_root.locator('.yax-tab[data-tab="Values"]').click()
        _row(page_root, "LayerNorm_0").click()
        error = page_root.locator(".yax-values .yax-error")
        error.wait_for(timeout=10_000)
        assert error.inner_text().startswith(SENTENCE + " show the values of this row: that needs the live kernel.")
        snap.screenshot(path=str(ARTIFACTS / "snapshot-4-not-recorded.png"))
        page_root.locator('.yax-tab[data-tab="Compare"]').click()
        snap.screenshot(path=str(ARTIFACTS / "snapshot-5-compare.png"))
        assert errors == [] and refused == [], (errors, refused)
    finally:
        context.close()
    assert nb.errors == [], nb.errors
