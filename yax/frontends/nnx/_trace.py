"""Tracing flax.nnx modules.

nnx modules are plain Python objects: no interceptor sees their method calls and they leave JAX's name stack empty. While a trace runs, the
methods of every ``nnx.Module`` subclass (``__call__`` and public methods
defined in the class, as ``nnx.tabulate`` does) are wrapped to run through
`yax._record.marked_call`; the classes get their own functions back in a
``finally`` block, also when the trace fails half-way; a wrapped method
called outside a yax trace (another thread) just calls through. Classes are
shared by every thread, so traces running at once share the wrapping: the
first wraps, later ones join (and wrap classes defined since), the last one
to end unwraps (`_wrap_methods`, `_unwrap_methods`).

Paths come from attribute names (``Transformer/blocks/0/attn/query``).
Before the first call, each module object of the traced graph is *stamped*
with a static attribute holding ``(trace number, path)``. nnx transforms
(``nnx.scan``, ``vmap``, ``remat``, ``jit``) split modules into a graphdef
and a state and merge new objects inside; static attributes travel in the
graphdef, so the objects merged inside a scanned body still know their path.
The trace number keeps ``nnx.jit``'s cache from handing a later trace a body
traced (and marked) by an earlier one. Stamps put on objects the caller owns
are removed when the trace ends. An object two threads trace at once (a
model called in place from two traced functions) holds a stamp per trace:
the attribute is a tuple of ``(trace number, path, keys)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from ... import _activations
from ..._ir import Kind, ModuleInfo
from ..._patching import Patches
from ..._record import CallInfo, Recorder, marked_call, recorder
from ..._vocab import key_name
from ._base import NAME, flax_nnx, is_graph_leaf, is_graph_type, is_variable_type, nnx_loaded

# A prefix nnx keeps for its own bookkeeping: the bridge (`ToNNX`) reads every other attribute as a
# variable, and reprs leave it out; it still travels in the graphdef as a static attribute.
_STAMP = "_pytree__yax_call"
_tokens = itertools.count(1)


@dataclasses.dataclass
class _Trace:
    """What the nnx frontend keeps for one trace (in ``Recorder.scratch``)."""

    token: int
    stamped: list[Any] = dataclasses.field(default_factory=list)   # modules given a path
    memo: dict[int, tuple[Any, ...]] = dataclasses.field(default_factory=dict)  # id(module) -> its variables
    sizes: dict[int, int] = dataclasses.field(default_factory=dict)   # id(Param) -> its size


def _state(rec: Recorder | None) -> _Trace | None:
    return None if rec is None else rec.scratch.get("nnx")


# -- paths --------------------------------------------------------------------------

def stamp(root: Any, path: str, tr: _Trace, keys: tuple[str, ...] = ()) -> None:
    """Give every module of ``root``'s graph not stamped in this trace its path
    and its keys below the root (``root``'s: ``keys``; a key may hold ``/``):
    the first path to it in nnx's graph order (attributes sorted by name,
    depth first), as in ``nnx.iter_graph`` and ``nnx.split``'s state."""
    nnx = flax_nnx()
    seen: set[int] = set()

    def visit(node: Any, p: str, ks: tuple[str, ...]) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, nnx.Module):
            old = vars(node).get(_STAMP)
            if old is None:
                object.__setattr__(node, _STAMP, ((tr.token, p, ks),))
                tr.stamped.append(node)
            elif _stamp_of(old, tr.token) is None:  # stamped by a trace running in another thread
                object.__setattr__(node, _STAMP, (*old, (tr.token, p, ks)))
                tr.stamped.append(node)
        for k, v in sorted(vars(node).items(), key=lambda kv: _order(kv[0])):
            if is_graph_type(type(v)):  # type: ignore[arg-type]  # mypy#11470
                visit(v, f"{p}/{k}", (*ks, str(k)))

    with _lock:  # another thread's trace may stamp the same objects
        visit(root, path, keys)


def _stamp_of(st: tuple[tuple[Any, ...], ...] | None, token: int) -> tuple[Any, ...] | None:
    """This trace's ``(token, path, keys)`` among a module's stamps ``st``."""
    if st is not None:
        for s in st:
            if s[0] == token:
                return s
    return None


def _order(k: str) -> tuple[Any, ...]:
    """nnx sorts the items of an ``nnx.List`` (attributes ``"0"``, ``"1"``, …) as numbers."""
    return (0, int(k), "") if k.isdigit() else (1, 0, k)


def _unstamp(tr: _Trace) -> None:
    with _lock:
        for node in tr.stamped:
            st = vars(node).get(_STAMP)
            rest = tuple(s for s in st or () if s[0] != tr.token)
            if rest:
                object.__setattr__(node, _STAMP, rest)
            elif st is not None:
                vars(node).pop(_STAMP, None)
        tr.stamped.clear()


def _path(module: Any, rec: Recorder, tr: _Trace) -> tuple[str, tuple[str, ...]]:
    """The module's path in this trace and its keys below the root (its
    scope; the last one is its name)."""
    st = _stamp_of(vars(module).get(_STAMP), tr.token)
    if st is not None:
        return st[1], st[2]
    # Not stamped: the outermost module of functional code (``merge(g, s)(x)``),
    # or one made during the trace. Find it under its caller if it is there.
    name = type(module).__name__
    path, scope = name, ()
    if rec.stack:
        cid, parent = rec.stack[-1]
        ppath = rec.calls[cid].path
        st = _stamp_of(vars(parent).get(_STAMP), tr.token) if parent is not None else None
        pscope = st[2] if st is not None else tuple(ppath.split("/")[1:])
        path, scope = f"{ppath}/{name}", (*pscope, name)
        if parent is not None:
            for keys, node in flax_nnx().graph.iter_graph(parent):
                if node is module and keys:
                    path, scope = "/".join([ppath, *map(key_name, keys)]), (*pscope, *map(key_name, keys))
                    break
    else:
        owner = _owner(module)
        if owner is not None:  # a module of a graph called from outside it: ``m.left(x) + m.right(x)``
            root = owner[0]
            stamp(root, type(root).__name__, tr)
            st = _stamp_of(vars(module).get(_STAMP), tr.token)
            if st is not None:
                if rec.root_name is None:
                    rec.root_name = type(root).__name__
                return st[1], st[2]
        if rec.root_name is None:
            rec.root_name = name
    stamp(module, path, tr, scope)
    return path, scope


def _owner(module: Any) -> tuple[Any, tuple[str, ...]] | None:
    """The module whose graph holds ``module`` (called outside any call: functional code merging a
    model and calling its parts, ``m.left(x) + m.right(x)``), and the keys down to it; ``None`` when
    nothing holds it or more than one object does (then the module is named by its class).
    nnx objects hold no parent: the holders are found among the objects referring to each
    ancestor's instance dict (the garbage collector's referrers, once per such call)."""
    import gc

    keys: list[str] = []
    node, seen = module, {id(module)}
    while True:
        refs = gc.get_referrers(node)
        holders = [r for r in refs if type(r) is not dict]  # objects holding their attributes inline
        dicts = {id(r): r for r in refs if type(r) is dict}  # instance dicts, or any dict: owners count
        if dicts:  # one more scan for all of them
            holders += [h for h in gc.get_referrers(*dicts.values()) if id(getattr(h, "__dict__", None)) in dicts]
        parents = [(h, k) for h in {id(h): h for h in holders}.values() if is_graph_type(type(h))  # type: ignore[arg-type]
                   for k, v in vars(h).items() if v is node]
        if len(parents) != 1 or id(parents[0][0]) in seen:
            break
        node, key = parents[0]
        seen.add(id(node))
        keys.append(str(key))
    return (node, tuple(reversed(keys))) if keys else None


# -- what a call node records -----------------------------------------------------------

_PRINTABLE = (bool, int, float, str, type(None), np.dtype, type, jax.sharding.PartitionSpec)  # a layer's sharding spec


def _printable(v: Any) -> bool:
    if isinstance(v, _PRINTABLE):
        return True
    if isinstance(v, tuple):
        return all(_printable(x) for x in v)
    return callable(v) and not is_graph_leaf(v) and not isinstance(v, jax.Array)


def module_attrs(module: Any) -> dict[str, Any]:
    """The configuration of an nnx module: its public attributes that are not
    variables, arrays or other modules (``in_features``, ``rate``, ``kernel_init``)."""
    return {k: v for k, v in sorted(vars(module).items()) if not k.startswith("_") and _printable(v)}


def _entries(x: Any) -> list[tuple[str, Any]]:
    """The attributes of an nnx object, or the entries of a plain dict, list or tuple
    in it (nnx walks those too: a ``ToNNX`` bridge keeps a linen submodule's variables
    in a dict attribute)."""
    if type(x) is dict:
        return sorted(((str(k), v) for k, v in x.items()), key=lambda kv: kv[0])
    if type(x) in (list, tuple):
        return [(str(i), v) for i, v in enumerate(x)]
    return sorted(vars(x).items())


def _collect(module: Any, memo: dict[int, tuple[set[int], int, dict[Any, Any]]],
             sizes: dict[int, int]) -> tuple[set[int], int, dict[Any, Any]]:
    """The ids of the variables below ``module``, its parameter count and its
    variables (abstract, as nested dicts by attribute). Memoised per object
    for the trace (shapes do not change while it runs): a parent reuses its
    children's, so a trace does this once per module. A variable reached
    twice (a shared submodule) is counted once."""
    hit = memo.get(id(module))
    if hit is not None:
        return hit
    ids: set[int] = set()
    n = 0
    tree: dict[str, Any] = {}
    for k, v in _entries(module):
        if is_variable_type(type(v)):  # type: ignore[arg-type]  # mypy#11470
            x = v.get_value()
            tree[k] = jax.ShapeDtypeStruct(np.shape(x), x.dtype) if hasattr(x, "dtype") else x
            if id(v) not in ids:
                ids.add(id(v))
                size = int(np.prod(np.shape(x))) if issubclass(type(v), flax_nnx().Param) else 0
                sizes[id(v)] = size
                n += size
        elif is_graph_type(type(v)) or type(v) in (dict, list, tuple):  # type: ignore[arg-type]  # mypy#11470
            c_ids, c_n, c_tree = _collect(v, memo, sizes)
            if c_tree:
                tree[k] = c_tree
            n += c_n if ids.isdisjoint(c_ids) else sum(sizes[i] for i in c_ids - ids)
            ids |= c_ids
    memo[id(module)] = out = (ids, n, tree)
    return out


# -- method wrappers ----------------------------------------------------------------

def _activation_holders(module: Any) -> list[tuple[dict[str, Any], str]]:
    """Attributes that may hold an activation bound before the trace
    (``self.act = nnx.gelu``, the items of ``nnx.Sequential``'s list)."""
    nnx = flax_nnx()
    d = vars(module)
    out = [(d, k) for k in d]
    out += [(vars(v), k2) for v in d.values() if type(v) is nnx.List for k2 in vars(v)]
    return out


def _dict_get(d: dict[str, Any], k: str) -> Any:
    return d[k]


def _dict_put(d: dict[str, Any], k: str, v: Any) -> None:
    d[k] = v


def _wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec = recorder()
        tr = _state(rec)
        if rec is None or tr is None:
            return fn(self, *args, **kwargs)
        same = bool(rec.stack) and rec.stack[-1][1] is self
        if same and rec.calls[rec.stack[-1][0]].info.method == name:
            return fn(self, *args, **kwargs)  # `super().__call__(x)`: part of the same call
        path, scope = _path(self, rec, tr)
        call = CallInfo(kind=Kind.METHOD_CALL if same else Kind.MODULE_CALL, path=path,
                        name=scope[-1] if scope else path, module=self,
                        info=ModuleInfo(type=type(self), method=name))  # read by nested calls
        undo = _activations.swapped(_activation_holders(self), _dict_get, _dict_put)
        try:
            out = marked_call(call, lambda *a, **k: fn(self, *a, **k), args, kwargs, is_leaf=is_graph_leaf)
        finally:
            _activations.restore(undo, _dict_put)
        _, n, tree = _collect(self, tr.memo, tr.sizes)
        call.info = ModuleInfo(type=type(self), method=name, attrs=module_attrs(self),
                               defaults=init_defaults(type(self)),  # type: ignore[arg-type]  # mypy#11470
                               num_params=n, var_tree=tree, scope=scope, frontend=NAME)
        return out

    method.__yax_method__ = fn  # type: ignore[attr-defined]
    return method


def _classes() -> list[type]:
    nnx = flax_nnx()
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


#: The wrapped methods; its lock guards what else traces in several threads share: the stamps.
_patches = Patches()
_lock = _patches.lock


@contextlib.contextmanager
def patched_methods(rec: Recorder) -> Iterator[None]:
    """Wrap the methods of every ``nnx.Module`` subclass for one trace
    (while any trace in any thread runs)."""
    if not nnx_loaded():
        yield
        return
    tr = rec.scratch["nnx"] = _Trace(next(_tokens))
    try:
        with _patches.wrapped(_unwrapped, _wrap):
            yield
    finally:
        _unstamp(tr)


def _unwrapped() -> Iterator[tuple[type, str, Callable[..., Any]]]:
    """What is not wrapped yet: every method for the first of traces running at once, the
    classes defined since for a later one."""
    for cls in _classes():
        for name, fn in list(vars(cls).items()):
            if (name == "__call__" or not name.startswith("_")) and inspect.isfunction(fn) \
                    and not hasattr(fn, "__yax_method__"):
                yield cls, name, fn


@functools.cache
def init_defaults(cls: type[Any]) -> dict[str, Any]:
    try:
        params = inspect.signature(cls.__init__).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


# -- make_mox(model) ------------------------------------------------------------------

def module_target(module: Any, method: str = "__call__") -> tuple[Callable[..., Any], Any, Any]:
    """The pure function traced for ``make_mox(model)``:
    ``f(state, *args, **kwargs) -> (out, new_state)``, the graphdef and the state."""
    nnx = flax_nnx()
    graphdef, state = nnx.split(module)
    root = type(module).__name__

    def pure(state: Any, *args: Any, **kwargs: Any) -> Any:
        m = nnx.merge(graphdef, state)
        rec = recorder()
        tr = _state(rec)
        if rec is not None and tr is not None:
            rec.root_name = root
            stamp(m, root, tr)
        out = getattr(m, method)(*args, **kwargs)
        return out, nnx.state(m)

    pure.__name__ = pure.__qualname__ = root
    return pure, graphdef, state


def _shape_of(x: Any) -> Any:
    """Trace the model's state abstractly, whatever its leaves are."""
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype) if hasattr(x, "dtype") else x


