"""The explorer on models nobody here wrote, end to end: a Hugging
Face Flax GPT-2 built from a small config (its wrapper object, its tied
``lm_head``, its ``gelu_new``) and a flax.nnx model, in a real JupyterLab with
Debian's chromium. What the browser shows is checked against what the kernel
holds. Screenshots of each state go to ``artifacts/e2e/real-*.png``; any
console error fails the test."""

from __future__ import annotations

import re

import pytest

from .lab import ARTIFACTS, Notebook, drag

pytestmark = pytest.mark.e2e


CELLS = [
    # 0: GPT-2 from a small config, opened as the wrapper object users hold
    """import jax, jax.numpy as jnp, yax
from thirdparty import IDS, _hf
from yax.internal import view, misfit
from yax_widget import Explorer
model = _hf("gpt2")
ex = Explorer(model, IDS)
ex.add_replacement("LoRA r=2", yax.LoRA(rank=2))
ex""",
    # 1: what the kernel holds
    """def ids(xp):
    return ",".join(str(view(ex.mox).ids[id(n)]) for n in yax.query(xp, ex.mox))
print("STATE", len(ex.history), ex.mox is ex.original, ex.comparison is not None and ex.comparison.allclose,
      "FIRST=" + str(ex.comparison and ex.comparison.first_divergence),
      "CALLS=" + str(len(yax.query("//module_call", ex.mox))),
      "HEAD=" + ids("//module_call[@name='lm_head']"), "DROP=" + ids("//module_call[@path='FlaxGPT2LMHeadModule/transformer/dropout']"),
      "GELU=" + ids("//activation[@name='gelu_new']"),
      "MLP=" + ids("//module_call[@path='FlaxGPT2LMHeadModule/transformer/h/0/mlp']"))
attn = yax.query("//module_call[@path='FlaxGPT2LMHeadModule/transformer/h/0/attn']", ex.mox)[0]
print("ATTN=" + ids("//module_call[@path='FlaxGPT2LMHeadModule/transformer/h/0/attn']"), "ORDER=" + "|".join(
    c.name if isinstance(c, yax.Equation) else c.name + ("." + c.method if c.kind == "method_call" else "")
    for c in attn.children), "PARAMS=" + str(attn.num_params),
    "BOUNDS=" + str(len(ex._comparison.get("boundaries", {}))), "FIRSTID=" + str(ex._comparison.get("first_divergence_id")))
print("FITS=" + ",".join(n for n, i in ex.session.items.items()
      if misfit(i.repl, yax.query("//module_call[@name='lm_head']", ex.mox)[0], ex.mox, params=ex.params) is None))""",
    # 2: the script "Copy as code" shows, run as pasted, makes the explorer's model
    """code = ex.code()
ns = {"model": model, "IDS": IDS}  # the names the explorer was opened with, which the script says it reads
exec(code, ns)
print("SAME", str(ns["mox"]) == str(ex.mox), len(code.splitlines()))""",
    # 3: an nnx model
    """from flax import nnx
class Net(nnx.Module):
    def __init__(self, rngs):
        self.fc1, self.fc2 = nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 2, rngs=rngs)
    def __call__(self, x):
        return self.fc2(nnx.gelu(self.fc1(x)))
net, xs = Net(nnx.Rngs(0)), jax.random.normal(jax.random.key(2), (3, 8))
nx = Explorer(net, xs)
nx.add_replacement("LoRA r=2", yax.LoRA(rank=2))
nx""",
    # 4: the nnx explorer in the kernel
    """print("NNX", len(nx.history), nx.comparison is not None and nx.comparison.allclose,
      "FC1=" + ",".join(str(view(nx.mox).ids[id(n)]) for n in yax.query("//*[@name='fc1']", nx.mox)),
      any("lora" in jax.tree_util.keystr(p).lower() for p, _ in jax.tree_util.tree_leaves_with_path(nx.params)))""",
    # 5: what the GPT-2 explorer compares with
    """print(repr(ex._compare_base), ex._comparison.get("base"))""",
    # 6: the files the Export button wrote run the rewritten model without yax
    """import numpy as np
f = jax.export.deserialize(open("yax_model_step2.jax_exported", "rb").read())
p = np.load("yax_model_step2.params.npz")
out = f.call(*[p[k] for k in p.files], IDS)
print("EXPORTED", bool(np.allclose(out[0], yax.eval_mox(ex.mox, ex.params, IDS).logits, atol=1e-5)))""",
]


@pytest.fixture(scope="module")
def notebook(lab):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with lab.notebook("real.ipynb", CELLS, permissions=("clipboard-read", "clipboard-write")) as nb:
        yield nb


def field(text: str, tag: str) -> str:
    m = re.search(rf"{tag}=(\S*)", text)
    assert m, text
    return m.group(1)


def test_real_models_end_to_end(notebook):
    try:
        _gpt2(notebook)
        _nnx(notebook)
    except BaseException:
        notebook.page.screenshot(path=str(ARTIFACTS / "real-failure.png"), full_page=True)
        print("console errors:", notebook.errors)
        raise
    assert notebook.errors == [], notebook.errors


def shot(root, name: str) -> None:
    root.screenshot(path=str(ARTIFACTS / f"real-{name}.png"))


def query(root, xpath: str, want: str) -> None:
    """Type ``xpath``; wait until the box says ``want`` next to it."""
    root.locator(".yax-query input").fill(xpath)
    root.page.wait_for_function("([el, want]) => el.querySelector('.yax-count').textContent === want",
                                arg=[root.element_handle(), want])


def open_fits(root, row_id: str):
    """Select a row and ask what fits it (Enter, as a keyboard user would)."""
    row = root.locator(f'.yax-row[data-id="{row_id}"]')
    row.scroll_into_view_if_needed()
    row.locator(".yax-name").click()
    # in this explorer: another one on the page keeps its own selection (undo and redo keep it)
    root.page.wait_for_function("([el, id]) => el.querySelector('.yax-row.yax-selected')?.dataset.id === id",
                                arg=[root.element_handle(), row_id])
    root.locator(".yax-tree").press("Enter")
    menu = root.locator(".yax-fits")
    menu.wait_for(state="visible")
    return menu


def watch_compare(root) -> None:
    """Record every text the compare pane shows from now on (in `window.yaxSeen`)."""
    root.evaluate("""(el) => {
      const pane = el.querySelector('.yax-compare');
      window.yaxSeen = [pane.textContent];
      new MutationObserver(() => window.yaxSeen.push(pane.textContent))
        .observe(pane, {childList: true, subtree: true, characterData: true});
    }""")


def compared(root, changes: int) -> None:
    """Wait until the history lists ``changes`` changes (and the original) and the compare pane
    shows the newest one's comparison."""
    root.page.wait_for_function(
        "([el, n]) => el.querySelectorAll('.yax-history-item').length === n + 1"
        " && !el.classList.contains('yax-busy') && el.querySelector('.yax-compare .yax-verdict')",
        arg=[root.element_handle(), changes], timeout=180_000)


def _gpt2(nb: Notebook) -> None:
    page = nb.page
    nb.run(0, timeout=300)
    page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=120_000)
    root = page.locator(".yax-explorer").first
    state = nb.run(1)
    assert "STATE 0 True False" in state, state
    names = root.locator(".yax-row .yax-name").all_inner_texts()
    assert names[:3] == ["FlaxGPT2LMHeadModule", "transformer", "wte"], names
    shot(root, "01-gpt2-tree")

    # points 4 and 5: a call's equations are listed in program order among its calls (as the MoX
    # holds them); a helper method's row names its method and does not count the module's
    # parameters again
    attn = field(state, "ATTN")
    query(root, "//module_call[@path='FlaxGPT2LMHeadModule/transformer/h/0/attn']", "1 match")  # opens its block
    root.locator(f'.yax-row[data-id="{attn}"] .yax-toggle').click()
    page.wait_for_function("(id) => [...document.querySelectorAll('.yax-row')].some((r) => r.classList.contains('yax-eq'))",
                           arg=attn)
    # the rows are virtualised: scroll attn to the top so that all its rows are in the page
    root.evaluate("""(el, id) => new Promise((done) => {
      const tree = el.querySelector('.yax-tree');
      tree.scrollTop = parseFloat(el.querySelector(`.yax-row[data-id="${id}"]`).style.top);
      requestAnimationFrame(() => requestAnimationFrame(done));
    })""", attn)
    rows = root.locator(".yax-row").evaluate_all(
        "els => els.sort((a, b) => parseFloat(a.style.top) - parseFloat(b.style.top))"
        ".map((e) => [e.dataset.id, e.style.paddingLeft, e.querySelector('.yax-name').textContent,"
        " e.querySelector('.yax-params')?.textContent || ''])")
    at = [r[0] for r in rows].index(attn)
    indent = lambda r: float(r[1].removesuffix("px"))  # noqa: E731
    inside = []
    for r in rows[at + 1:]:
        if indent(r) <= indent(rows[at]):
            break
        inside.append(r)
    assert "|".join(r[2] for r in inside) == field(state, "ORDER"), (inside, state)
    helpers = [r for r in inside if r[2].startswith("attn._")]
    assert [r[2] for r in helpers] == ["attn._split_heads"] * 3 + ["attn._merge_heads"], helpers
    assert all(r[3] == "" for r in helpers), helpers  # counted once, on attn's own row
    shot(root, "01b-gpt2-attn-order")
    root.locator(f'.yax-row[data-id="{attn}"] .yax-toggle').click()

    # point 12: the query box says what a query returned
    tree_top = root.locator(".yax-tree").bounding_box()["y"]
    query(root, "count(//module_call)", f"= {field(state, 'CALLS')}")
    query(root, "//module_call[@type='FlaxGPT2Block']/@path", "2 values (not nodes: nothing to highlight)")
    query(root, "//module_call[@type='Dense'][@features=7]", "0 matches")
    explain = root.locator(".yax-query-explain")
    assert explain.is_visible() and "yax.explain" in explain.inner_text(), explain.inner_text()
    shot(root, "02-gpt2-empty-query")
    # the explanation floats over the tree: it does not push the tree down (point 14)
    assert root.locator(".yax-tree").bounding_box()["y"] == tree_top, "the explanation moved the tree"
    query(root, "//activation[@name='gelu_new']", "2 matches")
    assert not explain.is_visible()
    assert root.get_attribute("data-match-ids") == field(state, "GELU")

    # point 2: on the tied lm_head the menu offers what the kernel's misfit allows (nothing with
    # variables) and gives LoRA's reason; a drop of LoRA there is refused with the same reason
    head = field(state, "HEAD")
    menu = open_fits(root, head)
    offered = menu.locator(".yax-fit:not(.yax-refused)").evaluate_all("els => els.map(e => e.dataset.name)")
    assert ",".join(offered) == field(state, "FITS"), (offered, state)
    lora = menu.locator('.yax-fit.yax-refused[data-name="LoRA r=2"]')
    assert "tied" in lora.get_attribute("title")
    shot(root, "03-gpt2-fits-lm-head")
    page.keyboard.press("Escape")
    drag(page, root.locator('.yax-palette-item[data-name="LoRA r=2"]'), root.locator(f'.yax-row[data-id="{head}"]'))
    notice = root.locator(".yax-notice")
    notice.wait_for(state="visible")
    assert "tied" in notice.inner_text()
    assert "STATE 0 True" in nb.run(1)
    shot(root, "04-gpt2-refused")

    # points 1 and 7: identity for the (deterministic) dropout, picked in the menu: the pane says
    # it is compiling, then that every difference is 0 -- no made-up range
    menu = open_fits(root, field(state, "DROP"))
    assert menu.locator('.yax-fit[data-name="identity"]:not(.yax-refused)').count() == 1
    watch_compare(root)
    menu.locator('.yax-fit[data-name="identity"]').click()
    compared(root, 1)
    seen = root.evaluate("() => window.yaxSeen")
    assert any("Compiling and comparing" in s for s in seen), seen
    text = root.locator(".yax-compare").inner_text()
    assert "outputs allclose" in text and "every difference is 0, unchanged" in text, text
    assert "STATE 1 False True" in nb.run(1)
    shot(root, "05-gpt2-unchanged")

    # point 3: ReLU for every gelu_new (a drop on the query box): the heatmaps say what they show
    drag(page, root.locator('.yax-palette-item[data-name="ReLU"]'), root.locator(".yax-query input"))
    compared(root, 2)
    state = nb.run(1)
    assert "STATE 2 False False" in state, state
    text = root.locator(".yax-compare").inner_text()
    assert "outputs differ" in text and field(state, "FIRST") in text, (text, state)
    assert "heatmaps of" in text and "[0]" in text, text  # logits are 3-D: the first slice
    assert root.locator(".yax-compare canvas.yax-heat").count() == 3
    assert root.locator(".yax-compare .yax-scale").count() == 2  # colour scales, with their values
    assert root.locator(".yax-compare .yax-hist-axis .yax-tick").count() >= 2  # the histogram's axis
    # point 13: the per-call table lists every module output compared, in program order; a click
    # on its first divergence selects that row in the tree
    bounds = root.locator(".yax-boundaries tr.yax-boundary")
    assert bounds.count() == int(field(state, "BOUNDS")) > 10, (bounds.count(), state)
    ids = [int(i) for i in bounds.evaluate_all("els => els.map((e) => e.dataset.id)")]
    assert ids == sorted(ids)
    first = root.locator(".yax-boundaries tr.yax-first-row")
    assert first.get_attribute("data-id") == field(state, "FIRSTID"), (first.inner_text(), state)
    # named below the model's own name: the path of the row that is now a relu
    want = field(state, "FIRST").replace("gelu_new", "relu").split("/", 1)[1]
    assert first.inner_text().startswith(want), first.inner_text()
    first.click()
    assert root.locator(".yax-row.yax-selected").get_attribute("data-id") == first.get_attribute("data-id")
    shot(root, "06-gpt2-relu")

    # point 10: the Graph tab draws the selected call when it is shown (no button needed), at a
    # size fitting the pane, coloured by divergence; it zooms; a click on a box selects its row
    mlp = field(state, "MLP")
    root.locator(f'.yax-row[data-id="{mlp}"] .yax-name').click()
    root.locator('.yax-tab[data-tab="Graph"]').click()
    page.wait_for_selector(".yax-graph svg g.node", timeout=60_000)
    assert root.locator(".yax-graph-what").inner_text() == "the selected call"
    view_ = root.locator(".yax-graph-view")
    scale = float(view_.get_attribute("data-scale"))
    pane, drawing = view_.bounding_box(), root.locator(".yax-graph-stage svg").bounding_box()
    assert 0 < scale <= 1 and drawing["y"] + drawing["height"] <= pane["y"] + pane["height"] + 1, (scale, drawing, pane)
    assert drawing["x"] + drawing["width"] <= pane["x"] + pane["width"] + 1, (drawing, pane)  # it opens fitted
    assert root.locator(".yax-graph svg g.node :is(polygon, path)[stroke^='hsl']").count() >= 3  # divergence colours
    root.locator(".yax-zoom-in").click()
    assert float(view_.get_attribute("data-scale")) > scale
    shot(root, "06b-gpt2-graph")
    root.locator(".yax-zoom-fit").click()
    box = root.locator(".yax-graph svg g.node[data-row]").first
    picked = box.get_attribute("data-row")
    box.click()
    page.wait_for_function("(id) => document.querySelector('.yax-row.yax-selected')?.dataset.id === id", arg=picked)
    # selecting a row while the graph is shown draws that row's call
    root.locator('.yax-tab[data-tab="History"]').click()
    # point 13: a click on a history item goes to that state; the later ones stay, to redo
    root.locator('.yax-history-item[data-index="1"]').click()
    page.wait_for_function("() => document.querySelector('.yax-history-item.yax-current')?.dataset.index === '1'"
                           " && !document.querySelector('.yax-explorer').classList.contains('yax-busy')", timeout=120_000)
    assert "STATE 1 False True" in nb.run(1)
    shot(root, "06c-gpt2-history")
    root.locator('.yax-history-item[data-index="2"]').click()
    page.wait_for_function("() => document.querySelector('.yax-history-item.yax-current')?.dataset.index === '2'"
                           " && !document.querySelector('.yax-explorer').classList.contains('yax-busy')", timeout=120_000)
    assert "STATE 2 False False" in nb.run(1)
    # point 13: compared with the previous step (what the ReLU alone did: the dropout's identity
    # changed nothing, so the numbers are those against the original)
    root.locator('.yax-tab[data-tab="Compare"]').click()
    max_abs = root.locator(".yax-compare .yax-stats").first.locator("td").nth(1).inner_text()
    root.locator(".yax-compare-base").select_option("previous")
    page.wait_for_function("() => document.querySelector('.yax-compare .yax-verdict')?.textContent"
                           ".includes('differ from the previous step')"
                           " && !document.querySelector('.yax-explorer').classList.contains('yax-busy')", timeout=120_000)
    assert root.locator(".yax-compare .yax-stats").first.locator("td").nth(1).inner_text() == max_abs
    assert "'previous'" in nb.run(5)
    shot(root, "06d-gpt2-vs-previous")
    root.locator(".yax-compare-base").select_option("original")
    page.wait_for_function("() => document.querySelector('.yax-compare .yax-verdict')?.textContent"
                           ".includes('differ from the original')"
                           " && !document.querySelector('.yax-explorer').classList.contains('yax-busy')", timeout=120_000)

    # points 8 and 11: Copy as code confirms the copy; the script, run as pasted, makes this model;
    # the pane follows undo
    root.locator(".yax-copy").click()
    pane = root.locator(".yax-code-pane")
    page.wait_for_function("() => document.querySelector('.yax-copied')?.textContent.includes('Copied')")
    script = pane.locator(".yax-code").inner_text()
    assert script.count("yax.sub(") == 2, script
    out = nb.run(2)
    assert f"SAME True {len(script.splitlines())}" in out, (out, script)
    assert page.evaluate("() => navigator.clipboard.readText()") == script
    shot(root, "07-gpt2-code")
    # point 13: Export writes the rewritten model next to the notebook; it runs without yax
    root.locator(".yax-export").click()
    page.wait_for_function("() => document.querySelector('.yax-status').textContent.includes('exported to')",
                           timeout=120_000)
    assert "EXPORTED True" in nb.run(6)
    root.locator(".yax-undo").click()
    page.wait_for_function("() => (document.querySelector('.yax-code-pane .yax-code')?.textContent.match(/yax\\.sub\\(/g)"
                           " || []).length === 1", timeout=60_000)
    root.locator(".yax-undo").click()
    page.wait_for_function("() => document.querySelector('.yax-undo').disabled")
    page.wait_for_function("() => document.querySelector('.yax-code-pane').textContent.includes('no changes')")
    root.locator('.yax-tab[data-tab="Compare"]').click()
    assert "Back at the original" in root.locator(".yax-compare").inner_text()
    assert "STATE 0 True False" in nb.run(1)
    shot(root, "08-gpt2-undone")

    # point 14: at 1100 px with the file browser open nothing overflows: the buttons read whole,
    # the side panel is inside the explorer
    page.set_viewport_size({"width": 1100, "height": 900})
    page.wait_for_timeout(500)
    assert page.locator(".jp-FileBrowser").first.is_visible()
    fits = root.evaluate("""(el) => {
      const r = el.getBoundingClientRect(), side = el.querySelector('.yax-side').getBoundingClientRect();
      const undo = el.querySelector('.yax-undo');
      const pane = el.querySelector('.yax-side'), tabs = el.querySelector('.yax-tabs');
      return [el.scrollWidth <= el.clientWidth + 1, side.right <= r.right + 1, undo.scrollWidth <= undo.clientWidth + 1,
              pane.scrollWidth <= pane.clientWidth + 1, tabs.lastChild.getBoundingClientRect().right <= side.right,
              el.querySelector('.yax-tree').getBoundingClientRect().width > 0.9 * r.width];
    }""")
    assert fits == [True] * 6, fits
    # the rows' shapes stay readable: the tree takes the whole width, above the side panel
    cut = root.locator(".yax-row .yax-shapes").evaluate_all("""els => els.filter((e) => {
      const tree = e.closest('.yax-tree').getBoundingClientRect();
      return e.scrollWidth > e.clientWidth + 1 || e.getBoundingClientRect().right > tree.right;
    }).map((e) => e.textContent)""")
    total = root.locator(".yax-row .yax-shapes").count()
    print(f"shapes cut at 1100 px: {len(cut)} of {total}: {cut}")
    assert cut == [], cut
    shot(root, "08b-gpt2-1100px")
    page.set_viewport_size({"width": 1400, "height": 1000})


def _nnx(nb: Notebook) -> None:
    page = nb.page
    nb.run(3, timeout=300)
    page.wait_for_function("() => document.querySelectorAll('.yax-explorer[data-ready=\"1\"]').length === 2",
                           timeout=120_000)
    root = page.locator(".yax-explorer").nth(1)
    assert root.locator(".yax-row .yax-name").all_inner_texts() == ["Net", "fc1", "gelu", "fc2"]
    fc1 = field(nb.run(4), "FC1")
    query(root, "//module_call[@type='Linear']", "2 matches")
    # LoRA fits an nnx Linear: offered, taken, bit-equal at the start; its variables join the state
    menu = open_fits(root, fc1)
    assert menu.locator('.yax-fit[data-name="LoRA r=2"]:not(.yax-refused)').count() == 1
    assert menu.locator('.yax-fit.yax-refused[data-name="GELU (tanh)"]').count() == 1
    menu.locator('.yax-fit[data-name="LoRA r=2"]').click()
    compared(root, 1)
    text = root.locator(".yax-compare").inner_text()
    assert "outputs allclose" in text and "every difference is 0, unchanged" in text, text
    assert "NNX 1 True" in nb.run(4) and nb.run(4).strip().endswith("True")
    # the query follows the model: fc1 is a LoRALinear now, so one Linear is left
    root.page.wait_for_function("(el) => el.querySelector('.yax-count').textContent === '1 match'",
                                arg=root.element_handle())
    shot(root, "09-nnx-lora")
    # GELU -> tanh changes the output: the heatmaps show the whole [3, 2] output
    gelu = root.locator(".yax-row", has=page.locator(".yax-name", has_text="gelu"))
    drag(page, root.locator('.yax-palette-item[data-name="tanh"]'), gelu)
    compared(root, 2)
    text = root.locator(".yax-compare").inner_text()
    assert "outputs differ" in text and "Net/gelu" in text, text
    assert "NNX 2 False" in nb.run(4)
    shot(root, "10-nnx-tanh")
