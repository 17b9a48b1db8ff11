"""Frontends: one adapter per module system (see docs/architecture.md).

A frontend knows one way of writing models (flax.linen, flax.nnx, plain JAX
functions) and nothing else does: how to trace it (hooks that mark its
calls, path naming, field defaults), what `make_mox` traces for one of its
objects, and, for rewrites, how to trace a replacement module of its kind
and where variables live in the parameters it takes. Shared code (the
recorder, the builder, the rewrite engine, printers) asks the registry here.

Adding a module system is one new file in this folder that defines a
`Frontend` subclass and a module-level ``frontend`` instance; `._builtin` finds
it by name when yax is imported and registers it here, ordered by its ``order``
(the plain-function frontend, which takes any callable, comes last). This module
is the registry only: it imports no frontend, so none of them imports upward. The interface, every hook a frontend may
contribute, is declared in `._protocol`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .._ir import Mox
from .._source import add_libraries
from ._protocol import Frontend as Frontend
from ._protocol import MappedCall as MappedCall
from ._protocol import Template as Template
from ._protocol import Variables as Variables
from ._protocol import engine as engine

T = TypeVar("T")


#: Every frontend, in the order they are asked: filled by `register`, which `._builtin` calls for
#: each module of this folder (the registry imports none of them).
_registry: list[Frontend] = []


def registry() -> list[Frontend]:
    """Every frontend, in the order they are asked."""
    return _registry


def register(frontend: Frontend) -> None:
    """Add a frontend: those in this folder are added by `._builtin` when yax is imported; a
    third-party module system calls this itself."""
    if frontend not in _registry:
        add_libraries(frontend.libraries)
        _registry.append(frontend)
        _registry.sort(key=lambda f: (f.order, f.name))


def get(name: str | None) -> Frontend:
    """The frontend called ``name`` (the plain-function one for ``None``)."""
    for f in registry():
        if f.name == name:
            return f
    return registry()[-1]


def for_target(fn: Any) -> Frontend | None:
    """The frontend `make_mox(fn)` traces ``fn`` with (``None``: no frontend takes it)."""
    return next((f for f in registry() if f.accepts(fn)), None)


def of_root(mox: Mox) -> Frontend:
    """The frontend that traced a root MoX."""
    return get(mox.frontend)


def of_replacement(x: Any) -> Frontend | None:
    """The frontend of a replacement module, or ``None`` for other replacements."""
    return next((f for f in registry() if f.owns(x)), None)


def first_answer(mox: Mox, ask: Callable[[Frontend], T | None]) -> T | None:
    """The first non-``None`` answer of ``ask(frontend)``: the root's frontend
    first, then the others in order (a plain function that takes a linen
    variables dict is answered by linen)."""
    first = of_root(mox)
    for f in [first, *(f for f in registry() if f is not first)]:
        found = ask(f)
        if found is not None:
            return found
    return None


def variables(mox: Mox, params: Any) -> Variables | None:
    """The variables layout for a `sub` on ``mox`` (see `Frontend.variables`)."""
    return first_answer(mox, lambda f: f.variables(mox, params))


def of_node(node: Any) -> Frontend:
    """The frontend of the module that a call node called (the plain-function
    one for activations, functions and equations)."""
    info = getattr(node, "info", None)
    return get(getattr(info, "frontend", None))


def unwrap(target: Any, args: tuple[Any, ...]) -> tuple[Callable[..., Any], tuple[Any, ...], Frontend] | None:
    """``(function, arguments, frontend)`` for an object holding its own
    variables that some frontend knows (`Frontend.unwrap`), else ``None``."""
    for f in registry():
        found = f.unwrap(target, args)
        if found is not None:
            return (*found, f)
    return None


def call_signature(target: Any) -> tuple[Callable[..., Any], int] | None:
    """The first frontend's answer to `Frontend.call_signature`, or ``None``."""
    for f in registry():
        found = f.call_signature(target)
        if found is not None:
            return found
    return None


def settle(mox: Any, rec: Any) -> bool:
    """Every frontend's `Frontend.settle` of a trace just built: whether any changed a call."""
    return any([f.settle(mox, rec) for f in registry()])


def hooks() -> list[Callable[..., Any]]:
    """The trace hooks of every frontend, for `yax._record.recording`."""
    return [f.hooks for f in registry()]
