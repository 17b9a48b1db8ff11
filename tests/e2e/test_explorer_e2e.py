"""The explorer end to end: a real JupyterLab, a real kernel, Debian's
chromium driven by Playwright. Screenshots of each state are saved under
``artifacts/e2e/``; any console error fails the test."""

from __future__ import annotations

import re

import pytest

from .lab import ARTIFACTS, Notebook, drag

pytestmark = pytest.mark.e2e


CELLS = [
    # 0: open the explorer on a small Transformer
    """import jax, jax.numpy as jnp, yax
from models import Transformer
from yax.internal import view
from yax_widget import Explorer
model = Transformer(num_layers=2)
batch = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 64
variables = model.init(jax.random.key(0), batch)
ex = Explorer(model, variables, batch)
ex.add_replacement("LoRA r=4", yax.LoRA(rank=4))
ex""",
    # 1: what yax.query returns, as view ids
    """XP = '//module_call[@type="Dense"][@features=64]'
print("IDS=" + ",".join(str(view(ex.mox).ids[id(n)]) for n in yax.query(XP, ex.mox)))""",
    # 2: the kernel's view of the explorer
    """print("STATE", [n.name for n in yax.query("//activation|//module_call[@type='Dropout']", ex.mox)],
      len(ex.history), ex.mox is ex.original, ex.comparison is not None)""",
    # 3: the magic
    """%load_ext yax_widget
%yax model variables batch --query "//activation[@name='gelu']"
""",
    # 4: ids the magic's query selects
    """print("GELU=" + ",".join(str(view(ex.mox).ids[id(n)]) for n in yax.query("//activation[@name='gelu']", ex.mox)))""",
    # 5: a flax.nnx model through the magic
    """from flax import nnx
class Net(nnx.Module):
    def __init__(self, rngs):
        self.fc1, self.fc2 = nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 2, rngs=rngs)
    def __call__(self, x):
        return self.fc2(nnx.gelu(self.fc1(x)))
net, xs = Net(nnx.Rngs(0)), jnp.ones((3, 8))
%yax net xs --query \"//module_call[@type='Linear']\"""",
    # 6: the same nnx model under PAX's mixed-precision policy: each row shows its dtypes
    """half, half_state = yax.mixed_precision(yax.make_mox(net)(xs), params=nnx.state(net))
Explorer(half, half_state, xs)""",
]


@pytest.fixture(scope="module")
def notebook(lab):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with lab.notebook("explore.ipynb", CELLS) as nb:
        yield nb


def type_query(root, xpath: str) -> list[str]:
    """Type a query that selects other nodes than the current highlight; the ids it highlights."""
    before = root.get_attribute("data-match-ids")
    root.locator(".yax-query input").fill(xpath)
    root.page.wait_for_function("([el, before]) => el.dataset.matchIds !== before",
                                arg=[root.element_handle(), before])
    return root.get_attribute("data-match-ids").split(",")


def ids_of(text: str, tag: str) -> list[str]:
    m = re.search(rf"{tag}=([\d,]*)", text)
    assert m, text
    return [x for x in m.group(1).split(",") if x]


def test_explorer_end_to_end(notebook):
    with notebook.failing("explorer"):
        _steps(notebook)


def _steps(nb: Notebook) -> None:
    page = nb.page
    nb.run(0)
    root = page.locator(".yax-explorer").first
    root.wait_for(timeout=60_000)
    page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=60_000)
    assert root.locator(".yax-row").count() > 10
    nb.shot("01-tree")

    # typing a query highlights exactly what yax.query returns
    want = ids_of(nb.run(1), "IDS")
    assert len(want) == 2
    box = root.locator(".yax-query input")
    box.fill('//module_call[@type="Dense"][@features=64]')
    page.wait_for_function(
        "(ids) => document.querySelector('.yax-explorer').dataset.matchIds === ids", arg=",".join(want))
    assert sorted(root.locator(".yax-row.yax-match").evaluate_all("els => els.map(e => e.dataset.id)")) == sorted(want)
    assert "2" in root.locator(".yax-count").inner_text()
    nb.shot("02-query")

    # an invalid query shows its error and keeps the last good highlight
    box.fill("//[@")
    err = root.locator(".yax-query-error")
    err.wait_for(state="visible")
    page.wait_for_function("() => document.querySelector('.yax-query-error').textContent.includes('XPath')")
    assert root.get_attribute("data-match-ids") == ",".join(want)
    nb.shot("03-invalid-query")

    # drag a palette item onto a row: the kernel's model changes and the comparison shows
    gelu = type_query(root, "//activation[@name='gelu']")[0]
    drag(page, root.locator('.yax-palette-item[data-name="ReLU"]'), root.locator(f'.yax-row[data-id="{gelu}"]'))
    page.wait_for_selector(".yax-compare .yax-hist", timeout=120_000)
    assert root.locator(".yax-compare canvas.yax-heat").count() == 3
    assert "Block_0/gelu" in root.locator(".yax-compare").inner_text()  # the first divergence
    out = nb.run(2)
    assert "'relu'" in out and " 1 False True" in out, out
    nb.shot("04-dragged")

    # a replacement that does not fit is refused at its row, and nothing changes
    dense = type_query(root, "//module_call[@name='Dense_0']")[0]
    drag(page, root.locator('.yax-palette-item[data-name="GELU (tanh)"]'), root.locator(f'.yax-row[data-id="{dense}"]'))
    notice = root.locator(".yax-notice")
    notice.wait_for(state="visible")
    assert "does not fit" in notice.inner_text()
    assert " 1 False True" in nb.run(2)
    nb.shot("05-refused")

    # click-to-substitute: a click selects the row (no menu), its "replace…" button offers what fits
    drops = type_query(root, "//module_call[@type='Dropout']")
    assert len(drops) == 4
    drop = drops[0]
    root.locator(f'.yax-row[data-id="{drop}"]').click()
    root.locator(f'.yax-row.yax-selected[data-id="{drop}"]').wait_for()
    assert root.locator(".yax-fits").count() == 0
    root.locator(f'.yax-row[data-id="{drop}"] .yax-replace').click()
    menu = root.locator(".yax-fits")
    menu.wait_for(state="visible")
    assert root.locator(".yax-notice").count() == 0  # the refusal's reason went once another row was chosen
    assert menu.locator('.yax-fit[data-name="identity"]').count() == 1
    nb.shot("06-fits")
    menu.locator('.yax-fit[data-name="identity"]').click()
    page.wait_for_function("() => !document.querySelector('.yax-status') || "
                           "!document.querySelector('.yax-status').textContent.includes('compiling')")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.yax-history li, .yax-history .yax-history-item')].length >= 2")
    out = nb.run(2)
    assert "'identity'" in out and " 2 False True" in out, out
    nb.shot("07-clicked")

    # the graph of the selected module renders as SVG in the browser
    root.locator(".yax-graph-button").click()
    page.wait_for_selector(".yax-graph svg", timeout=60_000)
    assert root.locator(".yax-graph svg g.node").count() > 2
    # every label inside its box, in the fonts this browser has (Graphviz estimated Helvetica's widths)
    spill = root.locator(".yax-graph svg").evaluate("""(svg) => [...svg.querySelectorAll('g.node, g.cluster')]
      .flatMap((g) => { const box = g.querySelector(':scope > polygon, :scope > ellipse, :scope > path');
        if (!box) return [];
        const b = box.getBBox();
        return [...g.querySelectorAll(':scope > text')].map((t) => t.getBBox())
          .filter((t) => t.x < b.x - 0.5 || t.x + t.width > b.x + b.width + 0.5)
          .map((t) => `${g.id}: text ${t.x.toFixed(1)}..${(t.x + t.width).toFixed(1)} in ${b.x.toFixed(1)}..${(b.x + b.width).toFixed(1)}`); })""")
    assert spill == [], spill
    nb.shot("08-graph")

    # undo twice restores the original
    root.locator(".yax-undo").click()
    page.wait_for_function("() => document.querySelector('.yax-history') !== null")
    root.locator(".yax-undo").click()
    page.wait_for_function("() => document.querySelector('.yax-undo').disabled")
    out = nb.run(2)
    assert " 0 True False" in out, out
    nb.shot("09-undone")

    # keyboard: arrows move the selection, right/left expand and collapse, enter offers what fits
    tree = root.locator(".yax-tree")
    tree.focus()
    selected = root.locator(".yax-row.yax-selected .yax-name")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    page.wait_for_function("() => document.querySelector('.yax-row.yax-selected .yax-name')?.textContent === 'embed'")
    page.keyboard.press("ArrowRight")  # embed's equations load on demand
    root.locator(".yax-row.yax-eq").first.wait_for()
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("() => !document.querySelector('.yax-explorer .yax-row.yax-eq')")
    page.keyboard.press("Enter")
    root.locator(".yax-fits").wait_for(state="visible")
    page.keyboard.press("Escape")
    root.locator(".yax-fits").wait_for(state="detached")
    assert selected.inner_text() == "embed"

    # the filter box keeps the rows whose name or type matches, and their ancestors
    root.locator(".yax-search input").fill("dropout")
    page.wait_for_function("() => document.querySelectorAll('.yax-explorer .yax-row').length === 7")
    names = root.locator(".yax-row .yax-name").all_inner_texts()
    assert names == ["Transformer", "Block_0", "Dropout_0", "Dropout_1", "Block_1", "Dropout_0", "Dropout_1"], names
    root.locator(".yax-search input").fill("")

    # a query selecting equations highlights them in their expanded call
    (eq,) = type_query(root, "//module_call[@path='Transformer/Block_0/Dense_0']/dot_general")
    row = root.locator(f'.yax-row[data-id="{eq}"]')
    assert row.get_attribute("class").split() >= ["yax-row", "yax-eq", "yax-match"], row.get_attribute("class")
    assert row.locator(".yax-name").inner_text() == "dot_general"
    nb.shot("10-equation-match")

    # dropping a palette item on the query box replaces every match; the diff marks them; undo and redo
    type_query(root, "//activation[@name='gelu']")
    drag(page, root.locator('.yax-palette-item[data-name="SiLU"]'), root.locator(".yax-query input"))
    page.wait_for_selector(".yax-compare .yax-hist", timeout=120_000)
    out = nb.run(2)
    assert out.count("'silu'") == 2 and " 1 False True" in out, out
    root.locator('.yax-tab[data-tab="Diff"]').click()
    # a call put where another was is a replacement: changed on both sides, not added and removed
    assert root.locator(".yax-diff .yax-diff-row.yax-changed").all_inner_texts() == ["~ gelu"] * 2 + ["~ silu"] * 2
    assert root.locator(".yax-diff .yax-diff-row.yax-added, .yax-diff .yax-diff-row.yax-removed").count() == 0
    nb.shot("11-query-drop-diff")
    root.locator(".yax-undo").click()
    page.wait_for_function("() => document.querySelector('.yax-undo').disabled")
    root.locator(".yax-redo").click()
    page.wait_for_function("() => document.querySelector('.yax-redo').disabled")
    assert nb.run(2).count("'silu'") == 2
    root.locator(".yax-undo").click()
    page.wait_for_function("() => document.querySelector('.yax-undo').disabled")
    assert " 0 True False" in nb.run(2)

    # %yax opens a second explorer with the query applied
    nb.run(3)
    page.wait_for_function("() => document.querySelectorAll('.yax-explorer[data-ready=\"1\"]').length === 2")
    second = page.locator(".yax-explorer").nth(1)
    want = ids_of(nb.run(4), "GELU")
    page.wait_for_function(
        "(ids) => document.querySelectorAll('.yax-explorer')[1].dataset.matchIds === ids", arg=",".join(want))
    assert second.locator(".yax-query input").input_value() == "//activation[@name='gelu']"
    second.screenshot(path=str(ARTIFACTS / "12-magic.png"))

    # an nnx model: its tree and the query's highlight
    nb.run(5)
    page.wait_for_function("() => document.querySelectorAll('.yax-explorer[data-ready=\"1\"]').length === 3")
    third = page.locator(".yax-explorer").nth(2)
    page.wait_for_function("() => (document.querySelectorAll('.yax-explorer')[2].dataset.matchIds || '').split(',')"
                           ".filter(Boolean).length === 2")
    assert third.locator(".yax-row").evaluate_all("els => els.map(e => e.querySelector('.yax-name').textContent)") == [
        "Net", "fc1", "gelu", "fc2"]
    assert third.locator(".yax-row.yax-match").count() == 2
    third.screenshot(path=str(ARTIFACTS / "13-nnx.png"))

    # a mixed-precision model: every row shows the dtypes of its parameters/computation/outputs
    nb.run(6)
    page.wait_for_function("() => document.querySelectorAll('.yax-explorer[data-ready=\"1\"]').length === 4")
    fourth = page.locator(".yax-explorer").nth(3)
    rows = fourth.locator(".yax-row").evaluate_all(
        "els => els.map(e => [e.querySelector('.yax-name').textContent, e.querySelector('.yax-policy')?.textContent])")
    assert rows == [["Net", "f32/bf16/f32"], ["fc1", "f32/bf16/f32"], ["gelu", "-/f32/f32"], ["fc2", "f32/bf16/f32"]]
    assert third.locator(".yax-policy").count() == 0  # the float32 model shows none
    fourth.screenshot(path=str(ARTIFACTS / "13b-mixed-precision.png"))

    # the match highlight keeps its rows' text at WCAG AA contrast (4.5:1): on the light theme here, the
    # dark one below
    root.locator(".yax-query input").fill("//module_call[@type='Dense'] | //activation")
    page.wait_for_function("(el) => el.querySelectorAll('.yax-row.yax-match').length >= 4", arg=root.element_handle())
    worst = root.evaluate(CONTRAST)
    assert worst["rows"] >= 4 and worst["min"] >= 4.5, worst
    # the explorer follows JupyterLab's theme: switched to dark, its colours are the theme's
    page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.wait_for_function(f"() => ({LUMINANCE})(getComputedStyle(document.querySelector('.yax-explorer'))"
                           ".backgroundColor) < 0.3", timeout=60_000)
    bg, theme_bg, fg, row_fg = page.evaluate("""() => {
      const probe = document.createElement('div');
      probe.style.background = 'var(--jp-layout-color1)';
      document.body.append(probe);
      const want = getComputedStyle(probe).backgroundColor;
      probe.remove();
      const el = document.querySelector('.yax-explorer');
      return [getComputedStyle(el).backgroundColor, want, getComputedStyle(el).color,
              getComputedStyle(el.querySelector('.yax-row .yax-name')).color];
    }""")
    lum = lambda c: page.evaluate(f"(c) => ({LUMINANCE})(c)", c)  # noqa: E731
    assert bg == theme_bg, (bg, theme_bg)
    assert lum(fg) > 0.5 and lum(row_fg) > 0.5, (fg, row_fg)  # light text on the dark background
    page.wait_for_selector("#jupyterlab-splash", state="detached")  # Lab's splash while it switches
    # the match highlight keeps every text of its rows at WCAG AA contrast (4.5:1) on the dark theme
    root.locator(".yax-query input").fill("//module_call[@type='Dense'] | //activation")
    page.wait_for_function("(el) => el.querySelectorAll('.yax-row.yax-match').length >= 4", arg=root.element_handle())
    worst = root.evaluate(CONTRAST)
    assert worst["rows"] >= 4 and worst["min"] >= 4.5, worst
    root.screenshot(path=str(ARTIFACTS / "14-dark.png"))

    assert nb.errors == [], nb.errors


# relative luminance (0 black .. 1 white) of a CSS `rgb(...)`/`rgba(...)` colour
LUMINANCE = """(c) => { const [r, g, b] = c.match(/[\\d.]+/g).slice(0, 3).map((v) => +v / 255);
  return 0.2126 * r + 0.7152 * g + 0.0722 * b; }"""

# the lowest WCAG contrast ratio of the texts in the highlighted rows against the highlight (composited
# over the explorer's background): {min, rows, at}
CONTRAST = """(root) => {
  const rgba = (c) => { const v = c.match(/[\\d.]+/g).map(Number);
    return c.startsWith('color(') ? [v[0] * 255, v[1] * 255, v[2] * 255, v[3] ?? 1] : [v[0], v[1], v[2], v[3] ?? 1]; };
  const over = (top, under) => top.slice(0, 3).map((x, i) => x * top[3] + under[i] * (1 - top[3]));
  const lin = (x) => { x /= 255; return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; };
  const L = ([r, g, b]) => 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
  const base = rgba(getComputedStyle(root).backgroundColor);
  const out = { min: Infinity, rows: 0, at: '' };
  for (const row of root.querySelectorAll('.yax-row.yax-match')) {
    out.rows += 1;
    const bg = over(rgba(getComputedStyle(row).backgroundColor), base);
    for (const el of row.querySelectorAll('.yax-name, .yax-type, .yax-attrs, .yax-shapes, .yax-params, .yax-policy')) {
      if (!el.textContent.trim()) continue;
      const fg = over(rgba(getComputedStyle(el).color), bg);
      const [a, b] = [L(fg), L(bg)].sort((x, y) => y - x);
      const ratio = (a + 0.05) / (b + 0.05);
      if (ratio < out.min) Object.assign(out, { min: ratio, at: `${el.className}: ${el.textContent}` });
    }
  }
  return out;
}"""
