"""What the explorer traces for the object it is given, and the opening lines
of "copy as code" that trace it again. Both are the frontends' to say
(`yax.internal.unwrap_target`, `Frontend.script`): no module system is named here."""

from __future__ import annotations

from typing import Any

from yax.internal import frontend_named, unwrap_target


def hf_call(target: Any, args: tuple) -> tuple[Any, tuple]:
    """``(target, args)`` unchanged, except for a model object that holds its
    own variables and takes them at call time (a Hugging Face Flax wrapper:
    ``FlaxBertForMaskedLM(...)``): then a function of ``(variables, *args)``
    calling it, and ``(variables, *args)`` (`Frontend.unwrap`). Traced that
    way, the explorer holds the parameters it compares and rewrites (a module
    substitution places its variables there) instead of baking them into the
    trace as constants."""
    found = unwrap_target(target, args)
    return (target, args) if found is None else (found[0], found[1])


def target_kind(target: Any, traced: Any, mox: Any) -> str:
    """How the explorer's model was given, for the opening lines of "copy as code":
    ``mox`` (a MoX), else the name of the frontend that writes the lines (the
    one that unwrapped ``target`` into ``traced``, see `hf_call`, or the MoX's own)."""
    if target is mox:
        return "mox"
    if traced is not target:
        found = unwrap_target(target, ())
        if found is not None:
            return found[2].name
    return getattr(mox, "frontend", None) or "jax"


def _literal(v: Any) -> str:
    return repr(v) if v is None or isinstance(v, (bool, int, float, str)) else "..."


def opening_lines(kind: str, names: list[str] | None, n_args: int, kwargs: dict, has_params: bool) -> list[str]:
    """The lines of "copy as code" that make ``mox`` and ``params`` as the explorer
    was opened, so the script runs as pasted. ``names``: the expressions the
    model and its inputs were given as (``%yax`` knows them); without them the
    frontend's usual names are written, with a comment saying to rename them.

    Example:
      >>> opening_lines("linen", ["net", "v", "x"], 2, {}, True)
      ['mox = yax.make_mox(net)(v, x)', 'params = v']
    """
    kw = "".join(f", {k}={_literal(v)}" for k, v in kwargs.items())
    guessed = names is None
    if kind == "mox":
        if names is None:
            names = ["mox0", *["batch", *(f"input{i}" for i in range(2, n_args + 1))][:n_args]]
        target, inputs = names[0], list(names[1:])
        lines = [f"mox = {target}"] + ([f"params = {inputs[0]}"] if has_params and inputs else [])
    else:
        fe = frontend_named(kind)
        if names is None:  # arguments the frontend put first (an nnx state, a wrapper's parameters) are not named
            names = fe.script_names(n_args - fe.prepended, has_params)
        lines = fe.script(names[0], list(names[1:]), kw, has_params)
    if guessed:
        lines.insert(0, f"# {', '.join(f'`{n}`' for n in names)}: what was given to Explorer(...); use your names")
    return lines
