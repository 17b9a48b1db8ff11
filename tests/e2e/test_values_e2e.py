"""Values, colouring, batches and the NaN search end to end: a real
JupyterLab and kernel, Debian's chromium driven by Playwright. What the page
shows is checked against what the kernel computes; screenshots of each state
are saved under ``artifacts/e2e/values-*.png``; any console error fails."""

from __future__ import annotations

import time

import pytest

from .lab import Notebook

pytestmark = pytest.mark.e2e


CELLS = [
    # 0: a Transformer whose embedding of token 63 is huge: a batch holding it overflows in a LayerNorm
    """import json, jax, jax.numpy as jnp, yax
from models import Transformer
from yax.internal import node_ids
from yax_widget import Explorer
model = Transformer(num_layers=2)
clean = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 60
variables = model.init(jax.random.key(0), clean)
p = variables["params"]
variables = {"params": {**p, "embed": {"embedding": p["embed"]["embedding"].at[63].set(1e20)}}}
poisoned = clean.at[1, 3].set(63)
ex = Explorer(model, variables, clean, batches={"clean": clean, "poisoned": poisoned})
ex""",
    # 1: the kernel's numbers for the row the values pane shows
    """node = yax.internal.view(ex.mox).nodes[ex._values["id"]]
s = ex.values(node)["out"]
print("STATS=" + json.dumps({"min": s.min, "max": s.max, "mean": s.mean, "std": s.std, "batch": ex.batch,
                            "nonfinite": [s.nan, s.posinf, s.neginf], "path": node.path}))""",
    # 2: the colouring the kernel sent, and where the first non-finite value is on the batch in use
    """f = yax.first_nonfinite(ex.mox, *ex.session.call_args()[0])
ids = node_ids(ex.mox)
print("OVERLAY=" + json.dumps(ex._overlay.get("values", {})))
print("NAN=" + json.dumps(None if f is None else [ids.get(id(f.call)), ids.get(id(f.equation)), ex.batch]))""",
]


@pytest.fixture(scope="module")
def notebook(lab):
    with lab.notebook("values.ipynb", CELLS) as nb:
        yield nb


def test_values_colouring_batches_and_nan(notebook):
    with notebook.failing("values"):
        _steps(notebook)


def _row(root, name: str):
    return root.locator(".yax-row", has=root.page.locator(f'.yax-name:text-is("{name}")')).first


def _stat(root, output: int, name: str) -> float:
    return float(root.locator(".yax-values .yax-values-output").nth(output)
                 .locator(f'td[data-stat="{name}"]').inner_text())


def _steps(nb: Notebook) -> None:
    page = nb.page
    nb.run(0)
    root = page.locator(".yax-explorer").first
    page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=120_000)
    batch = root.locator("select.yax-batch")
    assert batch.locator("option").all_inner_texts() == ["clean", "poisoned"] and batch.input_value() == "clean"

    # select a row, open Values: its statistics, histogram and heatmap are the kernel's numbers
    _row(root, "Block_0").click()
    root.locator('.yax-tab[data-tab="Values"]').click()
    out = root.locator(".yax-values .yax-values-output")
    out.first.wait_for(timeout=120_000)
    want = nb.printed(1, "STATS")
    for k in ("min", "max", "mean", "std"):
        assert _stat(root, 0, k) == pytest.approx(want[k], rel=6e-3, abs=1e-6), k
    assert "Transformer/Block_0" in root.locator(".yax-values-head").inner_text()
    assert "“clean”" in root.locator(".yax-values-head").inner_text()
    assert out.first.locator("canvas.yax-hist").count() == 1 and out.first.locator("canvas.yax-heat").count() == 1
    assert "values from" in out.first.locator(".yax-hist-fig figcaption").inner_text()
    assert root.locator('.yax-values td[data-stat="NaN / Inf"]').first.inner_text() == "none"
    nb.shot("values-1-pane")

    # another row: its values come without compiling the model again
    t = time.perf_counter()
    _row(root, "LayerNorm_0").click()
    page.wait_for_function("() => document.querySelector('.yax-values-head code')?.textContent"
                           ".endsWith('Block_0/LayerNorm_0')", timeout=60_000)
    seconds = time.perf_counter() - t
    print(f"values pane of a second row: {seconds * 1000:.0f} ms")
    assert seconds < 5

    # colour the tree by the norm: every call row gets the kernel's value, with a legend
    root.locator("select.yax-colour").select_option("norm")
    page.wait_for_selector('.yax-values-bar[data-overlay="norm"]', timeout=120_000)
    legend = root.locator(".yax-ov-legend")
    assert "norm of the outputs" in legend.inner_text() and "log scale" in legend.inner_text()
    overlay = nb.printed(2, "OVERLAY")
    chips = root.locator(".yax-row .yax-ov")
    assert chips.count() > 10
    rows = root.locator(".yax-row:not(.yax-eq)")
    for i in range(rows.count()):
        r = rows.nth(i)
        chip = r.locator(".yax-ov")
        value = overlay.get(r.get_attribute("data-id"))
        assert chip.count() == (value is not None)
        if value is not None:
            shown = float(chip.get_attribute("title").split(": ")[1])
            assert shown == pytest.approx(value, rel=6e-3)
    nb.shot("values-2-colour-norm")

    # the poisoned batch: the pane and the colours follow it; the overflow shows as +Inf
    batch.select_option("poisoned")
    page.wait_for_function("() => document.querySelector('.yax-values-head')?.textContent.includes('“poisoned”')",
                           timeout=120_000)
    nonfinite = root.locator('.yax-values td[data-stat="NaN / Inf"]').first
    want = nb.printed(1, "STATS")
    assert want["batch"] == "poisoned" and want["path"] == "Transformer/Block_0/LayerNorm_0"
    assert want["nonfinite"] == [0, 0, 0] and nonfinite.inner_text() == "none"  # the LayerNorm absorbs the overflow
    _row(root, "Block_1").click()
    page.wait_for_function("() => document.querySelector('.yax-values-head code')?.textContent === 'Transformer/Block_1'",
                           timeout=60_000)
    want = nb.printed(1, "STATS")
    nan, posinf, neginf = want["nonfinite"]
    assert nan + posinf + neginf > 0
    assert f"{nan} NaN, {posinf} +Inf, {neginf} −Inf" in nonfinite.inner_text(), nonfinite.inner_text()
    # its heatmap shows the slice holding them (the poisoned token is in the second sequence), in red
    part = root.locator(".yax-values .yax-heat-part").first.inner_text()
    assert part == "heatmap of out[1], the first slice holding NaN or Inf", part
    assert "NaN or infinite values shown here" in root.locator(".yax-values .yax-values-heat").first.inner_text()
    root.locator("select.yax-colour").select_option("nonfinite")
    page.wait_for_selector('.yax-values-bar[data-overlay="nonfinite"]', timeout=120_000)
    assert "holds NaN or Inf" in legend.inner_text()
    overlay = nb.printed(2, "OVERLAY")
    shown = {r.get_attribute("data-id"): float(r.locator(".yax-ov").get_attribute("title").split(": ")[1])
             for r in rows.all() if r.locator(".yax-ov").count()}
    assert shown and all(v == pytest.approx(overlay[k], rel=6e-3, abs=1e-9) for k, v in shown.items())
    red = {k for k, v in shown.items() if v > 0}
    assert red and red == {k for k in shown if overlay[k] > 0}
    nb.shot("values-3-poisoned-nonfinite")

    # find the first NaN: the row the kernel names is selected, and the message says where
    root.locator("button.yax-find-nan").click()
    message = root.locator(".yax-values-message")
    page.wait_for_selector(".yax-values-message.yax-nan-found", timeout=120_000)
    assert "LayerNorm_0" in message.inner_text() and "poisoned" in message.inner_text()
    call, eq, _ = nb.printed(2, "NAN")
    selected = root.locator(".yax-row.yax-selected")
    selected.wait_for()
    assert int(selected.get_attribute("data-id")) in (call, eq)
    assert selected.locator(".yax-name").inner_text() in ("square", "LayerNorm_0")
    key = "Transformer/Block_0/LayerNorm_0" + (":square" if int(selected.get_attribute("data-id")) == eq else "")
    page.wait_for_function("(key) => document.querySelector('.yax-values-head code')?.textContent === key", arg=key,
                           timeout=120_000)
    assert "+Inf" in root.locator('.yax-values td[data-stat="NaN / Inf"]').first.inner_text()
    nb.shot("values-4-first-nan")

    # back on the clean batch there is none, and the button says so
    batch.select_option("clean")
    page.wait_for_function("() => document.querySelector('.yax-values-bar select.yax-batch').value === 'clean'")
    page.wait_for_function("() => document.querySelector('.yax-values-bar')?.dataset.overlay === 'nonfinite'")
    root.locator("button.yax-find-nan").click()
    page.wait_for_selector(".yax-values-message.yax-nan-none", timeout=120_000)
    assert "No NaN or Inf" in message.inner_text() and "clean" in message.inner_text()
    assert nb.printed(2, "NAN") is None
    nb.shot("values-5-no-nan")

    assert nb.errors == [], nb.errors
