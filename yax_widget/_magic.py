"""The ``%yax`` line magic: ``%yax target [args ...] [--query XPATH]``."""

from __future__ import annotations

import shlex
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

USAGE = """Usage: %yax TARGET [ARG ...] [--query XPATH]

  TARGET  a MoX from yax.make_mox, a Flax module, or a JAX function (a name or expression)
  ARG     the example inputs, e.g. `%yax model variables batch` or `%yax fn x`
  --query open with this XPath applied, e.g. --query '//module_call[@type="Dense"]'
"""


@magics_class
class YaxMagics(Magics):
    """``%yax``: open the explorer on a model from the notebook's variables."""

    @line_magic
    def yax(self, line: str) -> Any:
        """Open the yax explorer: ``%yax model variables batch [--query XPATH]``."""
        import yax

        from ._explorer import Explorer

        try:
            words = shlex.split(line)
        except ValueError as e:
            raise UsageError(f"%yax could not split its arguments ({e}); check the quotes.\n\n{USAGE}") from None
        query = None
        if "--query" in words:
            i = words.index("--query")
            if i + 1 >= len(words):
                raise UsageError(f"--query needs an XPath after it.\n\n{USAGE}")
            query = words[i + 1]
            del words[i:i + 2]
        unknown = [w for w in words if w.startswith("--")]
        if unknown:
            raise UsageError(f"%yax has no option {unknown[0]}.\n\n{USAGE}")
        if not words:
            raise UsageError(f"%yax needs a model or function to explore.\n\n{USAGE}")
        values = []
        for w in words:
            try:
                values.append(eval(w, self.shell.user_ns))  # noqa: S307 - the user's own notebook expression
            except Exception as e:
                raise UsageError(f"%yax could not evaluate `{w}` in the notebook: {type(e).__name__}: {e}. "
                                 f"Define it first, or check its spelling.\n\n{USAGE}") from None
        try:
            explorer = Explorer(*values)
            if query is not None:
                explorer.query(query)
        except yax.YaxError as e:
            raise UsageError(f"%yax: {e}") from None
        return explorer


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext yax_widget``: registers ``%yax`` (loading twice is harmless)."""
    ipython.register_magics(YaxMagics)
