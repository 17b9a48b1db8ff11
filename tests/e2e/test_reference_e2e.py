"""A port compared with its PyTorch original in the explorer, end to end in a real JupyterLab
with Debian's chromium: Hugging Face's PyTorch GPT-2 recorded (`yax.Reference.from_torch`) and
its Flax class with the same weights (tests/ports.py). The user picks the reference in the
compare pane's "compare with" choice: the original port is allclose to it at every matched
call; after the GELU is dragged to ReLU, the table has one column per model compared with the
reference (the original, the change), the change's first divergence marked in its column.
Screenshots go to ``artifacts/e2e/reference-*.png``; any console error fails the test."""

from __future__ import annotations

import pytest

from .lab import ARTIFACTS, drag

pytestmark = pytest.mark.e2e

CELLS = [
    """import yax
from ports import port
p = port("gpt2")  # PyTorch's GPT-2 recorded, and its Flax class with the same weights
from yax_widget import Explorer
ex = Explorer(p.mox, p.params, *p.inputs)
ex.add_reference(p.reference, "pytorch")
ex""",
    """cs = ex.session.comparisons
print("FIRST=" + str(cs and cs.first_divergence), "BASE=" + ex.session.state["compare_base"])""",
]


@pytest.fixture(scope="module")
def notebook(lab):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with lab.notebook("reference.ipynb", CELLS) as nb:
        yield nb


def test_a_port_compared_with_its_pytorch_original_in_the_browser(notebook):
    nb = notebook
    page = nb.page
    try:
        nb.run(0, timeout=300)
        page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=120_000)
        root = page.locator(".yax-explorer").first
        root.locator(".yax-tab", has_text="Compare").first.click()
        choice = root.locator(".yax-compare .yax-compare-base")
        assert "the reference “pytorch”" in choice.inner_text()
        choice.select_option("pytorch")
        page.wait_for_function("(el) => !el.classList.contains('yax-busy') && el.querySelector('.yax-compare "
                               ".yax-matching')", arg=root.element_handle(), timeout=180_000)
        pane = root.locator(".yax-compare")
        text = pane.inner_text()
        assert "✓ outputs allclose to the reference “pytorch”" in text, text
        assert "✓ original: allclose to the reference" in text, text
        assert "torch GPT2LMHeadModel: 27 calls matched by name, 15 only in the model" in text, text
        root.screenshot(path=str(ARTIFACTS / "reference-01-original.png"))

        root.locator(".yax-query input").fill("//activation[@name='gelu_new']")
        page.wait_for_function("(el) => el.querySelector('.yax-count').textContent === '2 matches'",
                               arg=root.element_handle())
        drag(page, root.locator(".yax-palette-item", has_text="ReLU").first, root.locator(".yax-query input"))
        page.wait_for_function(
            "(el) => el.querySelectorAll('.yax-history-item').length === 2 && !el.classList.contains('yax-busy')"
            " && el.querySelectorAll('.yax-boundaries th').length === 6", arg=root.element_handle(), timeout=180_000)
        heads = pane.locator(".yax-boundaries th").all_inner_texts()
        assert heads[:3] == ["call", "rel: original", "rel: step 1 (current)"], heads
        text = pane.inner_text()
        assert "✗ outputs differ from the reference “pytorch”" in text, text
        assert "✗ step 1: differs from the reference, first at FlaxGPT2LMHeadModule/transformer/h/0/mlp/c_proj" \
            in text, text
        marked = pane.locator(".yax-first-cell")
        assert marked.count() == 1 and "◀" in marked.inner_text()
        assert "step 1: the first divergence" in marked.get_attribute("title")
        state = nb.run(1)
        assert "'original': None" in state and "'step 1': 'FlaxGPT2LMHeadModule/transformer/h/0/mlp/c_proj'" in state
        assert "BASE=pytorch" in state, state
        root.screenshot(path=str(ARTIFACTS / "reference-02-current.png"))
        marked.scroll_into_view_if_needed()
        pane.locator(".yax-boundaries").screenshot(path=str(ARTIFACTS / "reference-03-table.png"))
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / "reference-failure.png"), full_page=True)
        print("console errors:", nb.errors)
        raise
    assert nb.errors == [], nb.errors
