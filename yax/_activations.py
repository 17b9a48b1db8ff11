"""Activation functions as call nodes (``jax.nn.gelu`` -> an ``activation``).

Activations are plain functions, reached by name (``jax.nn.gelu``,
``nn.gelu``), held by objects built before the trace (a module field
``act = nn.gelu``, an attribute ``self.act = ACT2FN["gelu"]`` set in
``setup``), or looked up in a table a library built at import time (Hugging
Face's ``ACT2FN``: names to functions, ``functools.partial``s of them and the
library's own functions). Where they live is each frontend's to say
(`Frontend.activation_homes`: ``jax.nn`` for plain functions, ``flax.linen``,
``flax.nnx``; `Frontend.activation_tables`, and `TABLES` for tables registered
by hand). For the length of a trace, the public names in the homes and the
entries of the tables point at marking wrappers (`patched_names`), and
frontends point fields and attributes at them (`swapped`); every swap is
undone in a ``finally`` block, also when tracing fails.

Traces may run in several threads at once (the explorer's worker while the
user traces in a cell). Names and fields are shared by every thread, so what
is patched is counted, not owned: the first trace to need a swap makes it,
later ones join it, and the last one to leave undoes it (under `_lock`). A
wrapper marks only in the thread whose recorder is tracing (`recorder` is
thread-local); called anywhere else it is the function it wraps. A trace in
one thread never sees another put the original back half-way through.

Undoing puts the original back only where the wrapper put there still is: a
value the user wrote while traces ran (``ACT2FN["relu"] = jax.nn.silu`` in a
cell while the explorer's worker traces) is theirs and stays, and the next
trace marks it. A wrapper the user read from a table while another thread
traced and wrote back later is put back as the function it wraps. So no
trace leaves anything in the user's names and tables, and none takes away
what the user put there, whatever order the threads run in.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import jax

from ._ir import Kind, ModuleInfo
from ._record import CallInfo, is_traced, marked_call, recorder

#: The activation functions that become addressable ``activation`` nodes.
ACTIVATIONS = (
    "relu", "relu6", "gelu", "silu", "swish", "sigmoid", "tanh", "softmax",
    "log_softmax", "elu", "celu", "selu", "leaky_relu", "softplus", "soft_sign",
    "log_sigmoid", "hard_sigmoid", "hard_silu", "hard_swish", "hard_tanh",
    "glu", "mish", "sparse_plus", "squareplus", "identity",
)

#: Activation tables registered besides those the frontends contribute
#: (`Frontend.activation_tables`), as ``(module, attribute)``: a dict ``name ->
#: function`` or, with attribute ``None``, the module itself. Entries that are
#: known activations, functions defined in that module, or
#: ``functools.partial``s of either become nodes named by their key (the
#: config's ``hidden_act``). A table is read only once its module is imported:
#: yax never imports a library for it.
TABLES: list[tuple[str, str | None]] = []

_Entry = tuple[str, Callable[..., Any], Callable[..., Any]]  # (name, original, marking wrapper)


def _wrapper(name: str, fn: Callable[..., Any], method: str | None = None) -> Callable[..., Any]:
    """A function calling ``fn`` as an activation node ``name``. ``method``
    names the function really called (``gelu`` for ``ACT2FN["gelu_new"]``,
    a ``partial(nn.gelu, approximate=True)``), whose bound keywords become
    the node's attrs."""
    bound = dict(fn.keywords) if isinstance(fn, functools.partial) else {}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        rec = recorder()
        if rec is None or not any(is_traced(x) for x in jax.tree_util.tree_leaves((args, kwargs))):
            return fn(*args, **kwargs)
        parent = rec.parent_path()
        attrs = {k: v for k, v in {**bound, **kwargs}.items() if not is_traced(v)}
        call = CallInfo(
            kind=Kind.ACTIVATION,
            path=f"{parent}/{name}" if parent else name,
            name=name,
            info=ModuleInfo(method=method or name, attrs=attrs),
        )
        return marked_call(call, fn, args, kwargs)

    if not hasattr(fn, "__name__"):  # a partial
        wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__yax_activation__ = name  # type: ignore[attr-defined]
    wrapper.__yax_method__ = method or name  # type: ignore[attr-defined]
    return wrapper


def _home_names() -> tuple[str, ...]:
    """The frontends' activation homes, in their order, each once."""
    from . import frontends

    return tuple(dict.fromkeys(h for f in frontends.registry() for h in f.activation_homes))


def _homes() -> list[Any]:
    return list(_imported(_home_names()))


@functools.cache
def _imported(names: tuple[str, ...]) -> tuple[Any, ...]:
    out = []
    for home in names:
        try:
            out.append(importlib.import_module(home))
        except ImportError:
            continue
    return tuple(out)


def _known() -> dict[int, _Entry]:
    """The functions of `ACTIVATIONS` in the frontends' homes (jax.nn, flax.linen, flax.nnx), by id."""
    return _known_in(_home_names())


@functools.cache
def _known_in(names: tuple[str, ...]) -> dict[int, _Entry]:
    out: dict[int, _Entry] = {}
    for mod in _imported(names):
        for name in ACTIVATIONS:
            fn = getattr(mod, name, None)
            if callable(fn) and id(fn) not in out and not hasattr(fn, "__yax_activation__"):
                out[id(fn)] = (name, fn, _wrapper(name, fn))
    return out


def _loaded() -> list[tuple[str, Any]]:
    """The `TABLES` of modules already imported, as ``(module name, table)``."""
    from . import frontends

    out = []
    for modname, attr in dict.fromkeys([*(t for f in frontends.registry() for t in f.activation_tables), *TABLES]):
        mod = sys.modules.get(modname)
        tbl = mod if attr is None else getattr(mod, attr, None)
        if isinstance(tbl, (dict, types.ModuleType)):
            out.append((modname, tbl))
    return out


def _items(tbl: Any) -> list[tuple[str, Any]]:
    return list(tbl.items() if isinstance(tbl, dict) else vars(tbl).items())


def _own(f: Any, modname: str) -> bool:
    """A function defined in the table's module (``quick_gelu``)."""
    return inspect.isfunction(f) and f.__module__ == modname and not hasattr(f, "__yax_activation__")


def _partial_entry(p: functools.partial[Any], t: dict[int, _Entry], name: str | None = None) -> _Entry | None:
    """The entry of a partial of an activation in ``t``, named ``name`` (its
    table key) or after the function. A partial of a wrapper (made while a
    trace ran) marks itself: left alone."""
    hit = t.get(id(p.func))
    if hit is None or hit[1] is not p.func:
        return None
    method = hit[2].__yax_method__  # type: ignore[attr-defined]  # set by `_wrapper`
    return (name or hit[0], p, _wrapper(name or hit[0], p, method))


def _table_entries(modname: str, tbl: Any, out: dict[int, _Entry]) -> None:
    """Add the activations of one table to ``out``: known functions keep
    their own name; the table module's functions and partials of either
    (``"gelu_new": partial(nn.gelu, approximate=True)``) are named by their key."""
    items = _items(tbl)
    for k, v in items:
        if id(v) not in out and _own(v, modname) and isinstance(k, str) and not k.startswith("_"):
            out[id(v)] = (k, v, _wrapper(k, v, v.__name__))
    for k, v in items:
        if id(v) not in out and type(v) is functools.partial:
            entry = _partial_entry(v, out, k)
            if entry is not None:
                out[id(v)] = entry


#: The last table built (`_fresh`) and what it was built from: each loaded table and its
#: items as they were, held, so that the table is used again only while every entry is
#: the very object it was (a same-length patch, ``ACT2FN["relu"] = partial(...)``, or a
#: new dict at a dead one's address, is seen).
_cache: tuple[list[tuple[Any, list[tuple[Any, Any]]]], dict[int, _Entry]] | None = None
_MISSING = object()  # an entry a table no longer has
#: Guards what traces in several threads share: building a table, the
#: patched names (`_users`, `_during`, `_undo`) and the field swaps
#: (`_swaps`, `_placed`). Taken once per trace, and by `swapped` only for
#: a module call that holds an activation.
_lock = threading.Lock()
#: Traces running with the names patched, in all threads; the first patches, the last undoes.
_users = 0
#: While `_users`: the table every trace patches and swaps with (`swapped`
#: asks for it at every module call, and a table read from patched entries
#: would miss them).
_during: dict[int, _Entry] | None = None
_undo: list[tuple[Any, str, Any, Any]] = []  # (holder, key, original, wrapper) patched by `patched_names`
#: ``(id(holder), key) -> [holder, original, placed value, holding calls]``: the fields `swapped` points
#: at wrappers, counted over every running module call holding them, in any thread.
_swaps: dict[tuple[int, Any], list[Any]] = {}
#: ``id(placed value) -> how many fields hold it``: tells `swapped` a wrapper another call put there.
_placed: dict[int, int] = {}


def table() -> dict[int, _Entry]:
    """``id(original function or partial) -> (name, original, wrapper)``:
    the known activations and the entries of the loaded `TABLES`. Built again
    whenever a loaded table or any of its entries is another object than when
    it was last built (an entry lookup per table entry to tell)."""
    t = _during
    if t is not None:
        return t
    c = _cache
    if c is not None and _current(c[0], _loaded()):
        return c[1]
    with _lock:  # not while another thread's trace has the entries patched: they would be missed
        return _during if _during is not None else _fresh()


def _current(seen: list[tuple[Any, list[tuple[Any, Any]]]], loaded: list[tuple[str, Any]]) -> bool:
    """Whether the loaded tables are those ``seen`` holds, each entry the same object
    (by identity: an id or a length says nothing of an entry patched in place)."""
    if len(seen) != len(loaded):
        return False
    for (tbl, items), (_, now) in zip(seen, loaded):
        if tbl is not now:
            return False
        d = now if isinstance(now, dict) else vars(now)
        if len(d) != len(items) or any(d.get(k, _MISSING) is not v for k, v in items):
            return False
    return True


def _fresh() -> dict[int, _Entry]:
    """`table`, read from the names and tables themselves; with `_lock` held and nothing patched."""
    global _cache
    loaded = _loaded()
    c = _cache
    if c is not None and _current(c[0], loaded):
        return c[1]
    out = dict(_known())
    for modname, tbl in loaded:
        _table_entries(modname, tbl, out)
    _cache = ([(tbl, _items(tbl)) for _, tbl in loaded], out)  # one set of tables at a time
    return out


def marking(v: Any, t: dict[int, _Entry] | None = None) -> Any:
    """The marking wrapper of ``v`` if it is a known activation or a
    ``functools.partial`` of one (``act = partial(nn.gelu, approximate=False)``,
    remembered by id from then on), else ``v``."""
    if not callable(v):
        return v
    t = table() if t is None else t
    hit = t.get(id(v))
    if hit is None and type(v) is functools.partial:
        hit = _partial_entry(v, t)
        if hit is not None:
            t[id(v)] = hit
    return hit[2] if hit is not None and hit[1] is v else v


@contextlib.contextmanager
def patched_names(rec: Any = None) -> Iterator[None]:
    """Point the public activation names and the entries of the loaded
    activation tables at their marking wrappers (a trace hook), for as long
    as any trace in any thread runs."""
    try:
        _patch()
        yield
    finally:
        _unpatch()


def _patch() -> None:
    global _users, _during
    with _lock:
        _users += 1
        if _during is None:
            _during = _fresh()
        else:  # joining traces already running: a table imported since gets patched too
            for modname, tbl in _loaded():
                _table_entries(modname, tbl, _during)
        t = _during
        for holder, k, v in _slots():
            # a wrapper left there (read from a table while another thread traced, written back
            # later) stands for the function it wraps, which is what the undo puts back
            original = _unwrapped(v)
            hit = t.get(id(original))
            if hit is not None and hit[1] is original and v is not hit[2]:  # (else placed by a trace running)
                if _replace(holder, k, v, hit[2]):
                    _undo.append((holder, k, original, hit[2]))


def _unpatch() -> None:
    global _users, _during
    with _lock:
        _users -= 1
        if not _users:
            for holder, k, v, placed in reversed(_undo):
                _replace(holder, k, placed, v)  # else the user put something there meanwhile: theirs
            _undo.clear()
            for holder, k, v in _slots():  # a wrapper the user wrote back while traces ran
                if _unwrapped(v) is not v:
                    _replace(holder, k, v, _unwrapped(v))
            _during = None


def _replace(holder: Any, k: str, old: Any, new: Any) -> bool:
    """Put ``new`` at ``holder[k]`` if ``old`` is there still; whether it did. The user writes
    names and tables without our lock: the entry is read again just before the write, so that
    what the user wrote since `_slots` read it (a cell patching ``ACT2FN`` while the explorer's
    worker traces) stays theirs. Python has no compare-and-set on a dict: a write landing
    between this read and the store (one bytecode apart) would still be overwritten."""
    if isinstance(holder, dict):
        if holder.get(k, _MISSING) is old:
            holder[k] = new
            return True
        return False
    if getattr(holder, k, _MISSING) is old:
        setattr(holder, k, new)
        return True
    return False


def _slots() -> list[tuple[Any, str, Any]]:
    """``(holder, key, value)`` for the public names in the homes and the entries of the loaded tables."""
    out = [(mod, n, getattr(mod, n, None)) for mod in _homes() for n in ACTIVATIONS]
    out += [(tbl, k, v) for _, tbl in _loaded() for k, v in _items(tbl)]
    return out


def _unwrapped(v: Any) -> Any:
    """The function a marking wrapper wraps, or ``v`` (read without ``getattr``: a
    table that is a module holds lazy modules, which import on attribute access)."""
    if isinstance(v, types.FunctionType) and "__yax_activation__" in v.__dict__:
        return v.__dict__["__wrapped__"]
    return v


def _get(holder: Any, k: str) -> Any:
    return holder.get(k, _MISSING) if isinstance(holder, dict) else getattr(holder, k, _MISSING)


def swapped(items: list[tuple[Any, Any]], get: Callable[..., Any], put: Callable[..., Any]) -> list[tuple[Any, Any]]:
    """Point each ``(holder, key)`` whose value is an activation (or a plain
    list/tuple holding some: ``nn.Sequential`` layers) at the marking
    wrapper, with ``put(holder, key, value)``; returns what `restore` puts
    back. A field another running call (in this thread or another) already
    points at a wrapper is held as well, so that it stays swapped until the
    last of them returns."""
    t = table()
    held = []
    for holder, k in items:
        v = get(holder, k)
        if type(v) in (list, tuple):
            if any(marking(x, t) is not x for x in v) or (_placed and id(v) in _placed):
                held.append((holder, k))
        elif callable(v) and (marking(v, t) is not v or (_placed and id(v) in _placed)):
            held.append((holder, k))
    if not held:
        return held
    with _lock:  # read again: another thread may have swapped or restored it since
        return [(holder, k) for holder, k in held if _hold(holder, k, get, put, t)]


def _hold(holder: Any, k: Any, get: Callable[..., Any], put: Callable[..., Any], t: dict[int, _Entry]) -> bool:
    """Swap one field or join the swap already there (with `_lock` held); whether it is held now."""
    v = get(holder, k)
    s = _swaps.get((id(holder), k))
    if s is not None:
        if s[0] is holder and s[2] is v:
            s[3] += 1
            return True
        return False  # changed by the model's own code since it was swapped: left to it
    new = type(v)(marking(x, t) for x in v) if type(v) in (list, tuple) else marking(v, t)
    if new is v or (type(v) in (list, tuple) and all(a is b for a, b in zip(new, v))):
        return False
    _swaps[(id(holder), k)] = [holder, v, new, 1]
    _placed[id(new)] = _placed.get(id(new), 0) + 1
    put(holder, k, new)
    return True


def restore(undo: list[tuple[Any, Any]], put: Callable[..., Any]) -> None:
    """Give back the fields `swapped` held; the last call holding one puts its value back."""
    if not undo:
        return
    with _lock:
        for holder, k in reversed(undo):
            s = _swaps[(id(holder), k)]
            s[3] -= 1
            if not s[3]:
                del _swaps[(id(holder), k)]
                n = _placed.pop(id(s[2])) - 1
                if n:
                    _placed[id(s[2])] = n
                put(holder, k, s[1])
