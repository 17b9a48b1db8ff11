"""A careful user's first hour with the explorer (issue 38), in a real JupyterLab and Debian's chromium:
a Hugging Face CLIP opened with keyword inputs under the user's own names. The top row shows the inputs
as passed (the pixels channels-first, as given; no `position_ids`), and "copy as code", shown in the
page, names the user's variables: pasted into a cell as shown, it makes the explorer's model, bit for
bit. Screenshots: ``artifacts/e2e/first-hour-*.png``."""

from __future__ import annotations

import pytest

from .lab import ARTIFACTS

pytestmark = pytest.mark.e2e

CELLS = [
    """import jax, jax.numpy as jnp, numpy as np, transformers, yax
from yax_widget import Explorer
transformers.logging.set_verbosity_error()
clip = transformers.FlaxCLIPModel(transformers.CLIPConfig(
    text_config=dict(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, max_position_embeddings=8),
    vision_config=dict(image_size=32, patch_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2), projection_dim=8), seed=0)
ids = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 50
pix = jnp.linspace(-1.0, 1.0, 2 * 3 * 32 * 32).reshape(2, 3, 32, 32)
mask = jnp.ones((2, 8), jnp.int32).at[1, 6:].set(0)
ex = Explorer(clip, input_ids=ids, pixel_values=pix, attention_mask=mask)
ex.substitute("//activation", "GELU (erf)")
ex""",
    "# the script copied from the page goes here",
    """want = yax.eval_mox(ex.mox, ex.params, input_ids=ids, pixel_values=pix, attention_mask=mask)
got = yax.eval_mox(mox, params, input_ids=ids, pixel_values=pix, attention_mask=mask)
print("SAME", all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))),
      len(jax.tree_util.tree_leaves(got)))""",
]


@pytest.fixture(scope="module")
def notebook(lab):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with lab.notebook("first_hour.ipynb", CELLS) as nb:
        yield nb


def test_the_top_row_and_copy_as_code_say_what_the_user_gave(notebook):
    nb, page = notebook, notebook.page
    with nb.failing("first-hour"):
        nb.run(0, timeout=300)
        page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=120_000)
        root = page.locator(".yax-explorer").first
        top = root.locator(".yax-row").first
        assert top.locator(".yax-shapes").inner_text().startswith("i32[2,8] f32[2,3,32,32] i32[2,8] → ")
        title = top.get_attribute("title")
        assert "inputs as passed: input_ids i32[2,8], pixel_values f32[2,3,32,32], attention_mask i32[2,8]" in title
        assert "position_ids" not in top.locator(".yax-shapes").inner_text()
        nb.shot("first-hour-1-inputs")
        root.locator(".yax-copy").click()
        pane = root.locator(".yax-code-pane")
        pane.locator("pre, code").first.wait_for(timeout=60_000)
        code = pane.locator("pre").first.inner_text()
        assert "# `clip`, `ids`, `pix`, `mask`: the notebook's names given to Explorer(...)" in code.splitlines(), code
        nb.shot("first-hour-2-code")
        # pasted as shown, in a cell of its own: the same model, bit for bit
        page.evaluate("""(code) => { const nb = window.jupyterapp.shell.currentWidget.content;
          nb.widgets[1].model.sharedModel.setSource(code); }""", code)
        nb.run(1, timeout=300)
        assert "SAME True" in nb.run(2, timeout=300)
    assert nb.errors == [], nb.errors
