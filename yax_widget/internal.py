"""The semi-public layer of yax_widget: what the benches use beyond the `Explorer` and `Session`
API (as `yax.internal` is yax's). Nothing outside the package imports its private modules; these
names are stable between them, not promised to users.

Contents:
  the explorer's measuring program  `Boundaries` (every call row's values, reduced on the device,
                                    ``Boundaries.run(mox, args, kwargs)``), `Static` (its static
                                    arguments) and `programs` (the compiled program per MoX)
"""

from ._reduce import Boundaries as Boundaries
from ._reduce import Static as Static
from ._reduce import _programs as programs

__all__ = ["Boundaries", "Static", "programs"]
