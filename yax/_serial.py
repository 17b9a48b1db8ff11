"""Plain-data views of a MoX: ``to_dict``, ``to_json`` and ``dump_yson``."""

from __future__ import annotations

import json
from typing import IO, Any

from ._ir import Equation, Mox, holds_mox
from ._print import Names, dtype_str, key_attrs, value_str
from .errors import YaxDependencyError


def _sym(names: Names, a: Any) -> dict[str, Any]:
    d = {"shape": list(a.shape), "dtype": dtype_str(a.dtype)}
    if hasattr(a, "val"):
        d["literal"] = value_str(a.val)
    else:
        d["var"] = names(a)
    return d


def to_dict(mox: Mox, names: Names | None = None) -> dict[str, Any]:
    """A JSON-ready dict of the tree: kinds, paths, types, attributes,
    shapes, parameter counts, equations with their nested computations."""
    names = names or Names()

    def node(n: Any) -> dict[str, Any]:
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
                d["subs"] = {k: node(s) for k, s in subs}
            return d
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
            "children": [node(c) for c in n.children],
        }
        return d

    return node(mox)


def to_json(mox: Mox, **kwargs: Any) -> str:
    """`to_dict` as JSON text (``json.dumps`` keyword arguments pass through)."""
    return json.dumps(to_dict(mox), **kwargs)


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
        raise YaxDependencyError(
            "`dump_yson` needs the YSON library from the `yson` extra, which is not installed. "
            "Install it with `pip install 'yax[yson]'` (it brings `ytsaurus-client`), or use "
            "`yax.dump_xml` or `mox.to_json()` instead."
        ) from None
    fileobj.write(yson.dumps(to_dict(mox), yson_format=format))
