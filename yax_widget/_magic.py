"""The ``%yax`` line magic: ``%yax target [args ...] [--query XPATH]``."""

from __future__ import annotations

import ast
import io
import re
import shlex
import tokenize
from typing import Any, NamedTuple

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

USAGE = """Usage: %yax TARGET [ARG ...] [--query XPATH]

  TARGET  a MoX from yax.make_mox, a Flax module, a Hugging Face Flax model, or a JAX function
          (a name or expression)
  ARG     the example inputs: Python expressions separated by spaces (or commas), keyword
          arguments as in Explorer(...), e.g. `%yax model variables batch`, `%yax fn x[:2]`,
          `%yax model.module {'params': model.params} ids` or `%yax model input_ids=ids`
  --query open with this XPath applied, e.g. --query '//module_call[@type="Dense"]'
  #       starts a comment (outside strings), as in Python: what follows is neither argument nor option
"""

# Keywords that join the expressions either side (`a if c else b`, `x not in y`); `lambda` starts one.
_JOINING = frozenset({"and", "or", "not", "in", "is", "if", "else", "for", "async", "from"})
_UNARY = frozenset({"-", "+", "~", "*", "**"})  # `fn -x` or `fn *xs`: attached to what follows, they start an argument
_OPTION = re.compile(r"(?:^|(?<=\s))--(?=[A-Za-z])")


class Argument(NamedTuple):
    """One argument of a ``%yax`` line as typed: ``expr`` (a Python expression),
    with its keyword (``input_ids`` of ``input_ids=ids``) or unpacking star."""

    expr: str
    key: str | None = None
    star: str = ""  # "*" or "**"

    @property
    def text(self) -> str:
        return f"{self.key}={self.expr}" if self.key else self.star + self.expr


def _tokens(text: str) -> list[tokenize.TokenInfo]:
    """The tokens of one line of Python, without layout ones; a comment ends it.

    Raises:
      ValueError: a string or bracket is not closed, or a character is no Python.
    """
    out: list[tokenize.TokenInfo] = []
    depth: list[str] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                break
            if tok.type == tokenize.ERRORTOKEN:
                if tok.string.isspace():
                    continue
                raise ValueError("no closing quotation" if tok.string in "'\"" else f"`{tok.string}` is no Python")
            if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT):
                continue
            if tok.type == tokenize.OP and tok.string in "([{":
                depth.append(")]}"["([{".index(tok.string)])
            elif tok.type == tokenize.OP and tok.string in ")]}":
                if not depth or depth.pop() != tok.string:
                    raise ValueError(f"`{tok.string}` closes no bracket")
            out.append(tok)
    except tokenize.TokenError:
        if depth:
            raise ValueError(f"a bracket is not closed (`{depth[-1]}` missing)") from None
        raise ValueError("no closing quotation") from None  # a triple-quoted string runs on
    return out


def _complete(text: str) -> bool:
    try:
        _tokens(text)
    except ValueError:
        return False
    return True


def _commented(text: str) -> bool:
    """Whether a comment (``#`` outside strings) starts in ``text``, a complete line of Python."""
    try:
        return any(tok.type == tokenize.COMMENT for tok in tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return False


def _ends(tok: tokenize.TokenInfo) -> bool:
    """Whether ``tok`` can end an expression (a name, a literal, a closing bracket)."""
    if tok.type in (tokenize.NAME, tokenize.NUMBER, tokenize.STRING):
        return tok.string not in _JOINING and tok.string != "lambda"
    return tok.string in (")", "]", "}", "...")


def _starts(tok: tokenize.TokenInfo, nxt: tokenize.TokenInfo | None) -> bool:
    """Whether ``tok`` (followed by ``nxt``) starts an expression after a space."""
    if tok.string == "not":  # `fn not x`, but `x not in y`
        return nxt is None or nxt.string != "in"
    if tok.type in (tokenize.NAME, tokenize.NUMBER, tokenize.STRING):
        return tok.string not in _JOINING
    if tok.string in _UNARY:  # `x - 1` is one expression, `fn -x` two
        return nxt is not None and nxt.start == tok.end
    return tok.string in ("(", "[", "{", "...")


def split_line(line: str) -> tuple[list[Argument], list[str]]:
    """The arguments of a ``%yax`` line, parsed by Python as the argument list
    of a call, and its ``--options`` (words as a shell splits them).

    Python's tokenizer finds the spaces between top-level expressions (outside
    brackets and strings, not next to an operator: ``x + 1`` is one expression,
    ``{'params': p} ids`` two); they become commas, and `ast` reads the call
    ``f(...)``, so keyword arguments (``input_ids=ids``), ``*xs`` and commas
    work as in ``Explorer(...)``. Options start at the first ``--name`` outside
    brackets and strings and run to the end of the line. A ``#`` outside strings
    (Python's among the arguments, the shell's among the options, where an
    XPath's quotes count too) starts a comment: what follows it is neither.

    Example:
      >>> [a.text for a in split_line("model x + 1 input_ids=ids --query //activation")[0]]
      ['model', 'x + 1', 'input_ids=ids']

    Raises:
      ValueError: a string or bracket is not closed, the arguments are no Python, or
        the line holds a line break.
    """
    if "\n" in line or "\r" in line:
        raise ValueError("it holds a line break; %yax reads one line")
    head, options = line, []
    for m in _OPTION.finditer(line):
        if _complete(line[:m.start()]):
            if _commented(line[:m.start()]):  # `%yax m x  # --query //a`: the option is part of the comment
                break
            head, options = line[:m.start()], shlex.split(line[m.start():], comments=True)
            break
    toks = _tokens(head)
    pieces: list[str] = []
    first = 0
    for i in range(1, len(toks) + 1):
        if i == len(toks) or (toks[i - 1].end < toks[i].start and _ends(toks[i - 1]) and
                              _starts(toks[i], toks[i + 1] if i + 1 < len(toks) else None)):
            pieces.append(head[toks[first].start[1]:toks[i - 1].end[1]])
            first = i
    source = f"f({', '.join(pieces)})"
    try:
        call = ast.parse(source, mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"`{head.strip()}` is no list of Python arguments ({e.msg})") from None
    assert isinstance(call, ast.Call)
    found: list[tuple[int, Argument]] = []
    for a in call.args:
        if isinstance(a, ast.Starred):
            found.append((a.col_offset, Argument(ast.get_source_segment(source, a.value) or "", star="*")))
        else:
            found.append((a.col_offset, Argument(ast.get_source_segment(source, a) or "")))
    for k in call.keywords:
        expr = ast.get_source_segment(source, k.value) or ""
        found.append((k.col_offset, Argument(expr, key=k.arg) if k.arg else Argument(expr, star="**")))
    return [a for _, a in sorted(found, key=lambda p: p[0])], options


@magics_class
class YaxMagics(Magics):
    """``%yax``: open the explorer on a model from the notebook's variables."""

    @line_magic
    def yax(self, line: str) -> Any:
        """Open the yax explorer: ``%yax model variables batch [--query XPATH]``."""
        import yax

        from ._explorer import Explorer

        if "\n" in line or "\r" in line:
            raise UsageError(f"%yax reads one line, but its text holds a line break. Write the model and its "
                             f"inputs on one line.\n\n{USAGE}")
        try:
            arguments, options = split_line(line)
        except ValueError as e:
            raise UsageError(f"%yax could not split its arguments ({e}); check the quotes and brackets."
                             f"\n\n{USAGE}") from None
        query = None
        while options:
            word = options.pop(0)
            if word.startswith("--query="):
                query = word[len("--query="):]
            elif word == "--query":
                if not options:
                    raise UsageError(f"--query needs an XPath after it.\n\n{USAGE}")
                query = options.pop(0)
            elif word.startswith("--"):
                raise UsageError(f"%yax has no option {word.split('=')[0]}.\n\n{USAGE}")
            else:
                raise UsageError(f"%yax takes the model and its inputs before its options, but found `{word}` "
                                 f"after them. Try `%yax MODEL ARGS --query XPATH`.\n\n{USAGE}")
        if not arguments or arguments[0].key or arguments[0].star:
            raise UsageError(f"%yax needs a model or function to explore, first.\n\n{USAGE}")
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        given: dict[str, str] = {}  # keyword -> the argument giving it, as typed
        for a in arguments:
            try:
                value = eval(a.expr, self.shell.user_ns)  # noqa: S307 - the user's own notebook expression
            except Exception as e:
                raise UsageError(f"%yax could not evaluate `{a.expr}` in the notebook: {type(e).__name__}: {e}. "
                                 f"Define it first, or check its spelling.\n\n{USAGE}") from None
            try:
                if a.key:
                    named = {a.key: value}
                elif a.star == "**":
                    named = dict(value.items())  # as Python's `**`: a mapping (a list of pairs is refused)
                elif a.star:
                    args.extend(value)
                    continue
                else:
                    args.append(value)
                    continue
            except (TypeError, ValueError, AttributeError) as e:
                raise UsageError(f"%yax could not unpack `{a.text}`: {e}. Try a sequence after `*` and a dict "
                                 f"after `**`.\n\n{USAGE}") from None
            for k in named:
                if not isinstance(k, str):
                    raise UsageError(f"%yax could not unpack `{a.text}`: keyword arguments are named by strings, "
                                     f"but `{a.text}` holds the key `{str(k)[:40]}`. Try a dict with string keys "
                                     f"after `**`.\n\n{USAGE}")
                if k in given:
                    raise UsageError(f"The keyword `{k}` is given twice to %yax, by `{given[k]}` and by "
                                     f"`{a.text}`; give it once.\n\n{USAGE}")
                given[k] = a.text
            kwargs.update(named)
        try:
            explorer = Explorer(*args, **kwargs)
        except yax.YaxError as e:
            raise UsageError(f"%yax: {e}") from None
        try:
            # "copy as code" makes the model with the arguments typed here (the inputs' keywords only,
            # not the explorer's own `warm=`); an unpacked `*xs` leaves it the usual names
            typed = [a.text for a in arguments if a.key is None or a.key in explorer.session.kwargs]
            explorer.session.names = None if any(a.star for a in arguments) else typed
            explorer.session.names_given_to = "%yax"
            if query is not None:
                explorer.query(query)
        except BaseException as e:
            explorer.close()  # not returned: it leaves no widget or thread behind
            if isinstance(e, yax.YaxError):
                raise UsageError(f"%yax: {e}") from None
            raise
        return explorer


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext yax_widget``: registers ``%yax`` (loading twice is harmless)."""
    ipython.register_magics(YaxMagics)
