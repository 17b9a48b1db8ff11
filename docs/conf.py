"""Sphinx configuration of the yax site: the API reference from the docstrings (autodoc, Google style
through napoleon), the guides in docs/*.md (MyST) and the notebooks in notebooks/ (myst-nb), executed
during the build so the pages show current outputs. Nothing is fetched from the network.

Build: ``.venv/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html`` (tests/test_docs.py
does this with warnings as errors)."""

from __future__ import annotations

import os
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # document this checkout's yax, whatever else is installed
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import yax  # noqa: E402

project = "yax"
author = "the yax authors"
copyright = "the yax authors"  # noqa: A001
version = release = yax.__version__  # the one version source

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "myst_nb"]
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "Thumbs.db", ".DS_Store"]
root_doc = "index"

# `name` in a docstring links to the object when there is one (yax.query, Mox), as in jax's docs.
default_role = "py:obj"
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # GitHub's anchors, so links such as mox.md#queries-... work here too

# The notebooks run during the build (they are checked in without outputs); any error fails it.
nb_execution_mode = "force"
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_execution_in_temp = True
# A widget has no static rendering without a CDN; show its text/plain and then a screenshot (below).
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None),
                              ("html", "application/vnd.jupyter.widget-state+json", None)]

html_theme = "sphinx_book_theme"
html_title = f"yax {release}"
html_static_path = ["explorer.png"]
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": True,
    "home_page_in_toc": True,
}
html_last_updated_fmt = None

_WIDGET = re.compile(r"^<yax_widget\._explorer\.Explorer object at 0x[0-9a-f]+>$")


def _widget_screenshots(app, doctree, docname):
    """An explorer displayed by a notebook has no static form: show a screenshot in its place."""
    from docutils import nodes

    up = "../" * docname.count("/")
    for block in list(doctree.findall(nodes.literal_block)):
        if _WIDGET.match(block.astext().strip()):
            block.replace_self(nodes.raw("", (
                f'<figure class="yax-widget-shot"><img src="{up}_static/explorer.png" '
                'alt="the yax explorer" style="max-width:100%"><figcaption>Here a live notebook shows the '
                "explorer; this page shows a screenshot of one (on a small Transformer, from the browser "
                "tests), since the widget needs a running kernel.</figcaption></figure>"), format="html"))


_STARS = re.compile(r"^(\s*)\*args, \*\*kwargs:")


def _star_args(app, what, name, obj, options, lines):
    """Our docstrings document ``*args, **kwargs:`` as one entry; napoleon escapes the stars of one
    name only, and a bare ``**`` is reStructuredText's bold. Runs before napoleon (priority 400)."""
    lines[:] = [_STARS.sub(r"\1\\*args, \\*\\*kwargs:", line) for line in lines]


def setup(app):
    app.connect("autodoc-process-docstring", _star_args, priority=400)
    app.connect("doctree-resolved", _widget_screenshots)
