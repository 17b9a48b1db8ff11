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
import enum
import math
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import jax
import numpy as np

from ._vocab import Shaped as Shaped
from ._vocab import type_str

if TYPE_CHECKING:
    from ._source import Location

__all__ = ["Symbol", "Var", "Literal", "Equation", "Mox", "Kind", "CALL_KINDS", "FN_KINDS", "Packing",
           "Signature", "ModuleInfo", "holds_mox"]


class Kind(enum.StrEnum):
    """What a `Mox` node stands for (its ``kind``; equal to the plain strings)."""

    ROOT = "root"                  #: the traced function itself
    JAXPR = "jaxpr"                #: a computation nested in an equation (a scan body)
    MODULE_CALL = "module_call"    #: one call of a module method
    METHOD_CALL = "method_call"    #: a helper method called on the enclosing call's module
    ACTIVATION = "activation"      #: a call of a standard activation function
    FUNCTION = "function"          #: a call of a plain function put in by a rewrite


#: Kinds of Mox node that stand for a call in the user's program.
CALL_KINDS = (Kind.MODULE_CALL, Kind.METHOD_CALL, Kind.ACTIVATION, Kind.FUNCTION)
#: Call kinds that stand for a plain function rather than a module.
FN_KINDS = (Kind.ACTIVATION, Kind.FUNCTION)

#: The functions behind `Mox`'s convenience methods (``str``, ``query``, ``to_json``, ``summary``…),
#: put here by the modules that define them (`delegate`): the IR imports none of its printers,
#: serialisers or queries. Importing any part of yax imports them all (`yax/__init__.py`).
_delegates: dict[str, Callable[..., Any]] = {}

_F = TypeVar("_F", bound=Callable[..., Any])


def delegate(name: str) -> Callable[[_F], _F]:
    """Makes the decorated function the one `Mox`'s method ``name`` calls."""

    def put(f: _F) -> _F:
        _delegates[name] = f
        return f

    return put



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
        return f"Var({type_str(self)})"


class Literal(Symbol):
    """A constant scalar written inline, as in a jaxpr (``2.0:f32[]``)."""

    __slots__ = ("val",)

    def __init__(self, val: Any, shape: tuple[int, ...] = (), dtype: Any = None, weak_type: bool = False):
        if dtype is None:
            dtype = np.asarray(val).dtype
        super().__init__(shape, dtype, weak_type)
        self.val = val

    def __repr__(self) -> str:
        return f"Literal({self.val!r}:{type_str(self)})"



def holds_mox(v: Any) -> bool:
    """Whether an equation parameter holds nested computations: a `Mox`, or a
    tuple of them (``cond`` branches)."""
    return isinstance(v, Mox) or (isinstance(v, tuple) and bool(v) and all(isinstance(x, Mox) for x in v))


@dataclasses.dataclass(frozen=True)
class Packing:
    """How a pytree is rebuilt from the values that were traced: its treedef,
    the indices of its traced leaves (``dyn``), the other leaves as
    ``(index, value)`` pairs (``static``: ``train=False``, ``None``), and,
    for arguments, each traced leaf's key path as the user writes it
    (``"[0]['params']['Dense_0']['kernel']"``)."""

    tree: Any = None
    dyn: tuple[int, ...] = ()
    static: tuple[tuple[int, Any], ...] = ()
    paths: tuple[str, ...] = ()

    @classmethod
    def of(cls, tree: Any, traced: Any, is_leaf: Any = None, with_paths: bool = False) -> tuple[Packing, list[Any]]:
        """The packing of ``tree`` and its traced leaves (those ``traced`` accepts)."""
        if with_paths:
            flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
            keys, leaves = [k for k, _ in flat], [x for _, x in flat]
        else:
            (leaves, treedef), keys = jax.tree_util.tree_flatten(tree, is_leaf=is_leaf), None
        return cls.from_leaves(treedef, leaves, traced, keys)

    @classmethod
    def from_leaves(cls, treedef: Any, leaves: Sequence[Any], traced: Any,
                    keys: Sequence[Any] | None = None) -> tuple[Packing, list[Any]]:
        """The packing of flattened leaves, and the traced ones."""
        dyn = tuple(i for i, x in enumerate(leaves) if traced(x))
        dset = set(dyn)
        static = tuple((i, x) for i, x in enumerate(leaves) if i not in dset)
        paths = tuple(jax.tree_util.keystr(tuple(keys[i])) for i in dyn) if keys is not None else ()
        return cls(treedef, dyn, static, paths), [leaves[i] for i in dyn]

    @property
    def size(self) -> int:
        """The number of leaves, traced and static."""
        return len(self.dyn) + len(self.static)

    def unflatten(self, values: Sequence[Any]) -> Any:
        """The pytree with ``values`` at the traced leaves (in order)."""
        leaves: list[Any] = [None] * self.size
        for i, x in zip(self.dyn, values):
            leaves[i] = x
        for i, x in self.static:
            leaves[i] = x
        return jax.tree_util.tree_unflatten(self.tree, leaves)

    def leaf_paths(self) -> list[str]:
        """The key path of every leaf (``[0]['params']``), traced or not."""
        marks = jax.tree_util.tree_unflatten(self.tree, list(range(self.size)))
        return [jax.tree_util.keystr(kp) for kp, _ in jax.tree_util.tree_flatten_with_path(marks)[0]]


@dataclasses.dataclass(frozen=True)
class Signature:
    """How a call (or the root) is called: the packing of its ``(args,
    kwargs)`` and of its result. ``args(values)`` and ``results(values)``
    rebuild them from the traced values."""

    ins: Packing = Packing()
    outs: Packing = Packing()

    def args(self, values: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` with ``values`` at the traced leaves."""
        args: tuple[tuple[Any, ...], dict[str, Any]] = self.ins.unflatten(values)
        return args

    def results(self, values: Sequence[Any]) -> Any:
        """The result pytree with ``values`` at the traced leaves."""
        return self.outs.unflatten(values)


@dataclasses.dataclass(frozen=True)
class ModuleInfo:
    """What a call node knows of the module (or function) it called.

    Attributes:
      type: the module class (``None`` for activations and functions).
      method: the method name (``"__call__"``; the function name for activations).
      attrs: the module's fields (``features=10``), or an activation's keyword
        arguments: a read-only mapping (a copy of what it was built from).
      defaults: the fields' default values (so printers show what differs), read-only too.
      num_params: parameters the module owns (the size of its ``params``).
      var_tree: its variables as a pytree of ``jax.ShapeDtypeStruct``.
      scope: where its variables live: its path in the linen variables dict,
        or its attribute path in an nnx model.
      frontend: the name of the module system (``"linen"``, ``"nnx"``).
      seen: the shapes of its traced inputs and outputs as the module saw
        them, ``(ins, outs)``: one instance's inside ``nn.vmap``, where the
        node's ``inputs``/``outputs`` carry the mapped axis (``None``: not recorded).
      seconds: the wall seconds `make_mox` spent tracing the call (its Python code, the
        calls it made included; ``None``: not traced, a rewrite made it).
    """

    type: type | None = None
    method: str | None = None
    attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    num_params: int = 0
    var_tree: Any = None
    scope: tuple[str, ...] | None = None
    frontend: str | None = None
    seen: tuple[Any, ...] | None = dataclasses.field(default=None, repr=False, compare=False)
    seconds: float | None = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Frozen is not enough: a dict field can still be changed in place (a decider setting
        # `node.attrs["x"]`), and printing, querying (a cached view) and comparing would disagree.
        for name in ("attrs", "defaults"):
            v = getattr(self, name)
            if not isinstance(v, types.MappingProxyType):
                object.__setattr__(self, name, types.MappingProxyType(dict(v)))


_NO_INFO = ModuleInfo()
_NO_SIG = Signature()


class _Typed:
    """Shapes and dtypes of a node's ``inputs`` and ``outputs``."""

    __slots__ = ()
    inputs: tuple[Symbol, ...]
    outputs: tuple[Symbol, ...]

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


@dataclasses.dataclass(frozen=True, eq=False)
class Equation(_Typed):
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
    _jaxprs: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def name(self) -> str:
        """The primitive's name, e.g. ``"dot_general"``."""
        name: str = self.primitive.name
        return name

    @property
    def prim(self) -> Any:
        """The earlier prototype's name for `primitive`."""
        return self.primitive

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
    def source(self) -> Location | None:
        """Where the user's code made this equation: a ``Location(path, line)``
        (``str()``: ``model.py:12``), or ``None`` where JAX recorded no line of it."""
        from ._source import location

        return location(self)

    def __repr__(self) -> str:
        return f"Equation({self.name}, path={self.path!r})"


@dataclasses.dataclass(frozen=True, eq=False)
class Mox(_Typed):
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
      info: what the call knows of its module (`ModuleInfo`: type, method,
        fields, parameter count, variables, scope); read through the short
        names ``module_type``, ``method``, ``attrs``, ``num_params``,
        ``var_tree`` and ``scope``.
      sig: how it is called (`Signature`: the packing of ``(args, kwargs)``
        and of the result); read through ``in_tree``/``out_tree``,
        ``in_static``/``out_static`` (untraced leaves as ``(index, value)``),
        ``dyn_in``/``dyn_out`` (indices of traced leaves) and ``in_paths``.
      frontend: on a root, the name of the frontend that traced it
        (``"linen"``, ``"nnx"``, ``"equinox"``, ``"jax"`` for a plain function).
      origin: on a root, what that frontend keeps to rebuild the traced
        object (for nnx, the ``nnx.GraphDef``, also as ``graphdef``).
      shardings: on a root traced on arrays laid out over several devices (a
        ``jax.sharding.NamedSharding`` on a mesh), ``(var, PartitionSpec)`` of each
        such input; empty when no input splits an axis (`yax._sharding`).
      source_info: on a call, JAX's source info of the call's entry (its
        traceback runs through the line that called it); read as `source`.
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
    info: ModuleInfo = _NO_INFO
    sig: Signature = _NO_SIG
    ephemeral: bool | None = None
    frontend: str | None = None
    origin: Any = None
    shardings: tuple[tuple[Var, Any], ...] = dataclasses.field(default=(), repr=False)
    source_info: Any = dataclasses.field(default=None, repr=False)

    # -- module facts and call signature, by their short names ---------------
    module_type = property(lambda self: self.info.type, doc="The module class (``None`` for other kinds).")
    method = property(lambda self: self.info.method, doc="The method name (``\"__call__\"``).")
    attrs = property(lambda self: self.info.attrs, doc="The module's fields, or an activation's keywords.")
    num_params = property(lambda self: self.info.num_params, doc="Parameters owned by the module.")
    var_tree = property(lambda self: self.info.var_tree, doc="The module's variables, abstract.")
    scope = property(lambda self: self.info.scope, doc="Where the module's variables live.")
    in_tree = property(lambda self: self.sig.ins.tree, doc="The treedef of ``(args, kwargs)``.")
    out_tree = property(lambda self: self.sig.outs.tree, doc="The treedef of the result.")
    in_static = property(lambda self: self.sig.ins.static, doc="Untraced argument leaves, ``(index, value)``.")
    out_static = property(lambda self: self.sig.outs.static, doc="Untraced result leaves, ``(index, value)``.")
    dyn_in = property(lambda self: self.sig.ins.dyn, doc="Indices of the traced argument leaves.")
    dyn_out = property(lambda self: self.sig.outs.dyn, doc="Indices of the traced result leaves.")
    in_paths = property(lambda self: self.sig.ins.paths, doc="Key paths of the traced argument leaves.")
    module_ty = property(lambda self: self.info.type, doc="The earlier prototype's name for `module_type`.")
    graphdef = property(lambda self: self.origin,
                        doc="On a root traced from an ``nnx.Module``: the ``nnx.GraphDef`` (the frontend's origin).")

    @property
    def source(self) -> Location | None:
        """Where the user's code called this module (or function): a
        ``Location(path, line)`` (``str()``: ``model.py:12``), or ``None`` (the
        root, a nested computation, a node built by hand)."""
        from ._source import location

        return location(self)

    # -- identity ---------------------------------------------------------
    @property
    def is_ephemeral(self) -> bool:
        """True for nodes that stand for no real module: the root, nested
        jaxprs, and nodes created by a rewrite."""
        if self.ephemeral is not None:
            return self.ephemeral
        return self.kind in (Kind.ROOT, Kind.JAXPR)

    @property
    def type(self) -> str:
        """The module's class name (``"Dense"``); the function name for
        activations; the kind otherwise."""
        t: type | None = self.module_type
        if t is not None:
            return t.__name__
        return self.name if self.kind in FN_KINDS else self.kind

    @property
    def qualtype(self) -> str:
        t = self.module_type
        return f"{t.__module__}.{t.__qualname__}" if t is not None else self.type

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
        nodes inside nested computations (scan bodies, jit callees). Without
        recursion: a tree of any depth walks."""
        stack = [iter(self.children)]
        while stack:
            n = next(stack[-1], None)
            if n is None:
                stack.pop()
                continue
            yield n
            stack.append(iter(n.children) if isinstance(n, Mox) else iter([s for _, s in n.subs]))

    def modules(self) -> Iterator[Mox]:
        """Every call node below this one (module calls, helper method calls
        and activations), depth first."""
        return (n for n in self.walk() if isinstance(n, Mox) and n.kind in CALL_KINDS)

    def query(self, xpath: str, *, timeout: float | None = None) -> Any:
        """`yax.query(xpath, self)`: XPath 1.0 over the tree rooted here."""
        return _delegates["query"](xpath, self, timeout=timeout)

    # -- prototype-compatible views ----------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return _delegates["to_dict"](self)  # type: ignore[no-any-return]

    def to_json(self, **kwargs: Any) -> str:
        return _delegates["to_json"](self, **kwargs)  # type: ignore[no-any-return]

    def pprint(self, *, source: bool = False) -> str:
        """`yax.pprint` of this node; ``source=True`` ends each line with the user's ``# file.py:line``."""
        return _delegates["pprint"](self, source=source)  # type: ignore[no-any-return]

    def summary(self, cost: Any = None) -> str:
        """A table of module calls: path, type, shapes, parameters, FLOPs (`yax.summary`)."""
        return _delegates["summary"](self, cost)  # type: ignore[no-any-return]

    # -- printing (`yax.pprint`) ---------------------------------------------
    def __str__(self) -> str:
        return _delegates["pprint"](self)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        label = self.path or str(self.kind)
        return f"Mox({self.kind}, {label!r}, children={len(self.children)})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self) if cycle else str(self))

    __hash__ = object.__hash__
