"""Plain-data views of a MoX: ``to_dict``, ``to_json`` and ``dump_yson``."""

from __future__ import annotations

import json
from typing import IO, Any

from ._ir import Equation, Mox, delegate, holds_mox
from ._print import Names, key_attrs
from ._vocab import dtype_str, value_str
from .errors import MissingDependency


def _sym(names: Names, a: Any) -> dict[str, Any]:
    d = {"shape": list(a.shape), "dtype": dtype_str(a.dtype)}
    if hasattr(a, "val"):
        d["literal"] = value_str(a.val)
    else:
        d["var"] = names(a)
    return d


@delegate("to_dict")
def to_dict(mox: Mox, names: Names | None = None) -> dict[str, Any]:
    """A JSON-ready dict of the tree: kinds, paths, types, attributes,
    shapes, parameter counts, equations with their nested computations.
    Built without recursion: a MoX of any depth converts."""
    names = names or Names()

    def node(n: Any) -> tuple[dict[str, Any], list[tuple[Any, Any, Any]]]:
        """The dict of ``n`` and where its children's dicts go: (container, key, child)."""
        d: dict[str, Any]
        if isinstance(n, Equation):
            d = {
                "kind": "equation",
                "primitive": n.name,
                "path": n.path,
                "inputs": [_sym(names, a) for a in n.inputs],
                "outputs": [_sym(names, a) for a in n.outputs],
                "params": {k: value_str(v) for k, v in n.params.items() if not holds_mox(v)},
            }
            subs = n.subs
            if subs:
                d["subs"] = {}
            return d, [(d["subs"], k, s) for k, s in subs]
        d = {
            "kind": n.kind,
            "path": n.path,
            "name": n.name,
            "type": n.type,
            "method": n.method,
            "attrs": {k: value_str(v) for k, v in key_attrs(n).items()},
            "params": n.num_params,
            "inputs": [_sym(names, a) for a in n.inputs],
            "outputs": [_sym(names, a) for a in n.outputs],
            "children": [None] * len(n.children),
        }
        return d, [(d["children"], i, c) for i, c in enumerate(n.children)]

    top, todo = node(mox)
    todo.reverse()
    # not `_calls.visit`: each dict is filled into its holder's slot as the tree is rebuilt
    while todo:  # depth first, in document order: vars are named as the printer names them
        into, key, n = todo.pop()
        into[key], below = node(n)
        todo.extend(reversed(below))
    return top


# -- writing nested data without recursion (json's and yt's writers recurse) -----------

def _write(obj: Any, lay: Any) -> list[Any]:
    """The pieces of the text of ``obj`` (dicts, lists and scalars), laid out
    by ``lay``: ``open(is_map)``, ``before(level, count)`` (ahead of an item
    at ``level`` after ``count`` others), ``key(k)`` (with what follows a
    key), ``after`` (behind each item), ``close(level, is_map, count)``, and
    ``scalar(x)``."""
    out: list[Any] = []
    stack: list[list[Any]] = []  # [items left, is a map, level, items written, what follows it]

    def value(v: Any, level: int, after: Any) -> None:
        if isinstance(v, (dict, list, tuple)):
            is_map = isinstance(v, dict)
            out.append(lay.open(is_map))
            stack.append([iter(lay.items(v) if is_map else v), is_map, level, 0, after])
        else:
            out.append(lay.scalar(v))
            out.append(after)

    value(obj, 0, lay.empty)
    while stack:
        frame = stack[-1]
        items, is_map, level, count, after = frame
        item: Any = next(items, _END)
        if item is _END:
            stack.pop()
            out.append(lay.close(level, is_map, count))
            out.append(after)
            continue
        frame[3] += 1
        out.append(lay.before(level + 1, count))
        if is_map:
            out.append(lay.key(item[0]))
            item = item[1]
        value(item, level + 1, lay.after)
    return out


_END = object()


class _Json:
    """`json.dumps`'s layout, for its keyword arguments."""

    empty = after = ""

    def __init__(self, indent: Any = None, separators: Any = None, sort_keys: bool = False, cls: Any = None,
                 **kwargs: Any):
        if isinstance(indent, int) and not isinstance(indent, bool):
            indent = " " * indent
        self.indent = indent
        seps: tuple[str, str] = separators or ((",", ": ") if indent is not None else (", ", ": "))
        self.item_sep, self.key_sep = seps
        self.sort_keys = sort_keys
        self.encoder = (cls or json.JSONEncoder)(sort_keys=sort_keys, indent=None, **kwargs)

    def items(self, d: dict[str, Any]) -> Any:
        return sorted(d.items()) if self.sort_keys else d.items()

    def open(self, is_map: bool) -> str:
        return "{" if is_map else "["

    def before(self, level: int, count: int) -> str:
        sep = self.item_sep if count else ""
        return sep if self.indent is None else f"{sep}\n{self.indent * level}"

    def key(self, k: Any) -> str:
        return self.encoder.encode(k) + self.key_sep

    def close(self, level: int, is_map: bool, count: int) -> str:
        end = "}" if is_map else "]"
        return end if self.indent is None or not count else f"\n{self.indent * level}{end}"

    def scalar(self, x: Any) -> str:
        return self.encoder.encode(x)


class _Yson:
    """yt's YSON layout (``binary``, ``text`` or ``pretty``, 4 spaces)."""

    empty = b""

    def __init__(self, yson: Any, fmt: str):
        self.yson, self.fmt, self.pretty = yson, fmt, fmt == "pretty"
        self.after = b";\n" if self.pretty else b";"
        self.memo: dict[tuple[type, Any], bytes] = {}

    @staticmethod
    def items(d: dict[str, Any]) -> Any:
        return d.items()

    def open(self, is_map: bool) -> bytes:
        return (b"{" if is_map else b"[") + (b"\n" if self.pretty else b"")

    def before(self, level: int, count: int) -> bytes:
        return b"    " * level if self.pretty else b""

    def key(self, k: Any) -> bytes:
        return self.scalar(k) + (b" = " if self.pretty else b"=")

    def close(self, level: int, is_map: bool, count: int) -> bytes:
        return (b"    " * level if self.pretty else b"") + (b"}" if is_map else b"]")

    def scalar(self, x: Any) -> bytes:
        k = (type(x), x)  # True and 1 are different leaves
        b = self.memo.get(k)
        if b is None:
            b = self.yson.dumps(x, yson_format=self.fmt)
            if len(self.memo) < 65536:
                self.memo[k] = b
        return b


@delegate("to_json")
def to_json(mox: Mox, **kwargs: Any) -> str:
    """`to_dict` as JSON text (``json.dumps`` keyword arguments pass through:
    ``indent``, ``separators``, ``sort_keys``, ``ensure_ascii`` …), written
    without recursion so that a MoX of any depth converts."""
    return "".join(_write(to_dict(mox), _Json(**kwargs)))


YSON_FORMATS = ("binary", "text", "pretty")


def dump_yson(mox: Mox, fileobj: IO[bytes], *, format: str = "pretty") -> None:
    """Write `to_dict` of ``mox`` as YSON (``format``: ``"binary"``,
    ``"text"`` or ``"pretty"``) to a binary file object. Needs the ``yson``
    extra (``pip install 'yax[yson]'``, which installs ``ytsaurus-client``).

    Raises:
      YaxDependencyError: the YSON library is not installed.
      ValueError: an unknown ``format``.
    """
    if format not in YSON_FORMATS:
        raise ValueError(f"`format` must be one of {YSON_FORMATS}, but got {format!r}.")
    try:
        import yt.yson as yson
    except ImportError:
        raise MissingDependency("`dump_yson`", "the YSON library from the `yson` extra",
                                "`pip install 'yax[yson]'` (it brings `ytsaurus-client`)",
                                "Or use `yax.dump_xml` or `mox.to_json()` instead.") from None
    fileobj.write(b"".join(_write(to_dict(mox), _Yson(yson, format))))
