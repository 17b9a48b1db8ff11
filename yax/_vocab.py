"""The one way yax spells types and values, in every printer, view and message.

``f32[2,8]`` for an array type (`type_str`), ``f32`` for a dtype (`dtype_str`),
a short deterministic repr for a parameter or field value (`value_str`:
functions by name, no memory addresses). The IR's own reprs use it too
(``Var(f32[2,8])``), so a type reads the same in ``print(mox)``, the XML view,
the explorer, an error message and a debugger. It knows no IR class: anything
with ``shape`` and ``dtype`` has a type.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

_ADDR = re.compile(r" at 0x[0-9a-fA-F]+")


class Shaped(Protocol):
    """Anything with a shape and a dtype: a `Var`, a `jax.ShapeDtypeStruct`, an array."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> Any: ...


_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
          "int32": "i32", "int64": "i64", "int8": "i8", "int16": "i16", "uint8": "u8",
          "uint32": "u32", "uint64": "u64", "bool": "bool", "complex64": "c64"}


def dtype_str(dtype: Any) -> str:
    try:
        return _dtype_str(dtype)
    except TypeError:  # an unhashable dtype-like
        return _dtype_name(dtype)


@functools.lru_cache(maxsize=256)
def _dtype_str(dtype: Any) -> str:
    # NumPy computes `dtype.name` afresh on every access; the XML view asks thousands of times.
    return _dtype_name(dtype)


def _dtype_name(dtype: Any) -> str:
    name = getattr(dtype, "name", str(dtype))
    return _SHORT.get(name, name)


def key_name(k: Any) -> str:
    """One entry of a JAX key path as yax names it in paths and scopes: a dict key, an
    attribute's name or a sequence index, as text (``kernel``, ``0``)."""
    return str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))


def type_str(s: Shaped) -> str:
    return f"{dtype_str(s.dtype)}[{','.join(map(str, s.shape))}]"


def _name(f: Any) -> str:
    return getattr(f, "__yax_activation__", None) or getattr(f, "__name__", None) or type(f).__name__


def _is_default(v: Any, d: Any) -> bool:
    if v is d:
        return True
    try:  # of the same type too: `use_bias=1` where the default is `True` is shown
        return d is not inspect.Parameter.empty and type(v) is type(d) and bool(v == d)
    except Exception:  # an array compared element by element
        return False


def _partial_str(p: functools.partial[Any]) -> str:
    """What a `functools.partial` builds, as a call: ``Dense(features=64)``.

    Its keyword arguments equal to the callable's own defaults are left out, as
    a row leaves out the fields at their defaults: yax's LoRA adapters hold the
    layer they adapt as a partial of every one of its fields, and the row should
    read ``base=Dense(features=64)``, not list thirteen defaults."""
    try:
        # a class's own `__init__`: nnx's module metaclass hides it behind `(*args, **kwargs)`
        f: Any = getattr(p.func, "__init__", p.func) if isinstance(p.func, type) else p.func
        params: Mapping[str, inspect.Parameter] = inspect.signature(f).parameters
    except (TypeError, ValueError):  # a builtin without a signature: every argument is shown
        params = {}
    args = [value_str(a) for a in p.args]
    args += [f"{k}={value_str(v)}" for k, v in p.keywords.items()
             if not (k in params and _is_default(v, params[k].default))]
    return f"{_name(p.func)}({', '.join(args)})"


def value_str(v: Any) -> str:
    """A short, deterministic repr of a parameter or attribute value."""
    if isinstance(v, functools.partial):
        return _partial_str(v)
    if callable(v) and not isinstance(v, type):
        return _name(v)
    if isinstance(v, np.dtype) or (isinstance(v, type) and issubclass(v, np.generic)):
        return np.dtype(v).name
    if isinstance(v, type) and isinstance(dt := getattr(v, "dtype", None), np.dtype):  # jnp.float32
        return dt.name
    if isinstance(v, type):  # a class as a field's value (nnx's `lora_param_type=LoRAParam`): by name
        return v.__name__
    if isinstance(v, np.ndarray) and v.size > 8:
        return f"array<{v.dtype.name}{list(v.shape)}>"
    if type(v) in (tuple, list):  # element by element: a layer list shows `(Dense, relu, Dense)`
        inner = ", ".join(map(value_str, v))
        if type(v) is list:
            return f"[{inner}]"
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    if hasattr(v, "to_json_string") and hasattr(v, "to_dict"):  # a model config (Hugging Face's)
        return f"{type(v).__name__}(…)"
    return " ".join(_ADDR.sub("", repr(v)).split())
