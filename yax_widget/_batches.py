"""The named input batches of a session: each batch and its name, which one the values,
colouring and comparison use, and the checks a new batch must pass (the structure, shapes
and dtypes the model was traced with)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from yax.errors import BadArgument, BatchDoesNotFit, UnknownName, arg_name
from yax.internal import type_str

from . import _payloads

EXAMPLE = "example"  # the name of the batch the explorer was opened with, unless `batches` names it

_serials = itertools.count()


@dataclasses.dataclass(frozen=True, eq=False)
class NamedBatch:
    """A batch of inputs and its name: the model's arguments (its parameters
    first) and keywords. Whatever is measured on a batch is kept under its
    ``serial``, never its name: a batch added again under the same name is a new
    `NamedBatch`, so it can never be served the numbers of the one it replaces."""

    name: str
    args: tuple
    kwargs: dict
    serial: int = dataclasses.field(default_factory=lambda: next(_serials))

    def args_with(self, params: Any, has_params: bool) -> tuple:
        """The positional arguments of a model with ``params`` on this batch (in place of its
        own, when the model ``has_params``)."""
        return (params, *self.args[1:]) if has_params else self.args


class Batches:
    """The named batches of one session and the one in use (`Session.add_batch`,
    `Session.use_batch`): what a request may name, checked before the session shows it."""

    def __init__(self, example: NamedBatch):
        self.named: dict[str, NamedBatch] = {}
        self.in_use = example  #: the batch the values, colouring and comparison use

    def fitting(self, name: Any, args: tuple, kwargs: dict, has_params: bool) -> NamedBatch:
        """The batch ``name`` of the inputs ``args`` (after the parameters, when the model
        ``has_params``) and ``kwargs`` (the example's, where not given), refused unless it
        fits the batch in use (`check_fits`)."""
        if not isinstance(name, str) or not name.strip() or len(name) > 80:
            raise BadArgument("name", "a non-empty string of at most 80 characters", name, "A batch name")
        use = self.in_use
        head = use.args[:1] if has_params else ()
        new = NamedBatch(name, (*head, *args), {**use.kwargs, **kwargs})
        check_fits(name, (use.args, use.kwargs), (new.args, new.kwargs))
        return new

    def get(self, name: Any) -> NamedBatch:
        """The batch named ``name``, refused when there is none."""
        if not isinstance(name, str) or name not in self.named:
            raise UnknownName("batch", name, list(self.named), "Add one with `explorer.add_batch(name, *inputs)`.")
        return self.named[name]

    def shown(self, input_names: Sequence[str] | None, has_params: bool) -> dict:
        """The ``batches`` entry of the session's `state`: the names, the one in use and its
        inputs as given (a wrapper's parameters and an nnx state, put first, aside)."""
        b = self.in_use
        shown = _payloads.inputs(input_names or [], b.args[1 if has_params else 0:], b.kwargs)
        return {"names": list(self.named), "current": b.name, "inputs": shown}


def as_args(value: Any, n: int) -> tuple:
    """A batch given in `batches` as positional arguments: the value itself for
    a model of one input, a tuple of them for several."""
    return (value,) if n <= 1 or not isinstance(value, tuple) else value


def same_inputs(a: Any, b: Any) -> bool:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    return ta == tb and all(x is y for x, y in zip(la, lb))


def check_fits(name: str, example: tuple, new: tuple) -> None:
    """Refuse a batch whose structure, shapes or dtypes differ from the example's."""
    want, wt = jax.tree_util.tree_flatten_with_path(example)
    got, gt = jax.tree_util.tree_flatten_with_path(new)
    if wt != gt:
        raise BatchDoesNotFit(name, "structure", wt, gt)
    for (path, w), (_, g) in zip(want, got):
        ws, gs = hasattr(w, "dtype") and hasattr(w, "shape"), hasattr(g, "dtype") and hasattr(g, "shape")
        if ws and gs and (tuple(w.shape) != tuple(g.shape) or np.dtype(w.dtype) != np.dtype(g.dtype)):
            raise BatchDoesNotFit(name, "type", type_str(w), type_str(g), arg_name(path))
        if ws != gs or (not ws and w != g):
            raise BatchDoesNotFit(name, "static", w, g, arg_name(path))
