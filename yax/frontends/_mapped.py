"""Module calls mapped by a vectorising transform (linen's ``nn.vmap``, a
``jax.vmap`` over an Equinox layer): how a replacement module is mapped like
the module it replaces, for frontends whose `Frontend.mapping` and
`Frontend.trace_replacement` need it.

A module inside such a transform sees one instance's inputs while its call
node carries the mapped axis; its variables are stacked per instance (or
broadcast). The shapes the module saw (``info.seen``) against the node's
tell the axes; the variables the model holds (`Variables.held`) tell how
they are stacked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._ir import Mox
from .._vocab import type_str
from ..errors import Unmappable
from ._protocol import engine


@dataclasses.dataclass(frozen=True)
class Mapped:
    """How a module call runs inside a vectorising transform: the axis each of the node's
    inputs and outputs carries (``None``: not mapped), how many instances,
    and the axis its variables are stacked along at the node's level
    (``None``: broadcast, one set shared by all instances). A replacement
    module is traced under ``jax.vmap`` the same way, on one instance's inputs."""

    size: int
    in_axes: tuple[int | None, ...]
    out_axes: tuple[int | None, ...]
    var_axis: int | None

    @property
    def stack(self) -> tuple[int, ...]:
        """The axes the replacement's variables gain at the node's level: one per instance, or none (broadcast)."""
        return (self.size,) if self.var_axis == 0 else ()

    def instance(self, avals: Sequence[Any]) -> list[jax.ShapeDtypeStruct]:
        """One instance's avals of the node's inputs."""
        return [jax.ShapeDtypeStruct(a.shape if k is None else a.shape[:k] + a.shape[k + 1:], a.dtype)
                for a, k in zip(avals, self.in_axes)]

    def stacked(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A variable's shape at the node's level, from one instance's."""
        k = self.var_axis
        return tuple(shape) if k is None else (*shape[:k], self.size, *shape[k:])


def inserted(small: tuple[int, ...], big: tuple[int, ...]) -> list[int]:
    """The axes ``k`` with ``big == small[:k] + (n,) + small[k:]``."""
    if len(big) != len(small) + 1:
        return []
    return [k for k in range(len(big)) if big[:k] + big[k + 1:] == small]


def _unmappable(node: Any, why: str, transform: str, axis: int | None = None) -> Unmappable:
    return Unmappable(node, why, transform, axis)


def mapped(node: Any, scans: tuple[int, ...], held: Callable[..., Any] | None, transform: str = "nn.vmap") -> Mapped | None:
    """How the module call ``node`` is mapped by ``transform``, told by the
    shapes its module saw (``info.seen``) against the node's, and by its
    variables as the model holds them (``held(node)``: ``{collection: tree of
    shapes}`` at the root, the layer axes of enclosing scans, ``scans``, first); ``None`` when it is not
    mapped. Refuses what yax cannot map the same way."""
    seen = getattr(getattr(node, "info", None), "seen", None)
    if not isinstance(node, Mox) or seen is None:
        return None
    ins, outs = seen
    atoms = (*node.inputs, *node.outputs)
    if len(ins) != len(node.inputs) or len(outs) != len(node.outputs):
        return None
    pairs = [(tuple(s), tuple(a.shape)) for s, a in zip((*ins, *outs), atoms)]
    if all(s == b for s, b in pairs):
        return None
    axes: list[int | None] = []
    for s, b in pairs:
        ks = inserted(s, b)
        if s != b and not ks:
            raise _unmappable(node, f"seeing {type_str(jax.ShapeDtypeStruct(s, atoms[len(axes)].dtype))} where "
                                    f"the call has {type_str(atoms[len(axes)])} (more than one mapped axis)",
                              transform)
        axes.append(None if s == b else ks[0])  # ambiguous (equal neighbouring sizes): flax's default, the first
    sizes = {b[k] for (_, b), k in zip(pairs, axes) if k is not None}
    if len(sizes) != 1:
        raise _unmappable(node, f"with mapped axes of sizes {sorted(sizes)}", transform)
    size = sizes.pop()
    var_axis = _var_axis(node, len(scans), held, size, transform) if node.var_tree else None
    n = len(node.inputs)
    return Mapped(size, tuple(axes[:n]), tuple(axes[n:]), var_axis)


def _var_axis(node: Mox, lead: int, held: Callable[..., Any] | None, size: int, transform: str) -> int | None:
    """The axis the node's variables are stacked along at its level (``None``: broadcast),
    below ``lead`` layer axes of enclosing scans."""
    root = held(node) if held is not None else None
    if root is None:
        raise _unmappable(node, "and yax cannot find its variables among the model's to tell how they are "
                                "mapped (pass `params=`)", transform)
    found = set()
    for coll, tree in node.var_tree.items():
        outer = root.get(coll)
        if outer is None:
            raise _unmappable(node, f"and yax cannot find its `{coll}` among the model's variables", transform)
        for a, b in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(outer)):
            s, b = tuple(a.shape), tuple(b.shape)[lead:]
            ks = [k for k in inserted(s, b) if b[k] == size]
            found.add(None if s == b else (ks[0] if ks else "?"))
    if len(found) != 1 or "?" in found:
        raise _unmappable(node, "with variables stacked along different axes, or not along the mapped one",
                          transform)
    axis = found.pop()
    if axis not in (None, 0):
        raise _unmappable(node, f"with variables stacked along axis {axis}", transform, int(axis))
    return axis


def fit_hint(node: Any, found: tuple[int, ...], expected: tuple[int, ...], transform: str = "nn.vmap") -> str:
    """Why a replacement's output may have one axis less than the node's: the
    module (one with variables) is likely mapped by ``transform``."""
    if not (getattr(node, "var_tree", None) and inserted(tuple(found), tuple(expected))):
        return ""
    return (f"The node's output has one axis more: the module is likely mapped by `{transform}`. A function "
            "replacement is called on the whole mapped call (map it yourself with `jax.vmap`); a module "
            "replacement is mapped like the original.")


def trace_mapped(module: Any, apply: Callable[..., Any], var_avals: Any, avals: list[Any], how: Mapped) -> Mox:
    """``apply(variables, *xs)`` traced under ``jax.vmap`` as ``how`` maps the
    replaced call: on one instance's inputs, variables stacked (or broadcast)."""
    stacked = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(how.stacked(a.shape), a.dtype), var_avals)

    def leaves(v: Any, *xs: Any) -> list[Any]:
        return jax.tree_util.tree_leaves(apply(v, *xs))

    each = jax.vmap(leaves, in_axes=(how.var_axis, *how.in_axes), out_axes=list(how.out_axes), axis_size=how.size)

    def vmapped(v: Any, *xs: Any) -> Any:
        return each(v, *xs)

    vmapped.__name__ = vmapped.__qualname__ = type(module).__name__
    mox: Mox = engine.make_mox(vmapped)(stacked, *avals)
    return mox
