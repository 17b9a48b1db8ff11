"""Frontends: one adapter per module system (see docs/architecture.md).

A frontend knows one way of writing models (flax.linen, flax.nnx, plain JAX
functions) and nothing else does: how to trace it (hooks that mark its
calls, path naming, field defaults), what `make_mox` traces for one of its
objects, and, for rewrites, how to trace a replacement module of its kind
and where variables live in the parameters it takes. Shared code (the
recorder, the builder, the rewrite engine, printers) asks the registry here.

Adding a module system is one new file in this folder that defines a
`Frontend` subclass and a module-level ``frontend`` instance; it is found by
name at import, ordered by its ``order`` (the plain-function frontend, which
takes any callable, comes last).
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from .._ir import Mox


class Frontend:
    """The interface every module system implements. Defaults suit a system
    with no modules of its own (plain functions)."""

    #: the name stored on roots and call nodes (``Mox.frontend``, ``ModuleInfo.frontend``)
    name = ""
    #: lower comes first when the registry asks who accepts an object
    order = 50

    # -- tracing -------------------------------------------------------------
    def hooks(self, rec: Any) -> contextlib.AbstractContextManager:
        """Installed for every trace: mark this system's calls (restored on exit)."""
        return contextlib.nullcontext()

    def accepts(self, fn: Any) -> bool:
        """Whether `make_mox(fn)` traces ``fn`` through this frontend."""
        return False

    def prepare(self, fn: Any, args: tuple, kwargs: dict) -> tuple[Callable, tuple, dict, Any]:
        """What `make_mox(fn)(*args, **kwargs)` traces: a function, the
        arguments it is traced on (a stateful system puts its state first), and
        the origin kept on the root (`Mox.origin`: what rebuilds the object)."""
        return fn, args, kwargs, None

    def arguments(self, fn: Any, args: tuple) -> tuple:
        """The positional arguments the MoX of ``fn`` is evaluated with, given
        those ``fn`` is called with (a stateful system puts its state first)."""
        return args

    def defaults(self, cls: type) -> dict[str, Any]:
        """Default values of a module class's fields (printers show the rest)."""
        return {}

    # -- rewriting -------------------------------------------------------------
    def owns(self, x: Any) -> bool:
        """Whether ``x`` is a module instance of this system (a replacement)."""
        return False

    def rebuild(self, node: Mox) -> Any:
        """A new module like the one a call node of this system called (for a
        node cut from another MoX used as a replacement), or ``None`` when
        this system cannot rebuild one from the node's fields."""
        return None

    def fill(self, module: Any, node: Any) -> Any:
        """The replacement ``module`` completed from the node it replaces (linen
        fills the fields left ``None``); by default ``module`` itself."""
        return module

    def trace_replacement(self, module: Any, avals: list, call: Callable) -> tuple[Mox, Any, int]:
        """``module`` traced on the replaced node's input ``avals`` (called with
        ``call(xs) -> (args, kwargs)``, the convention the engine chose): a root MoX
        whose first inputs are the module's variables, those variables (a
        pytree, abstract or with the module's own values), and how many of the
        root's last outputs are the variables' final values (stateful systems)."""
        raise NotImplementedError

    def variables(self, mox: Mox, params: Any) -> Any:
        """The layout of ``params`` for a `sub` on ``mox`` (placing, keeping and
        dropping variables), or ``None`` when this system does not hold them."""
        return None

    def params_argument(self, mox: Mox, args: tuple) -> Any:
        """The argument of ``args`` that `sub`'s ``params=`` takes, or ``None``."""
        return None

    def compared(self, mox: Mox) -> list[int]:
        """Which of the root's outputs `compare` pairs up (all, by default)."""
        return list(range(len(mox.outvars)))

    #: `compare` pairs the outputs of a model and its rewrite by their names (``out[1]['bn']['mean']``)
    #: rather than by position, leaving out those only one has (a state whose variables differ).
    pair_by_name = False


def _load() -> list[Frontend]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        f = getattr(mod, "frontend", None)
        if isinstance(f, Frontend):
            found.append(f)
    return sorted(found, key=lambda f: (f.order, f.name))


_registry: list[Frontend] | None = None


def registry() -> list[Frontend]:
    """Every frontend, in the order they are asked."""
    global _registry
    if _registry is None:
        _registry = _load()
    return _registry


def register(frontend: Frontend) -> None:
    """Add a frontend defined outside this folder (a third-party module system);
    one defined here is found by itself."""
    registry().append(frontend)
    registry().sort(key=lambda f: (f.order, f.name))


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


def first_answer(mox: Mox, question: str, *args: Any) -> Any:
    """The first non-``None`` answer to ``frontend.question(mox, *args)``: the
    root's frontend first, then the others in order (a plain function that
    takes a linen variables dict is answered by linen)."""
    first = of_root(mox)
    for f in [first, *(f for f in registry() if f is not first)]:
        found = getattr(f, question)(mox, *args)
        if found is not None:
            return found
    return None


def variables(mox: Mox, params: Any) -> Any:
    """The variables layout for a `sub` on ``mox`` (see `Frontend.variables`)."""
    return first_answer(mox, "variables", params)


def hooks() -> list[Callable]:
    """The trace hooks of every frontend, for `yax._record.recording`."""
    return [f.hooks for f in registry()]
