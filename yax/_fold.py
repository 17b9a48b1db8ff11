"""Which calls have the same structure: the key by which the explorer's tree and `yax.to_dot`
fold repeated layers (80 decoder layers, the steps of a stack) into one ×N.

Two calls get the same key exactly when they compute the same thing up to their weights: the
same kind, class, method and fields, the same input and output types, and children with the
same keys in the same order, under the same names. A call's own name (``layers_3``) and its
path are not part of its key; its children's names are. An equation's key is its primitive,
its parameters (nested computations by their keys) and its types.

>>> import jax, jax.numpy as jnp
>>> import flax.linen as nn
>>> import yax
>>> class Stack(nn.Module):
...     @nn.compact
...     def __call__(self, x):
...         for _ in range(3):
...             x = nn.Dense(4)(x)
...         return nn.Dense(2)(x)
>>> x = jnp.ones((1, 4))
>>> mox = yax.make_mox(Stack().apply)(Stack().init(jax.random.key(0), x), x)
>>> keys = structure_keys(mox)
>>> [c.name for c in runs(mox.calls[0].calls, keys)[0]]
['Dense_0', 'Dense_1', 'Dense_2']
>>> len(runs(mox.calls[0].calls, keys))
2
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._calls import memo
from ._ir import Equation, Mox, Symbol
from ._vocab import type_str

__all__ = ["structure_keys", "runs"]

_SCALARS = (bool, int, float, complex, str, bytes, type(None), np.dtype, np.generic, enum.Enum)


def _plain(v: Any, keys: dict[int, int]) -> Any:
    """A hashable stand-in for a parameter or field: values as they are, nested computations
    by their keys, containers item by item, functions by name, other objects by their type
    (their repr may hold an address, which would make equal layers differ)."""
    if isinstance(v, Mox):
        return ("mox", keys[id(v)])
    if isinstance(v, _SCALARS):
        return v if not isinstance(v, np.generic) else v.item()
    if isinstance(v, tuple | list):
        return tuple(_plain(x, keys) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((str(k), _plain(x, keys)) for k, x in v.items()))
    if isinstance(v, functools.partial):
        return ("partial", _plain(v.func, keys), _plain(v.args, keys), _plain(v.keywords, keys))
    if callable(v) and hasattr(v, "__qualname__"):
        return ("fn", getattr(v, "__module__", ""), v.__qualname__)
    return ("obj", type(v).__qualname__)


def _types(atoms: Sequence[Symbol]) -> tuple[str, ...]:
    return tuple(type_str(a) for a in atoms)


def structure_keys(mox: Mox) -> dict[int, int]:
    """``id(node)`` -> a small int for every `Mox` node and `Equation` under ``mox`` (itself
    included): equal exactly when their structure is (see the module's doc). No recursion,
    so any depth works; computed once per ``mox``."""
    # kept while the model lives (`memo`): the tree's rows and each graph of it (another depth, a
    # box opened) share one walk of the model (0.3 s on an 80-layer Llama)
    return memo(mox, "fold.structure_keys", lambda: _structure_keys(mox))


def _structure_keys(mox: Mox) -> dict[int, int]:
    table: dict[Any, int] = {}
    keys: dict[int, int] = {}
    # post-order, not `_calls.visit`'s pre-order: a node's key is made of its children's, and the
    # numbers (shown in the explorer's rows) are given in the order subtrees finish
    stack: list[tuple[Equation | Mox, bool]] = [(mox, False)]
    while stack:
        node, done = stack.pop()
        if not done:
            stack.append((node, True))
            below = [s for _, s in node.subs] if isinstance(node, Equation) else list(node.children)
            stack.extend((c, False) for c in reversed(below))
            continue
        if isinstance(node, Equation):
            params = tuple(sorted((k, _plain(v, keys)) for k, v in node.params.items()))
            key: Any = ("eq", node.name, params, _types(node.inputs), _types(node.outputs))
        else:
            kids = tuple((c.name if isinstance(c, Mox) else "", keys[id(c)]) for c in node.children)
            key = (node.kind, node.info.type and node.info.type.__qualname__, node.method,
                   _plain(dict(node.attrs), keys), _types(node.inputs), _types(node.outputs), kids)
        keys[id(node)] = table.setdefault(key, len(table))
    return keys


def runs(nodes: Sequence[Mox], keys: dict[int, int]) -> list[list[Mox]]:
    """``nodes`` (siblings, in order) cut into runs of consecutive nodes with the same key:
    ``[[Dense_0, Dense_1, Dense_2], [Dense_3]]``. Every node is in exactly one run."""
    out: list[list[Mox]] = []
    for n in nodes:
        if out and keys[id(out[-1][0])] == keys[id(n)]:
            out[-1].append(n)
        else:
            out.append([n])
    return out
