"""The XML view of a MoX and XPath 1.0 queries over it, evaluated by lxml.

Every MoX node becomes one element; its ``id`` attribute indexes the node list
kept beside the document, so query results map back to the `Mox`/`Equation`
objects. The view is built once per MoX (cached weakly) and is the very
document `dump_xml` writes.

Elements: ``mox`` (the root), ``jaxpr`` (a computation nested in an
equation, with ``param`` naming the parameter), ``module_call``,
``method_call``, ``activation``, and one element per equation named after its
primitive (``dot_general``, ``jit``, ``scan`` …).
"""

from __future__ import annotations

import functools
import re
import textwrap
import weakref
from typing import Any

from lxml import etree

from ._ir import CALL_KINDS, FN_KINDS, Equation, Kind, Mox
from ._print import dtype_str, pprint, shown_params, type_str, value_str
from .errors import YaxQueryError

NS = {"re": "http://exslt.org/regular-expressions"}
_NAME_OK = re.compile(r"^[A-Za-z_][\w.-]*$")


class View:
    """An lxml document of a MoX and the node each element stands for."""

    def __init__(self, tree: etree._ElementTree, nodes: list[Any]):
        self.tree = tree
        self.nodes = nodes

    def node(self, el: etree._Element) -> Any:
        return self.nodes[int(el.get("id"))]

    @functools.cached_property
    def ids(self) -> dict[int, int]:
        """``id(node)`` -> the node's element id (its index in ``nodes``)."""
        return {id(n): i for i, n in enumerate(self.nodes)}


_views: weakref.WeakKeyDictionary[Mox, View] = weakref.WeakKeyDictionary()


def _num(v: Any) -> str | None:
    """Attribute text for a printable value; numbers stay numbers."""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, (int, float)):
        return repr(v)
    if v is None or isinstance(v, (str, tuple, list)) or callable(v) or hasattr(v, "dtype") or isinstance(v, type):
        s = value_str(v)
        return s if len(s) <= 200 else None
    return None


def _io_attrs(el: etree._Element, node: Any) -> None:
    ins, outs = node.inputs, node.outputs
    el.set("in_shape", " ".join(type_str(a) for a in ins))
    el.set("out_shape", " ".join(type_str(a) for a in outs))
    el.set("in_dtype", " ".join(dtype_str(a.dtype) for a in ins))
    el.set("out_dtype", " ".join(dtype_str(a.dtype) for a in outs))
    if outs:
        el.set("shape", ",".join(map(str, outs[0].shape)))
        el.set("dtype", getattr(outs[0].dtype, "name", str(outs[0].dtype)))


def build_view(mox: Mox) -> View:
    nodes: list[Any] = []

    def add(parent: etree._Element | None, node: Any, tag: str, param: str | None = None,
            texted: bool = False) -> etree._Element:
        el = etree.Element(tag) if parent is None else etree.SubElement(parent, tag)
        el.set("id", str(len(nodes)))
        nodes.append(node)
        if isinstance(node, Equation):
            el.set("primitive", node.name)
            # a jitted helper is named after its function: //jit[@name="relu"], as the prototype's
            # //pjit[@name="relu"]. (Inside the activation `relu`, jax.nn's jitted body is named so
            # too: `//activation[@name="relu"]` selects the activations alone.)
            fn = node.params.get("name")
            el.set("name", fn if isinstance(fn, str) and _NAME_OK.match(fn) else node.name)
            el.set("path", node.path)
            _io_attrs(el, node)
            for k, v in shown_params(node):
                t = _num(v)
                if t is not None and _NAME_OK.match(k) and k not in el.attrib:
                    el.set(k, t)
            for k, sub in node.subs:
                add(el, sub, Kind.JAXPR, k, texted)
            return el
        el.set("primitive", node.kind)
        el.set("name", node.name or node.kind)
        el.set("path", node.path)
        if param is not None:
            el.set("param", param)
        _io_attrs(el, node)
        if node.kind in CALL_KINDS:
            el.set("type", node.type)
            el.set("qualtype", node.qualtype)
            el.set("method", node.method or "")
            if node.kind not in FN_KINDS:
                el.set("params", str(node.num_params))
            for k, v in node.attrs.items():
                t = _num(v)
                if t is not None and _NAME_OK.match(k) and k not in el.attrib:
                    el.set(k, t)
        if not texted and node.children and not any(
            isinstance(n, Mox) and n.kind in CALL_KINDS for n in node.walk() if n is not node
        ):
            # the outermost leaf computation: its jaxpr text shows the dataflow elements leave out
            text = pprint(node) if node.kind in (Kind.ROOT, Kind.JAXPR) else pprint(node).split("\n", 1)[1]
            el.append(etree.Comment("\n" + textwrap.dedent(text).replace("--", "- -").rstrip("-") + "\n"))
            texted = True
        for c in node.children:
            if isinstance(c, Equation):
                add(el, c, c.name if _NAME_OK.match(c.name) else "equation", texted=texted)
            else:
                add(el, c, c.kind, texted=texted)
        return el

    root = add(None, mox, "mox" if mox.kind == Kind.ROOT else mox.kind)
    return View(etree.ElementTree(root), nodes)


def view(mox: Mox) -> View:
    """The cached XML view of ``mox`` (built on first use)."""
    v = _views.get(mox)
    if v is None:
        v = _views[mox] = build_view(mox)
    return v


def tree_of(x: Any, caller: str) -> tuple[etree._ElementTree, View | None]:
    """The document of a MoX (with its view) or of a loaded Document (no view)."""
    if isinstance(x, Mox):
        v = view(x)
        return v.tree, v
    tree = getattr(x, "tree", None)
    if not isinstance(tree, etree._ElementTree):
        raise YaxQueryError(f"`{caller}` expected a MoX or a loaded Document, but got a `{type(x).__name__}`.")
    return tree, None


# -- queries ---------------------------------------------------------------------------

_COMPAT_EMPTY_TEST = re.compile(r"(^|[|(\s])(//?)\[")
_PJIT = re.compile(r"(?<![\w@$\"'-])pjit(?![\w\"'-])")


def normalise(xpath: str) -> str:
    """The earlier prototype's dialect in standard XPath: ``//[@p]`` means
    ``//*[@p]``, ``pjit`` (JAX's former name) matches ``jit`` elements, and
    ``/`` (the document) is its root element."""
    if xpath.strip() == "/":
        return "/*"
    out = _COMPAT_EMPTY_TEST.sub(lambda m: f"{m.group(1)}{m.group(2)}*[", xpath)
    return _PJIT.sub("jit", out)


def _hint(xpath: str) -> str:
    hints = []
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


def _compile(xpath: str) -> etree.XPath:
    if not isinstance(xpath, str):
        raise YaxQueryError(f"A query must be an XPath string, but got a `{type(xpath).__name__}`.")
    x = _compiled.get(xpath)
    if x is None:
        try:
            x = etree.XPath(normalise(xpath), namespaces=NS, smart_strings=False)
        except (etree.XPathError, ValueError) as e:
            raise YaxQueryError(
                f"The XPath `{xpath}` is invalid: lxml reported {type(e).__name__}: {e}. {_hint(xpath)}"
            ) from None
        if len(_compiled) > 512:
            _compiled.clear()
        _compiled[xpath] = x
    return x


def query(xpath: str, mox: Mox) -> Any:
    """Run an XPath 1.0 query over a MoX.

    Args:
      xpath: the query; EXSLT regular expressions are available as ``re:``.
      mox: the MoX (any node: the query runs over the tree rooted there).

    Returns:
      For a node-set, the matching `Mox`/`Equation` nodes in document order
      (attribute nodes come back as strings); for ``count()``/``sum()`` a
      float, for string functions a str, for comparisons a bool.

    Raises:
      YaxQueryError: the XPath is invalid or cannot be evaluated.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Sequential([nn.Dense(4), nn.gelu, nn.Dense(2)]); x = jnp.ones((1, 3))
      >>> mox = yax.make_mox(m.apply)(m.init(jax.random.key(0), x), x)
      >>> [n.path for n in yax.query('//module_call[@type="Dense"][@features=4]', mox)]
      ['Sequential/layers_0']
      >>> yax.query('count(//*[@name="gelu"])', mox)
      1.0
    """
    x = _compile(xpath)
    tree, v = tree_of(mox, "query")
    try:
        res = x(tree)
    except etree.XPathError as e:
        raise YaxQueryError(
            f"The XPath `{xpath}` could not be evaluated: lxml reported {type(e).__name__}: {e}. "
            f"{_hint(xpath)}"
        ) from None
    if v is None:  # a loaded Document: results are its elements
        return res
    if isinstance(res, list):
        out = []
        for r in res:
            if isinstance(r, etree._Element):
                out.append(v.node(r))
            elif isinstance(r, (str, bytes)):
                out.append(r if isinstance(r, str) else r.decode())
            else:  # text or other nodes: their string value
                out.append(str(r))
        return out
    return res


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
            prefixes.append(xpath[:i])
        i += 1
    prefixes.append(xpath)
    return [p for p in prefixes if p.strip("/")]


def explain(xpath: str, mox: Mox) -> str:
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
    lines, stopped = [], False
    for p in _steps(xpath):
        try:
            r = query(p, mox)
        except YaxQueryError:
            continue
        n = len(r) if isinstance(r, list) else r
        mark = ""
        if isinstance(r, list) and not r and not stopped:
            mark, stopped = "   <- stops matching here", True
        lines.append(f"{n}  {p}{mark}")
    return "\n".join(lines)
