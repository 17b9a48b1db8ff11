"""Plain-data views of a MoX: ``to_dict`` / ``to_json``."""

from __future__ import annotations

import json
from typing import Any

from ._ir import Equation, Mox, holds_mox
from ._print import Names, dtype_str, key_attrs, value_str


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
