"""yax_widget: the explorer widget and the ``%yax`` magic.

``Explorer(model, variables, batch)`` shows a model's module tree with live
XPath queries, drag-and-drop replacements and a visual comparison of the
original and modified model. ``%load_ext yax_widget`` adds ``%yax``.
``Session`` is the same explorer without the widget: its state and commands
in plain Python, importable without anywidget or ipywidgets.
"""

from typing import Any

from ._session import Change as Change
from ._session import Session as Session

__all__ = ["Change", "Explorer", "Session", "follow", "load_ipython_extension"]


def __getattr__(name: str) -> Any:
    # the widget and the magic import anywidget and IPython: only when asked for
    if name == "Explorer":
        from ._explorer import Explorer

        return Explorer
    if name == "follow":
        from ._follow import follow

        return follow
    if name == "load_ipython_extension":
        from ._magic import load_ipython_extension

        return load_ipython_extension
    raise AttributeError(f"module 'yax_widget' has no attribute {name!r}")
