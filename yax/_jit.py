"""`model_jit`: how yax compiles the programs that run a whole model (`compare`'s
measurement, `capture`/`patch`, `first_nonfinite`, the explorer's values)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

#: XLA:CPU's memory-minimising scheduler. Its default one starts independent work early: every
#: float32 copy XLA makes of a bfloat16 weight for a matrix product is made first and lives to the
#: end (a bfloat16 1B Llama: 4.09 GB of temporaries besides its 2.03 GiB of weights, 0.26 GB with
#: this). The order of operations changes, not what any of them computes: the values are equal bit
#: for bit.
_MEMORY = {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"}


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
    ``jax.jit``, as `capture` may be, is compiled as part of that one)."""
    options = _options()
    return jax.jit(fn, **kwargs) if options is None else _Scheduled(fn, options, kwargs)


class _Scheduled:
    """A jitted function called at top level with compiler options, and without them
    inside another trace (where JAX refuses them: "can only be passed to top-level")."""

    def __init__(self, fn: Callable[..., Any], options: dict[str, str | bool], kwargs: dict[str, Any]):
        self.top = jax.jit(fn, compiler_options=options, **kwargs)
        self.nested = jax.jit(fn, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.top(*args, **kwargs)
        except ValueError as e:
            if "top-level" not in str(e):
                raise
        return self.nested(*args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        return self.top.lower(*args, **kwargs)

    def _cache_size(self) -> int:  # as a jitted function's: how many programs it compiled
        sizes: list[int] = [f._cache_size() for f in (self.top, self.nested)]  # type: ignore[attr-defined]
        return sum(sizes)
