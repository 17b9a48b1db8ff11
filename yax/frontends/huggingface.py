"""Hugging Face's Flax models: linen modules (traced by the linen frontend)
behind a wrapper object, in the spirit of treescope's one support file per
library. What differs from plain linen is contributed here: the activation
table the library builds at import time (``ACT2FN``: its own functions and
partials of linen's, named by the config's ``hidden_act``), and how the
explorer holds a wrapper's parameters (`unwrap`) and writes the script that
traces it again (`script`).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._scripts import Script, register_script
from ._protocol import Frontend


class HuggingFace(Frontend):
    name = "huggingface"
    order = 25  # accepts nothing itself: its models are traced by linen
    activation_tables = (("transformers.modeling_flax_utils", "ACT2FN"),)
    prepended = 1  # the wrapper's parameters

    def call_signature(self, target: Any) -> tuple[Callable[..., Any], int] | None:
        if "flax.linen" not in sys.modules:
            return None
        import flax.linen as nn

        wrapper = not isinstance(target, nn.Module) and isinstance(getattr(target, "module", None), nn.Module)
        return (target.__call__, 0) if wrapper else None  # `model(input_ids, ...)`: its parameters are no input

    def unwrap(self, target: Any, args: tuple[Any, ...]) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
        """For a Hugging Face Flax wrapper (``FlaxBertForMaskedLM(...)``: a linen
        ``.module``, its ``.params``, and a ``__call__`` taking ``params=``): a
        function of ``(params, *args)`` calling it, and ``(target.params, *args)``.

        Example:
          ``Explorer(FlaxGPT2LMHeadModel(config), ids)`` traces
          ``lambda params, ids: model(ids, params=params)`` on ``(model.params, ids)``.
        """
        if "flax.linen" not in sys.modules:  # then no object holds a linen module
            return None
        import flax.linen as nn

        if isinstance(target, nn.Module) or not isinstance(getattr(target, "module", None), nn.Module):
            return None
        try:
            params = target.params
            takes = "params" in inspect.signature(target.__call__).parameters
        except Exception:  # a wrapper built with `_do_init=False` holds no parameters: traced as it is
            return None
        if not isinstance(params, Mapping) or not takes:
            return None

        @functools.wraps(type(target).__call__, assigned=("__doc__",))
        def call(params: Any, *inputs: Any, **kwargs: Any) -> Any:
            return target(*inputs, params=params, **kwargs)

        call.__name__ = call.__qualname__ = type(target).__name__
        return call, (params, *args)



def _lines(model: str, inputs: Sequence[str], kwargs: str, has_params: bool) -> list[str]:
    # the wrapper's parameters first, as `unwrap` traces it; its keyword inputs (`input_ids=`) passed on
    return [f"mox = yax.make_mox(lambda params, *inputs, **kwargs: {model}(*inputs, params=params, **kwargs))"
            f"({', '.join([f'{model}.params', *inputs])}{kwargs})", f"params = {model}.params"]


frontend = HuggingFace()
register_script(frontend.name, Script(
    names=lambda n, has_params: ["model", "batch", *(f"input{i}" for i in range(2, n + 1))][: n + 1], lines=_lines))
