"""Call markers and the recorder: how module boundaries get into a jaxpr.

`jax.make_jaxpr` records equations in the order Python binds them, so the
equations a module method ran are exactly those bound between its start and
its end. While tracing, a frontend's hook (a Flax interceptor, wrapped nnx
methods, a wrapped activation) runs each call through `marked_call`, which
passes every traced array going in and coming out through
``jax.lax.optimization_barrier`` inside ``jax.named_scope("yax_in_17")`` /
``("yax_out_17")``. These *markers* are ordinary public primitives: they have
batching, differentiation and checkpointing rules, so they survive lifted
transforms (``nn.scan``, ``nnx.vmap``, remat, jit), landing inside the nested
jaxprs where the calls really happened. `_build` turns each marker pair into
a call node and drops the markers, so the evaluated computation is the
original one, op for op.

Metadata a jaxpr cannot hold (module type, path, fields, parameter counts) is
recorded in a table keyed by the marker id. Bodies traced more than once
(``nn.scan`` traces for shapes first) leave calls whose markers never reach
the final jaxpr: they are simply never looked up.

This module knows no module system: frontends (`yax.frontends`) call
`marked_call` with what they know, and `recording` installs their hooks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._ir import Kind, ModuleInfo, Packing, Signature
from .errors import YaxTraceError

MARKER_RE = re.compile(r"yax_(in|out)_(\d+)")


@dataclasses.dataclass
class CallInfo:
    """What a hook learned about one call; completed when the call returns."""

    kind: Kind
    path: str
    name: str
    info: ModuleInfo = ModuleInfo()
    sig: Signature = Signature()
    module: Any = dataclasses.field(default=None, repr=False)  # the module object, while it runs
    #: shapes of the traced inputs and outputs as the call saw them (one instance's inside `nn.vmap`)
    seen: tuple[Any, ...] | None = None
    #: wall seconds its Python code took to trace, the calls it made included
    seconds: float | None = None


#: Marker ids, unique in the process, not per trace: a function JAX keeps in its trace cache (a
#: `jax.jit` helper, a scan body defined once) keeps the markers of the trace that first traced it,
#: and a later trace reuses that jaxpr. Its markers then name no call of the new trace, and are
#: left as plain equations, never taken for another call that happens to have the same number.
_IDS = itertools.count()


class Recorder:
    """Collects `CallInfo` for the markers placed during one trace."""

    def __init__(self) -> None:
        self.calls: dict[int, CallInfo] = {}
        #: calls that ended by an exception (caught by the model's code or Flax's: ``hasattr`` through
        #: a module's ``__getattr__``): their entry markers are dropped and the call is in no tree
        self.raised: set[int] = set()
        self._ids = _IDS  # one count for every trace: see `_IDS`
        self.stack: list[tuple[int, Any]] = []  # (call id, module or None)
        #: the name of the first outermost module called (a frontend's paths below that module's root
        #: start with it); not the traced function's, so never a prefix of what runs outside every call
        self.root_name: str | None = None
        #: per-frontend state for this trace, by frontend name (nnx's stamps)
        self.scratch: dict[str, Any] = {}
        #: with the collector paused for the trace: collect the young generation past this many objects
        self.young_limit: int | None = None

    def parent_path(self) -> str:
        """The path of the innermost running call; ``""`` outside any (at the
        root: ``relu`` after ``model.apply`` in a plain function is the root's,
        not ``Block/relu``, which names the activation inside the module)."""
        return self.calls[self.stack[-1][0]].path if self.stack else ""


_local = threading.local()

#: A value of this context in JAX's trace caches for each trace (`recording`), so that no trace
#: shares what a cache holds with the user's code or another trace. Without it a function the user
#: had jitted and run (``jax.jit(model.apply)``, ``nn.jit`` on ``__call__``, a jitted helper) was
#: handed back from JAX's cache as traced before, with no markers: a MoX with no calls, silently;
#: and the other way round, the user's next ``lower`` got the jaxpr yax had traced, barriers and all.
_OWN_CACHE = jax.make_user_context(None)
_TRACES = itertools.count(1)


def recorder() -> Recorder | None:
    """The recorder of the trace running in this thread, if any."""
    return getattr(_local, "recorder", None)


def is_traced(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


LAYOUT_SCOPE = "yax_layout"


def _canonical(x: Any) -> Any:
    """``x`` unchanged, but with every axis a ``jax.vmap`` added at the front, outermost first.

    Under ``jax.vmap`` an array's mapped axis sits wherever the last operation's
    batching rule left it (a ``dot_general`` of a bias-free layer leaves it last),
    and a call's values would come out in that internal layout: ``f32[5,7]`` for
    the ``f32[7,5]`` that ``jax.vmap(layer)(x)`` returns. A unit axis added and
    removed again is a no-op, but its batching rules move the mapped axes to the
    front, level by level (and again when a jaxpr holding it is mapped later: a
    scan or jit body inside a vmap). `_build` drops the pair and keeps the
    transposes that put the value in the stacked layout, so every call's inputs
    and outputs read as ``jax.vmap`` with ``out_axes=0`` would give them.
    """
    dtype = getattr(x, "dtype", None)
    if dtype is None or jnp.issubdtype(dtype, jax.dtypes.extended):
        return x
    with jax.named_scope(LAYOUT_SCOPE):
        y = jax.lax.broadcast_in_dim(x, (1, *x.shape), tuple(range(1, x.ndim + 1)))
        return jax.lax.squeeze(y, (0,))


def _mark(tag: str, leaves: list[Any], idx: tuple[int, ...]) -> None:
    """Pass ``leaves[i]`` for ``i in idx`` through a named barrier, in place,
    in the stacked layout (`_canonical`).

    A call with no traced values still gets a (dummy) barrier so that its start
    and end can be found in the jaxpr.
    """
    with jax.named_scope(tag):
        vals = [_canonical(leaves[i]) for i in idx] or [np.int8(0)]
        out = jax.lax.optimization_barrier(vals)
    for i, v in zip(idx, out):
        leaves[i] = v


def marked_call(call: CallInfo, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                is_leaf: Callable[..., Any] | None = None) -> Any:
    """Run ``fn(*args, **kwargs)`` between markers, recording ``call``.
    ``is_leaf`` keeps objects whole (nnx modules and variables)."""
    rec = recorder()
    if rec is None:
        raise YaxTraceError("`marked_call` runs only inside `recording` (a `make_mox` trace)")
    cid = next(rec._ids)
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs), is_leaf=is_leaf)
    ins, _ = Packing.from_leaves(treedef, leaves, is_traced)
    seen_in = tuple(tuple(leaves[i].shape) for i in ins.dyn)
    _mark(f"yax_in_{cid}", leaves, ins.dyn)
    if ins.dyn:
        args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
    rec.calls[cid] = call
    rec.stack.append((cid, call.module))
    started = time.perf_counter()
    try:
        out = fn(*args, **kwargs)
    except BaseException:
        # an exit marker never comes: the call is forgotten (what it bound stays in its caller)
        del rec.calls[cid]
        rec.raised.add(cid)
        raise
    finally:
        rec.stack.pop()
    call.seconds = time.perf_counter() - started
    leaves, treedef = jax.tree_util.tree_flatten(out, is_leaf=is_leaf)
    outs, _ = Packing.from_leaves(treedef, leaves, is_traced)
    call.sig = Signature(ins, outs)
    call.seen = (seen_in, tuple(tuple(leaves[i].shape) for i in outs.dyn))
    _mark(f"yax_out_{cid}", leaves, outs.dyn)
    if rec.young_limit is not None and gc.get_count()[0] > rec.young_limit:
        gc.collect(1)  # the two young generations: a cycle may have outlived a collection of the youngest
    return jax.tree_util.tree_unflatten(treedef, leaves) if outs.dyn else out


@contextlib.contextmanager
def recording(hooks: list[Callable[[Recorder], Any]]) -> Iterator[Recorder]:
    """Install a fresh recorder and each frontend's trace hooks (context
    manager factories taking the recorder) for one trace."""
    if recorder() is not None:
        raise YaxTraceError(
            "`make_mox` was called while another `make_mox` trace was running in this thread. "
            "Nested tracing is not supported; trace the inner function separately."
        )
    rec = Recorder()
    _local.recorder = rec
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(_OWN_CACHE(next(_TRACES)))
            for hook in hooks:
                stack.enter_context(hook(rec))
            yield rec
    finally:
        _local.recorder = None
