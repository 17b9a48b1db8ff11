"""What the explorer traces for the object it is given (and the options it refuses), and
the opening lines of "copy as code" that trace it again. Both are the frontends' to say
(`yax.internal.unwrap_target`, `Frontend.script`): no module system is named here."""

from __future__ import annotations

import ast
import builtins
import keyword
import math
import re
import symtable
from typing import Any

from yax.errors import WrongType
from yax.internal import frontend_named, script_of, unwrap_target


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


def check_static(argnums: Any, argnames: Any) -> None:
    """Refuse ``static_argnums``/``static_argnames`` that `yax.make_mox` (as `jax.jit`) does not take."""
    def each(v: Any, kind: type) -> bool:
        items = [v] if isinstance(v, kind) else list(v) if isinstance(v, (list, tuple)) else None
        return items is not None and all(isinstance(i, kind) and not isinstance(i, bool) for i in items)

    if argnums is not None and not each(argnums, int):
        raise WrongType("static_argnums", "the position of an argument or a tuple of them, such as `(1,)`", argnums,
                        show=True)
    if argnames is not None and not each(argnames, str):
        raise WrongType("static_argnames", "the name of an argument or a tuple of them, such as `(\"grid\",)`",
                        argnames, show=True)


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


def _static(v: Any) -> str | None:
    """``v`` as Python source when it is a plain Python value that reads back
    as itself (``train=False``, ``mode="eval"``, ``(2, 3)``), else ``None``."""
    if v is None or isinstance(v, (bool, int, str)) or isinstance(v, float) and math.isfinite(v):
        return repr(v)
    if type(v) in (tuple, list):
        parts = [_static(x) for x in v]
        if all(p is not None for p in parts):
            return repr(type(v)(ast.literal_eval(p) for p in parts))  # type: ignore[arg-type]
    return None


def _keyword(text: str) -> str | None:
    """The keyword of an argument typed as ``key=expr``, else ``None``."""
    m = re.match(r"\s*([A-Za-z_]\w*)\s*=(?!=)", text)
    return m.group(1) if m else None


def _free_names(exprs: list[str]) -> list[str]:
    """The names the expressions read from the notebook, in order (``model`` of
    ``{'params': model.params}``): not builtins, lambda parameters, or the
    modules the script imports itself."""
    names: list[str] = []

    def walk(table: symtable.SymbolTable) -> None:
        for sym in table.get_symbols():
            n = sym.get_name()
            if sym.is_referenced() and sym.is_global() and n not in names and not hasattr(builtins, n):
                names.append(n)
        for child in table.get_children():
            walk(child)

    for e in exprs:
        try:
            walk(symtable.symtable(e, "<yax>", "eval"))
        except SyntaxError:  # not an expression (a `*xs`): its names are not listed
            continue
    return [n for n in names if n not in ("jax", "yax")]


def caller_names(scope: dict[str, Any], target: Any, args: tuple, kwargs: dict) -> list[str] | None:
    """The arguments of ``Explorer(target, *args, **kwargs)`` as the caller wrote
    them, read from its namespace ``scope`` (its globals updated with its locals):
    each object by the one name bound to it there, a plain Python value as itself,
    keywords as ``key=name``; ``None`` when any argument has no name or several
    (``x[:2]``, or ``x`` and ``batch`` the same array): "copy as code" then writes
    its usual names and says so.

    Example:
      >>> import numpy as np
      >>> net, xs = object(), np.ones(3)
      >>> caller_names({"net": net, "xs": xs}, net, (xs,), {"train": False})
      ['net', 'xs', 'train=False']
      >>> caller_names({"net": net, "a": xs, "b": xs}, net, (xs,), {}) is None
      True
    """
    by_id: dict[int, list[str]] = {}
    for n, v in scope.items():
        if n.isidentifier() and not n.startswith("_") and not keyword.iskeyword(n):
            by_id.setdefault(id(v), []).append(n)

    def name(v: Any) -> str | None:
        code = _static(v)
        if code is not None:
            return code
        found = by_id.get(id(v), [])
        return found[0] if len(found) == 1 else None

    written = [name(target), *map(name, args), *(None if (c := name(v)) is None else f"{k}={c}"
                                                  for k, v in kwargs.items())]
    return None if any(w is None for w in written) else [w for w in written if w is not None]


def _guessed_keywords(kwargs: dict, taken: set[str]) -> tuple[str, list[str]]:
    """``(", k=v" text, the names it uses)`` for keyword inputs whose expressions
    are unknown: a plain Python value as itself, anything else (an array) by a
    name, its keyword where no other name of the script has it."""
    text, named = "", []
    for k, v in kwargs.items():
        code = _static(v)
        if code is None:
            code = k
            while code in taken or keyword.iskeyword(code):
                code += "_"
            taken.add(code)
            named.append(code)
        text += f", {k}={code}"
    return text, named


def opening_lines(kind: str, names: list[str] | None, n_args: int, kwargs: dict, has_params: bool,
                  static: str = "", given_to: str = "%yax") -> list[str]:
    """The lines of "copy as code" that make ``mox`` and ``params`` as the explorer
    was opened, so the script runs as pasted. ``names``: the arguments as typed
    in ``%yax`` or read from ``Explorer(...)``'s caller (`caller_names`; ``given_to``
    says which): the model, then the inputs' expressions, ``key=expr`` for a
    keyword; a comment lists the notebook names they read. ``static``: the
    ``", static_argnums=(1,)"`` text `make_mox` is given. Without them the
    frontend's usual names are written (one per keyword input that is no plain
    Python value, named by its keyword), with a comment listing them to rename.

    Example:
      >>> print(*opening_lines("linen", ["net", "v", "x[:2]"], 2, {}, True), sep="\\n")
      # `net`, `v`, `x`: the notebook's names given to %yax
      mox = yax.make_mox(net)(v, x[:2])
      params = v
      >>> import jax.numpy as jnp
      >>> print(*opening_lines("jax", None, 0, {"x": jnp.ones(3), "train": False}, False), sep="\\n")
      # `fn`, `x`: what was given to Explorer(...); use your names
      mox = yax.make_mox(fn)(x=x, train=False)
    """
    fe = None if kind == "mox" else frontend_named(kind)
    if names is not None:  # the user's own expressions
        model, typed = names[0], list(names[1:])
        inputs = [t for t in typed if _keyword(t) is None]
        kw = "".join(f", {t}" for t in typed if _keyword(t) is not None)
        used = [*inputs, *(t.split("=", 1)[1] for t in typed if _keyword(t) is not None)]
        if fe is None:  # a MoX: `mox = mox0` and its parameters, the inputs are not needed
            used = inputs[:1] if has_params else []
        listed = _free_names([model, *used])
        comment = f"# {', '.join(f'`{n}`' for n in listed)}: the notebook's names given to {given_to}" if listed else None
    else:
        if fe is None:  # a MoX: only its parameters are needed to make `mox` and `params`
            model, inputs = "mox0", ["variables"] if has_params and n_args else []
        else:  # arguments the frontend put first (an nnx state, a wrapper's parameters) are not named
            model, *inputs = script_of(fe.name).names(n_args - fe.prepended, has_params)
        kw, named = _guessed_keywords({} if fe is None else kwargs, {model, *inputs, *_SCRIPT_NAMES})
        listed = [model, *inputs, *named]
        comment = f"# {', '.join(f'`{n}`' for n in listed)}: what was given to Explorer(...); use your names"
    if fe is None:
        lines = [f"mox = {model}"] + ([f"params = {inputs[0]}"] if has_params and inputs else [])
    else:
        lines = [line.replace(f"yax.make_mox({model})", f"yax.make_mox({model}{static})")
                 for line in script_of(fe.name).lines(model, inputs, kw, has_params)]
    return ([comment] if comment else []) + lines


# names the opening lines bind or import themselves: a guessed input name never takes one
_SCRIPT_NAMES = frozenset({"jax", "yax", "mox", "params", "KEY", "nnx"})
