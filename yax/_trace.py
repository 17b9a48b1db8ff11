"""`make_mox`: trace a function into a MoX with public JAX APIs only.

The frontend that accepts ``fn`` (`yax.frontends`) says what is traced;
`jax.make_jaxpr` traces it while every frontend's hooks mark module calls
(`yax._record`); `yax._build` turns the marked jaxpr into the MoX tree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from . import _roots, frontends
from ._activations import ACTIVATIONS as ACTIVATIONS
from ._build import build
from ._check import check_if_enabled
from ._ir import Packing
from ._record import recording
from ._sharding import input_specs
from .errors import CouldNotTrace, WrongType, YaxTraceError


def is_dynamic(x: Any) -> bool:
    """Which argument leaves are traced: arrays and abstract shapes. Python
    scalars, strings and other objects are static, like ``train=False``."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


def make_mox(fn: Callable[..., Any], *, static_argnums: int | Sequence[int] | None = None,
             static_argnames: str | Sequence[str] | None = None) -> Callable[..., Any]:
    """Trace ``fn`` into a module expression, like ``jax.make_jaxpr``.

    Args:
      fn: a JAX function, a Flax linen ``Module.apply``, a bound linen module,
        an unbound linen module (meaning its ``apply``), an ``nnx.Module``
        (meaning its ``__call__``) or a bound method of one (``model.encode``).
      static_argnums, static_argnames: as for ``jax.jit``. By default, array
        leaves are traced and every other leaf (a Python float, ``train=False``)
        is static. Given either, the arguments named are static and every
        other leaf is traced, Python numbers included (a temperature that is a
        value, not a switch).

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
    frontend = frontends.for_target(fn)
    if frontend is None:
        raise WrongType("fn", "a callable (a JAX function, `Module.apply` or a module)", fn,
                        "Try `yax.make_mox(model.apply)(variables, x)`.")

    explicit = static_argnums is not None or static_argnames is not None
    nums = {static_argnums} if isinstance(static_argnums, int) else set(static_argnums or ())
    names = {static_argnames} if isinstance(static_argnames, str) else set(static_argnames or ())

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        n_user = len(args)
        target, args, kwargs, origin = frontend.prepare(fn, args, kwargs)
        shift = len(args) - n_user  # arguments a frontend put first (an nnx state) are never static

        def dynamic(keypath: tuple[Any, ...], x: Any) -> bool:
            if not explicit:
                return is_dynamic(x)
            where, which = keypath[0].idx, keypath[1]
            static = (which.idx - shift in nums) if where == 0 else (which.key in names)
            return not static and (is_dynamic(x) or isinstance(x, (bool, int, float, complex)))

        # remembered while it lives: a node cut from it and used in another MoX names its variables here
        return _roots.note(check_if_enabled(_traced_root(target, args, kwargs, frontend.name, origin, dynamic)))

    return traced


class _Setting:
    """A process-wide setting a trace changes (the recursion limit, the
    collector), for traces that may run in several threads at once: the
    first of them changes it, the last puts back what the first found, so
    that one ending never takes it from under another. Entered, yields what
    the first found."""

    def __init__(self, get: Callable[[], Any], put: Callable[[Any], Any], during: Callable[[Any], Any]):
        self._get, self._put, self._during = get, put, during
        self._lock = threading.Lock()
        self._traces = 0
        self._found: Any = None

    @contextlib.contextmanager
    def __call__(self) -> Iterator[Any]:
        with self._lock:
            if not self._traces:
                self._found = self._get()
                self._put(self._during(self._found))
            self._traces += 1
            found = self._found
        try:
            yield found
        finally:
            with self._lock:
                self._traces -= 1
                if not self._traces:
                    self._put(self._found)


#: Python's recursion limit raised twice while tracing: the hooks add frames
#: to every nested module call (interceptor, marker), and models as deep as
#: Flax itself can run must still trace.
_headroom = _Setting(sys.getrecursionlimit, sys.setrecursionlimit, lambda limit: 2 * limit)


def _traced_root(target: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], frontend: str, origin: Any,
                 dynamic: Callable[[tuple[Any, ...], Any], bool]) -> Any:
    flat, treedef = jax.tree_util.tree_flatten_with_path((args, kwargs))
    flags = iter([dynamic(kp, x) for kp, x in flat])
    ins, dyn_vals = Packing.from_leaves(treedef, [x for _, x in flat], lambda _: next(flags), [kp for kp, _ in flat])
    dyn_vals = [x if is_dynamic(x) else jax.numpy.asarray(x) for x in dyn_vals]
    outs: list[Packing] = []

    def flat_fn(*vals: Any) -> list[Any]:
        a, k = ins.unflatten(vals)
        packing, out = Packing.of(target(*a, **k), lambda x: isinstance(x, jax.Array))
        outs.append(packing)
        return out

    with _collector_paused() as paused:
        with recording(frontends.hooks()) as rec, _headroom():
            rec.young_limit = _YOUNG_LIMIT if paused else None
            try:
                closed = _roomy(jax.make_jaxpr(flat_fn), *dyn_vals)
            except YaxTraceError:
                raise
            except Exception as e:
                name = getattr(target, "__qualname__", type(target).__name__)
                raise CouldNotTrace(name, e, isinstance(e, jax.errors.ConcretizationTypeError)) from e
        name = getattr(target, "__name__", None) or type(target).__name__
        mox = build(closed, rec, ins, outs[-1], name=name, frontend=frontend, origin=origin)
        if frontends.settle(mox, rec):  # a path the trace guessed, corrected from the data flow
            mox = build(closed, rec, ins, outs[-1], name=name, frontend=frontend, origin=origin)
        del closed, rec  # gone before the collector runs again, which then scans only what lives on
    specs = input_specs(mox.invars, dyn_vals)
    return dataclasses.replace(mox, shardings=specs) if specs else mox


#: While the collector is paused for a trace, the young objects (allocated
#: and not yet collected) it lets pile up before it collects them anyway: a
#: bound on the garbage a trace can leave waiting (about 50 MB of objects).
_YOUNG_LIMIT = 500_000


def _collect(on: bool) -> None:
    (gc.enable if on else gc.disable)()


#: Python's cyclic garbage collector paused for a trace and build; yields
#: whether it was running (and so was paused here).
#:
#: A trace keeps almost everything it makes (the jaxpr, the recorded calls,
#: then the MoX: tens of objects per equation), so collections during it
#: free little and move what lives on to the old generation, until a full
#: collection of the whole process heap runs (0.11-0.15 s here, more in a
#: larger process). make_mox makes about twice what make_jaxpr makes and
#: so paid one in every trace of the 48-layer and 7B models, making it
#: 1.4-1.5 times make_jaxpr. Paused, what the trace leaves young is
#: collected once, at the next collection after it (2-10 ms on those
#: models); a trace that makes more than `_YOUNG_LIMIT` young objects
#: collects them on the way (`yax._record.marked_call`). The collector is
#: left as it was found: paused by the caller, it stays paused.
_collector_paused = _Setting(gc.isenabled, _collect, lambda was: False)


def _call(f: Callable[..., Any], *args: Any) -> Any:
    return f(*args)


#: ``f(*args)``, called from a frame that reserves half a megabyte of stack.
#:
#: CPython (3.11 on) keeps Python frames in chunks of 16 KiB, mapping a new
#: chunk when a call crosses a chunk's end and unmapping it when that call
#: returns. A JAX trace of a Flax model runs hundreds of frames deep and
#: can go up and down across such an end thousands of times; where it does
#: depends on how deep the caller is, and each module call of a make_mox
#: trace adds a few frames (the interceptor, the markers). A process making
#: 6 make_mox traces of Hugging Face BERT made 38,500 mmap calls without this
#: frame and 2,800 with it, imports included; a trace took 0.26 s with it and
#: 0.36 s without (make_jaxpr: 0.23 s). This frame reserves 64,600 stack
#: slots, so CPython gives it a 1 MiB chunk of its own and the trace runs in
#: the ~500 KiB left: no crossings unless the trace is thousands of frames
#: deep. ``co_stacksize`` only sizes the frame; the code is `_call`'s. Where
#: frames are not kept in chunks it changes nothing.
_roomy = types.FunctionType(_call.__code__.replace(co_stacksize=64_600), _call.__globals__, "_roomy")


def trace_target(target: Any, *args: Any, static_argnums: int | Sequence[int] | None = None,
                 static_argnames: str | Sequence[str] | None = None, **kwargs: Any) -> tuple[Any, tuple[Any, ...]]:
    """The MoX of ``target`` (anything `make_mox` takes) on ``*args, **kwargs``,
    and the positional arguments it is evaluated with (for an nnx module,
    its state comes first: docs/nnx.md)."""
    if frontends.for_target(target) is None:
        raise WrongType("target", "a model, a function or the MoX of one", target,
                        "Pass the model itself, its `apply` or a JAX function, then its inputs.")
    mox = make_mox(target, static_argnums=static_argnums, static_argnames=static_argnames)(*args, **kwargs)
    return mox, frontends.get(mox.frontend).arguments(target, args)


frontends.engine.provide(make_mox=make_mox)
