"""The ``%yax`` line magic: ``%yax target [args ...] [--query XPATH]``."""

from __future__ import annotations

import shlex
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

USAGE = """Usage: %yax TARGET [ARG ...] [--query XPATH]

  TARGET  a MoX from yax.make_mox, a Flax module, a Hugging Face Flax model, or a JAX function
          (a name or expression)
  ARG     the example inputs, Python expressions separated by spaces, e.g. `%yax model variables batch`,
          `%yax fn x[:2]` or `%yax model.module {'params': model.params} ids`
  --query open with this XPath applied, e.g. --query '//module_call[@type="Dense"]'
"""

_OPEN, _CLOSE = "([{", ")]}"
# a space next to one of these joins its neighbours into one expression (`x + 1`, `f(a, b)`)
_BINARY = set("+*/%@&|^<>=,.:!~")


def split_line(line: str) -> list[str]:
    """The words of a ``%yax`` line: Python expressions separated by spaces
    outside brackets and strings (``{'params': p} ids`` is two words, ``x + 1``
    one), and ``--options``. Quotes stay on expressions (they are Python
    strings); `shlex` takes them off an option's value.

    Raises:
      ValueError: a string or bracket is not closed.
    """
    words: list[str] = []
    cur: list[str] = []
    depth: list[str] = []
    quote = ""
    i, n = 0, len(line)
    while i < n:
        ch = line[i]
        if quote:
            cur.append(ch)
            if ch == "\\" and i + 1 < n:
                cur.append(line[i + 1])
                i += 1
            elif line.startswith(quote, i):
                cur.extend(quote[1:])
                i += len(quote) - 1
                quote = ""
        elif ch in "'\"":
            quote = ch * 3 if line.startswith(ch * 3, i) else ch
            cur.append(quote)
            i += len(quote) - 1
        elif ch in _OPEN:
            depth.append(_CLOSE[_OPEN.index(ch)])
            cur.append(ch)
        elif ch in _CLOSE:
            if not depth or depth.pop() != ch:
                raise ValueError(f"`{ch}` closes no bracket")
            cur.append(ch)
        elif ch.isspace() and not depth:
            j = i
            while j < n and line[j].isspace():
                j += 1
            nxt = line[j] if j < n else ""
            before = "".join(cur).rstrip()
            joined = (before and not before.startswith("--") and nxt and not line.startswith("--", j) and
                      (before[-1] in _BINARY or before[-1] == "-" or nxt in _BINARY or (nxt == "-" and line[j + 1:j + 2].isspace())))
            if joined:
                cur.append(" ")
            elif cur:
                words.append("".join(cur))
                cur = []
            i = j
            continue
        else:
            cur.append(ch)
        i += 1
    if quote:
        raise ValueError("no closing quotation")
    if depth:
        raise ValueError(f"a bracket is not closed (`{depth[-1]}` missing)")
    if cur:
        words.append("".join(cur))
    return words


def _unquoted(word: str) -> str:
    """An option's value as a shell would pass it: quotes taken off."""
    try:
        parts = shlex.split(word)
    except ValueError:
        return word
    return parts[0] if len(parts) == 1 else word


@magics_class
class YaxMagics(Magics):
    """``%yax``: open the explorer on a model from the notebook's variables."""

    @line_magic
    def yax(self, line: str) -> Any:
        """Open the yax explorer: ``%yax model variables batch [--query XPATH]``."""
        import yax

        from ._explorer import Explorer

        try:
            words = split_line(line)
        except ValueError as e:
            raise UsageError(f"%yax could not split its arguments ({e}); check the quotes and brackets."
                             f"\n\n{USAGE}") from None
        query = None
        for i, w in enumerate(words):
            if w.startswith("--query="):
                query = _unquoted(w[len("--query="):])
                del words[i]
                break
            if w == "--query":
                if i + 1 >= len(words):
                    raise UsageError(f"--query needs an XPath after it.\n\n{USAGE}")
                query = _unquoted(words[i + 1])
                del words[i:i + 2]
                break
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
            explorer.session.names = words  # "copy as code" makes the model with the names typed here
            if query is not None:
                explorer.query(query)
        except yax.YaxError as e:
            raise UsageError(f"%yax: {e}") from None
        return explorer


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext yax_widget``: registers ``%yax`` (loading twice is harmless)."""
    ipython.register_magics(YaxMagics)
