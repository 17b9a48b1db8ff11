"""The documentation site builds with warnings as errors (Sphinx: the API reference from the
docstrings, the guides in docs/, the notebooks in notebooks/), and documents every public name.

The build executes the notebooks (myst-nb), so this is also where they run headless, for real, in a
Jupyter kernel: a cell that raises fails the build, and the executed copies are checked below.
The docstrings' examples run as doctests (``--doctest-modules`` over yax and yax_widget)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import types

import pytest

import yax
import yax_widget

pytestmark = pytest.mark.slow  # builds the whole docs site

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def public_names() -> list[str]:
    names = [f"yax.{n}" for n, o in vars(yax).items() if not n.startswith("_") and not isinstance(o, types.ModuleType)]
    return [*names, "yax.__version__", *(f"yax_widget.{n}" for n in yax_widget.__all__)]


def test_the_docs_build_and_document_every_public_name(tmp_path):
    out = tmp_path / "html"
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(ROOT / "docs"), str(out)],
        capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert build.returncode == 0, f"the docs build failed:\n{build.stdout[-5000:]}\n{build.stderr[-5000:]}"

    # every notebook ran to the end without an error, and its page shows the outputs
    assert {"recipes.ipynb", "inside.ipynb", "explorer.ipynb"} <= {p.name for p in NOTEBOOKS}
    for path in NOTEBOOKS:
        import nbformat  # (jsonschema's import takes seconds: only here, not at collection)

        nb = nbformat.read(tmp_path / "jupyter_execute" / "notebooks" / path.name, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.get("execution_count") for c in code), path.name
        assert not [o for c in code for o in c.get("outputs", []) if o.output_type == "error"], path.name
        page = (out / "notebooks" / f"{path.stem}.html").read_text()
        assert page.count('class="cell_output') >= sum(bool(c.outputs) for c in code) > 0, path.name
    assert "first_divergence" in (out / "notebooks" / "explorer.html").read_text()
    assert "_static/explorer.png" in (out / "notebooks" / "explorer.html").read_text()  # widgets: a screenshot

    # each public name has an entry with text in the API reference
    api = (out / "api.html").read_text()
    def summary(name: str) -> str:  # the first paragraph of the entry, without its markup
        m = re.search(rf'id="{re.escape(name)}".*?</dt>\s*<dd>\s*(?:<p>Bases:.*?</p>\s*)?<p>(.*?)</p>', api, re.S)
        return re.sub(r"<[^>]+>", "", m.group(1)).strip() if m else ""

    missing = [n for n in public_names() if not summary(n)]
    assert not missing, f"public names without documentation in docs/api.md: {missing}"
    for guide in ("mox", "rewrite", "port", "nnx", "widget", "migrating", "architecture", "changelog"):
        assert (out / f"{guide}.html").exists(), guide
    assert f"yax {yax.__version__}" in (out / "index.html").read_text()
