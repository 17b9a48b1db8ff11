"""The XML view of a MoX: one lxml element per node, and node identity.

Every MoX node becomes one element; its ``id`` attribute indexes the node list
kept beside the document (`View.nodes`), so an element maps back to the
`Mox`/`Equation` it stands for and a node to its id (`View.ids`): the ids the
explorer's rows, `yax.to_dot`'s ``yax-N`` and `yax.query`'s results share. The
view is built once per MoX (cached weakly) and is the very document `dump_xml`
writes; queries (`_xpath`) run on it.

Elements: ``mox`` (the root), ``jaxpr`` (a computation nested in an
equation, with ``param`` naming the parameter), ``module_call``,
``method_call``, ``activation``, and one element per equation named after its
primitive (``dot_general``, ``jit``, ``scan`` …).

Where the user's code made a node (`yax._source`), its element has ``file``
(the base name, ``model.py``) and ``line``: ``//dot_general[@file="model.py"]``.
`dump_xml` leaves them out unless asked (``source=True``): a dumped document
then reads the same wherever the model's files are.

Text XML cannot hold (a control character in a module name, which Flax
accepts; a lone surrogate in the name of a replacement function) is escaped
reversibly in attributes and comments, as Python writes it: ``name='a\\x01b'``
is the attribute ``name="a\\x01b"`` (a backslash is doubled only where it
would otherwise start such an escape). `to_xml_text` and `from_xml_text`
convert.
"""

from __future__ import annotations

import functools
import itertools
import re
import textwrap
from typing import Any

from lxml import etree

from ._calls import memo, visit
from ._ir import CALL_KINDS, FN_KINDS, Equation, Kind, Mox
from ._precision import precisions
from ._print import pprint, shown_params
from ._sharding import call_specs
from ._source import location
from ._vocab import dtype_str, type_str, value_str
from .errors import NotQueryable

#: The attributes saying where the user's code made a node (only the view has them; `dump_xml` on request).
SOURCE_ATTRS = ("file", "line")
_NAME_OK = re.compile(r"^[A-Za-z_][\w.-]*$")
_tokens = itertools.count(1)


class Queryable:
    """A document queries run on: a MoX's view or a loaded `Document`.
    ``token`` names it to the query process, which keeps a copy."""

    tree: etree._ElementTree

    @functools.cached_property
    def token(self) -> int:
        return next(_tokens)

    @functools.cached_property
    def elements(self) -> list[Any]:
        """Every node of the tree (elements, comments) in document order: the
        positions the query process answers with."""
        return list(self.tree.getroot().iter())

    def xml_bytes(self) -> bytes:
        data: bytes = etree.tostring(self.tree)
        return data


class View(Queryable):
    """An lxml document of a MoX and the node each element stands for."""

    def __init__(self, tree: etree._ElementTree, nodes: list[Any], sourced: bool = False,
                 own_source_names: tuple[int, ...] = ()):
        self.tree = tree
        self.nodes = nodes
        self.sourced = sourced  #: whether any element has ``file`` and ``line`` (`SOURCE_ATTRS`)
        #: ids of the elements whose own fields hold those names (a module field `line`): kept in a dump
        self.own_source_names = own_source_names

    def node(self, el: etree._Element) -> Any:
        return self.nodes[int(el.get("id"))]

    @functools.cached_property
    def ids(self) -> dict[int, int]:
        """``id(node)`` -> the node's element id (its index in ``nodes``)."""
        return {id(n): i for i, n in enumerate(self.nodes)}


# Characters outside XML 1.0's `Char` production: lxml refuses them in attributes and comments.
_NOT_XML = "\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff"
# What `to_xml_text` rewrites: such a character, or a backslash that would otherwise read as
# the start of an escape (before `x`, `u`, another backslash, or such a character).
_UNSAFE = re.compile(f"[{_NOT_XML}]|\\\\(?=[xu\\\\{_NOT_XML}])")
NOT_XML_CHAR = re.compile(f"[{_NOT_XML}]")
_ESCAPE = re.compile(r"\\(\\|x[0-9a-f]{2}|u[0-9a-f]{4})")


def _escaped(m: re.Match[str]) -> str:
    c = m.group()
    if c == "\\":
        return "\\\\"
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def to_xml_text(s: str) -> str:
    """``s`` as an XML attribute or comment can hold it: characters XML
    cannot hold written as Python escapes (``\\x01``, ``\\ud800``); any other
    text, the usual case, unchanged. `from_xml_text` undoes it."""
    return _UNSAFE.sub(_escaped, s) if _UNSAFE.search(s) else s


def from_xml_text(s: str) -> str:
    """The text `to_xml_text` was given: an attribute of the XML view (or
    of a document `yax.load_xml` read) as the MoX holds it."""
    return _ESCAPE.sub(lambda m: "\\" if m.group(1) == "\\" else chr(int(m.group(1)[1:], 16)), s)


def _num(v: Any) -> str | None:
    """Attribute text for a printable value: numbers stay numbers, a string is itself
    (``@padding="SAME"``, as users type it; not its repr), anything else its `value_str`."""
    if isinstance(v, str):
        return v if len(v) <= 200 else None
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


def _below(node: Any) -> list[Any]:
    """The nodes directly below ``node``: a Mox's children, an equation's nested computations."""
    return list(node.children) if isinstance(node, Mox) else [s for _, s in node.subs]


def calls_below(mox: Mox) -> set[int]:
    """``id`` of every node of ``mox`` (itself included) with a call node
    somewhere below it, found in one pass without recursion."""
    out: set[int] = set()
    for n in reversed([mox, *mox.walk()]):  # children before parents
        if any(id(c) in out or (isinstance(c, Mox) and c.kind in CALL_KINDS) for c in _below(n)):
            out.add(id(n))
    return out


def _source_attrs(el: etree._Element, node: Any) -> str | None:
    """Set ``@file``/``@line`` of ``node`` where it has a location and no field
    of its own took those names. Returns ``"set"``, ``"own"`` (its own field
    holds one of the names) or None."""
    if any(a in el.attrib for a in SOURCE_ATTRS):
        return "own"
    loc = location(node)
    if loc is None:
        return None
    el.set("file", to_xml_text(loc.file))
    el.set("line", str(loc.line))
    return "set"


def _note(outcome: str | None, i: int, outcomes: set[str | None], own: list[int]) -> None:
    outcomes.add(outcome)
    if outcome == "own":
        own.append(i)


def build_view(mox: Mox) -> View:
    """The XML view of ``mox``, built without recursion (any depth)."""
    nodes: list[Any] = []
    sourced: set[str | None] = set()
    own: list[int] = []
    with_calls = calls_below(mox)
    policies = precisions(mox)
    laid_out = call_specs(mox) if mox.kind == Kind.ROOT else {}  # `@sharding`: only where a parameter is split
    root_tag = "mox" if mox.kind == Kind.ROOT else mox.kind
    elements: list[Any] = []  # number -> its element (a node's number is its element id)
    shows: list[bool] = []    # number -> whether it or an element around it shows the jaxpr text
    for node, parent, holders in visit(mox):
        up = nodes[parent] if parent >= 0 else None
        param: str | None = None
        if up is None:
            tag = root_tag
        elif isinstance(up, Equation):  # a computation it holds
            tag, param = Kind.JAXPR, holders[-1][1]
        elif isinstance(node, Equation):
            tag = node.name if _NAME_OK.match(node.name) else "equation"
        else:
            tag = node.kind
        el = etree.Element(tag) if up is None else etree.SubElement(elements[parent], tag)
        texted = parent >= 0 and shows[parent]
        el.set("id", str(len(nodes)))
        nodes.append(node)
        elements.append(el)
        if isinstance(node, Equation):
            el.set("primitive", node.name)
            # a jitted helper is named after its function: //jit[@name="relu"], as the prototype's
            # //pjit[@name="relu"]. (Inside the activation `relu`, jax.nn's jitted body is named so
            # too: `//activation[@name="relu"]` selects the activations alone.)
            fn = node.params.get("name")
            el.set("name", to_xml_text(fn if isinstance(fn, str) and _NAME_OK.match(fn) else node.name))
            el.set("path", to_xml_text(node.path))
            _io_attrs(el, node)
            for k, v in shown_params(node):
                t = _num(v)
                if t is not None and _NAME_OK.match(k) and k not in el.attrib:
                    el.set(k, to_xml_text(t))
            _note(_source_attrs(el, node), len(nodes) - 1, sourced, own)
        else:
            el.set("primitive", node.kind)
            el.set("name", to_xml_text(node.name or node.kind))
            el.set("path", to_xml_text(node.path))
            if param is not None:
                el.set("param", param)
            _io_attrs(el, node)
            if node.kind in CALL_KINDS:
                el.set("type", to_xml_text(node.type))
                el.set("qualtype", to_xml_text(node.qualtype))
                el.set("method", to_xml_text(node.method or ""))
                if node.kind not in FN_KINDS:
                    el.set("params", str(node.num_params))
                pol = policies[id(node)]
                el.set("policy", str(pol))
                if pol.compute:
                    el.set("compute", pol.compute)
                if id(node) in laid_out:
                    el.set("sharding", laid_out[id(node)])
                for k, v in node.attrs.items():
                    t = _num(v)
                    if t is not None and _NAME_OK.match(k) and k not in el.attrib:
                        el.set(k, to_xml_text(t))
                _note(_source_attrs(el, node), len(nodes) - 1, sourced, own)
            if not texted and node.children and id(node) not in with_calls:
                # the outermost leaf computation: its jaxpr text shows the dataflow elements leave out
                text = pprint(node)
                if node.kind not in (Kind.ROOT, Kind.JAXPR):
                    text = text.split("\n", 1)[1]
                text = to_xml_text(textwrap.dedent(text))
                el.append(etree.Comment("\n" + text.replace("--", "- -").rstrip("-") + "\n"))
                texted = True
        shows.append(texted)
    return View(etree.ElementTree(elements[0]), nodes, "set" in sourced, tuple(own))


def view(mox: Mox) -> View:
    """The cached XML view of ``mox`` (built on first use)."""
    return memo(mox, "view", lambda: build_view(mox))


def target_of(x: Any, caller: str) -> Queryable:
    """What a query runs on: the view of a MoX, or a loaded `Document`."""
    if isinstance(x, Mox):
        return view(x)
    if isinstance(x, Queryable) and isinstance(getattr(x, "tree", None), etree._ElementTree):
        return x
    raise NotQueryable(caller, x)


def tree_of(x: Any, caller: str) -> tuple[etree._ElementTree, View | None]:
    """The document of a MoX (with its view) or of a loaded Document (no view)."""
    t = target_of(x, caller)
    return t.tree, t if isinstance(t, View) else None


