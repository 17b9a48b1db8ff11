"""Tracing a function into a MoX with public JAX and Flax APIs only.

How module boundaries get into the jaxpr
----------------------------------------
`jax.make_jaxpr` records equations in the order Python binds them, so the
equations a module method ran are exactly those bound between its start and
its end. While tracing, a Flax interceptor (``nn.intercept_methods``) passes
every traced array going into and coming out of a module method through
``jax.lax.optimization_barrier`` inside ``jax.named_scope("yax_in_17")`` /
``("yax_out_17")``. These *markers* are ordinary public primitives: they have
batching, differentiation and checkpointing rules, so they survive
``nn.scan``, ``nn.vmap``, ``nn.remat`` and ``nn.jit``, landing inside the
nested jaxprs where the calls really happened. `_build` then turns each
marker pair into a call node and drops the markers, so the evaluated
computation is the original one, op for op.

Metadata that a jaxpr cannot hold (module type, path, attributes, parameter
counts) is recorded by the interceptor in a table keyed by the marker id.
Flax traces some bodies more than once (``nn.scan`` traces for shapes first):
calls whose markers never reach the final jaxpr are simply never looked up.

Activations (``jax.nn.gelu`` and friends) are marked the same way, by
temporarily replacing the public names in ``jax.nn``, ``flax.linen`` and
``flax.nnx`` (and module fields holding them) for the duration of the trace.
Everything is restored in ``finally`` blocks, also when tracing fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import itertools
import math
import re
import threading
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .errors import YaxTraceError

MARKER_RE = re.compile(r"yax_(in|out)_(\d+)")

#: The activation functions that become addressable ``activation`` nodes.
ACTIVATIONS = (
    "relu", "relu6", "gelu", "silu", "swish", "sigmoid", "tanh", "softmax",
    "log_softmax", "elu", "celu", "selu", "leaky_relu", "softplus", "soft_sign",
    "log_sigmoid", "hard_sigmoid", "hard_silu", "hard_swish", "hard_tanh",
    "glu", "mish", "sparse_plus", "squareplus", "identity",
)
_ACTIVATION_HOMES = ("jax.nn", "flax.linen", "flax.linen.activation", "flax.nnx")


@dataclasses.dataclass
class CallInfo:
    """What the interceptor learned about one call; completed on exit."""

    kind: str
    path: str
    name: str
    module_type: type | None = None
    method: str | None = None
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    num_params: int = 0
    var_tree: Any = None
    in_tree: Any = None
    in_static: tuple = ()
    dyn_in: tuple = ()
    out_tree: Any = None
    out_static: tuple = ()
    dyn_out: tuple = ()
    scope: tuple[str, ...] | None = None


class Recorder:
    """Collects `CallInfo` for the markers placed during one trace."""

    def __init__(self) -> None:
        self.calls: dict[int, CallInfo] = {}
        self._ids = itertools.count()
        self.stack: list[tuple[int, Any]] = []  # (call id, module or None)
        self.root_name: str | None = None
        self.token: int | None = None  # set while nnx methods are wrapped
        self.stamped: list[Any] = []   # nnx modules given a path (see `_trace_nnx`)
        self.memo: dict[int, tuple] = {}  # id(nnx module) -> its variables, abstract
        self.sizes: dict[int, int] = {}   # id(nnx Param) -> its size


_local = threading.local()


def _recorder() -> Recorder | None:
    return getattr(_local, "recorder", None)


def _is_traced(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def _mark(tag: str, leaves: list[Any], idx: tuple[int, ...]) -> None:
    """Pass ``leaves[i]`` for ``i in idx`` through a named barrier, in place.

    A call with no traced values still gets a (dummy) barrier so that its start
    and end can be found in the jaxpr.
    """
    vals = [leaves[i] for i in idx] or [np.int8(0)]
    with jax.named_scope(tag):
        out = jax.lax.optimization_barrier(vals)
    for i, v in zip(idx, out):
        leaves[i] = v


def partition(leaves: list[Any], traced: Callable[[Any], bool]) -> tuple[tuple[int, ...], tuple]:
    """Indices of the leaves ``traced`` accepts, and ``(index, value)`` of the rest."""
    dyn = tuple(i for i, x in enumerate(leaves) if traced(x))
    dset = set(dyn)
    return dyn, tuple((i, x) for i, x in enumerate(leaves) if i not in dset)


def _split(tree: Any, is_leaf: Callable | None = None) -> tuple[list[Any], Any, tuple[int, ...], tuple]:
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_leaf)
    return leaves, treedef, *partition(leaves, _is_traced)


def marked_call(info: CallInfo, fn: Callable, args: tuple, kwargs: dict,
                is_leaf: Callable | None = None) -> Any:
    """Run ``fn(*args, **kwargs)`` between markers, recording ``info``.
    ``is_leaf`` keeps objects whole (nnx modules and variables)."""
    rec = _recorder()
    cid = next(rec._ids)
    leaves, info.in_tree, info.dyn_in, info.in_static = _split((args, kwargs), is_leaf)
    _mark(f"yax_in_{cid}", leaves, info.dyn_in)
    args, kwargs = jax.tree_util.tree_unflatten(info.in_tree, leaves)
    rec.calls[cid] = info
    rec.stack.append((cid, getattr(info, "_module", None)))
    try:
        out = fn(*args, **kwargs)
    finally:
        rec.stack.pop()
    leaves, info.out_tree, info.dyn_out, info.out_static = _split(out, is_leaf)
    _mark(f"yax_out_{cid}", leaves, info.dyn_out)
    return jax.tree_util.tree_unflatten(info.out_tree, leaves)


# -- Flax linen -----------------------------------------------------------------

def _linen_path(module: Any, rec: Recorder) -> str:
    """``Model/Block_3/Dense_0`` for a bound linen module."""
    import flax.linen as nn

    names = list(module.path or ())
    if not names and module.name is not None and isinstance(module.parent, nn.Module):
        # Lifted-transform wrappers (nn.scan(Block)) have no scope path of their own.
        return f"{_linen_path(module.parent, rec)}/{module.name}"
    if module.parent is None or not names:
        root_name = module.name or type(module).__name__
        if rec.root_name is None:
            rec.root_name = root_name
        if not names:
            # A root: the outermost one, or a module applied inside another
            # (tied embeddings through `other.apply`): nest it under its caller.
            outer = [c for c, m in rec.stack if m is not None and m is not module]
            if outer and rec.calls[outer[-1]].path:
                return f"{rec.calls[outer[-1]].path}/{root_name}"
            return root_name
    return "/".join([rec.root_name or "Model", *names])


_SKIP_FIELDS = ("parent", "name")


def _module_attrs(module: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(module):
        if f.name in _SKIP_FIELDS:
            continue
        out[f.name] = getattr(module, f.name, None)
    return out


def _count(tree: Any) -> int:
    return sum(math.prod(np.shape(x)) for x in jax.tree_util.tree_leaves(tree))


def _abstract(tree: Any) -> Any:
    def one(x: Any) -> Any:
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype)

    return jax.tree_util.tree_map(one, tree)


def _linen_interceptor(next_fun: Callable, args: tuple, kwargs: dict, context: Any) -> Any:
    rec = _recorder()
    if rec is None or context.method_name == "setup":
        return next_fun(*args, **kwargs)
    module = context.module
    method = context.method_name
    if not method.isidentifier():  # lifted transforms wrap __call__ in a lambda
        method = "__call__"
    same = bool(rec.stack) and rec.stack[-1][1] is module
    path = _linen_path(module, rec)
    info = CallInfo(
        kind="method_call" if same else "module_call",
        path=path,
        name=path.rsplit("/", 1)[-1],
        module_type=type(module),
        method=method,
        attrs=_module_attrs(module),
    )
    info._module = module  # type: ignore[attr-defined]
    with _swap_activation_fields(module):
        out = marked_call(info, next_fun, args, kwargs)
    try:
        variables = module.variables
    except Exception:  # an unbound helper module: nothing to count
        variables = {}
    info.num_params = _count(variables.get("params", {}))
    info.var_tree = _abstract(dict(variables))
    info.scope = tuple(module.path) if module.scope is not None else None
    return out


# -- activations ---------------------------------------------------------------

def _activation_wrapper(name: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        rec = _recorder()
        if rec is None or not any(_is_traced(x) for x in jax.tree_util.tree_leaves((args, kwargs))):
            return fn(*args, **kwargs)
        parent = rec.calls[rec.stack[-1][0]].path if rec.stack else (rec.root_name or "")
        info = CallInfo(
            kind="activation",
            path=f"{parent}/{name}" if parent else name,
            name=name,
            method=name,
            attrs={k: v for k, v in kwargs.items() if not _is_traced(v)},
        )
        return marked_call(info, fn, args, kwargs)

    wrapper.__yax_activation__ = name  # type: ignore[attr-defined]
    return wrapper


@functools.cache
def _activation_table() -> dict[int, tuple[str, Callable, Callable]]:
    """``id(original function) -> (name, original, wrapper)``."""
    import importlib

    table: dict[int, tuple[str, Callable, Callable]] = {}
    for home in _ACTIVATION_HOMES:
        try:
            mod = importlib.import_module(home)
        except ImportError:
            continue
        for name in ACTIVATIONS:
            fn = getattr(mod, name, None)
            if callable(fn) and id(fn) not in table and not hasattr(fn, "__yax_activation__"):
                table[id(fn)] = (name, fn, _activation_wrapper(name, fn))
    return table


@contextlib.contextmanager
def _patched_activations():
    import importlib

    table = _activation_table()
    undo = []
    try:
        for home in _ACTIVATION_HOMES:
            try:
                mod = importlib.import_module(home)
            except ImportError:
                continue
            for name in ACTIVATIONS:
                fn = getattr(mod, name, None)
                hit = table.get(id(fn))
                if hit is not None and hit[1] is fn:
                    undo.append((mod, name, fn))
                    setattr(mod, name, hit[2])
        yield
    finally:
        for mod, name, fn in reversed(undo):
            setattr(mod, name, fn)


def _swap(table: dict, v: Any) -> Any:
    hit = table.get(id(v)) if callable(v) else None
    return hit[2] if hit is not None and hit[1] is v else v


@contextlib.contextmanager
def _swap_activation_fields(module: Any):
    """Module fields that hold an activation (``act: Callable = nn.gelu``) are
    bound at class definition; point them at the marking wrapper for the call.
    Only the bound clone Flax made for this call is touched, and it is restored."""
    table = _activation_table()
    undo = []
    try:
        for f in dataclasses.fields(module):
            v = getattr(module, f.name, None)
            if isinstance(v, (list, tuple)) and type(v) in (list, tuple):  # nn.Sequential(layers)
                swapped = type(v)(_swap(table, x) for x in v)
                if any(a is not b for a, b in zip(swapped, v)):
                    undo.append((f.name, v))
                    object.__setattr__(module, f.name, swapped)
            elif _swap(table, v) is not v:
                undo.append((f.name, v))
                object.__setattr__(module, f.name, _swap(table, v))
        yield
    finally:
        for k, v in undo:
            object.__setattr__(module, k, v)


@contextlib.contextmanager
def recording():
    """Install the recorder, the linen interceptor, the nnx method wrappers
    and the activation patches."""
    if _recorder() is not None:
        raise YaxTraceError(
            "`make_mox` was called while another `make_mox` trace was running in this thread. "
            "Nested tracing is not supported; trace the inner function separately."
        )
    rec = Recorder()
    _local.recorder = rec
    try:
        with contextlib.ExitStack() as stack:
            try:
                import flax.linen as nn
            except ImportError:  # plain JAX functions need no interceptor
                nn = None
            if nn is not None:
                stack.enter_context(nn.intercept_methods(_linen_interceptor))
            from ._trace_nnx import patched_methods

            stack.enter_context(patched_methods(rec))
            stack.enter_context(_patched_activations())
            yield rec
    finally:
        _local.recorder = None


# -- the entry point ---------------------------------------------------------------

def is_dynamic(x: Any) -> bool:
    """Which argument leaves are traced: arrays and abstract shapes. Python
    scalars, strings and other objects are static, like ``train=False``."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


def _describe(fn: Any) -> Any:
    """Turn the forms of ``fn`` yax accepts into a plain callable."""
    try:
        import flax.linen as nn
    except ImportError:
        nn = None
    if nn is not None and isinstance(fn, nn.Module):
        if fn.scope is None:
            return fn.apply  # make_mox(model)(variables, x) == make_mox(model.apply)(...)
        return fn
    if not callable(fn):
        raise YaxTraceError(
            f"`make_mox` expected a callable (a JAX function, `Module.apply` or a bound module), "
            f"but got a `{type(fn).__name__}`. Try `yax.make_mox(model.apply)(variables, x)`."
        )
    return _swap(_activation_table(), fn)  # a bare activation becomes an activation node too


def make_mox(fn: Callable) -> Callable[..., Any]:
    """Trace ``fn`` into a module expression, like ``jax.make_jaxpr``.

    Args:
      fn: a JAX function, a Flax linen ``Module.apply``, a bound linen module,
        an unbound linen module (meaning its ``apply``), an ``nnx.Module``
        (meaning its ``__call__``) or a bound method of one (``model.encode``).

    Returns:
      A function taking the same ``*args, **kwargs`` as ``fn`` and returning
      the root :class:`Mox`. Array leaves (also ``jax.ShapeDtypeStruct``) are
      traced abstractly; other leaves (``train=False``, ``mutable=[...]``) are
      static and baked in.

      For an nnx module, the MoX computes the pure function
      ``(state, *args, **kwargs) -> (out, new_state)`` with
      ``graphdef, state = nnx.split(model)``: evaluate it with
      ``out, new_state = yax.eval_mox(mox, state, x)``; ``mox.graphdef`` is
      the graphdef (see docs/nnx.md). The model is not changed.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> model = nn.Dense(3)
      >>> x = jnp.ones((2, 4))
      >>> variables = model.init(jax.random.key(0), x)
      >>> mox = yax.make_mox(model.apply)(variables, x)
      >>> [m.path for m in mox.modules()]
      ['Dense']
    """
    from ._build import build
    from ._trace_nnx import is_module

    if is_module(fn) or (inspect.ismethod(fn) and is_module(fn.__self__)):
        return _make_nnx_mox(fn)
    target = _describe(fn)

    @functools.wraps(target)
    def traced(*args: Any, **kwargs: Any) -> Any:
        flat, in_tree = jax.tree_util.tree_flatten_with_path((args, kwargs))
        leaves = [x for _, x in flat]
        dyn, static = partition(leaves, is_dynamic)
        out_info: dict[str, Any] = {}

        def flat_fn(*dyn_vals: Any) -> list[Any]:
            full = list(leaves)
            for i, v in zip(dyn, dyn_vals):
                full[i] = v
            a, k = jax.tree_util.tree_unflatten(in_tree, full)
            out = target(*a, **k)
            out_leaves, out_info["tree"] = jax.tree_util.tree_flatten(out)
            out_info["dyn"], out_info["static"] = partition(out_leaves, lambda x: isinstance(x, jax.Array))
            return [out_leaves[i] for i in out_info["dyn"]]

        with recording() as rec:
            try:
                closed = jax.make_jaxpr(flat_fn)(*[leaves[i] for i in dyn])
            except YaxTraceError:
                raise
            except Exception as e:
                name = getattr(target, "__qualname__", type(target).__name__)
                raise YaxTraceError(
                    f"JAX could not trace `{name}`: {type(e).__name__}: {e}\n"
                    "The function must be traceable by `jax.make_jaxpr` with these arguments; "
                    "Python scalars are static (like `train=False`), arrays are traced."
                ) from e
        return build(
            closed,
            rec,
            in_tree=in_tree,
            in_static=static,
            dyn_in=dyn,
            in_paths=tuple(jax.tree_util.keystr(flat[i][0]) for i in dyn),
            out_tree=out_info["tree"],
            out_static=out_info["static"],
            dyn_out=out_info["dyn"],
            name=getattr(target, "__name__", None) or type(target).__name__,
        )

    return traced


def _make_nnx_mox(fn: Any) -> Callable[..., Any]:
    import dataclasses

    from ._trace_nnx import module_target

    module, method = (fn.__self__, fn.__name__) if inspect.ismethod(fn) else (fn, "__call__")

    def traced(*args: Any, **kwargs: Any) -> Any:
        pure, graphdef, state = module_target(module, method)
        state = jax.tree_util.tree_map(_shape_of, state)
        mox = make_mox(pure)(state, *args, **kwargs)
        return dataclasses.replace(mox, graphdef=graphdef)

    return traced


def _shape_of(x: Any) -> Any:
    """Trace the model's state abstractly, whatever its leaves are."""
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype) if hasattr(x, "dtype") else x
