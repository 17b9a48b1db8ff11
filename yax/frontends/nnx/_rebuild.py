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

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax

from ..._ir import Mox
from ...errors import CannotRebuild, UnknownFields
from ._base import flax_nnx, is_module_type
from ._trace import module_attrs


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def builder(node: Mox) -> Callable[..., Any] | str:
    """``type(**arguments)`` for the nnx module ``node`` called, every argument
    read from the node's attribute of the same name (give it ``rngs=``), or why
    it cannot be: an argument the node did not record, or a rebuilt module whose
    attributes or variable shapes differ from the recorded ones (a constructor
    storing its arguments under other names, a Conv's array ``mask``)."""
    t = node.module_type
    assert t is not None
    try:
        params = list(inspect.signature(t.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        params = []
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "rngs"]
    missing = [p.name for p in named if p.name not in node.attrs and p.default is p.empty]
    if missing:
        return (f"no recorded attribute for its argument{'s' if len(missing) > 1 else ''} "
                f"{', '.join(f'`{k}`' for k in missing)} (the module keeps {'them' if len(missing) > 1 else 'it'} "
                "under another name, or not at all)")
    build = functools.partial(t, **{p.name: node.attrs[p.name] for p in named if p.name in node.attrs})
    nnx = flax_nnx()
    try:
        again = nnx.eval_shape(lambda: build(rngs=nnx.Rngs(0)))
    except Exception as e:
        return f"attributes its constructor does not take back ({type(e).__name__}: {e})"
    mine, theirs = module_attrs(again), dict(node.attrs)
    differ = sorted(k for k in {*mine, *theirs} if not _same(mine.get(k, _MISSING), theirs.get(k, _MISSING)))
    if differ:
        return (f"attributes that come out different when rebuilt from its constructor "
                f"({', '.join(f'`{k}`' for k in differ)})")
    shapes, recorded = _shapes(nnx.state(again)), _shapes(node.var_tree)
    other = sorted(k for k, v in recorded.items() if shapes.get(k, v) != v or k not in shapes)
    if other:
        return (f"variables that come out otherwise when rebuilt from its constructor "
                f"({', '.join(f'`{k}`' for k in other)})")
    return build


def _shapes(tree: Any) -> dict[str, Any]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in kp if getattr(k, "name", None) != "value"):
            (tuple(x.shape), str(x.dtype)) for kp, x in flat if hasattr(x, "shape")}


def rebuild(node: Mox, changes: Mapping[str, Any] | None = None) -> Any:
    """The nnx module ``node`` called, rebuilt from its attributes, with ``changes``
    (constructor arguments); ``None`` when ``node`` did not call an nnx module."""
    t = node.module_type
    if not is_module_type(t):
        return None
    changes = dict(changes or {})
    try:
        takes = [n for n in list(inspect.signature(t.__init__).parameters)[1:] if n != "rngs"]
    except (TypeError, ValueError):
        takes = []
    unknown = sorted(set(changes) - set(takes))
    if unknown:
        raise UnknownFields(t.__name__, node.path, unknown, takes, "constructor argument")
    build = builder(node)
    if isinstance(build, str):
        raise CannotRebuild(t.__name__, node.path, f"it has {build}",
                            f"Build the replacement yourself: `{t.__name__}(...)`.")
    return build(rngs=flax_nnx().Rngs(0), **changes)


_MISSING = object()
