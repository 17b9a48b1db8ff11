"""XML serialisation: `dump_xml` writes the document queries run against;
`load_xml` reads one back safely (no DTD, no entities, no network, bounded)."""

from __future__ import annotations

import copy
import io
from typing import IO, Any

from lxml import etree

from ._ir import Mox
from ._xpath import view
from .errors import YaxXMLError

MAX_BYTES = 256 * 2**20


class Document:
    """A loaded MoX document: printable, queryable with `yax.query` (results
    are lxml elements) and comparable with `yax.diff`; not evaluable."""

    def __init__(self, tree: etree._ElementTree):
        self.tree = tree

    @property
    def root(self) -> etree._Element:
        return self.tree.getroot()

    def __str__(self) -> str:
        return etree.tostring(self.tree, pretty_print=True, encoding="unicode")

    def __repr__(self) -> str:
        return f"Document(<{self.root.tag}>, {sum(1 for _ in self.root.iter(etree.Element))} elements)"


def to_xml(mox: Mox, indent: int | bool = True) -> str:
    """The XML text of the view `yax.query` runs on, indented by ``indent``
    spaces per level (``True``: 2; ``False`` or 0: on one line)."""
    tree = view(mox).tree
    if indent is True or indent == 2:
        return etree.tostring(tree, pretty_print=True, encoding="unicode")
    if not indent:
        return etree.tostring(tree, encoding="unicode")
    root = copy.deepcopy(tree.getroot())  # the cached view stays as queries see it
    etree.indent(root, space=" " * int(indent))
    return etree.tostring(root, encoding="unicode") + "\n"


def dump_xml(mox: Mox, fileobj: IO[Any], *, indent: int | bool = True) -> None:
    """Write the XML view of ``mox`` (the same document queries run against),
    indented by ``indent`` spaces (the earlier prototype's option; default 2),
    to a binary or text file object, so a query can be debugged with any
    XPath tool.

    Example:
      >>> import io, jax.numpy as jnp, yax
      >>> buf = io.StringIO()
      >>> yax.dump_xml(yax.make_mox(jnp.sin)(jnp.ones(2)), buf)
      >>> print(buf.getvalue())
      <mox id="0" primitive="root" name="sin" path="" in_shape="f32[2]" out_shape="f32[2]" in_dtype="f32" out_dtype="f32" shape="2" dtype="float32">
        <!--
      { lambda ; a:f32[2]. let
          b:f32[2] = sin a
        in (b) }
      -->
        <sin id="1" primitive="sin" name="sin" path="" in_shape="f32[2]" out_shape="f32[2]" in_dtype="f32" out_dtype="f32" shape="2" dtype="float32"/>
      </mox>
      <BLANKLINE>
    """
    text = to_xml(mox, indent)
    if isinstance(fileobj, io.TextIOBase):
        fileobj.write(text)
    else:
        try:
            fileobj.write(text.encode())
        except TypeError:
            fileobj.write(text)


def load_xml(fileobj: IO[Any] | bytes | str, *, max_bytes: int = MAX_BYTES) -> Document:
    """Read a document written by `dump_xml`. Safe for untrusted input: a
    DOCTYPE or entity declaration is refused before parsing, nothing is
    fetched, and at most ``max_bytes`` are read.

    Raises:
      YaxXMLError: the input is too large, declares a DTD/entities, or is not
        well-formed XML.
    """
    if isinstance(fileobj, (bytes, str)):
        data = fileobj.encode() if isinstance(fileobj, str) else fileobj
    else:
        data = fileobj.read(max_bytes + 1)
        if isinstance(data, str):
            data = data.encode()
    if len(data) > max_bytes:
        raise YaxXMLError(
            f"The document is larger than the limit of {max_bytes} bytes. "
            "Pass a larger `max_bytes` if you trust it."
        )
    head = data.upper()
    if b"<!DOCTYPE" in head or b"<!ENTITY" in head:
        raise YaxXMLError(
            "The document declares a DTD or entities, which yax documents never contain; it was "
            "refused unparsed (entity expansion and external entities are unsafe)."
        )
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)
    try:
        tree = etree.ElementTree(etree.fromstring(data, parser))
    except etree.XMLSyntaxError as e:
        raise YaxXMLError(f"The document is not well-formed XML: {e}.") from None
    return Document(tree)
