"""Every row linked to its source, end to end: a real JupyterLab and kernel,
Debian's chromium driven by Playwright. The model lives in a ``.py`` file in
the lab's folder; a row's tooltip says ``file:line``, the Source tab shows the
lines around it with that line highlighted, as the file reads; a row with no
line says so. Screenshots: ``artifacts/e2e/source-*.png``; any console error fails."""

from __future__ import annotations

import pytest

from .lab import Notebook

pytestmark = pytest.mark.e2e


MODEL = '''"""A small model for the Source tab's test."""
import flax.linen as nn
import jax.numpy as jnp


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(16, name="up")(x)
        h = nn.gelu(h)
        return x + nn.Dense(8, name="down")(h)


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        for i in range(2):
            x = Block(name=f"block{i}")(x)
        return jnp.tanh(x)
'''

CELLS = [
    """import json, jax, jax.numpy as jnp, yax
from source_model import Net
from yax_widget import Explorer
from yax_widget._payloads import source
model = Net()
x = jnp.ones((2, 8))
ex = Explorer(model, model.init(jax.random.key(0), x), x)
ex""",
    # 1: where the kernel says each row comes from
    """nodes = yax.internal.view(ex.mox).nodes
up = yax.query('//module_call[@path="Net/block0/up"]', ex.mox)[0]
dot = up.equations[0]
ids = yax.internal.node_ids(ex.mox)
where = lambda n: None if n.source is None else [n.source.file, n.source.line]
print("WHERE=" + json.dumps({"up": [ids[id(up)], where(up)], "dot": [ids[id(dot)], where(dot)],
                             "net": [ids[id(ex.mox.calls[0])], where(ex.mox.calls[0])]}))""",
    # 2: a function typed in this cell: Python's line cache holds the cell, so its lines are there too
    """def in_a_cell(x):
    return jnp.sin(x) * 3.0
m = yax.make_mox(in_a_cell)(jnp.ones(3))
print("CELL=" + json.dumps(source(m.equations[0], 0)))""",
]


@pytest.fixture(scope="module")
def notebook(lab):
    (lab.root / "source_model.py").write_text(MODEL)
    with lab.notebook("source.ipynb", CELLS) as nb:
        yield nb


def test_rows_show_their_source(notebook):
    with notebook.failing("source"):
        _steps(notebook)
    assert not notebook.errors, notebook.errors


def _row(root, rid: int):
    return root.locator(f'.yax-row[data-id="{rid}"]')


def _highlighted(root, file_lines: list[str], line: int) -> None:
    here = root.locator(".yax-source-pane .yax-source-here")
    here.wait_for(timeout=60_000)
    assert here.get_attribute("data-line") == str(line)
    number = here.locator(".yax-source-no").inner_text()
    assert number.strip() == str(line)
    assert here.inner_text()[len(number) + 1:] == file_lines[line - 1]


def _steps(nb: Notebook) -> None:
    page = nb.page
    nb.run(0)
    root = page.locator(".yax-explorer").first
    page.wait_for_selector('.yax-explorer[data-ready="1"]', timeout=120_000)
    where = nb.printed(1, "WHERE")
    up_id, (up_file, up_line) = where["up"]
    assert up_file == "source_model.py"
    lines = MODEL.splitlines()
    assert lines[up_line - 1].strip() == 'h = nn.Dense(16, name="up")(x)'

    # the row's tooltip says where it is called
    root.locator(".yax-tree-bar input[type=search]").fill("up")
    row = _row(root, up_id)
    row.wait_for(timeout=30_000)
    row.hover()
    assert f"source: source_model.py:{up_line}" in row.get_attribute("title")

    # the Source tab: the lines around it, its own highlighted, as the file reads
    row.click()
    root.locator('.yax-tab[data-tab="Source"]').click()
    _highlighted(root, lines, up_line)
    assert root.locator(".yax-source-pane .yax-source-head").inner_text() == f"source_model.py:{up_line}"
    shown = root.locator(".yax-source-pane .yax-source-line")
    assert shown.count() == min(len(lines), up_line + 8) - max(1, up_line - 8) + 1
    nb.shot("source-1-call")

    # an equation of the call: its own line (Flax's Dense code is skipped: the line calling it)
    dot_id, (_, dot_line) = where["dot"]
    root.locator(".yax-tree-bar input[type=search]").fill("")  # the filter would hide the equations
    row.locator(".yax-toggle").click()
    eq = _row(root, dot_id)
    eq.wait_for(timeout=60_000)
    assert f"source: source_model.py:{dot_line}" in eq.get_attribute("title")
    eq.click()
    _highlighted(root, lines, dot_line)

    # the outermost call: yax makes it, so JAX may record no line of the user's; the pane says so
    net_id, net_where = where["net"]
    _row(root, net_id).click()
    if net_where is None:
        note = root.locator(".yax-source-pane .yax-source-note")
        note.wait_for(timeout=30_000)
        assert note.inner_text().startswith("JAX recorded no line of your code")
        assert root.locator(".yax-source-pane .yax-source-line").count() == 0
    else:
        _highlighted(root, lines, net_where[1])
    nb.shot("source-2-outermost")

    # back on the call, for the screenshot to look at
    root.locator(".yax-tree-bar input[type=search]").fill("up")
    _row(root, up_id).click()
    _highlighted(root, lines, up_line)
    nb.shot("source-3-call-again")

    # code typed in a cell: the kernel reads its lines from Python's line cache
    cell = nb.printed(2, "CELL")
    assert cell["note"] == "" and cell["lines"], cell
    assert dict((n, t) for n, t in cell["lines"])[cell["line"]].strip() == "return jnp.sin(x) * 3.0"
