"""The module expression (MoX) IR: data only, no printing, tracing or I/O.

A MoX is a jaxpr whose equations are grouped into a tree of *module calls*.

* :class:`Var` and :class:`Literal` are the atoms (`Symbol`) that flow
  between equations, as in a jaxpr. Vars are compared by identity.
* :class:`Equation` is one JAX primitive application. Parameters that hold
  jaxprs in JAX (the body of ``scan``, the branches of ``cond``, the callee of
  ``jit``/``custom_jvp_call``/``remat``) hold nested :class:`Mox` nodes of kind
  ``"jaxpr"`` instead, so module calls inside a scanned body stay visible.
* :class:`Mox` is a node with children. Its kind says what it stands for:

  ``"root"``        the traced function itself (ephemeral);
  ``"jaxpr"``       a nested computation held by an equation (ephemeral);
  ``"module_call"`` one call of a Flax module method;
  ``"method_call"`` a call of a method on the same module instance as the
                    enclosing call (a private helper such as ``_split_heads``);
  ``"activation"``  a call of a standard activation such as ``jax.nn.gelu``;
  ``"function"``    a call of another plain function put in by a rewrite.

  A call node works like a function called in place: ``inputs`` are the
  caller's atoms, ``invars`` the node's own formal parameters, ``outvars`` the
  results computed inside, ``outputs`` the caller's vars bound to them.
  Equations inside may also read vars of enclosing nodes (the module's
  parameters are read this way, like a closure).

Nodes are immutable: rewrites build new nodes (`dataclasses.replace`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["Symbol", "Var", "Literal", "Equation", "Mox", "CALL_KINDS", "FN_KINDS", "holds_mox"]

#: Kinds of Mox node that stand for a call in the user's program.
CALL_KINDS = ("module_call", "method_call", "activation", "function")
#: Call kinds that stand for a plain function rather than a module.
FN_KINDS = ("activation", "function")


class Symbol:
    """An atom of a MoX: a :class:`Var` or a :class:`Literal`."""

    __slots__ = ("shape", "dtype", "weak_type")

    def __init__(self, shape: tuple[int, ...], dtype: Any, weak_type: bool = False):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.weak_type = bool(weak_type)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class Var(Symbol):
    """A variable: produced by exactly one equation or bound as an input.

    Vars compare and hash by identity, so the same name never means two things.
    """

    __slots__ = ("__weakref__",)

    def __repr__(self) -> str:
        return f"Var({_short_type(self)})"


class Literal(Symbol):
    """A constant scalar written inline, as in a jaxpr (``2.0:f32[]``)."""

    __slots__ = ("val",)

    def __init__(self, val: Any, shape=(), dtype=None, weak_type: bool = False):
        if dtype is None:
            dtype = np.asarray(val).dtype
        super().__init__(shape, dtype, weak_type)
        self.val = val

    def __repr__(self) -> str:
        return f"Literal({self.val!r}:{_short_type(self)})"


def _short_type(s: Symbol) -> str:
    return f"{getattr(s.dtype, 'name', s.dtype)}{list(s.shape)}"


def holds_mox(v: Any) -> bool:
    """Whether an equation parameter holds nested computations: a `Mox`, or a
    tuple of them (``cond`` branches)."""
    return isinstance(v, Mox) or (isinstance(v, tuple) and bool(v) and all(isinstance(x, Mox) for x in v))


@dataclasses.dataclass(frozen=True, eq=False)
class Equation:
    """One primitive application: ``outputs = primitive[params](*inputs)``.

    Attributes:
      primitive: the JAX primitive (a ``jax.extend.core.Primitive``).
      params: its parameters; jaxpr-valued ones hold :class:`Mox` nodes of kind
        ``"jaxpr"`` (or tuples of them, for ``cond`` branches).
      inputs: the atoms read.
      outputs: the vars written.
      path: the path of the module call this equation ran in.
      source_info: JAX's source info (traceback, name stack), kept for users.
      ctx: JAX's equation context (compute type, metadata), re-entered on eval.
    """

    primitive: Any
    params: dict[str, Any]
    inputs: tuple[Symbol, ...]
    outputs: tuple[Var, ...]
    path: str = ""
    source_info: Any = None
    ctx: Any = None
    # Original JAX jaxprs for parameters whose sub-MoX had nothing to strip;
    # evaluation reuses them instead of re-tracing. Not part of the identity.
    _jaxprs: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def name(self) -> str:
        """The primitive's name, e.g. ``"dot_general"``."""
        return self.primitive.name

    @property
    def subs(self) -> list[tuple[str, Mox]]:
        """The nested computations held in params, as ``(param_name, mox)``."""
        out = []
        for k, v in self.params.items():
            if isinstance(v, Mox):
                out.append((k, v))
            elif holds_mox(v):
                out.extend((f"{k}[{i}]", x) for i, x in enumerate(v))
        return out

    @property
    def in_shapes(self) -> list[tuple[int, ...]]:
        return [a.shape for a in self.inputs]

    @property
    def out_shapes(self) -> list[tuple[int, ...]]:
        return [a.shape for a in self.outputs]

    @property
    def in_dtypes(self) -> list[Any]:
        return [a.dtype for a in self.inputs]

    @property
    def out_dtypes(self) -> list[Any]:
        return [a.dtype for a in self.outputs]

    def __repr__(self) -> str:
        return f"Equation({self.name}, path={self.path!r})"


@dataclasses.dataclass(frozen=True, eq=False)
class Mox:
    """A module expression node: the root, a nested jaxpr, or a call.

    Attributes:
      kind: ``"root"``, ``"jaxpr"``, ``"module_call"``, ``"method_call"`` or
        ``"activation"``.
      children: equations and nested call nodes, in program order.
      inputs / outputs: the caller's atoms passed in / vars bound to results.
      invars / outvars: the node's formal parameters / results.
      constvars / consts: closed-over constants (root and ``"jaxpr"`` nodes).
      path: ``Model/Block_3/Dense_0``; ``name``: its last component (the
        function name for activations).
      module_type: the Flax module class (``None`` for other kinds).
      method: the method name (``"__call__"``).
      attrs: the module's dataclass fields (``features=10``), or the keyword
        arguments of an activation call.
      num_params: parameters owned by the module (size of its ``params``).
      var_tree: the module's variables as a pytree of ``jax.ShapeDtypeStruct``.
      in_tree / out_tree: treedefs of ``(args, kwargs)`` and of the result;
        leaves that were not traced (Python scalars, strings) are kept in
        ``in_static`` / ``out_static`` as ``(leaf_index, value)`` pairs.
      dyn_in / dyn_out: indices of the traced leaves in those treedefs.
      scope: where the module's variables live: its path in the linen
        variables dict, or its attribute path in an nnx model.
      graphdef: on a root traced from an ``nnx.Module``, the ``nnx.GraphDef``
        that ``nnx.merge(graphdef, state)`` rebuilds the model with.
    """

    kind: str
    children: tuple[Equation | Mox, ...] = ()
    inputs: tuple[Symbol, ...] = ()
    outputs: tuple[Var, ...] = ()
    invars: tuple[Var, ...] = ()
    outvars: tuple[Symbol, ...] = ()
    constvars: tuple[Var, ...] = ()
    consts: tuple[Any, ...] = ()
    path: str = ""
    name: str = ""
    module_type: type | None = None
    method: str | None = None
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    num_params: int = 0
    var_tree: Any = None
    in_tree: Any = None
    out_tree: Any = None
    in_static: tuple[tuple[int, Any], ...] = ()
    out_static: tuple[tuple[int, Any], ...] = ()
    dyn_in: tuple[int, ...] = ()
    dyn_out: tuple[int, ...] = ()
    in_paths: tuple[str, ...] = ()
    scope: tuple[str, ...] | None = None
    ephemeral: bool | None = None
    graphdef: Any = None

    # -- identity ---------------------------------------------------------
    @property
    def is_ephemeral(self) -> bool:
        """True for nodes that stand for no real module: the root, nested
        jaxprs, and nodes created by a rewrite."""
        if self.ephemeral is not None:
            return self.ephemeral
        return self.kind in ("root", "jaxpr")

    @property
    def type(self) -> str:
        """The module's class name (``"Dense"``); the function name for
        activations; the kind otherwise."""
        if self.module_type is not None:
            return self.module_type.__name__
        return self.name if self.kind in FN_KINDS else self.kind

    @property
    def qualtype(self) -> str:
        t = self.module_type
        return f"{t.__module__}.{t.__qualname__}" if t is not None else self.type

    # -- shapes -----------------------------------------------------------
    @property
    def in_shapes(self) -> list[tuple[int, ...]]:
        return [a.shape for a in self.inputs]

    @property
    def out_shapes(self) -> list[tuple[int, ...]]:
        return [a.shape for a in self.outputs]

    @property
    def in_dtypes(self) -> list[Any]:
        return [a.dtype for a in self.inputs]

    @property
    def out_dtypes(self) -> list[Any]:
        return [a.dtype for a in self.outputs]

    # -- traversal --------------------------------------------------------
    @property
    def calls(self) -> list[Mox]:
        """The call nodes directly below this node (not inside equations)."""
        return [c for c in self.children if isinstance(c, Mox)]

    @property
    def equations(self) -> list[Equation]:
        return [c for c in self.children if isinstance(c, Equation)]

    def walk(self) -> Iterator[Equation | Mox]:
        """Every node below this one, depth first in program order, including
        nodes inside nested computations (scan bodies, jit callees)."""
        for c in self.children:
            yield c
            if isinstance(c, Mox):
                yield from c.walk()
            else:
                for _, sub in c.subs:
                    yield sub
                    yield from sub.walk()

    def modules(self) -> Iterator[Mox]:
        """Every call node below this one (module calls, helper method calls
        and activations), depth first."""
        return (n for n in self.walk() if isinstance(n, Mox) and n.kind in CALL_KINDS)

    def query(self, xpath: str) -> Any:
        """`yax.query(xpath, self)`: XPath 1.0 over the tree rooted here."""
        from ._xpath import query

        return query(xpath, self)

    # -- prototype-compatible views ----------------------------------------
    def to_dict(self) -> dict[str, Any]:
        from ._serial import to_dict

        return to_dict(self)

    def to_json(self, **kwargs: Any) -> str:
        from ._serial import to_json

        return to_json(self, **kwargs)

    def summary(self) -> str:
        """A table of module calls: path, type, shapes, parameters, FLOPs."""
        from ._summary import summary

        return summary(self)

    # -- printing (delegates to _print) -------------------------------------
    def __str__(self) -> str:
        from ._print import pprint

        return pprint(self)

    def __repr__(self) -> str:
        label = self.path or self.kind
        return f"Mox({self.kind}, {label!r}, children={len(self.children)})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self) if cycle else str(self))

    __hash__ = object.__hash__
