"""Activation functions as call nodes (``jax.nn.gelu`` -> an ``activation``).

Activations are plain functions, reached by name (``jax.nn.gelu``,
``nn.gelu``) or held by objects built before the trace (a module field
``act = nn.gelu``). For the length of a trace, the public names in
``jax.nn``, ``flax.linen`` and ``flax.nnx`` point at marking wrappers
(`patched_names`), and frontends point fields at them (`swapped`); every
swap is undone in a ``finally`` block, also when tracing fails.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable
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
_HOMES = ("jax.nn", "flax.linen", "flax.linen.activation", "flax.nnx")


def _wrapper(name: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        rec = recorder()
        if rec is None or not any(is_traced(x) for x in jax.tree_util.tree_leaves((args, kwargs))):
            return fn(*args, **kwargs)
        parent = rec.parent_path()
        call = CallInfo(
            kind=Kind.ACTIVATION,
            path=f"{parent}/{name}" if parent else name,
            name=name,
            info=ModuleInfo(method=name, attrs={k: v for k, v in kwargs.items() if not is_traced(v)}),
        )
        return marked_call(call, fn, args, kwargs)

    wrapper.__yax_activation__ = name  # type: ignore[attr-defined]
    return wrapper


def _homes() -> list[Any]:
    out = []
    for home in _HOMES:
        try:
            out.append(importlib.import_module(home))
        except ImportError:
            continue
    return out


@functools.cache
def table() -> dict[int, tuple[str, Callable, Callable]]:
    """``id(original function) -> (name, original, wrapper)``."""
    out: dict[int, tuple[str, Callable, Callable]] = {}
    for mod in _homes():
        for name in ACTIVATIONS:
            fn = getattr(mod, name, None)
            if callable(fn) and id(fn) not in out and not hasattr(fn, "__yax_activation__"):
                out[id(fn)] = (name, fn, _wrapper(name, fn))
    return out


def marking(v: Any) -> Any:
    """The marking wrapper of ``v`` if it is a known activation, else ``v``."""
    hit = table().get(id(v)) if callable(v) else None
    return hit[2] if hit is not None and hit[1] is v else v


@contextlib.contextmanager
def patched_names(rec: Any = None):
    """Point the public activation names at their marking wrappers (a trace hook)."""
    t = table()
    undo = []
    try:
        for mod in _homes():
            for name in ACTIVATIONS:
                fn = getattr(mod, name, None)
                hit = t.get(id(fn))
                if hit is not None and hit[1] is fn:
                    undo.append((mod, name, fn))
                    setattr(mod, name, hit[2])
        yield
    finally:
        for mod, name, fn in reversed(undo):
            setattr(mod, name, fn)


def swapped(items: list[tuple[Any, Any]], get: Callable, put: Callable) -> list[tuple[Any, Any]]:
    """Point each ``(holder, key)`` whose value is an activation (or a plain
    list/tuple holding some: ``nn.Sequential`` layers) at the marking
    wrapper, with ``put(holder, key, value)``; returns what `restore` puts back."""
    undo = []
    for holder, k in items:
        v = get(holder, k)
        if type(v) in (list, tuple):
            new = type(v)(marking(x) for x in v)
            if any(a is not b for a, b in zip(new, v)):
                undo.append((holder, k, v))
                put(holder, k, new)
        elif marking(v) is not v:
            undo.append((holder, k, v))
            put(holder, k, marking(v))
    return undo


def restore(undo: list[tuple[Any, Any, Any]], put: Callable) -> None:
    for holder, k, v in reversed(undo):
        put(holder, k, v)
