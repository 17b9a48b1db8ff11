"""The process that evaluates XPath queries for `yax.query`, so that every
query's time is bounded.

A query is evaluated by libxml2 (through lxml) and, for EXSLT ``re:``
functions, by Python's ``re``; neither can be interrupted once it runs, and
both have inputs that take hours (``count(//*[count(//*[count(//*)>0])>0])``
on a few thousand elements, ``re:test(@path, "^(a|aa)+$")`` on a long
string). So `_xpath` sends each query to this separate process, waits at
most the query's time limit for the answer, and kills the process when the
limit passes: the kernel is never held up, and the next query starts a fresh
process.

This file is the child's whole program. It is run as ``python -P -c
<this source>`` and imports only the standard library and lxml (never yax or
JAX, which would make starting it slow). The parent's side is
`yax._xpath.Evaluator`.

Protocol (both directions): frames of an 8-byte little-endian length and a
`marshal`-ed tuple, on the child's stdin and on the pipe whose descriptor is
its first argument (its stdout and stderr go nowhere).

  ("query", token, xpath, data)   data: the document's XML bytes, or None
                                  when the child was sent it before
  -> ("need",)                    the child has no document under token
  -> ("nodes", items)             items: int (the node's position in
                                  ``root.iter()`` order) or str
  -> ("value", v)                 a float, bool or str
  -> ("error", kind, message)     kind: "eval" (lxml), "regex" (``re.error``
                                  in a ``re:`` function), "call" (a function
                                  called wrongly), "memory", "other"
"""

from __future__ import annotations

import collections
import marshal
import os
import re
import struct
import sys
from typing import IO, Any

from lxml import etree

NS = {"re": "http://exslt.org/regular-expressions"}
KEEP = 3  # documents kept, most recently used first


class Doc:
    def __init__(self, data: bytes) -> None:
        try:  # huge_tree: deeper than 256 levels; our own serialised tree, never a DTD
            root = etree.fromstring(data, etree.XMLParser(huge_tree=True, resolve_entities=False,
                                                          no_network=True, load_dtd=False))
        except etree.XMLSyntaxError:  # deeper than libxml2 parses (2048 levels): expat has no limit
            import xml.parsers.expat as expat

            builder = etree.TreeBuilder()
            p = expat.ParserCreate()
            p.buffer_text = True
            p.StartElementHandler, p.EndElementHandler = builder.start, builder.end
            p.CharacterDataHandler, p.CommentHandler = builder.data, builder.comment
            p.ProcessingInstructionHandler = builder.pi
            p.Parse(data, True)
            root = builder.close()
        self.tree = etree.ElementTree(root)
        self._index: dict[Any, int] | None = None

    @classmethod
    def of(cls, tree: Any) -> Doc:
        """A document already parsed (the in-process fallback)."""
        doc = cls.__new__(cls)
        doc.tree, doc._index = tree, None
        return doc

    def position(self, el: Any) -> int | None:
        if self._index is None:
            self._index = {e: i for i, e in enumerate(self.tree.getroot().iter())}
        return self._index.get(el)


def string_value(x: Any) -> str:
    if isinstance(x, etree._Element):
        if isinstance(x.tag, str):
            return "".join(x.itertext())
        return x.text or ""
    if isinstance(x, bytes):
        return x.decode("utf-8", "replace")
    if isinstance(x, tuple):  # the namespace axis: (prefix, uri)
        return " ".join(str(p) for p in x)
    return str(x)


def evaluate(doc: Doc, xpath: str, compiled: dict[str, etree.XPath]) -> tuple[Any, ...]:
    x = compiled.get(xpath)
    if x is None:
        x = etree.XPath(xpath, namespaces=NS, smart_strings=False)
        if len(compiled) > 256:
            compiled.clear()
        compiled[xpath] = x
    res = x(doc.tree)
    if isinstance(res, list):
        items = []
        for r in res:
            i = doc.position(r) if isinstance(r, etree._Element) else None
            # nodes of this document come back by position; anything else (the elements
            # `re:match` builds, attribute values, text) by its string value
            items.append(i if i is not None else string_value(r))
        return ("nodes", items)
    for t in (bool, float, str):  # plain types: marshal takes no subclasses
        if isinstance(res, t):
            return ("value", t(res))
    return ("value", string_value(res))


def answer(docs: collections.OrderedDict[int, Doc], compiled: dict[str, etree.XPath],
           msg: tuple[Any, ...]) -> tuple[Any, ...]:
    _, token, xpath, data = msg
    try:
        if data is not None:
            docs.pop(token, None)
            docs[token] = Doc(data)
            while len(docs) > KEEP:
                docs.popitem(last=False)
        doc = docs.get(token)
        if doc is None:
            return ("need",)
        docs.move_to_end(token)
        return evaluate(doc, xpath, compiled)
    except etree.XPathError as e:
        return ("error", "eval", f"{type(e).__name__}: {e}")
    except re.error as e:
        return ("error", "regex", str(e))
    except TypeError as e:
        return ("error", "call", str(e))
    except MemoryError:
        return ("error", "memory", "")
    except Exception as e:  # noqa: BLE001 - every failure is reported, none ends the process
        return ("error", "other", f"{type(e).__name__}: {e}")


def read_exactly(f: IO[bytes], n: int) -> bytes | None:
    parts = []
    while n:
        b = f.read(n)
        if not b:
            return None
        parts.append(b)
        n -= len(b)
    return b"".join(parts)


def main() -> None:
    out = os.fdopen(int(sys.argv[1]), "wb")  # a pipe of its own: a stray print cannot corrupt the frames
    inp = sys.stdin.buffer
    docs: collections.OrderedDict[int, Doc] = collections.OrderedDict()
    compiled: dict[str, etree.XPath] = {}
    while True:
        head = read_exactly(inp, 8)
        if head is None:
            return
        body = read_exactly(inp, struct.unpack("<Q", head)[0])
        if body is None:
            return
        reply = marshal.dumps(answer(docs, compiled, marshal.loads(body)))
        out.write(struct.pack("<Q", len(reply)) + reply)
        out.flush()


if __name__ == "__main__":
    main()
