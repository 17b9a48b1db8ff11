"""The flax.nnx frontend: tracing in `._trace`, the state layout of rewrites
and `replace_modules` in `._state`.

``make_mox(model)`` traces the pure function
``(state, *args, **kwargs) -> (out, new_state)`` with
``graphdef, state = nnx.split(model)``; the root keeps the graphdef as its
origin (``mox.graphdef``). Variables live in that state, at the module's
attribute path.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ..._ir import Mox
from ..._precision import register_param_rule
from ..._scripts import Script, register_script
from ..._sharding import spec_of
from .._protocol import Frontend, MappedCall, Variables, engine
from . import _lora, _rebuild  # noqa: F401  # _lora registers nnx's LoRA adapters (yax._lora.ADAPTERS)
from ._base import NAME, flax_nnx, is_module, nnx_loaded
from ._state import StateVariables, replace_modules
from ._trace import init_defaults, module_target, patched_methods

__all__ = ["frontend", "replace_modules"]


def _shape_of(x: Any) -> Any:
    """Trace the model's state abstractly, whatever its leaves are; a leaf laid out on a
    mesh keeps its sharding, which `make_mox` records (``Mox.shardings``)."""
    if not hasattr(x, "dtype"):
        return x
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=x.sharding if spec_of(x) is not None else None)


def _module_and_method(fn: Any) -> tuple[Any, str]:
    return (fn.__self__, fn.__name__) if inspect.ismethod(fn) else (fn, "__call__")


class NnxFrontend(Frontend):
    name = NAME
    order = 10
    libraries = ("flax",)

    def hooks(self, rec: Any) -> Any:
        return patched_methods(rec)

    def accepts(self, fn: Any) -> bool:
        return is_module(fn) or (inspect.ismethod(fn) and is_module(fn.__self__))

    def prepare(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Any]:
        pure, graphdef, state = module_target(*_module_and_method(fn))
        return pure, (jax.tree_util.tree_map(_shape_of, state), *args), kwargs, graphdef

    def arguments(self, fn: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (flax_nnx().state(_module_and_method(fn)[0]), *args)

    def defaults(self, cls: type) -> dict[str, Any]:
        return init_defaults(cls)

    def owns(self, x: Any) -> bool:
        return is_module(x)

    def rebuild(self, node: Mox, changes: Mapping[str, Any] | None = None) -> Any:
        return _rebuild.rebuild(node, changes)

    activation_homes = ("flax.nnx",)

    def call_signature(self, target: Any) -> tuple[Callable[..., Any], int] | None:
        return (target.__call__, 0) if is_module(target) else None  # the state is no parameter of `__call__`
    prepended = 1  # the state

    def trace_replacement(self, module: Any, avals: list[Any], call: Callable[..., Any],
                          mapped: MappedCall | None = None) -> tuple[Mox, Any, int]:
        if mapped is not None:
            raise NotImplementedError("An nnx module cannot be mapped like a call of another module system.")

        pure, _, r_state = module_target(module)

        def called(state: Any, *xs: Any) -> Any:
            a, k = call(xs)
            return pure(state, *a, **k)

        called.__name__ = called.__qualname__ = pure.__name__
        abstract = jax.tree_util.tree_map(_shape_of, r_state)
        return engine.make_mox(called)(abstract, *avals), r_state, len(jax.tree_util.tree_leaves(r_state))

    def variables(self, mox: Mox, params: Any) -> Variables | None:
        return StateVariables(mox, params) if mox.frontend == self.name else None

    def variables_argument(self, mox: Mox, args: tuple[Any, ...]) -> Any:
        return args[0] if mox.frontend == self.name and args else None

    pair_by_name = True  # the states of a model and its rewrite hold different variables

    def compared(self, mox: Mox) -> list[int]:
        """Those of ``out`` in ``(out, new_state)``, and the state's entries the
        call updates (batch statistics in train mode, RNG counts): not those it
        hands back as they came in (parameters)."""
        outs = mox.sig.outs
        first, _ = jax.tree_util.tree_unflatten(outs.tree, list(range(outs.size)))
        mine = set(jax.tree_util.tree_leaves(first))
        passed = set(mox.invars)
        return [j for j, i in enumerate(outs.dyn) if i in mine or mox.outvars[j] not in passed]




def _lines(model: str, inputs: Sequence[str], kwargs: str, has_params: bool) -> list[str]:
    call = (", ".join(inputs) + kwargs).removeprefix(", ")  # keyword inputs only: no comma first
    return ["from flax import nnx", f"mox = yax.make_mox({model})({call})", f"params = nnx.state({model})"]


frontend = NnxFrontend()
register_script(NAME, Script(names=lambda n, has_params: ["net", "batch", *(f"input{i}" for i in range(2, n + 1))][: n + 1],
                             lines=_lines, homes=(("flax.nnx", "nnx"),)))
register_param_rule(NAME, lambda x: nnx_loaded() and isinstance(x, flax_nnx().Param))  # `mixed_precision`'s param_dtype
