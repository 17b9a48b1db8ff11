"""What each call computes in: an analysis the views and tables read (`yax.rewrite.precision`'s
`mixed_precision` changes it by query).

A call's *precision* is read from what it does, never from a label: the dtype
of the parameters it owns, the dtype its matrix products and convolutions
take their operands in (or, for a call with none, the dtypes its other
floating equations compute in), and the dtype of its floating outputs. It is
written as a jmp-style policy, ``params=float32,compute=bfloat16,output=float32``,
and shown in the XML view (``@policy``, ``@compute``: ``//module_call[@compute="bfloat16"]``),
`yax.summary` and the explorer's rows. Several dtypes are joined with ``+``
(a block with half-precision linear layers and full-precision norms computes
in ``bfloat16+float32``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._calls import memo
from ._ir import CALL_KINDS, Equation, Kind, Mox
from ._vocab import dtype_str
from .errors import BadPolicy

#: Names jmp accepts for dtypes (``half`` is float16 there too).
_ALIASES = {"f32": "float32", "full": "float32", "float32": "float32", "f16": "float16", "half": "float16",
            "float16": "float16", "bf16": "bfloat16", "bfloat16": "bfloat16", "f64": "float64",
            "float64": "float64"}
_FIELDS = {"p": "params", "params": "params", "c": "compute", "compute": "compute", "o": "output",
           "output": "output"}

@dataclasses.dataclass(frozen=True)
class Policy:
    """A jmp-style policy: the dtype of parameters, of computation and of outputs
    (``None``: left as it is). Parsed from ``"params=float32,compute=bfloat16,output=float32"``
    (jmp's short forms ``p=f32,c=bf16,o=f32``, ``full``, ``half`` too) or any object with
    ``param_dtype``/``compute_dtype``/``output_dtype`` (a ``jmp.Policy``)."""

    params: str | None = None
    compute: str | None = None
    output: str | None = None

    @classmethod
    def parse(cls, x: Any) -> Policy:
        if isinstance(x, Policy):
            return x
        if all(hasattr(x, a) for a in ("param_dtype", "compute_dtype", "output_dtype")):
            return cls(*(np.dtype(getattr(x, a)).name for a in ("param_dtype", "compute_dtype", "output_dtype")))
        if not isinstance(x, str):
            raise BadPolicy(x, None,
                f"A mixed-precision policy is a string like \"params=float32,compute=bfloat16,output=float32\" "
                f"or a `jmp.Policy`, but got a `{type(x).__name__}`.")
        got: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in x.split(","))):
            k, _, v = part.partition("=")
            field, dtype = _FIELDS.get(k.strip()), _ALIASES.get(v.strip())
            if field is None or dtype is None or field in got:
                raise BadPolicy(x, part,
                    f"The policy {x!r} has {part!r}, which is not one of params=, compute=, output= "
                    f"(or p=, c=, o=) given once with one of {', '.join(sorted(set(_ALIASES)))}. "
                    "Example: \"params=float32,compute=bfloat16,output=float32\".")
            got[field] = dtype
        return cls(**got)

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in dataclasses.asdict(self).items() if v is not None)

    def short(self) -> str:
        """``f32/bf16/f32``: params/compute/output as tables show them (``-``: none)."""
        return "/".join("+".join(map(dtype_str, v.split("+"))) if v else "-"
                        for v in (self.params, self.compute, self.output))


# -- what each call computes in ------------------------------------------------------------

_HEAVY = ("dot_general", "conv_general_dilated")
_MOVES = {"convert_element_type", "broadcast_in_dim", "reshape", "transpose", "squeeze", "expand_dims",
          "slice", "dynamic_slice", "concatenate", "copy", "copy_p", "optimization_barrier",
          "select_n", "gather", "dynamic_update_slice", "scatter", "pad", "rev", "stop_gradient"}


def _floats(xs: Any) -> set[str]:
    return {np.dtype(x.dtype).name for x in xs
            if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)}


def _joined(ds: set[str]) -> str:
    return "+".join(sorted(ds, key=lambda d: (-np.dtype(d).itemsize, d)))


@dataclasses.dataclass
class _Seen:
    heavy: set[str] = dataclasses.field(default_factory=set)  # operand dtypes of products and convolutions
    other: set[str] = dataclasses.field(default_factory=set)  # result dtypes of other arithmetic

    def add(self, o: _Seen) -> None:
        self.heavy |= o.heavy
        self.other |= o.other


def precisions(mox: Mox) -> dict[int, Policy]:
    """``id(call)`` -> the `Policy` each call node under ``mox`` (itself
    included) computes with, read from its equations (one pass, no recursion; cached)."""
    return memo(mox, "precision.precisions", lambda: _precisions(mox))


def _precisions(mox: Mox) -> dict[int, Policy]:
    seen: dict[int, _Seen] = {}
    out: dict[int, Policy] = {}
    for n in reversed([mox, *mox.walk()]):  # children before parents
        s = seen[id(n)] = _Seen()
        if isinstance(n, Equation):
            if n.name in _HEAVY:
                s.heavy |= _floats(n.inputs[:2])
            elif not n.subs and n.name not in _MOVES:
                s.other |= _floats(n.outputs)
            for _, sub in n.subs:
                s.add(seen[id(sub)])
            continue
        for c in n.children:
            s.add(seen[id(c)])
        if n.kind in CALL_KINDS or n.kind == Kind.ROOT:
            params = _floats(jax.tree_util.tree_leaves(n.var_tree)) if n.kind == Kind.MODULE_CALL else set()
            out[id(n)] = Policy(_joined(params) or None, _joined(s.heavy or s.other) or None,
                                _joined(_floats(n.outputs)) or None)
    return out


def is_mixed(mox: Mox) -> bool:
    """Whether the calls of ``mox`` use more than one floating dtype (tables then show each call's)."""
    return len({d for p in precisions(mox).values() for v in (p.params, p.compute, p.output) if v
                for d in v.split("+")}) > 1


#: Which variables of a module system's layout hold parameters (`yax.mixed_precision`'s
#: ``param_dtype`` casts them), by frontend name: a system whose variables are objects
#: (nnx's ``Variable``) registers a test of one (`register_param_rule`); plain arrays are
#: parameters where the layout puts them (a linen dict's ``params`` collection).
PARAM_RULES: dict[str, Any] = {}


def register_param_rule(system: str, is_param: Any) -> None:
    """``is_param(variable)``: whether a variable object of ``system`` holds a parameter."""
    PARAM_RULES[system] = is_param
