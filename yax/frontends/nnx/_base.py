"""What the nnx frontend's parts share: the lazily imported ``flax.nnx`` and
cached type tests (``isinstance`` against nnx's classes runs Python code, and
tracing asks thousands of times)."""

from __future__ import annotations

import functools
import sys
from typing import Any

NAME = "nnx"


def nnx_loaded() -> bool:
    return "flax.nnx" in sys.modules


def is_module(x: Any) -> bool:
    if not nnx_loaded():
        return False
    from flax import nnx

    return isinstance(x, nnx.Module)


def is_module_type(t: Any) -> bool:
    return nnx_loaded() and isinstance(t, type) and is_graph_type(t) and issubclass(t, flax_nnx().Module)


def flax_nnx() -> Any:
    from flax import nnx

    return nnx


# By type, cached: ``isinstance`` against nnx's classes runs Python code
# (``Variable``'s metaclass), and tracing asks thousands of times.
@functools.cache
def is_variable_type(t: type) -> bool:
    return issubclass(t, flax_nnx().Variable)


@functools.cache
def is_graph_type(t: type) -> bool:
    """nnx graph objects other than variables (modules, ``Rngs``, lists)."""
    return not is_variable_type(t) and issubclass(t, flax_nnx().Pytree)


def is_graph_leaf(x: Any) -> bool:
    """nnx objects (modules, ``Rngs``, ``Variable``) passed to or returned by a
    method are kept whole: flattening them would hand the method copies, and
    its updates (an RNG counter) would be lost."""
    return is_variable_type(type(x)) or is_graph_type(type(x))  # type: ignore[arg-type]  # mypy#11470


