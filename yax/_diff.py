"""`diff`: a structural diff of two MoX (or loaded documents), by path."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from ._ir import CALL_KINDS
from ._view import SOURCE_ATTRS, tree_of

_CALLS = CALL_KINDS


def keyed(x: Any) -> dict[tuple[Any, ...], Any]:
    """``(path, kind, method, k)`` -> the XML element of each call: the k-th
    call of that module method at that path. The keys `diff` reports."""
    tree, _ = tree_of(x, "diff")
    seen: collections.Counter[tuple[Any, ...]] = collections.Counter()
    out = {}
    for el in tree.iter(*_CALLS):
        base = (el.get("path"), el.tag, el.get("method"))
        out[(*base, seen[base])] = el
        seen[base] += 1
    return out


def _calls(x: Any) -> dict[tuple[Any, ...], dict[str, str]]:
    # where the code sits is no difference between models (nor what a document dumped without it lacks)
    return {k: {a: v for a, v in el.attrib.items() if a != "id" and a not in SOURCE_ATTRS}
            for k, el in keyed(x).items()}


@dataclasses.dataclass(frozen=True)
class Diff:
    """Calls only in ``b`` (added), only in ``a`` (removed), and in both with
    different attributes (changed: ``{attr: (old, new)}``). Keys are
    ``(path, kind, method, k)``: the k-th call of that method at that path."""

    added: list[tuple[Any, ...]]
    removed: list[tuple[Any, ...]]
    changed: dict[tuple[Any, ...], dict[str, tuple[str | None, str | None]]]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def to_dict(self) -> dict[str, Any]:
        def k(key: tuple[Any, ...]) -> dict[str, Any]:
            return {"path": key[0], "kind": key[1], "method": key[2], "index": key[3]}

        return {
            "added": [k(x) for x in self.added],
            "removed": [k(x) for x in self.removed],
            "changed": [{**k(x), "attrs": {a: list(v) for a, v in d.items()}} for x, d in self.changed.items()],
        }

    def __repr__(self) -> str:
        def call(sign: str, key: tuple[Any, ...]) -> str:
            p, kind, m, _ = key
            return f"{sign} {p} ({kind}{'' if m in ('__call__', None) else '.' + m})"

        lines = [call("+", k) for k in self.added] + [call("-", k) for k in self.removed]
        for (p, _, _, _), d in self.changed.items():
            lines.append(f"~ {p}: " + ", ".join(f"{a}: {o} -> {n}" for a, (o, n) in d.items()))
        return "\n".join(lines) or "no differences"


def diff(a: Any, b: Any) -> Diff:
    """Compare the calls of two MoX (or `yax.load_xml` documents) by path.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> x = jnp.ones((1, 2))
      >>> def trace(m): return yax.make_mox(m.apply)(m.init(jax.random.key(0), x), x)
      >>> yax.diff(trace(nn.Sequential([nn.Dense(3), nn.relu])), trace(nn.Sequential([nn.Dense(4), nn.gelu])))
      + Sequential/gelu (activation.gelu)
      - Sequential/relu (activation.relu)
      ~ Sequential: out_shape: f32[1,3] -> f32[1,4], shape: 1,3 -> 1,4, params: 9 -> 12, layers: (Dense, relu) -> (Dense, gelu)
      ~ Sequential/layers_0: out_shape: f32[1,3] -> f32[1,4], shape: 1,3 -> 1,4, params: 9 -> 12, features: 3 -> 4
    """
    ca, cb = _calls(a), _calls(b)
    changed = {}
    for key, x in ca.items():  # in a's document order
        y = cb.get(key)
        if y is not None:
            d = {k: (x.get(k), y.get(k)) for k in {**x, **y} if x.get(k) != y.get(k)}
            if d:
                changed[key] = d
    return Diff(
        added=[k for k in cb if k not in ca],
        removed=[k for k in ca if k not in cb],
        changed=changed,
    )
