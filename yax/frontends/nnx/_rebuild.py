"""A new nnx module like the one a call node called (`NnxFrontend.rebuild`,
behind `yax.module_of`).

An nnx module is built by its constructor, not from its fields: yax calls
``type(**arguments)`` with each constructor parameter read from the node's
attribute of the same name (``nnx.Linear(in_features=…, out_features=…,
use_bias=…, dtype=…)``), ``rngs=nnx.Rngs(0)`` (the new module's own
variables are placeholders: `yax.sub` keeps the replaced layer's values), and
the changes asked for. It then checks that the result is the module the node
called: every attribute the node recorded must come out the same, or yax
says which did not (a constructor that stores its arguments under other names
cannot be rebuilt this way).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from ..._ir import Mox
from ...errors import YaxRewriteError
from ._base import flax_nnx, is_module_type
from ._trace import module_attrs


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def rebuild(node: Mox, changes: Mapping[str, Any] | None = None) -> Any:
    """The nnx module ``node`` called, rebuilt from its attributes, with ``changes``
    (constructor arguments); ``None`` when ``node`` did not call an nnx module."""
    t = node.module_type
    if not is_module_type(t):
        return None
    changes = dict(changes or {})
    try:
        params = [p for p in inspect.signature(t.__init__).parameters.values()][1:]
    except (TypeError, ValueError):
        params = []
    named = {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = sorted(set(changes) - set(named) - {"rngs"})
    if unknown:
        raise YaxRewriteError(
            f"`module_of` passes changes to the constructor of the `{t.__name__}` at {node.path!r}, which takes "
            f"no {', '.join(f'`{k}`' for k in unknown)}. It takes: {', '.join(n for n in named if n != 'rngs')}.")
    args: dict[str, Any] = {}
    missing = []
    for name, p in named.items():
        if name == "rngs":
            continue  # a fresh `nnx.Rngs(0)` for each build
        if name in node.attrs:
            args[name] = node.attrs[name]
        elif p.default is p.empty:
            missing.append(name)
    if missing:
        raise YaxRewriteError(
            f"`module_of` rebuilds the `{t.__name__}` at {node.path!r} from its constructor, but the call recorded "
            f"no attribute for its argument{'s' if len(missing) > 1 else ''} {', '.join(f'`{k}`' for k in missing)} "
            f"(the module keeps {'them' if len(missing) > 1 else 'it'} under another name, or not at all). "
            f"Build the replacement yourself: `{t.__name__}(...)`.")
    nnx = flax_nnx()
    rngs = {"rngs": nnx.Rngs(0)} if "rngs" in named else {}
    again = nnx.eval_shape(lambda: t(**args, **({"rngs": nnx.Rngs(0)} if rngs else {})))
    differ = [k for k, v in node.attrs.items() if not _same(module_attrs(again).get(k, _MISSING), v)]
    if differ:
        raise YaxRewriteError(
            f"`module_of` rebuilt the `{t.__name__}` at {node.path!r} from its constructor, but the result differs "
            f"from the module called in {', '.join(f'`{k}`' for k in differ)} (its constructor does not store its "
            f"arguments under their own names). Build the replacement yourself: `{t.__name__}(...)`.")
    return t(**{**args, **rngs, **changes})


_MISSING = object()
