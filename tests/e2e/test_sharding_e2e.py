"""A sharded model in the explorer end to end: a Transformer whose kernels are split over a
2 × 4 mesh of the 8 CPU devices tests/conftest.py asks for (the kernel inherits XLA_FLAGS),
in a real JupyterLab and Debian's chromium. Each row's tooltip says how its parameters are
laid out, as the kernel computed it; a LoRA drop places its adapters like the kernel they
adapt, and the comparison shows. Screenshots: ``artifacts/e2e/sharding-*.png``."""

from __future__ import annotations

import pytest

from .lab import ARTIFACTS, Notebook, drag

pytestmark = pytest.mark.e2e


CELLS = [
    """import json, jax, jax.numpy as jnp, numpy as np, yax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from models import Transformer
from yax_widget import Explorer
mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
model = Transformer(num_layers=2)
ids = jnp.arange(64, dtype=jnp.int32).reshape(4, 16) % 64

def place(kp, x):  # 2-D kernels and the embedding split over `model`, the rest replicated
    name = str(getattr(kp[-1], "key", ""))
    return jax.device_put(x, NamedSharding(mesh, P(None, "model") if name in ("kernel", "embedding") else P()))

variables = jax.tree_util.tree_map_with_path(place, model.init(jax.random.key(0), ids))
ex = Explorer(model, variables, jax.device_put(ids, NamedSharding(mesh, P("data"))))
ex""",
    # 1: what the kernel says of the rows and, after the drop, of the adapters
    """layer = ex.params["params"]["Block_0"]["Dense_0"]
print("SHARDING=" + json.dumps({"devices": len(jax.devices()),
    "dense": yax.query('string(//module_call[@path="Transformer/Block_0/Dense_0"]/@sharding)', ex.mox),
    "lora": {k: str(v.sharding.spec) for k, v in layer.items() if k.startswith("lora")}}))""",
]


@pytest.fixture(scope="module")
def notebook(lab):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with lab.notebook("shard.ipynb", CELLS) as nb:
        yield nb


def test_rows_show_their_sharding_and_a_lora_drop_places_its_adapters(notebook):
    with notebook.failing("sharding"):
        _steps(notebook)
    assert notebook.errors == []


def _dense(root, block: str):
    """The row of ``block``'s first Dense (its path is in the tooltip's owner: the row under the block's)."""
    return root.locator(f'.yax-row[data-id="{root.page.evaluate(_ID, block)}"]')


# the id of Block_k/Dense_0's row: the first "Dense_0" row after the row named Block_k
_ID = """(block) => {
  const rows = [...document.querySelectorAll('.yax-explorer .yax-row')];
  const at = rows.findIndex((r) => r.querySelector('.yax-name')?.textContent === block);
  return rows.slice(at).find((r) => r.querySelector('.yax-name')?.textContent === 'Dense_0').dataset.id;
}"""


def _shot(root, row, name: str) -> None:
    """A screenshot with ``row``'s tooltip drawn beside it (headless chromium draws no native tooltip)."""
    root.scroll_into_view_if_needed()
    row.evaluate("""(el) => {
      const r = el.getBoundingClientRect(), d = document.createElement('div');
      d.className = 'e2e-tooltip'; d.textContent = el.title;
      Object.assign(d.style, { position: 'fixed', left: `${r.left + 40}px`, top: `${r.bottom + 2}px`, zIndex: 9999,
        background: '#ffffe1', color: '#000', border: '1px solid #767676', padding: '2px 5px', whiteSpace: 'pre', font: '12px sans-serif' });
      document.body.append(d);
    }""")
    root.screenshot(path=str(ARTIFACTS / f"sharding-{name}.png"))
    root.page.evaluate("() => document.querySelector('.e2e-tooltip').remove()")


def _steps(nb: Notebook) -> None:
    page = nb.page
    nb.run(0)
    root = page.locator(".yax-explorer").first
    page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=120_000)
    said = nb.printed(1, "SHARDING")
    assert said["devices"] == 8 and said["dense"] == "kernel=P(None,'model') bias=P()"

    # hover a Dense row: its tooltip holds the PartitionSpecs the kernel computed
    row = _dense(root, "Block_0")
    row.hover()
    assert f"sharding: {said['dense']}" in row.get_attribute("title").split("\n")
    assert row.locator(".yax-sharding").inner_text() == "P(None,'model')"  # on the row, not only on hover
    top = root.locator(".yax-row").first  # the model's input, split over `data`, as passed
    assert top.locator(".yax-sharding").inner_text() == "in P('data')"
    assert "inputs as passed: ids i32[4,16] P('data')" in top.get_attribute("title")
    norm = root.locator(".yax-row", has=page.locator('.yax-name:text-is("LayerNorm_0")')).first
    assert "sharding" not in (norm.get_attribute("title") or "")  # replicated parameters: nothing said
    assert norm.locator(".yax-sharding").count() == 0
    _shot(root, row, "1-tree")

    # drop LoRA on it: the comparison shows, and the adapter's row says how its new parameters lie
    drag(page, root.locator('.yax-palette-item[data-name="LoRA r=4"]'), row)
    page.wait_for_selector(".yax-compare .yax-hist", timeout=120_000)
    assert "allclose" in root.locator(".yax-compare").inner_text()  # lora_b starts at zero
    said = nb.printed(1, "SHARDING")
    assert said["lora"] == {"lora_a": "P(None, None)", "lora_b": "P(None, 'model')"}
    lora = root.locator(".yax-row", has=page.locator('.yax-type:text-is("LoRA")')).first
    lora.wait_for(timeout=60_000)
    lora.hover()
    title = lora.get_attribute("title")
    assert "sharding: lora_a=P(None,None) lora_b=P(None,'model') kernel=P(None,'model') bias=P()" in title, title
    _shot(root, lora, "2-lora")
