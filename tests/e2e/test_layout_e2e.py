"""The explorer's layout at the widths users work at (issue 26): a Hugging Face Flax T5 (rows
with several inputs, long output names, 4 + 4 layers of which 3 fold into one row ×3 with its dtype
badges) in a real JupyterLab and Debian's chromium, at 1100,
1400 and 1600 px, each with JupyterLab's file browser open and closed. Nothing the explorer
shows may be cut or overlap: checked on the elements' boxes, and a screenshot of each state is
saved as ``artifacts/e2e/layout-<width>-<open|closed>.png``."""

from __future__ import annotations

import pytest

from .lab import ARTIFACTS, Notebook

pytestmark = pytest.mark.e2e

WIDTHS = (1100, 1400, 1600)
HEIGHT = 900

CELLS = [
    # 0: a tiny T5 (random weights, nothing downloaded), opened with its two keyword inputs
    """import jax.numpy as jnp, transformers
from transformers.models.t5 import modeling_flax_t5
from thirdparty import DEC, IDS
from yax_widget import Explorer
transformers.logging.set_verbosity_error()  # no deprecation notice above the explorer

class OldClip:  # T5 calls jnp.clip(x, a_max=...), a keyword JAX 0.10 no longer takes
    def __getattr__(self, name):
        return getattr(jnp, name)
    @staticmethod
    def clip(x, a_min=None, a_max=None):
        return jnp.clip(x, a_min, a_max)

modeling_flax_t5.jnp = OldClip()
config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=4, num_decoder_layers=4,
                               num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16)
model = transformers.FlaxT5ForConditionalGeneration(config, seed=0, dtype=jnp.float32, _do_init=True)
ex = Explorer(model, input_ids=IDS, decoder_input_ids=DEC)
ex""",
    # 1: one change, so that the comparison and the Diff tab have content: the activations in bfloat16,
    # so that every row shows its dtypes (`f32/f32/f32`, `-/bf16/f32`), the widest rows there are
    """import jax
ex.add_replacement("GELU in bf16", lambda x: jax.nn.gelu(x.astype(jnp.bfloat16)).astype(jnp.float32))
print(ex.substitute("//activation[@name='relu']", "GELU in bf16"))""",
]

# Everything measured in the page, in one call per state: what is cut, overflows or overlaps.
MEASURE = """async (root) => {
  const frame = () => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  const box = (el) => el.getBoundingClientRect();
  const text = (el) => el.textContent.trim();
  const out = { rows: 0, folded: 0, cutRows: [], table: [], diff: null, toolbar: null, treeBar: null, outside: null };

  // the explorer inside its output area (nothing beyond JupyterLab's notebook panel)
  const panel = box(root.closest('.jp-WindowedPanel-outer, .jp-Notebook'));
  const r = box(root);
  if (r.right > panel.right + 0.5 || r.left < panel.left - 0.5) out.outside = [r.left, r.right, panel.left, panel.right];

  // the tree: every row, scrolled through. A row's shapes, dtypes and parameter count are cut when
  // their text is clipped, or they end beyond their row or beyond what the tree scrolls to; they are
  // out of view when they end beyond the tree's visible width (the tree then scrolls sideways)
  const tree = root.querySelector('.yax-tree');
  const seen = new Set();
  out.outOfView = [];
  out.slack = Infinity;
  for (let top = 0; ; top += tree.clientHeight - 22) {
    tree.scrollTop = top;
    await frame();
    const tb = box(tree);
    const edge = tb.left + tree.clientLeft + tree.clientWidth;
    const reach = tb.left + tree.clientLeft + tree.scrollWidth - tree.scrollLeft;
    for (const row of root.querySelectorAll('.yax-row:not(.yax-eq)')) {
      if (seen.has(row.dataset.id)) continue;
      const rb = box(row);
      if (rb.top < tb.top || rb.bottom > tb.bottom) continue;  // partly out of view: on the next page
      seen.add(row.dataset.id);
      if (row.classList.contains('yax-folded')) out.folded += 1;
      const name = row.querySelector('.yax-name').textContent;
      for (const el of row.querySelectorAll('.yax-shapes, .yax-params, .yax-policy')) {
        const b = box(el);
        const what = `${name} ${el.className} "${text(el)}" ends at ${Math.round(b.right)}`;
        if (b.width === 0 || el.scrollWidth > el.clientWidth + 0.5) out.cutRows.push(`${what}: clipped (${el.scrollWidth} > ${el.clientWidth})`);
        else if (b.right > rb.right + 0.5) out.cutRows.push(`${what}, beyond its row (${Math.round(rb.right)})`);
        else if (b.right > reach + 0.5) out.cutRows.push(`${what}, beyond where the tree scrolls (${Math.round(reach)})`);
        else if (b.right > edge + 0.5) out.outOfView.push(`${what} > ${Math.round(edge)}`);
      }
      // how much narrower the tree could be before this row needs scrolling: what its fields take and
      // what its type could still give (down to 3em), or, when it already needs it, minus how much more
      const attrs = row.querySelector('.yax-attrs'), type = row.querySelector('.yax-type');
      const em = parseFloat(getComputedStyle(row).fontSize);
      const give = (attrs ? box(attrs).width : 0) + (type ? Math.max(0, box(type).width - 3 * em) : 0);
      const last = Math.max(...[...row.children].map((c) => box(c).right));
      out.slack = Math.min(out.slack, last > edge ? edge - last : give);
    }
    if (top + tree.clientHeight >= tree.scrollHeight) break;
  }
  tree.scrollTop = 0;
  out.rows = seen.size;

  // a table's cells inside the visible width of the side panel (not hidden behind its scroll)
  const cellsOutside = (table) => {
    const side = root.querySelector('.yax-side');
    const sb = box(side);
    const left = sb.left + side.clientLeft, right = left + side.clientWidth;
    return [...table.querySelectorAll('th, td')].filter((c) => {
      const b = box(c);
      return b.width > 0 && (b.left < left - 0.5 || b.right > right + 0.5 || c.scrollWidth > c.clientWidth + 1);
    }).map((c) => `${text(c) || '(empty)'} ${Math.round(box(c).left)}..${Math.round(box(c).right)} not in ${Math.round(left)}..${Math.round(right)}`);
  };
  out.table = [...root.querySelectorAll('.yax-compare table.yax-stats')].filter((t) => t.offsetParent)
    .flatMap(cellsOutside);

  // the Diff tab: its two columns side by side or one above the other, no text of one over the other
  const diff = root.querySelector('.yax-diff');
  if (diff && diff.offsetParent) {
    const [a, b] = [...diff.querySelectorAll('.yax-diff-side')];
    const ab = box(a), bb = box(b);
    const apart = ab.right <= bb.left + 0.5 || ab.bottom <= bb.top + 0.5;
    const over = [];
    for (const [side, sb] of [[a, ab], [b, bb]]) {
      for (const row of side.querySelectorAll('.yax-diff-row')) {
        const rb = box(row);
        if (rb.left + row.scrollWidth > sb.right + 0.5) over.push(`${text(row)} ends at ${Math.round(rb.left + row.scrollWidth)} > ${Math.round(sb.right)}`);
      }
    }
    out.diff = { apart, over, rows: diff.querySelectorAll('.yax-diff-row').length };
  }

  // the toolbar's buttons on one line; "collapse all" shares its line with another control
  const buttons = ['.yax-query', '.yax-undo', '.yax-redo', '.yax-copy', '.yax-graph-button', '.yax-export', '.yax-save-html']
    .map((s) => root.querySelector(`.yax-toolbar ${s}`));
  const tops = buttons.map((b) => Math.round(box(b).top));
  const lineH = parseFloat(getComputedStyle(buttons[0]).lineHeight) || 18;
  out.toolbar = { tops, tall: buttons.filter((b) => b.matches('button') && box(b).height > 2 * lineH).map(text),
    query: Math.round(box(root.querySelector('.yax-query input')).width) };
  // the tree beside the side panel keeps most of the width (the panel never squeezes it to a strip)
  const [left, side] = [box(root.querySelector('.yax-left')), box(root.querySelector('.yax-side'))];
  out.split = { tree: Math.round(left.width), side: Math.round(side.width), beside: side.left >= left.right - 1 };
  const collapse = root.querySelector('.yax-collapse-all');
  const cb = box(collapse);
  const mates = [...collapse.parentElement.children].filter((c) => c !== collapse && box(c).width > 0)
    .filter((c) => { const b = box(c); return b.bottom > cb.top + 2 && b.top < cb.bottom - 2; });
  out.treeBar = { alone: mates.length === 0, mates: mates.map((m) => m.className || m.tagName) };
  return out;
}"""


@pytest.fixture(scope="module")
def notebook(lab):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with lab.notebook("layout.ipynb", CELLS, width=1600, height=HEIGHT) as nb:
        yield nb


def open_t5(nb: Notebook):
    """Run the two cells; the explorer once its comparison is on screen."""
    page = nb.page
    nb.run(0)
    root = page.locator(".yax-explorer").first
    page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=120_000)
    out = nb.run(1)
    assert "replaced 8 node(s)" in out, out  # one in each of the 4 + 4 layers
    page.wait_for_selector(".yax-compare .yax-hist", timeout=120_000)
    root.locator(".yax-expand-all").click()  # every row, the decoder's too
    return root


def set_layout(page, width: int, browser_open: bool) -> None:
    """Resize the page and open or close the left sidebar (the file browser); wait until
    JupyterLab and the explorer stop moving."""
    page.set_viewport_size({"width": width, "height": HEIGHT})
    page.evaluate("""async (want) => {
      const app = window.jupyterapp;
      if (app.shell.leftCollapsed === want) await app.commands.execute('application:toggle-left-area');
      if (want) await app.commands.execute('filebrowser:activate');
    }""", browser_open)
    page.wait_for_function("(want) => window.jupyterapp.shell.leftCollapsed !== want", arg=browser_open)
    last = None
    for _ in range(50):  # until the boxes are the same at two checks in a row
        now = page.evaluate("""() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(() => {
          const el = document.querySelector('.yax-explorer'), side = el.querySelector('.yax-side');
          r([el.getBoundingClientRect().width, side.getBoundingClientRect().width, document.body.clientWidth]);
        })))""")
        if now == last:
            break
        last = now


def show_tab(root, name: str) -> None:
    root.locator(f'.yax-tab[data-tab="{name}"]').click()
    root.locator(f'.yax-tab.yax-active[data-tab="{name}"]').wait_for()


def check(root, width: int, browser_open: bool) -> list[str]:
    """What is wrong in this state (an empty list: nothing)."""
    state = f"{width} px, file browser {'open' if browser_open else 'closed'}"
    show_tab(root, "Diff")
    diff = root.evaluate(MEASURE)["diff"]
    show_tab(root, "Compare")
    m = root.evaluate(MEASURE)
    print(f"{state}: {m['rows']} rows, {len(m['outOfView'])} shapes/dtypes/counts to scroll sideways to, "
          f"narrowest margin {m['slack']:.0f} px")
    problems = []
    if m["outside"]:
        problems.append(f"{state}: the explorer sticks out of the notebook: {m['outside']}")
    if m["rows"] < 100:
        problems.append(f"{state}: only {m['rows']} tree rows seen")
    if m["folded"] < 2:  # encoder's and decoder's 3 layers alike after the first (its relative attention bias)
        problems.append(f"{state}: {m['folded']} folded rows seen, whose badges must fit too")
    problems += [f"{state}: tree row cut: {c}" for c in m["cutRows"]]
    if width >= 1600 and not browser_open:  # the user's case: every row in view, without scrolling sideways
        problems += [f"{state}: tree row out of view: {c}" for c in m["outOfView"]]
    problems += [f"{state}: comparison cell outside its pane: {c}" for c in m["table"]]
    if not diff or not diff["rows"]:
        problems.append(f"{state}: the Diff tab is empty")
    else:
        if not diff["apart"]:
            problems.append(f"{state}: the Diff tab's columns overlap")
        problems += [f"{state}: diff row over the other column: {o}" for o in diff["over"]]
    if m["toolbar"]["query"] < 100:
        problems.append(f"{state}: the query box is squeezed to {m['toolbar']['query']} px")
    if m["split"]["beside"] and m["split"]["tree"] < 1.2 * m["split"]["side"]:
        problems.append(f"{state}: the side panel squeezes the tree: {m['split']}")
    if len(set(m["toolbar"]["tops"])) != 1 or m["toolbar"]["tall"]:
        problems.append(f"{state}: toolbar buttons not on one line: tops {m['toolbar']['tops']}, "
                        f"wrapped {m['toolbar']['tall']}")
    if m["treeBar"]["alone"]:
        problems.append(f"{state}: 'collapse all' alone on its line")
    return problems


def test_layout_at_three_widths_with_the_file_browser_open_and_closed(notebook):
    page = notebook.page
    try:
        root = open_t5(notebook)
        problems = []
        for width in WIDTHS:
            for browser_open in (True, False):
                set_layout(page, width, browser_open)
                problems += check(root, width, browser_open)
                root.scroll_into_view_if_needed()
                page.screenshot(path=str(ARTIFACTS / f"layout-{width}-{'open' if browser_open else 'closed'}.png"))
        assert not problems, "\n".join(problems)
        keeps_the_selection_in_place(root)
        assert not notebook.errors, notebook.errors
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / "layout-failure.png"), full_page=True)
        print("console errors:", notebook.errors)
        raise


def keeps_the_selection_in_place(root) -> None:
    """Undo (Ctrl+Z) and redo (Ctrl+Shift+Z) keep the selected row where it was on screen, deep in the tree."""
    page = root.page
    tree = root.locator(".yax-tree")
    tree.evaluate("(el) => { el.scrollTop = 60 * 22; }")
    page.wait_for_timeout(300)
    row = root.locator(".yax-row").nth(8)
    row.locator(".yax-name").click()
    where = "(el) => { const s = el.querySelector('.yax-row.yax-selected'); return s && [s.querySelector('.yax-name').textContent, Math.round(s.getBoundingClientRect().top - el.getBoundingClientRect().top)]; }"
    before = tree.evaluate(where)
    for keys, ready in (("Control+z", ".yax-redo:not([disabled])"), ("Control+Shift+z", ".yax-undo:not([disabled])")):
        page.keyboard.press(keys)
        root.locator(ready).wait_for(timeout=120_000)
        page.wait_for_timeout(1500)  # the equations of open calls load again
        assert tree.evaluate(where) == before, (keys, before, tree.evaluate(where))
    page.screenshot(path=str(ARTIFACTS / "layout-undo-kept.png"))
