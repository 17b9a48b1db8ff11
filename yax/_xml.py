"""XML serialisation: `dump_xml` writes the document queries run against;
`load_xml` reads one back safely (no DTD, no entities, no network, bounded
in bytes read and in memory)."""

from __future__ import annotations

import codecs
import copy
import io
import os
import re
import stat
from collections.abc import Iterator
from typing import IO, Any, NoReturn

from lxml import etree

from ._ir import Mox
from ._view import SOURCE_ATTRS, Queryable, view
from .errors import (
    BadLimit,
    CannotRead,
    DeclaresDTD,
    DocumentTooLarge,
    NotWellFormed,
    YaxError,
    YaxXMLError,
    unexpected,
)

MAX_BYTES = 256 * 2**20
#: What `load_xml` allows the parsed tree per byte of ``max_bytes`` when no
#: ``max_memory`` is given: a `dump_xml` document takes 6 to 9 times its size.
MEMORY_PER_BYTE = 10
CHUNK = 2**20
# What libxml2 allocates, at most, per node and per attribute (measured: an element
# with its text 250 bytes, an attribute with its value node 230): every node starts
# with `<` and every attribute has a `=`, so counting them bounds the tree's memory.
_NODE_BYTES, _ATTR_BYTES = 260, 250


class Document(Queryable):
    """A loaded MoX document: printable, queryable with `yax.query` (results
    are lxml elements) and comparable with `yax.diff`; not evaluable.
    Queries see the document as it was loaded: change a copy, not ``tree``."""

    def __init__(self, tree: etree._ElementTree):
        self.tree = tree

    @property
    def root(self) -> etree._Element:
        return self.tree.getroot()

    def __str__(self) -> str:
        text: str = etree.tostring(self.tree, pretty_print=True, encoding="unicode")
        return text

    def __repr__(self) -> str:
        return f"Document(<{self.root.tag}>, {sum(1 for _ in self.root.iter(etree.Element))} elements)"


# the widest indent written: each level's spaces are a string in memory, and an indent of 10**9 (which a
# fuzzed call passed) took gigabytes per level and had the process killed
MAX_INDENT = 64


def to_xml(mox: Mox, indent: int | bool = True, *, source: bool = False) -> str:
    """The XML text of the view `yax.query` runs on, indented by ``indent``
    spaces per level, at most `MAX_INDENT` (``True``: 2; ``False`` or 0: on one line). Text XML
    cannot hold (a control character in a module name) is escaped as
    `yax.internal.to_xml_text` does. ``source=True`` keeps each node's
    ``@file`` and ``@line`` (the user's code that made it); left out by
    default, so that the text is the same wherever the model's files are."""
    if not isinstance(mox, Mox):
        raise YaxXMLError(f"`dump_xml` and `to_xml` write a MoX (from `yax.make_mox` or `yax.sub`), but got a "
                          f"`{type(mox).__name__}`.")
    if indent is None:  # as before: on one line
        indent = False
    if not isinstance(indent, int) or not 0 <= indent <= MAX_INDENT:
        raise BadLimit("indent", indent, f"a number of spaces from 0 to {MAX_INDENT} (or True for 2, False for none)")
    if not isinstance(source, bool):
        raise YaxXMLError(f"`source` must be True or False, but got {source!r}.")
    try:
        return _text(mox, indent, source)
    except YaxError:
        raise
    except Exception as e:
        raise unexpected("Writing the XML view of a MoX", e, YaxXMLError) from e


def _text(mox: Mox, indent: int | bool, source: bool) -> str:
    v = view(mox)
    tree: Any = v.tree
    text: str
    if not source and v.sourced:
        tree = copy.deepcopy(tree.getroot())  # the cached view stays as queries see it
        etree.strip_attributes(tree, *SOURCE_ATTRS)
        if v.own_source_names:  # a module's own field named `file` or `line`: put back
            own = set(v.own_source_names)
            for el, orig in zip(tree.iter(etree.Element), v.tree.getroot().iter(etree.Element)):
                if int(orig.get("id")) in own:
                    for a in SOURCE_ATTRS:
                        if a in orig.attrib:
                            el.set(a, orig.get(a))
    if indent is True or indent == 2:
        text = etree.tostring(tree, pretty_print=True, encoding="unicode")
        return text
    if not indent:
        text = etree.tostring(tree, encoding="unicode")
        return text
    root = copy.deepcopy(tree.getroot()) if tree is v.tree else tree  # the cached view stays as queries see it
    etree.indent(root, space=" " * int(indent))
    text = etree.tostring(root, encoding="unicode")
    return text + "\n"


def dump_xml(mox: Mox, fileobj: IO[Any], *, indent: int | bool = True, source: bool = False) -> None:
    """Write the XML view of ``mox`` (the same document queries run against),
    indented by ``indent`` spaces (the earlier prototype's option; default 2),
    to a binary or text file object, so a query can be debugged with any
    XPath tool. `load_xml` reads back whatever this writes. The view's
    ``@file`` and ``@line`` (where the user's code made each node) are
    written only with ``source=True``: without them the document does not
    depend on where the model's files are.

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
    text = to_xml(mox, indent, source=source)
    if not callable(getattr(fileobj, "write", None)):
        raise YaxXMLError(f"`dump_xml` writes to a file object (`open(path, 'wb')`, `io.StringIO()`), but got a "
                          f"`{type(fileobj).__name__}`.")
    try:
        if isinstance(fileobj, io.TextIOBase):
            fileobj.write(text)
        else:
            try:
                fileobj.write(text.encode())
            except TypeError:
                fileobj.write(text)
    except Exception as e:  # a closed file, a full disk, a write that takes neither bytes nor str
        raise YaxXMLError(f"`dump_xml` could not write to the file object: {type(e).__name__}: {e}.") from e


# -- load_xml --------------------------------------------------------------------------

class _Source:
    """The input of `load_xml` as chunks (bytes, or str from a text file),
    at most ``max_bytes`` of them; ``again()`` reads it once more where it can."""

    def __init__(self, source: Any, max_bytes: int):
        self.max_bytes = max_bytes
        self.path: str | None = None
        self.data: memoryview | None = None
        self.file: Any = None
        self.start: int | None = None
        if isinstance(source, (bytes, bytearray, memoryview)):
            view = memoryview(source)
            self.data = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
            self._check_size(self.data.nbytes)
        elif isinstance(source, (str, os.PathLike)):
            self.path = os.fspath(source)
            if not isinstance(self.path, str):
                self.path = os.fsdecode(self.path)
            self._check_path(source)
        elif callable(getattr(source, "read", None)):
            self.file = source
            try:
                if source.seekable():
                    self.start = source.tell()
            except (OSError, AttributeError, ValueError):
                pass
            try:  # a regular file's size is known before reading it
                st = os.fstat(source.fileno())
            except (OSError, AttributeError, ValueError, TypeError):
                st = None
            if st is not None and stat.S_ISREG(st.st_mode):
                self._check_size(st.st_size - (self.start or 0))
        else:
            raise CannotRead("source", type(source).__name__)

    def _check_size(self, n: int) -> None:
        if n > self.max_bytes:
            raise DocumentTooLarge("max_bytes", self.max_bytes, n, unread=True)

    def _check_path(self, source: Any) -> None:
        path = self.path
        assert path is not None  # set just before the check
        try:
            size = os.stat(path).st_size
        except OSError as e:
            looks_like_xml = isinstance(source, str) and source.lstrip().startswith("<")
            raise CannotRead("open", str(e.strerror or e), _short(path), looks_like_xml) from None
        if os.path.isfile(path):
            self._check_size(size)

    def chunks(self) -> Iterator[bytes | str]:
        total = 0
        for chunk in self._raw():
            if not isinstance(chunk, (bytes, bytearray, memoryview, str)):
                raise CannotRead("chunk", type(chunk).__name__)
            total += len(chunk) if not isinstance(chunk, str) else len(chunk.encode("utf-8", "surrogatepass"))
            if total > self.max_bytes:
                raise DocumentTooLarge("max_bytes", self.max_bytes, total)
            yield bytes(chunk) if isinstance(chunk, (bytearray, memoryview)) else chunk

    def _raw(self) -> Iterator[Any]:
        if self.data is not None:
            for i in range(0, self.data.nbytes, CHUNK):
                yield self.data[i:i + CHUNK]
        elif self.path is not None:
            try:
                with open(self.path, "rb") as f:
                    while chunk := f.read(CHUNK):
                        yield chunk
            except OSError as e:
                raise CannotRead("read", str(e.strerror or e), _short(self.path)) from None
        else:
            while True:
                chunk = self.file.read(CHUNK)
                if not chunk:
                    return
                yield chunk

    def again(self) -> bool:
        """Rewind for a second reading; False where that cannot be done (a pipe)."""
        if self.file is None:
            return True
        if self.start is None:
            return False
        try:
            self.file.seek(self.start)
            return True
        except (OSError, ValueError):
            return False


def _short(s: str, n: int = 120) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


_DECL_ENCODING = re.compile(rb"""^<\?xml\s[^>]{0,200}?encoding\s*=\s*["']([A-Za-z][A-Za-z0-9._-]{0,40})["']""")
# What the first bytes say about the encoding (XML 1.0, Appendix F): BOMs; then, in
# `_encoding`, zero bytes around the first characters (UTF-16 or UTF-32 without a BOM).
_SNIFF = [
    (b"\x00\x00\xfe\xff", "utf-32"), (b"\xff\xfe\x00\x00", "utf-32"), (b"\xef\xbb\xbf", "utf-8-sig"),
    (b"\xfe\xff", "utf-16"), (b"\xff\xfe", "utf-16"),
]
# Which of the first four bytes are zero -> the encoding (ASCII characters in UTF-32 or UTF-16).
_ZEROS: dict[tuple[bool, ...], str] = {
    (False, True, True, True): "utf-32-le", (True, True, True, False): "utf-32-be",
    (False, True, False, True): "utf-16-le", (True, False, True, False): "utf-16-be",
}


def _encoding(head: bytes) -> str:
    """The Python codec of a document starting with ``head`` (at least 4
    bytes or the whole input): by BOM, byte pattern, or XML declaration."""
    for prefix, codec in _SNIFF:
        if head.startswith(prefix):
            return codec
    if len(head) >= 4 and head[:4].count(0) in (2, 3):  # no BOM: ASCII characters with zero bytes around them
        zero = [b == 0 for b in head[:4]]
        found = _ZEROS.get(tuple(zero))
        if found:
            return found
    if head.startswith(b"\x4c\x6f\xa7\x94"):
        raise YaxXMLError("The document is in EBCDIC, which `load_xml` does not read; `dump_xml` writes UTF-8.")
    m = _DECL_ENCODING.match(head)
    if m is None:
        return "utf-8"
    name = m.group(1).decode("ascii")
    try:
        info = codecs.lookup(name)
    except LookupError:
        raise YaxXMLError(f"The document declares the encoding `{name}`, which Python does not know.") from None
    if not getattr(info, "_is_text_encoding", True) or info.name.startswith(("utf-16", "utf-32")):
        raise YaxXMLError(
            f"The document declares the encoding `{name}`, but its first bytes are not in it; `dump_xml` "
            "writes UTF-8."
        )
    return "utf-8" if info.name == "utf-8" else info.name


def _utf8(chunks: Iterator[bytes | str]) -> Iterator[bytes]:
    """The document as UTF-8, whatever it was in: the parsers are then told
    UTF-8, so what `_prolog` checks is exactly what libxml2 reads."""
    head, first = b"", None
    it = iter(chunks)
    for chunk in it:
        if isinstance(chunk, str):  # a text file: already decoded
            first = chunk
            break
        head += chunk
        if len(head) >= 256:
            break
    if first is not None:
        yield _encode(head.decode("utf-8", "strict") if head else "")
        yield _encode(first)
        for chunk in it:
            yield _encode(chunk if isinstance(chunk, str) else chunk.decode("utf-8"))
        return
    codec = _encoding(head)
    if codec in ("utf-8", "utf-8-sig"):  # as it is: libxml2 checks that it is valid
        yield head
        yield from (c if isinstance(c, bytes) else _encode(c) for c in it)
        return
    decoder = codecs.getincrementaldecoder(codec)("strict")
    try:
        yield _encode(decoder.decode(head))
        for chunk in it:
            yield _encode(decoder.decode(chunk if isinstance(chunk, bytes) else chunk.encode("utf-8")))
        yield _encode(decoder.decode(b"", True))
    except UnicodeDecodeError as e:
        raise YaxXMLError(f"The document is not valid {codec}: {e.reason} at byte {e.start} of a chunk.") from None


def _encode(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise YaxXMLError("The document holds a lone surrogate, which is no character XML allows.") from None



def _prolog(buf: bytes, final: bool) -> int | None:
    """Where the root element starts in ``buf`` (UTF-8), or None while more
    bytes are needed. Before it XML allows only a declaration, processing
    instructions, comments, white space and a DTD: a DTD is refused here,
    before any parser sees it."""
    i, n = 3 if buf.startswith(b"\xef\xbb\xbf") else 0, len(buf)
    while True:
        while i < n and buf[i] in b" \t\r\n":
            i += 1
        if n - i < 4 and not final:
            return None
        if buf.startswith(b"<?", i):
            j = buf.find(b"?>", i + 2)
        elif buf.startswith(b"<!--", i):
            j = buf.find(b"-->", i + 4)
        elif buf.startswith(b"<!", i):
            raise DeclaresDTD()
        else:
            return i  # the root element, or text libxml2 will call malformed
        if j < 0:
            return None if not final else i
        i = j + (2 if buf[i + 1:i + 2] == b"?" else 3)


class _Budget:
    """The memory the parsed tree may take, estimated from what was fed."""

    def __init__(self, max_memory: int):
        self.max_memory, self.used = max_memory, 0

    def spend(self, chunk: bytes) -> None:
        self.used += len(chunk) + _NODE_BYTES * chunk.count(b"<") + _ATTR_BYTES * chunk.count(b"=")
        if self.used > self.max_memory:
            raise DocumentTooLarge("max_memory", self.max_memory, self.used)


def _checked(source: _Source, budget: _Budget) -> Iterator[bytes]:
    """UTF-8 chunks of the source, its prolog checked, its memory counted."""
    head, started = b"", False
    for chunk in _utf8(source.chunks()):
        if not started:
            head += chunk
            if len(head) > 4 * CHUNK:
                raise YaxXMLError("The document has more than 4 MiB before its root element; yax documents have none.")
            if _prolog(head, False) is None:
                continue
            chunk, started = head, True
        budget.spend(chunk)
        yield chunk
    if not started:
        _prolog(head, True)
        budget.spend(head)
        yield head


def _parse_libxml2(source: _Source, budget: _Budget) -> etree._Element:
    parser = etree.XMLParser(encoding="utf-8", huge_tree=True, resolve_entities=False, no_network=True,
                             load_dtd=False, dtd_validation=False, collect_ids=False)
    for chunk in _checked(source, budget):
        parser.feed(chunk)
    return parser.close()


def _parse_expat(source: _Source, budget: _Budget) -> etree._Element:
    """libxml2 parses at most 2048 levels deep; expat has no limit (slower)."""
    import xml.parsers.expat as expat

    builder = etree.TreeBuilder()
    p = expat.ParserCreate("UTF-8", "}")
    p.buffer_text = True

    def name(n: str) -> str:
        return "{" + n if "}" in n else n

    def refuse(*_: Any) -> NoReturn:
        raise DeclaresDTD()

    p.StartElementHandler = lambda tag, attrs: builder.start(name(tag), {name(k): v for k, v in attrs.items()})
    p.EndElementHandler = lambda tag: builder.end(name(tag))
    p.CharacterDataHandler, p.CommentHandler, p.ProcessingInstructionHandler = builder.data, builder.comment, builder.pi
    p.StartDoctypeDeclHandler = p.EntityDeclHandler = p.ExternalEntityRefHandler = refuse
    p.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    try:
        for chunk in _checked(source, budget):
            p.Parse(chunk, False)
        p.Parse(b"", True)
    except expat.ExpatError as e:
        raise NotWellFormed(str(e)) from None
    return builder.close()


def load_xml(source: IO[Any] | bytes | str | os.PathLike[str], *, max_bytes: int = MAX_BYTES,
             max_memory: int | None = None) -> Document:
    """Read a document written by `dump_xml`, safely for untrusted input.

    A DTD or entity declaration is refused before any parser sees it (in
    whatever encoding the document is), nothing is fetched, at most
    ``max_bytes`` are read (a file larger than that is refused unread), and
    parsing stops before the tree takes more than ``max_memory`` bytes
    (default ``MEMORY_PER_BYTE`` = 10 times ``max_bytes``; a `dump_xml`
    document takes 6 to 9 times its size). Any document `dump_xml` writes
    within those limits loads, however deep or long its leaf computations.

    Args:
      source: a binary or text file object, a path (``str`` or
        ``pathlib.Path``), or the document as ``bytes``/``bytearray``/``memoryview``.

    Raises:
      YaxXMLError: the input is too large, declares a DTD or entities, is not
        well-formed XML, or is not something to read.

    Example:
      >>> import io, jax.numpy as jnp, yax
      >>> buf = io.BytesIO()
      >>> yax.dump_xml(yax.make_mox(jnp.sin)(jnp.ones(2)), buf)
      >>> doc = yax.load_xml(buf.getvalue())
      >>> [e.get("primitive") for e in yax.query("//sin", doc)]
      ['sin']
    """
    for name, v in (("max_bytes", max_bytes), ("max_memory", max_memory)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise BadLimit(name, v)
    src = _Source(source, max_bytes)
    limit = MEMORY_PER_BYTE * max_bytes if max_memory is None else max_memory
    etree.clear_error_log()  # the log of this thread: from here on, this parse's errors
    try:
        root = _parse_libxml2(src, _Budget(limit))
    except etree.XMLSyntaxError as e:
        if "Excessive depth" not in str(e):
            first = next((f"{x.message}, line {x.line}, column {x.column}" for x in e.error_log
                          if x.level_name == "FATAL"), str(e))  # the cause: `e` may say "no element found"
            raise NotWellFormed(first) from None
        if not src.again():
            raise CannotRead("seek") from None
        root = _parse_expat(src, _Budget(limit))
    except (ValueError, TypeError) as e:  # lxml's checks of names and text, beyond libxml2's
        raise NotWellFormed(str(e)) from None
    return Document(etree.ElementTree(root))
