"""`model_jit`: how yax compiles the programs that run a whole model (`compare`'s
measurement, `capture`/`patch`, `first_nonfinite`, the explorer's values)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

#: XLA:CPU's memory-minimising scheduler. Its default one starts independent work early: every
#: float32 copy XLA makes of a bfloat16 weight for a matrix product is made first and lives to the
#: end (a bfloat16 1B Llama: 4.09 GB of temporaries besides its 2.03 GiB of weights, 0.26 GB with
#: this). The order of operations changes, not what any of them computes: the values are equal bit
#: for bit.
_MEMORY = {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"}

#: The event `jax.monitoring` records on the compiling thread right after XLA compiled a program
#: (before it first runs).
COMPILED = "/jax/core/compile/backend_compile_duration"


@functools.cache
def _options() -> dict[str, str | bool] | None:
    """`_MEMORY` where XLA:CPU compiles and knows it (jax >= 0.10), None elsewhere."""
    if jax.default_backend() != "cpu":
        return None
    try:
        jax.jit(lambda x: x + 1).lower(np.float32(0)).compile(dict(_MEMORY))
    except Exception:  # an XLA without the option refuses it: "No such compile option"
        return None
    return dict(_MEMORY)


def model_jit(fn: Callable[..., Any], **kwargs: Any) -> Any:
    """``jax.jit(fn, **kwargs)``, compiled with the memory-minimising scheduler on
    XLA:CPU where it is called outside any trace (a program run inside another
    ``jax.jit``, as `capture` may be, is compiled as part of that one), and giving
    the compiler's freed memory back to the system before the program first runs
    (`giving_back`)."""
    return _Scheduled(fn, _options(), kwargs)


# -- the compiler's memory ------------------------------------------------------------------
#
# Compiling a whole model allocates hundreds of MB on the host in many small blocks (a bfloat16 1B
# Llama's flagging program: 0.4 GB) that glibc keeps after XLA frees them. The program's temporaries
# that come next are large blocks glibc maps afresh, never from those: without a trim between the
# two, the compiler's leftovers and the run's temporaries are resident together (that program's
# peak 5.37 -> 4.95 GB). Only the compiles of yax's whole-model programs trim (`giving_back` marks
# the thread); a user's own compiles are left alone.

_here = threading.local()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    jax.monitoring.register_event_duration_secs_listener(_compiled)
    return trim


def _compiled(event: str, duration_secs: float, **kwargs: str | int) -> None:
    if event == COMPILED and getattr(_here, "giving_back", False):
        trim = _malloc_trim()
        if trim is not None:
            trim(0)
            _here.trims = getattr(_here, "trims", 0) + 1


@contextlib.contextmanager
def giving_back() -> Iterator[None]:
    """Within it, each program XLA compiles on this thread gives the memory the
    compiler freed back to the system (glibc's ``malloc_trim``) before it runs."""
    _malloc_trim()  # registers the listener once
    was = getattr(_here, "giving_back", False)
    _here.giving_back = True
    try:
        yield
    finally:
        _here.giving_back = was


class _Scheduled:
    """A jitted function called at top level with compiler options, and without them
    inside another trace (where JAX refuses them: "can only be passed to top-level")."""

    def __init__(self, fn: Callable[..., Any], options: dict[str, str | bool] | None, kwargs: dict[str, Any]):
        self.nested = jax.jit(fn, **kwargs)
        self.top = self.nested if options is None else jax.jit(fn, compiler_options=options, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with giving_back():
            try:
                return self.top(*args, **kwargs)
            except ValueError as e:
                if "top-level" not in str(e):
                    raise
            return self.nested(*args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> _Lowered:
        return _Lowered(self.top.lower(*args, **kwargs))

    def _cache_size(self) -> int:  # as a jitted function's: how many programs it compiled
        fs = (self.top,) if self.top is self.nested else (self.top, self.nested)
        sizes: list[int] = [f._cache_size() for f in fs]  # type: ignore[attr-defined]
        return sum(sizes)


class _Lowered:
    """A lowered whole-model program whose `compile` gives the compiler's memory back."""

    def __init__(self, lowered: Any):
        self.lowered = lowered

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        with giving_back():
            return self.lowered.compile(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lowered, name)
