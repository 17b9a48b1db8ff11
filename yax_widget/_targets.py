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


def target_kind(target: Any, traced: Any, mox: Any) -> str:
    """How the explorer's model was given, for the opening lines of "copy as code":
    ``mox`` (a MoX), ``hf`` (a Hugging Face wrapper object, see `hf_call`), ``nnx``, or
    ``call`` (a linen module or a function: ``yax.make_mox(target)(*args)``)."""
    if target is mox:
        return "mox"
    if traced is not target:
        return "hf"
    return "nnx" if getattr(mox, "frontend", None) == "nnx" else "call"


def _literal(v: Any) -> str:
    return repr(v) if v is None or isinstance(v, (bool, int, float, str)) else "..."


def opening_lines(kind: str, names: list[str] | None, n_args: int, kwargs: dict, has_params: bool) -> list[str]:
    """The lines of "copy as code" that make ``mox`` and ``params`` as the explorer
    was opened, so the script runs as pasted. ``names``: the expressions the
    model and its inputs were given as (``%yax`` knows them); without them the
    usual names are written, with a comment saying to rename them.

    Example:
      >>> opening_lines("call", ["net", "v", "x"], 2, {}, True)
      ['mox = yax.make_mox(net)(v, x)', 'params = v']
    """
    if kind in ("hf", "nnx"):
        n_args -= 1  # the wrapper's params, the nnx state: the explorer put them first
    guessed = names is None
    if guessed:
        plain = kind == "call" and not has_params  # a function of arrays
        first = "variables" if has_params and kind == "call" else None
        rest = ["x" if plain else "batch"] + [f"input{i}" for i in range(2, n_args + 1)]
        inputs = ([first] if first else []) + rest
        names = ["fn" if plain else {"hf": "model", "nnx": "net", "mox": "mox0"}.get(kind, "model"), *inputs[:n_args]]
    target, inputs = names[0], list(names[1:])
    kw = "".join(f", {k}={_literal(v)}" for k, v in kwargs.items())
    call = f"({', '.join(inputs)}{kw})"
    if kind == "mox":
        lines = [f"mox = {target}"] + ([f"params = {inputs[0]}"] if has_params and inputs else [])
    elif kind == "hf":
        lines = [f"mox = yax.make_mox(lambda params, *inputs: {target}(*inputs, params=params))"
                 f"({target}.params, {', '.join(inputs)}{kw})", f"params = {target}.params"]
    elif kind == "nnx":
        lines = ["from flax import nnx", f"mox = yax.make_mox({target}){call}", f"params = nnx.state({target})"]
    else:
        lines = [f"mox = yax.make_mox({target}){call}"] + ([f"params = {inputs[0]}"] if has_params and inputs else [])
    if guessed:
        lines.insert(0, f"# {', '.join(f'`{n}`' for n in names)}: what was given to Explorer(...); use your names")
    return lines
