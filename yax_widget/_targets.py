"""What the explorer traces when it is given an object that is not a module
`yax.make_mox` knows: a Hugging Face Flax model (the wrapper object, which
holds its parameters and passes them to its linen module at call time)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any


def hf_call(target: Any, args: tuple) -> tuple[Any, tuple]:
    """``(target, args)`` unchanged, except for a Hugging Face Flax wrapper
    (``FlaxBertForMaskedLM(...)``: a linen ``.module``, its ``.params``, and a
    ``__call__`` taking ``params=``): then a function of ``(params, *args)``
    calling it, and ``(target.params, *args)``. Traced that way, the explorer
    holds the parameters it compares and rewrites (a module substitution places
    its variables there) instead of baking them into the trace as constants.

    Example:
      ``Explorer(FlaxGPT2LMHeadModel(config), ids)`` traces
      ``lambda params, ids: model(ids, params=params)`` on ``(model.params, ids)``.
    """
    import flax.linen as nn

    if isinstance(target, nn.Module) or not isinstance(getattr(target, "module", None), nn.Module):
        return target, args
    try:
        params = target.params
        takes = "params" in inspect.signature(target.__call__).parameters
    except Exception:  # a wrapper built with `_do_init=False` holds no parameters: traced as it is
        return target, args
    if not isinstance(params, Mapping) or not takes:
        return target, args

    @functools.wraps(type(target).__call__, assigned=("__doc__",))
    def call(params: Any, *inputs: Any, **kwargs: Any) -> Any:
        return target(*inputs, params=params, **kwargs)

    call.__name__ = call.__qualname__ = type(target).__name__
    return call, (params, *args)
