"""What a module system contributes to yax: the `Frontend` interface and the
`Variables` layout a `sub` places variables with.

Everything yax does that depends on how models are written asks a frontend
through the hooks declared here, and nothing else: shared code (the
recorder, the builder, the rewrite engine, `yax.LoRA`, the explorer's
copy-as-code) names no module system. Every hook has a default that suits
a system with no modules of its own (plain functions), so a frontend
overrides only what its modules need. docs/architecture.md says which
frontend overrides which hook.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .._ir import Mox, Var


class Engine:
    """What frontends use of the layers above them, handed down rather than imported (so no
    frontend imports upward): ``make_mox`` (`yax._trace` puts it here), ``sub``, ``locate`` and
    ``matches`` (`yax.rewrite`). Importing any part of yax fills it (`yax/__init__.py`)."""

    make_mox: Callable[..., Any]
    sub: Callable[..., Any]
    locate: Callable[..., Any]
    matches: Callable[..., Any]

    def provide(self, **functions: Callable[..., Any]) -> None:
        for name, f in functions.items():
            setattr(self, name, f)


#: The one `Engine`: frontends call ``engine.make_mox(...)``, ``engine.sub(...)``.
engine = Engine()


@runtime_checkable
class Template(Protocol):
    """A replacement completed from each node it replaces (`yax.LoRA`): `sub`
    calls ``__yax_fill__(node)`` for the module to put there, which raises
    `yax.YaxRewriteError` for a node it cannot replace."""

    def __yax_fill__(self, node: Any) -> Any: ...


class MappedCall(Hashable, Protocol):
    """How a module call runs under its module system's own mapping
    transform (linen's ``nn.vmap``), as the node's frontend tells it
    (`Frontend.mapping`). The engine keeps it with the traced replacement,
    hands it back to `Frontend.trace_replacement` (``mapped=``) and reads
    ``stack``; what else it holds is the frontend's."""

    @property
    def stack(self) -> tuple[int, ...]:
        """The axes the replacement's variables gain at the node's level
        (``(instances,)`` for variables stacked per instance; ``()`` when
        broadcast), inside the layers of enclosing scans."""
        ...


class Variables(abc.ABC):
    """Where a model keeps its variables, for one `sub`: a frontend's answer
    to `Frontend.variables`. The engine calls `place` once with every site
    (after every replacement was traced and checked), splices, then calls
    `finish` with the new tree. A site (`yax.rewrite.replacement.Site`) holds
    the replaced ``node``, the ``traced`` replacement (its ``module``,
    ``frontend``, ``var_avals``: the module's variables, ``root.invars[:
    n_vars]``: the vars standing for them, ``state_out``), the ``chain`` of
    nested computations down to the node and the ``stack`` of layer axes its
    variables have at the root."""

    @abc.abstractmethod
    def place(self, sites: list[Any], key: Any, keep: dict[str, str] | None = None) -> dict[int, dict[Var, Var]]:
        """Decide where each replacement's variables live (kept ones reuse the
        model's vars and values; new ones are initialised, with ``key`` where
        the system needs one); returns, by ``id(site.node)``, how the
        replacement's variable vars map to the root's. Raises
        `yax.YaxRewriteError` for a replacement whose variables have no place."""

    @abc.abstractmethod
    def finish(self, new: Mox, sites: list[Any]) -> Any:
        """The rewritten root (its signature rebuilt around the new
        variables) and the new variables, as `sub` returns them: ``(root,
        variables)`` when parameters were given, else the root."""

    def dropped(self) -> set[Var]:
        """The root vars of variables the rewrite removes (no longer passed to the tree)."""
        return set()

    def held(self, node: Any) -> dict[str, Any] | None:
        """The shapes of the module call ``node``'s variables as the model holds
        them (``{collection: tree}``, with the layer axes of scans and mapping
        transforms), or ``None`` where this layout cannot tell: how a mapped
        call's variables are stacked (`Frontend.mapping`) is read from it."""
        return None


class Frontend:
    """The interface every module system implements. Defaults suit a system
    with no modules of its own (plain functions): override what differs.

    A frontend is one file (or sub-package) in ``yax/frontends/`` that defines
    a module-level ``frontend`` instance, or one registered from outside with
    `yax.internal.register`.
    """

    #: the name stored on roots and call nodes (``Mox.frontend``, ``ModuleInfo.frontend``)
    name = ""
    #: lower comes first when the registry asks who accepts an object
    order = 50
    #: the packages of this module system, whose frames are never the user's code (`yax._source`)
    libraries: tuple[str, ...] = ()

    # -- tracing -------------------------------------------------------------
    def hooks(self, rec: Any) -> contextlib.AbstractContextManager[Any]:
        """Installed for every trace: mark this system's calls (restored on exit)."""
        return contextlib.nullcontext()

    def settle(self, mox: Mox, rec: Any) -> bool:
        """After a trace is built: correct what the trace could only guess
        (paths of calls) from the built MoX, changing ``rec``'s calls; whether
        anything changed (the MoX is then built again)."""
        return False

    def accepts(self, fn: Any) -> bool:
        """Whether `make_mox(fn)` traces ``fn`` through this frontend."""
        return False

    def prepare(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Any]:
        """What `make_mox(fn)(*args, **kwargs)` traces: a function, the
        arguments it is traced on (a stateful system puts its state first), and
        the origin kept on the root (`Mox.origin`: what rebuilds the object)."""
        return fn, args, kwargs, None

    def arguments(self, fn: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The positional arguments the MoX of ``fn`` is evaluated with, given
        those ``fn`` is called with (a stateful system puts its state first)."""
        return args

    def defaults(self, cls: type) -> dict[str, Any]:
        """Default values of a module class's fields (printers show the rest)."""
        return {}

    #: Modules whose public names of `yax.ACTIVATIONS` (``gelu``, ``relu``) are
    #: activation functions this system's models call (``"flax.linen"``); imported when asked.
    activation_homes: tuple[str, ...] = ()

    #: Activation tables a library built on this system fills at import time, as
    #: ``(module, attribute)``: a dict ``name -> function`` (Hugging Face's
    #: ``ACT2FN``) or, with attribute ``None``, the module itself. Read only once
    #: the module is imported (yax never imports a library for it).
    activation_tables: tuple[tuple[str, str | None], ...] = ()

    # -- rewriting -------------------------------------------------------------
    def owns(self, x: Any) -> bool:
        """Whether ``x`` is a module instance of this system (a replacement)."""
        return False

    #: Whether a replacement's variables are placed by module (its own new
    #: module initialises those the model lacks: linen), rather than read where
    #: the model holds them (an nnx state, which a replacement cannot extend).
    places_by_module = False

    def rebuild(self, node: Mox, changes: Mapping[str, Any] | None = None) -> Any:
        """A new module like the one a call node of this system called, with
        ``changes`` to its fields (`yax.module_of`; a node cut from another MoX
        used as a replacement), or ``None`` when this system cannot rebuild
        one from the node's fields. Raises `yax.YaxRewriteError` for changes
        the module does not take, or a module it cannot rebuild faithfully."""
        return None

    def fill(self, module: Any, node: Any) -> Any:
        """The replacement ``module`` completed from the node it replaces (linen
        fills the fields left ``None``); by default ``module`` itself."""
        return module

    def mapping(self, node: Mox, scans: tuple[int, ...], held: Callable[[Any], Any] | None) -> MappedCall | None:
        """How this system's call ``node`` runs mapped by the system's own
        transform (linen's ``nn.vmap``), or ``None`` when it is not: a module
        replacing it is traced the same way (`trace_replacement`'s
        ``mapped``). ``scans``: the layer axes of the scans around the node;
        ``held(node)`` is `Variables.held`. Raises `yax.YaxRewriteError`
        for a mapping yax cannot repeat."""
        return None

    def trace_replacement(self, module: Any, avals: list[Any], call: Callable[..., Any],
                          mapped: MappedCall | None = None) -> tuple[Mox, Any, int]:
        """``module`` traced on the replaced node's input ``avals`` (called with
        ``call(xs) -> (args, kwargs)``, the convention the engine chose): a root MoX
        whose first inputs are the module's variables, those variables (a
        pytree, abstract or with the module's own values), and how many of the
        root's last outputs are the variables' final values (stateful systems).
        ``mapped`` (from the replaced node's frontend, `mapping`): trace it
        mapped the same way."""
        raise NotImplementedError(f"The `{self.name}` frontend cannot trace replacement modules.")

    def fit_hint(self, node: Mox, found: tuple[int, ...], expected: tuple[int, ...]) -> str:
        """A sentence for the refusal of a replacement whose output has shape
        ``found`` where this system's call ``node`` has ``expected`` (what the
        system does that explains it), or ``""``."""
        return ""

    def variables(self, mox: Mox, params: Any) -> Variables | None:
        """The layout of ``params`` for a `sub` on ``mox`` (placing, keeping and
        dropping variables), or ``None`` when this system does not hold them."""
        return None

    def variables_argument(self, mox: Mox, args: tuple[Any, ...]) -> Any:
        """The argument of ``args`` that `sub`'s ``params=`` takes, or ``None``."""
        return None

    def compared(self, mox: Mox) -> list[int]:
        """Which of the root's outputs `compare` pairs up (all, by default)."""
        return list(range(len(mox.outvars)))

    #: `compare` pairs the outputs of a model and its rewrite by their names (``out[1]['bn']['mean']``)
    #: rather than by position, leaving out those only one has (a state whose variables differ).
    pair_by_name = False


    # -- the explorer ----------------------------------------------------------------
    def unwrap(self, target: Any, args: tuple[Any, ...]) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
        """For an object of this system that holds its own variables and takes
        them at call time (a Hugging Face Flax wrapper): a function of
        ``(variables, *args)`` calling it, and ``(variables, *args)``, so that
        the explorer holds the variables it rewrites and compares instead of
        baking them into the trace; ``None`` for other objects."""
        return None

    def call_signature(self, target: Any) -> tuple[Callable[..., Any], int] | None:
        """For a model object of this system as the user gave it (a module, its
        bound ``apply``, a wrapper): the function whose positional parameters
        name its inputs (its ``__call__``), and how many of them lead that are
        no input; ``None`` for other objects (the target is then that function,
        its variables first). The explorer's export names the inputs so."""
        return None

    # What copy-as-code writes to trace this system's model again is a table the system registers
    # into (`yax._scripts.register_script`), not a member here.

    #: How many arguments `arguments` (or `unwrap`) puts before those the model
    #: is called with (an nnx state, a wrapper's parameters).
    prepended = 0
