"""Python source for "copy as code": the XPath of a node and the expression
of a registered replacement."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import keyword
from typing import Any

import yax
from yax import Equation, Mox
from yax.errors import NotInMox, WrongType
from yax.internal import frontends, node_ids, script_of


def _homes() -> list[tuple[str, str]]:
    """Where users import things from, as ``(module, alias)``, most familiar
    first: yax and JAX, then each frontend's modules (``flax.linen`` as ``nn``)."""
    first = [("yax", "yax"), ("jax.nn", "jax.nn"), ("jax.numpy", "jnp")]
    return [*first, *(h for f in frontends() for h in script_of(f.name).homes), ("yax_widget", "yax_widget")]


def _dotted(name: Any) -> bool:
    """Whether ``name`` is Python names joined by dots (``flax.linen.Dense``), and nothing else."""
    return isinstance(name, str) and all(p.isidentifier() and not keyword.iskeyword(p) for p in name.split("."))


def _public_name(obj: Any) -> str | None:
    """``jax.nn.gelu`` / ``nn.Dense`` / ``yax.LoRA`` for an object reachable
    from a familiar home, else ``module.qualname`` when that is importable.
    Only dotted Python names are written: a ``__qualname__`` is any string
    (``"f\nimport os"`` would be a statement of its own in the script), so
    anything else gives None, and the script names a placeholder to define."""
    name = getattr(obj, "__name__", None)
    if not _dotted(name):
        return None
    for home, alias in _homes():
        try:
            mod = importlib.import_module(home)
        except ImportError:
            continue
        if getattr(mod, name, None) is obj:
            return f"{alias}.{name}"
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if _dotted(mod) and _dotted(qual) and not any(p.startswith("_") for p in mod.split(".")):
        return f"{mod}.{qual}"
    return None


def _expression(code: str) -> bool:
    """Whether ``code`` is one Python expression on one line (a field's ``repr``)."""
    if "\n" in code or "\r" in code:
        return False
    try:
        ast.parse(code, mode="eval")
    except (SyntaxError, ValueError):
        return False
    return True


def replacement_code(repl: Any) -> str | None:
    """A Python expression for ``repl``, or ``None`` when it has no importable
    name. A dataclass instance (a linen module, `yax.LoRA`) is written as its
    class called with the fields that differ from their defaults."""
    if dataclasses.is_dataclass(repl) and not isinstance(repl, type):
        cls = _public_name(type(repl)) or type(repl).__name__
        if not _dotted(cls):
            return None
        args = []
        for f in dataclasses.fields(repl):
            if f.name in ("parent", "name") or not f.init:  # linen's own fields
                continue
            v = getattr(repl, f.name)
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
            if default is not dataclasses.MISSING and v is default or (
                    default is not dataclasses.MISSING and type(v) is type(default) and v == default):
                continue
            code = replacement_code(v) if callable(v) else repr(v)
            code = code if code is not None and _expression(code) else "..."
            args.append(f"{f.name}={code}")
        return f"{cls}({', '.join(args)})"
    if isinstance(repl, (Mox, Equation)):
        return None
    return _public_name(repl)


def _literal(s: str) -> str:
    """``s`` as an XPath 1.0 string: quoted, or a ``concat`` of quoted parts
    when it holds both kinds of quote (XPath has no escapes)."""
    if '"' not in s:
        return f'"{s}"'
    if "'" not in s:
        return f"'{s}'"
    return "concat(" + ", \'\"\', ".join(f'"{part}"' for part in s.split('"')) + ")"


def xpath_for(node: Any, mox: Mox) -> str:
    """An XPath that selects exactly ``node`` in ``mox``: by its path (and
    method), else by its place among the nodes with that path, else by its
    element id.

    Raises:
      yax.errors.NotInMox: ``node`` is not a node of ``mox``.
    """
    if not isinstance(node, (Mox, Equation)):
        raise WrongType("node", "a node of the current model, an XPath or \"query\"", node)
    ids = node_ids(mox)
    if id(node) not in ids:
        raise NotInMox(node, "Explorer", "the explorer's current model", "It may come from the model before a "
                       "change, or from another model: query the current one again, e.g. `explorer.query(...)`.")
    if isinstance(node, Equation):
        base = f"//*[@primitive={_literal(node.name)}][@path={_literal(node.path)}]"
    else:
        base = f"//{node.kind}[@path={_literal(node.path)}]"
        if node.method and node.method != "__call__" and node.kind in ("module_call", "method_call"):
            base += f"[@method={_literal(node.method)}]"
    hits = yax.query(base, mox)
    if len(hits) == 1 and hits[0] is node:
        return base
    at = next((i for i, n in enumerate(hits) if n is node), None)
    if at is not None:
        return f"({base})[{at + 1}]"
    return f'//*[@id="{ids[id(node)]}"]'  # the element id: the same in any MoX traced the same way
