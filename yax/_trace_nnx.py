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

from ._trace import CallInfo, Recorder, _activation_table, _recorder, marked_call

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
    return _kind(type(x)) != 0


@functools.cache
def _kind(t: type) -> int:
    """1 for ``nnx.Variable`` types, 2 for other nnx graph objects, 0 otherwise.
    By type, cached: ``isinstance`` against nnx's classes runs Python code
    (``Variable``'s metaclass), and tracing asks thousands of times."""
    from flax import nnx

    if issubclass(t, nnx.Variable):
        return 1
    return 2 if issubclass(t, nnx.Pytree) else 0


# -- paths --------------------------------------------------------------------------

def _key(k: Any) -> str:
    return str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))


def stamp(root: Any, path: str, rec: Recorder) -> None:
    """Give every module of ``root``'s graph not stamped in this trace its path:
    the first path to it in nnx's graph order (attributes sorted by name,
    depth first), as in ``nnx.iter_graph`` and ``nnx.split``'s state."""
    from flax import nnx

    seen: set[int] = set()

    def visit(node: Any, p: str) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, nnx.Module):
            old = vars(node).get(_STAMP)
            if old is None or old[0] != rec.token:
                object.__setattr__(node, _STAMP, (rec.token, p))
                rec.stamped.append(node)
        for k, v in sorted(vars(node).items(), key=lambda kv: _order(kv[0])):
            if _kind(type(v)) == 2:
                visit(v, f"{p}/{k}")

    visit(root, path)


def _order(k: str) -> tuple:
    """nnx sorts the items of an ``nnx.List`` (attributes ``"0"``, ``"1"``, …) as numbers."""
    return (0, int(k), "") if k.isdigit() else (1, 0, k)


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
    return callable(v) and _kind(type(v)) == 0 and not isinstance(v, jax.Array)


def module_attrs(module: Any) -> dict[str, Any]:
    """The configuration of an nnx module: its public attributes that are not
    variables, arrays or other modules (``in_features``, ``rate``, ``kernel_init``)."""
    return {k: v for k, v in sorted(vars(module).items())
            if not k.startswith("_") and _printable(v)}


def _variables(module: Any, rec: Recorder) -> tuple[int, Any]:
    """The parameter count and the variables (abstract, as nested dicts by
    attribute) of a module. Memoised per object for the trace (shapes do not
    change while it runs): a parent reuses its children's, so a trace does
    this once per module. A variable reached twice (a shared submodule) is
    counted once."""
    return _vars(module, rec.memo, rec.sizes)[1:]


def _vars(module: Any, memo: dict, sizes: dict) -> tuple[set[int], int, dict]:
    from flax import nnx

    hit = memo.get(id(module))
    if hit is not None:
        return hit
    ids: set[int] = set()
    n = 0
    tree: dict[str, Any] = {}
    for k, v in sorted(vars(module).items()):
        kind = _kind(type(v))
        if kind == 1:
            x = v.get_value()
            tree[k] = jax.ShapeDtypeStruct(np.shape(x), x.dtype) if hasattr(x, "dtype") else x
            if id(v) not in ids:
                ids.add(id(v))
                size = int(np.prod(np.shape(x))) if issubclass(type(v), nnx.Param) else 0
                sizes[id(v)] = size
                n += size
        elif kind == 2:
            c_ids, c_n, c_tree = _vars(v, memo, sizes)
            if c_tree:
                tree[k] = c_tree
            if ids.isdisjoint(c_ids):
                n += c_n
            else:
                n += sum(sizes[i] for i in c_ids - ids)
            ids |= c_ids
    memo[id(module)] = out = (ids, n, tree)
    return out


# -- method wrappers ----------------------------------------------------------------

def _swap_activation_attrs(module: Any) -> list[tuple[dict, str, Any]]:
    """Attributes holding an activation (``self.act = nnx.gelu``, the items of
    ``nnx.Sequential``'s list) were bound before the trace: point them at the
    marking wrapper for the call. Returns what `_restore` puts back."""
    from flax import nnx

    table = _activation_table()
    undo = []
    d = vars(module)
    for k, v in d.items():
        hit = table.get(id(v))
        if hit is not None and hit[1] is v:
            undo.append((d, k, v))
        elif type(v) is nnx.List:
            for k2, v2 in vars(v).items():
                hit = table.get(id(v2))
                if hit is not None and hit[1] is v2:
                    undo.append((vars(v), k2, v2))
    for holder, k, v in undo:
        holder[k] = table[id(v)][2]
    return undo


def _restore(undo: list[tuple[dict, str, Any]]) -> None:
    for holder, k, v in reversed(undo):
        holder[k] = v


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
        undo = _swap_activation_attrs(self)
        try:
            out = marked_call(info, lambda *a, **k: fn(self, *a, **k), args, kwargs, is_leaf=is_graph_leaf)
        finally:
            _restore(undo)
        info.num_params, info.var_tree = _variables(self, rec)
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
