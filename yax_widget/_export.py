"""Saving the explorer's current model to run without yax: the function as
`jax.export` serialises it, and the parameters as arrays named by their tree
paths. Flat on both sides (leaves in, leaves out), so that any model's trees
(Hugging Face output classes, nnx states) serialise without registering them.
"""

from __future__ import annotations

import pathlib
import re
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

import yax

if TYPE_CHECKING:
    from ._explorer import Explorer


def export(ex: Explorer, stem: str | pathlib.Path) -> dict:
    """Write ``{stem}.jax_exported`` and (when the model has parameters)
    ``{stem}.params.npz``; returns ``{"files": [paths], "bytes": [sizes]}``.

    The exported function takes the leaves of ``(params, *inputs)`` (in
    `jax.tree_util.tree_leaves` order, shaped like the example inputs) and
    returns the leaves of the output. The ``.npz`` holds the parameter leaves
    in that order, each named by `jax.tree_util.keystr` of its path.
    """
    stem = pathlib.Path(stem)
    if not re.fullmatch(r"[\w.\-]+", stem.name):
        raise yax.YaxInputError(f"`export` expected a file name of letters, digits, `_`, `.` and `-` for its "
                                f"files, not {stem.name!r}. Try `ex.export('my_model')`.")
    if not (ex._args or ex._kwargs):
        raise yax.YaxInputError("The explorer has no example inputs, so the exported function's argument shapes "
                                "are unknown. Open it with inputs: `Explorer(model, variables, batch)`.")
    args = (ex.params, *ex._args[1:]) if ex._has_params else ex._args
    leaves, tree = jax.tree_util.tree_flatten((args, ex._kwargs))
    f = yax.to_function(ex.mox)

    def flat(*xs: Any) -> list:
        a, kw = jax.tree_util.tree_unflatten(tree, xs)
        return jax.tree_util.tree_leaves(f(*a, **kw))

    exported = jax.export.export(jax.jit(flat))(*leaves)
    files = [stem.with_name(stem.name + ".jax_exported")]
    files[0].write_bytes(exported.serialize())
    if ex._has_params:
        named = jax.tree_util.tree_flatten_with_path(ex.params)[0]
        files.append(stem.with_name(stem.name + ".params.npz"))
        with open(files[1], "wb") as fh:
            np.savez(fh, **dict(_array(jax.tree_util.keystr(p), v) for p, v in named))
    return {"files": [str(p) for p in files], "bytes": [p.stat().st_size for p in files]}


def _array(name: str, v: Any) -> tuple[str, np.ndarray]:
    """A leaf as a numpy array: a typed PRNG key as its key data, its name saying so."""
    if isinstance(v, jax.Array) and jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key):
        return f"{name}#key_data", np.asarray(jax.random.key_data(v))
    return name, np.asarray(v)
