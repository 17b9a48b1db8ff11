"""XPath 1.0 queries over the XML view of a MoX (`_view`), evaluated by lxml.

Query results map back to the `Mox`/`Equation` objects through the view's
node list. Queries are evaluated in a separate process (`_xpath_worker`, which keeps a
copy of the last few documents), so that a query that would run for hours is
stopped after its time limit instead of holding up the kernel.

A string literal in a query holding characters XML cannot hold is escaped as
the view escapes them (`_view.to_xml_text`), so ``[@name="a\\x01b"]`` finds the
node whichever way it was written.
"""

from __future__ import annotations

import atexit
import collections
import marshal
import os
import pathlib
import re
import select
import struct
import subprocess
import sys
import threading
import time
import weakref
from typing import Any

from lxml import etree

from . import _xpath_worker as worker
from . import errors
from ._ir import Equation, Mox, delegate
from ._view import NOT_XML_CHAR, Queryable, View, target_of, to_xml_text
from .errors import BadQueryArgument, InvalidXPath, QueryTimeout, YaxError, YaxQueryError, unexpected

NS = worker.NS
#: Seconds a query may run (`query`'s ``timeout``) before it is stopped.
TIMEOUT = 10.0


# -- queries ---------------------------------------------------------------------------

_COMPAT_EMPTY_TEST = re.compile(r"(^|[|(\s]|(?=//))(//?)\[")  # `//[` anywhere (no XPath has it); `/[` where a path starts
_PJIT = re.compile(r"(?<![\w@$-])pjit(?![\w-])")
# XPath 1.0 string literals (no escapes inside: a literal cannot hold its own quote); an
# unterminated one runs to the end, for lxml to report.
_LITERAL = re.compile(r"""("[^"]*"?|'[^']*'?)""")


def _split_literals(xpath: str) -> list[str]:
    """``xpath`` cut into the text outside string literals (even positions)
    and the literals with their quotes (odd positions)."""
    return _LITERAL.split(xpath)


def _outside_literals(xpath: str) -> str:
    """``xpath`` with every string literal emptied (``'a pjit b'`` -> ``''``)."""
    return "".join(t if i % 2 == 0 else t[0] * 2 for i, t in enumerate(_split_literals(xpath)))


def normalise(xpath: str) -> str:
    """The earlier prototype's dialect in standard XPath: ``//[@p]`` means
    ``//*[@p]``, ``pjit`` (JAX's former name) matches ``jit`` elements, and
    ``/`` (the document) is its root element. String literals are left as
    written (``[@name="x /[y"]``, ``string('a pjit b')``), except that text
    XML cannot hold is escaped there as the view escapes it (`to_xml_text`)."""
    if xpath.strip() == "/":
        return "/*"
    literals = _split_literals(xpath)[1::2]
    # translate with the literals emptied, then put them back: translating never adds or
    # removes a quote, so the k-th literal of the result is the k-th of the query
    out = _COMPAT_EMPTY_TEST.sub(lambda m: f"{m.group(1)}{m.group(2)}*[", _outside_literals(xpath))
    out = _PJIT.sub("jit", out)
    parts = _split_literals(out)
    for i, lit in enumerate(literals):
        parts[2 * i + 1] = lit[0] + to_xml_text(lit[1:]) if NOT_XML_CHAR.search(lit) else lit
    return "".join(parts)


def _hint(xpath: str) -> str:
    hints = []
    xpath = _outside_literals(xpath)  # what literals hold is no mistake of syntax
    if re.search(r"@[\w-]+\s*(=|!=)\s*[A-Za-z_][\w-]*\s*\]", xpath):
        hints.append('Quote string values: `[@type="Dense"]`, not `[@type=Dense]`.')
    if re.search(r"/\[", xpath):
        hints.append("A step needs a node test before its predicate: `//*[@name=\"gelu\"]`.")
    if xpath.count("[") != xpath.count("]") or xpath.count("(") != xpath.count(")"):
        hints.append("Brackets or parentheses are unbalanced.")
    if re.search(r"re:\w+\(", xpath) is None and "test(" in xpath:
        hints.append("Regular expressions are `re:test(@path, \"Block_[0-3]/\")` (EXSLT).")
    if not hints:
        hints.append('Try a simpler query first, e.g. `//module_call[@type="Dense"]`, and `yax.explain` it.')
    return " ".join(hints)


_compiled: dict[str, etree.XPath] = {}


def _compile(xpath: str) -> str:
    """``xpath`` in standard XPath, checked by lxml (compiling is quick and
    bounded; evaluating is what the query process does)."""
    if not isinstance(xpath, str):
        raise YaxQueryError(f"A query must be an XPath string, but got a `{type(xpath).__name__}`.")
    if xpath not in _compiled:
        try:
            _compiled[xpath] = etree.XPath(normalise(xpath), namespaces=NS, smart_strings=False)
        except Exception as e:  # XPathSyntaxError; ValueError for text XML cannot hold (NUL, lone surrogates)
            raise InvalidXPath(xpath, "syntax", f"{type(e).__name__}: {e}", _hint(xpath)) from None
        if len(_compiled) > 512:
            _compiled.clear()
    return normalise(xpath)


def _shown(xpath: str, n: int = 300) -> str:
    """The query as messages quote it: at most ``n`` characters."""
    return xpath if len(xpath) <= n else xpath[: n - 1] + "…"


class _Stopped(Exception):
    """The query process was stopped (time limit) or stopped by itself."""


class Evaluator:
    """The parent's side of `_xpath_worker`: one query process per Python
    process, started on first use, killed when a query runs past its time
    limit and started afresh by the next query.

    Where no process can be started (a sandbox without ``subprocess``),
    queries run in this process, without a time limit.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sent: set[int] = set()  # documents the current process was given
        # the in-process fallback's documents, once a process failed to start
        self._local: _LocalDocs | None = None
        self._owner = 0  # the pid that started the process: a forked child starts its own
        self._replies: Any = None  # the pipe the process answers on

    def _start(self) -> subprocess.Popen[bytes] | None:
        if self._proc is not None and self._owner == os.getpid() and self._proc.poll() is None:
            return self._proc
        if self._proc is not None and self._owner == os.getpid():
            self.stop()
        self._proc, self._sent = None, set()
        if self._local is None and (not sys.executable or os.name != "posix"):  # select() needs POSIX pipes
            self._local = _LocalDocs()
        if self._local is not None:
            return None
        source = pathlib.Path(worker.__file__).read_text(encoding="utf-8")
        r, w = os.pipe()  # replies come on a pipe of their own: nothing else the child prints can mix in
        try:
            proc = subprocess.Popen([sys.executable, "-P", "-c", source, str(w)], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(w,))
        except (OSError, ValueError):
            os.close(r)
            self._local = _LocalDocs()
            return None
        finally:
            os.close(w)
        self._proc, self._owner, self._replies = proc, os.getpid(), os.fdopen(r, "rb", buffering=0)
        return proc

    def stop(self) -> None:
        """Kill the query process (the next query starts another)."""
        proc, self._proc, self._sent = self._proc, None, set()
        if proc is not None and self._owner == os.getpid():
            proc.kill()
            proc.wait()
            assert proc.stdin is not None  # started with stdin=PIPE
            proc.stdin.close()
            self._replies.close()

    def evaluate(self, target: Queryable, xpath: str, timeout: float) -> tuple[Any, ...]:
        """The worker's reply to ``xpath`` over ``target`` within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            proc = self._start()
            if proc is None:
                assert self._local is not None  # `_start` starts no process only with the fallback ready
                return self._local.answer(target, xpath)
            data = None if target.token in self._sent else target.xml_bytes()
            try:
                reply = self._call(("query", target.token, xpath, data), deadline)
                if reply[0] == "need":
                    reply = self._call(("query", target.token, xpath, target.xml_bytes()), deadline)
            except _Stopped:
                code = proc.poll()
                self.stop()
                raise _Stopped(code) from None
            except BaseException:
                # Interrupted between a request and its reply (KeyboardInterrupt: the kernel's stop
                # button): the process is still evaluating, and its late reply would be read as the
                # next query's. Kill it; the next query starts a fresh one at once.
                self.stop()
                raise
            self._sent.add(target.token)
            return reply

    def _call(self, msg: tuple[Any, ...], deadline: float) -> tuple[Any, ...]:
        body = marshal.dumps(msg)
        proc = self._proc
        assert proc is not None and proc.stdin is not None  # `evaluate` started it, with stdin=PIPE
        try:
            proc.stdin.write(struct.pack("<Q", len(body)) + body)
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise _Stopped() from None
        head = _read(self._replies.fileno(), 8, deadline)
        reply: tuple[Any, ...] = marshal.loads(_read(self._replies.fileno(), struct.unpack("<Q", head)[0], deadline))
        return reply


#: Longest wait in one `select` call while a query runs: a KeyboardInterrupt is raised only
#: when this thread runs Python code again, and a signal caught by another thread (or
#: `_thread.interrupt_main`) does not wake a blocked `select`.
_WAKE = 0.05


def _read(fd: int, n: int, deadline: float) -> bytes:
    parts = []
    while n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Stopped()
        if not select.select([fd], [], [], min(left, _WAKE))[0]:
            continue
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            raise _Stopped()
        parts.append(b)
        n -= len(b)
    return b"".join(parts)


class _LocalDocs:
    """The worker's answers computed in this process (no time limit)."""

    def __init__(self) -> None:
        self.docs: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self.compiled: dict[str, Any] = {}

    def answer(self, target: Queryable, xpath: str) -> tuple[Any, ...]:
        doc = self.docs.get(target)
        if doc is None:
            doc = self.docs[target] = worker.Doc.of(target.tree)
        return worker.answer(collections.OrderedDict({0: doc}), self.compiled, ("query", 0, xpath, None))


_evaluator = Evaluator()
atexit.register(_evaluator.stop)


def _failed(xpath: str, kind: str, detail: str) -> YaxQueryError:
    if kind in ("regex", "call", "memory"):
        return InvalidXPath(xpath, kind, detail)
    return InvalidXPath(xpath, "evaluation", detail, _hint(xpath))


@delegate("query")
def query(xpath: str, mox: Mox, *, timeout: float | None = None) -> Any:
    """Run an XPath 1.0 query over a MoX.

    Args:
      xpath: the query; EXSLT regular expressions are available as ``re:``.
      mox: the MoX (any node: the query runs over the tree rooted there), or a
        `Document` from `yax.load_xml`.
      timeout: seconds the query may run (default ``yax._xpath.TIMEOUT``, 10);
        it runs in a separate process, which is stopped when they pass.

    Returns:
      For a node-set, the matching `Mox`/`Equation` nodes in document order
      (attribute values, text and comments come back as strings; over a
      `Document`, its lxml elements and comments); for ``count()``/``sum()`` a
      float, for string functions a str, for comparisons a bool.

    Raises:
      YaxQueryError: the XPath is invalid, cannot be evaluated, or ran past
        ``timeout`` (and, chained, anything else that went wrong: every
        failure is a `YaxError`).

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Sequential([nn.Dense(4), nn.gelu, nn.Dense(2)]); x = jnp.ones((1, 3))
      >>> mox = yax.make_mox(m.apply)(m.init(jax.random.key(0), x), x)
      >>> [n.path for n in yax.query('//module_call[@type="Dense"][@features=4]', mox)]
      ['Sequential/layers_0']
      >>> yax.query('count(//*[@name="gelu"])', mox)
      1.0
    """
    try:
        return _query(xpath, mox, timeout)
    except YaxError:
        raise
    except Exception as e:
        raise unexpected(f"`yax.query` of `{_shown(xpath) if isinstance(xpath, str) else xpath!r}`", e,
                         YaxQueryError) from e


def _query(xpath: str, mox: Mox, timeout: float | None) -> Any:
    std = _compile(xpath)
    target = target_of(mox, "query")
    limit = TIMEOUT if timeout is None else timeout
    if not isinstance(limit, (int, float)) or isinstance(limit, bool) or not limit > 0:
        raise BadQueryArgument("timeout", "a positive number of seconds", timeout)
    try:
        reply = _evaluator.evaluate(target, std, float(limit))
    except _Stopped as e:
        code = e.args[0] if e.args else None
        if code is None:
            raise QueryTimeout(xpath, limit) from None
        raise YaxQueryError(
            f"The process evaluating the XPath `{_shown(xpath)}` stopped unexpectedly (exit code {code}); most "
            "likely the query needed more memory than there is. Narrow the query; the next one starts a new "
            "process."
        ) from None
    if reply[0] == "error":
        raise _failed(xpath, reply[1], reply[2])
    if reply[0] == "value":
        return reply[1]
    elements, out = target.elements, []
    node_of = target.node if isinstance(target, View) else None
    for item in reply[1]:
        if isinstance(item, str):
            out.append(item)
            continue
        el = elements[item]
        if node_of is None:
            out.append(el)  # a loaded Document: its own nodes
        elif isinstance(el.tag, str):
            out.append(node_of(el))
        else:  # a comment (the jaxpr text of a leaf computation)
            out.append(el.text or "")
    return out


def selected(pattern: Any, mox: Mox, what: str, error: type[Exception]) -> list[Any]:
    """What ``pattern`` selects in ``mox`` for `what` (``sub``, ``capture``):
    the nodes an XPath string finds, a node itself, or a list of nodes as
    given. Anything else, or a query giving a number, string or boolean,
    raises ``error``. Callers check which kinds of node they take."""
    if isinstance(pattern, str):
        found = query(pattern, mox)
        if not isinstance(found, list):
            raise errors.NotNodes(what, pattern, found)
        return found
    if isinstance(pattern, (Mox, Equation)):
        return [pattern]
    if isinstance(pattern, (list, tuple)):
        return list(pattern)
    raise error(
        f"`pattern` must be an XPath string, a node or a list of nodes, but got a `{type(pattern).__name__}`."
    )


# -- explain ---------------------------------------------------------------------------

def _steps(xpath: str) -> list[str]:
    """Split a location path into cumulative prefixes at top-level ``/``.

    Only used to explain a query: evaluation itself is lxml's.
    """
    prefixes, depth, quote, i = [], 0, None, 0
    while i < len(xpath):
        ch = xpath[i]
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "/" and depth == 0 and i > 0 and xpath[i - 1] != "/":
            prefixes.append(i)
        i += 1
    prefixes.append(len(xpath))
    return [p for p in (xpath[:i] for i in prefixes[-65:]) if p.strip("/")]


def explain(xpath: str, mox: Mox, *, timeout: float | None = None) -> str:
    """Show how many nodes each location step of ``xpath`` matched, so you
    can see where a query stopped matching.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Dense(3); x = jnp.ones((1, 2))
      >>> mox = yax.make_mox(m.apply)(m.init(jax.random.key(0), x), x)
      >>> print(yax.explain('//module_call[@type="Dense"]/dot_general[@primitive="x"]', mox))
      1  //module_call[@type="Dense"]
      0  //module_call[@type="Dense"]/dot_general[@primitive="x"]   <- stops matching here
    """
    _compile(xpath)
    limit = TIMEOUT if timeout is None else timeout
    deadline = time.monotonic() + limit  # one time limit for all the steps together
    lines, stopped = [], False
    for p in _steps(xpath):  # the last 64 steps at most
        try:
            r = query(p, mox, timeout=max(deadline - time.monotonic(), 1e-3))
        except YaxQueryError:
            if time.monotonic() >= deadline:
                lines.append(f"?  {_shown(p)}   <- not evaluated: the steps took longer than {limit:g} s together")
                break
            continue
        n = len(r) if isinstance(r, list) else r
        mark = ""
        if isinstance(r, list) and not r and not stopped:
            mark, stopped = "   <- stops matching here", True
        lines.append(f"{n}  {_shown(p)}{mark}")
    return "\n".join(lines)
