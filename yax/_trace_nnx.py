"""Tracing flax.nnx modules: call markers without a name stack.

nnx modules are plain Python objects: no interceptor sees their method
calls, and they leave JAX's name stack empty. While a trace runs, yax
therefore wraps the methods of every ``nnx.Module`` subclass (``__call__``
and public methods defined in the class, like ``nnx.tabulate`` does) with a
function that puts the same ``yax_in_N``/``yax_out_N`` markers as for linen
around the call (`_trace.marked_call`). The classes get their own functions
back in a ``finally`` block, also when the trace fails half-way; a wrapped
method called outside a yax trace (another thread) just calls through.

Paths come from attribute names (``Transformer/blocks/0/attn/query``).
Before the first call, yax *stamps* each module object of the traced graph
with a static attribute holding ``(trace number, path)``. nnx transforms
(``nnx.scan``, ``nnx.vmap``, ``nnx.remat``, ``nnx.jit``) split modules into a
graphdef and a state and merge new objects inside; static attributes travel
in the graphdef, so the objects merged inside a scanned body still know
their path. The trace number keeps ``nnx.jit``'s cache from handing a later
trace a body traced (and marked) by an earlier one. Stamps put on objects
the caller owns are removed when the trace ends.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ._trace import CallInfo, Recorder, _abstract, _activation_table, _recorder, _swap, marked_call

_STAMP = "_yax_call"
_tokens = itertools.count(1)


def nnx_loaded() -> bool:
    return "flax.nnx" in sys.modules


def is_module(x: Any) -> bool:
    if not nnx_loaded():
        return False
    from flax import nnx

    return isinstance(x, nnx.Module)


def is_graph_leaf(x: Any) -> bool:
    """nnx objects (modules, ``Rngs``, ``Variable``) passed to or returned by a
    method are kept whole: flattening them would hand the method copies, and
    its updates (an RNG counter) would be lost."""
    from flax import nnx

    return isinstance(x, (nnx.Pytree, nnx.Variable))


# -- paths --------------------------------------------------------------------------

def _key(k: Any) -> str:
    return str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))


def stamp(root: Any, path: str, rec: Recorder) -> None:
    """Give every module of ``root``'s graph not stamped in this trace its path."""
    from flax import nnx

    for keys, node in nnx.graph.iter_graph(root):
        if not isinstance(node, nnx.Module):
            continue
        old = vars(node).get(_STAMP)
        if old is not None and old[0] == rec.token:
            continue
        p = "/".join([path, *map(_key, keys)]) if keys else path
        object.__setattr__(node, _STAMP, (rec.token, p))
        rec.stamped.append(node)


def unstamp(rec: Recorder) -> None:
    for node in rec.stamped:
        if vars(node).get(_STAMP, (None,))[0] == rec.token:
            vars(node).pop(_STAMP, None)
    rec.stamped.clear()


def _path(module: Any, rec: Recorder) -> str:
    st = vars(module).get(_STAMP)
    if st is not None and st[0] == rec.token:
        return st[1]
    # Not stamped: the outermost module of functional code (``merge(g, s)(x)``),
    # or one made during the trace. Find it under its caller if it is there.
    from flax import nnx

    name = type(module).__name__
    path = name
    if rec.stack:
        cid, parent = rec.stack[-1]
        ppath = rec.calls[cid].path
        path = f"{ppath}/{name}"
        if parent is not None:
            for keys, node in nnx.graph.iter_graph(parent):
                if node is module and keys:
                    path = "/".join([ppath, *map(_key, keys)])
                    break
    elif rec.root_name is None:
        rec.root_name = name
    stamp(module, path, rec)
    return path


# -- what a call node records -----------------------------------------------------------

_PRINTABLE = (bool, int, float, str, type(None), np.dtype, type)


def _printable(v: Any) -> bool:
    if isinstance(v, _PRINTABLE):
        return True
    if isinstance(v, tuple):
        return all(_printable(x) for x in v)
    return callable(v) and not is_graph_leaf(v) and not isinstance(v, jax.Array)


def module_attrs(module: Any) -> dict[str, Any]:
    """The configuration of an nnx module: its public attributes that are not
    variables, arrays or other modules (``in_features``, ``rate``, ``kernel_init``)."""
    return {k: v for k, v in sorted(vars(module).items())
            if not k.startswith("_") and _printable(v)}


def _variables(module: Any) -> tuple[int, Any]:
    from flax import nnx

    params = nnx.state(module, nnx.Param)
    n = sum(int(np.prod(np.shape(x))) for x in jax.tree_util.tree_leaves(params))
    return n, _abstract(nnx.to_pure_dict(nnx.state(module)))


# -- method wrappers ----------------------------------------------------------------

@contextlib.contextmanager
def _swap_activation_attrs(module: Any):
    """Attributes holding an activation (``self.act = nnx.gelu``, the items of
    ``nnx.Sequential``'s list) were bound before the trace; point them at the
    marking wrapper for the call, and put them back after."""
    from flax import nnx

    table = _activation_table()
    undo = []
    try:
        holders = [module] + [v for v in vars(module).values() if isinstance(v, nnx.List)]
        for h in holders:
            d = vars(h)
            for k, v in list(d.items()):
                if k.startswith("_") or not callable(v):
                    continue
                w = _swap(table, v)
                if w is not v:
                    undo.append((d, k, v))
                    d[k] = w
        yield
    finally:
        for d, k, v in reversed(undo):
            d[k] = v


def _wrap(name: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec = _recorder()
        if rec is None or rec.token is None:
            return fn(self, *args, **kwargs)
        same = bool(rec.stack) and rec.stack[-1][1] is self
        if same and rec.calls[rec.stack[-1][0]].method == name:
            return fn(self, *args, **kwargs)  # `super().__call__(x)`: part of the same call
        path = _path(self, rec)
        info = CallInfo(
            kind="method_call" if same else "module_call",
            path=path,
            name=path.rsplit("/", 1)[-1],
            module_type=type(self),
            method=name,
            attrs=module_attrs(self),
            scope=tuple(path.split("/")[1:]),
        )
        info._module = self  # type: ignore[attr-defined]
        with _swap_activation_attrs(self):
            out = marked_call(info, lambda *a, **k: fn(self, *a, **k), args, kwargs, is_leaf=is_graph_leaf)
        info.num_params, info.var_tree = _variables(self)
        return out

    method.__yax_method__ = fn  # type: ignore[attr-defined]
    return method


def _classes() -> list[type]:
    from flax import nnx

    skip = {nnx.List, nnx.Dict}
    out, todo = [], [nnx.Module]
    seen = set()
    while todo:
        for c in todo.pop().__subclasses__():
            if c not in seen:
                seen.add(c)
                todo.append(c)
                if c not in skip:
                    out.append(c)
    return out


@contextlib.contextmanager
def patched_methods(rec: Recorder):
    """Wrap the methods of every ``nnx.Module`` subclass for one trace."""
    if not nnx_loaded():
        yield
        return
    rec.token = next(_tokens)
    undo = []
    try:
        for cls in _classes():
            for name, fn in list(vars(cls).items()):
                if (name == "__call__" or not name.startswith("_")) and inspect.isfunction(fn) \
                        and not hasattr(fn, "__yax_method__"):
                    undo.append((cls, name, fn))
                    setattr(cls, name, _wrap(name, fn))
        yield
    finally:
        for cls, name, fn in reversed(undo):
            setattr(cls, name, fn)
        unstamp(rec)


# -- make_mox(model) ------------------------------------------------------------------

def module_target(module: Any, method: str = "__call__") -> tuple[Callable, Any]:
    """The pure function traced for ``make_mox(model)``:
    ``f(state, *args, **kwargs) -> (out, new_state)`` and the graphdef."""
    from flax import nnx

    graphdef, state = nnx.split(module)
    root = type(module).__name__

    def pure(state: Any, *args: Any, **kwargs: Any) -> Any:
        m = nnx.merge(graphdef, state)
        rec = _recorder()
        if rec is not None and rec.token is not None:
            rec.root_name = root
            stamp(m, root, rec)
        out = getattr(m, method)(*args, **kwargs)
        return out, nnx.state(m)

    pure.__name__ = pure.__qualname__ = root
    return pure, graphdef, state
