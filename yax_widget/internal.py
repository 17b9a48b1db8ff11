"""The semi-public layer of yax_widget: what the benches use beyond the `Explorer` and `Session`
API (as `yax.internal` is yax's). Nothing outside the package imports its private modules; these
names are stable between them, not promised to users.

Contents:
  the explorer's measuring program  `Boundaries` (every call row's values, reduced on the device,
                                    ``Boundaries.run(mox, args, kwargs)``), `Static` (its static
                                    arguments) and `programs` (the compiled program of a MoX)
"""

from typing import Any

from yax.internal import kept

from ._reduce import Boundaries as Boundaries
from ._reduce import Static as Static


def programs(mox: Any) -> Any:
    """The explorer's measuring program of ``mox``, or ``None`` before one measured it."""
    return kept(mox, "widget.reduce")

__all__ = ["Boundaries", "Static", "programs"]
