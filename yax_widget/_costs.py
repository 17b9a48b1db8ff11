"""The compiled cost of the current model in the explorer (`yax.cost`): the
colourings by FLOPs, bytes accessed and collectives, and what the Cost tab
adds once the model is compiled.

Compiling needs shapes, not values: it runs on the batch in use as abstract
arguments (`jax.ShapeDtypeStruct`, with their shardings), so it works in
structure-only mode (a 70B model opened with abstract parameters) as well.
One compiled cost is kept: the current model's on the batch in use.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import jax

import yax
from yax.internal import node_ids

if TYPE_CHECKING:
    from ._session import Session

#: The colourings by the compiled program's cost: stat -> its label.
COST_STATS = {"flops": "FLOPs (compiled)", "bytes": "bytes accessed (compiled)",
              "comm": "bytes of collectives (compiled)"}
_QUANTITY = {"flops": "flops", "bytes": "bytes_accessed", "comm": "collective_bytes"}


def _abstract(x: Any) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct) or not hasattr(x, "shape") or not hasattr(x, "dtype"):
        return x
    sharding = getattr(x, "sharding", None) if isinstance(x, jax.Array) else None
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


class Costs:
    """The current model's `yax.Cost` on the batch in use, compiled on demand and kept."""

    def __init__(self, session: Session):
        self._session = session
        self._kept: tuple[yax.Mox, int, yax.Cost] | None = None

    def cached(self) -> yax.Cost | None:
        """The compiled cost of the current model on the batch in use, if it was compiled."""
        s, k = self._session, self._kept
        return k[2] if k is not None and k[0] is s.mox and k[1] == s.batch_key else None

    def current(self) -> yax.Cost:
        """The compiled cost of the current model on the batch in use (compiled now if need be)."""
        found = self.cached()
        if found is None:
            s = self._session
            self._kept = None
            args = jax.tree_util.tree_map(_abstract, s.inputs.in_use.args_with(s.params, s.has_params))
            kwargs = jax.tree_util.tree_map(_abstract, s.kwargs)
            found = yax.cost(s.mox, *args, **kwargs)
            self._kept = (s.mox, s.batch_key, found)
        return found

    def overlay(self, stat: str) -> dict:
        """The ``overlay`` state colouring every call row by ``stat`` (`COST_STATS`): per row
        the value every run of it takes (its calls' included), or why it is not known."""
        t = time.perf_counter()
        cost = self.current()
        ids = node_ids(self._session.mox)
        values: dict[str, float | None] = {}
        why: dict[str, str] = {}
        for key, c in cost.calls.items():
            if not key:
                continue
            rid = str(ids[id(cost.node(key))])
            values[rid] = v = c.total[_QUANTITY[stat]]
            if v is None:
                why[rid] = c.why
        shown = [v for v in values.values() if v is not None]
        return {"stat": stat, "label": COST_STATS[stat], "values": values, "why": why,
                "lo": min(shown) if shown else None, "hi": max(shown) if shown else None, "rows": len(values),
                "per": f"per run, per device ({cost.devices} device{'s' if cost.devices > 1 else ''})",
                "seconds": round(time.perf_counter() - t, 3)}
