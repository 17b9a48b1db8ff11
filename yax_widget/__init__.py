"""yax_widget: the explorer widget and the ``%yax`` magic.

``Explorer(model, variables, batch)`` shows a model's module tree with live
XPath queries, drag-and-drop replacements and a visual comparison of the
original and modified model. ``%load_ext yax_widget`` adds ``%yax``.
"""

from ._explorer import Change as Change
from ._explorer import Explorer as Explorer
from ._magic import load_ipython_extension as load_ipython_extension

__all__ = ["Change", "Explorer", "load_ipython_extension"]
