"""Row data providers: an analysis of the selected row that the explorer shows
in a tab of its own, written in Python only.

A provider (`RowData`) turns one node of the current model into a `Details`:
a heading, a table (columns and rows of text) and a note. The front-end paints
every provider the same way (``js/src/panes/details.js``): one tab a provider,
titled by it, filled by the ``details`` request when a row is selected. So a
new analysis is a subclass and a `register` call; no front-end code, no new
request, no new trait (docs/architecture.md, "Adding a pane").

What a provider shows must be exactly true, or say why it is not known: the
front-end shows the text it is given and computes nothing.

Example:
  >>> import jax, jax.numpy as jnp, flax.linen as nn
  >>> from yax_widget import Session
  >>> from yax_widget._providers import PROVIDERS
  >>> m = nn.Dense(3); x = jnp.ones((2, 4))
  >>> s = Session(m, m.init(jax.random.key(0), x), x, warm=False)
  >>> d = PROVIDERS["Cost"].details(s.mox, s.node(1))
  >>> d.heading, d.rows[0]
  ('module_call Dense', ['FLOPs (matrix products, convolutions)', '48', 'one run'])
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import numpy as np

import yax
from yax.internal import (
    CALL_KINDS,
    all_flops,
    flops_unknown_why,
    is_branch,
    is_loop,
    is_scan,
    node_index,
    param_copies,
)

if TYPE_CHECKING:
    from ._session import Session


@dataclasses.dataclass(frozen=True)
class Details:
    """What a provider shows for one row: ``heading``, a table of text
    (``columns``, ``rows``) and a ``note`` under it ("" for none)."""

    heading: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""

    def payload(self) -> dict:
        """The ``details`` reply's fields."""
        return dataclasses.asdict(self)


class RowData(abc.ABC):
    """A per-row analysis shown in a tab titled `title`."""

    #: the tab's title (unique among the providers)
    title: ClassVar[str]

    @abc.abstractmethod
    def details(self, mox: yax.Mox, node: yax.Mox | yax.Equation, session: Session | None = None) -> Details:
        """What the tab shows for ``node``, a call or an equation of ``mox``: the current model of
        ``session`` (for what else the explorer holds: its batches, `Session.costs`), when there is one."""


#: The providers the explorer shows, by title, in tab order (`register`).
PROVIDERS: dict[str, RowData] = {}


def register(provider: RowData) -> RowData:
    """Show ``provider`` in a tab of every explorer opened from now on."""
    PROVIDERS[provider.title] = provider
    return provider


def _n(x: int) -> str:
    return f"{x:,}".replace(",", "_")


def _bytes(shape: tuple[int, ...], dtype: Any) -> int:
    return math.prod(shape) * np.dtype(dtype).itemsize


class Cost(RowData):
    """The cost of a call or an equation as its jaxpr states it, before XLA
    compiles it: the FLOPs of its matrix products and convolutions (``2·m·n·k``
    for a product of ``m×k`` by ``k×n``), how many times it runs (the steps of
    the scans around it), the elements and bytes of its variables (a scanned
    stack's every layer), and the bytes of what one run returns. Counts that
    cannot be known before the program runs (a ``while`` loop's body) say so."""

    title = "Cost"

    def details(self, mox: yax.Mox, node: yax.Mox | yax.Equation, session: Session | None = None) -> Details:
        known = all_flops(mox)
        flops = known[id(node)]
        idx = node_index(mox)
        steps = self._steps(idx, node)
        rows = [["FLOPs (matrix products, convolutions)", "unknown" if flops is None else _n(flops),
                 flops_unknown_why(node, known) if flops is None else self._how(node, flops)]]
        if isinstance(steps, str):
            rows.append(["runs", "unknown", f"not known before it runs: {steps}"])
        elif math.prod(steps) > 1:
            runs = math.prod(steps)
            rows.append(["runs", _n(runs), "the steps of the scans around it: " + " × ".join(map(str, steps))])
            rows.append(["FLOPs, every run", "unknown" if flops is None else _n(flops * runs), ""])
        if isinstance(node, yax.Mox) and node.kind in CALL_KINDS:
            copies = param_copies(mox, node) if node.kind == "module_call" else 1
            tree = node.var_tree or {}
            leaves = jax.tree_util.tree_leaves(tree)
            if leaves:
                size = sum(math.prod(a.shape) for a in leaves) * copies
                rows.append(["variables", f"{_n(size)} elements",
                             f"{_n(sum(_bytes(a.shape, a.dtype) for a in leaves) * copies)} bytes ({', '.join(tree)})"
                             + (f", {copies} layers of a scanned stack" if copies > 1 else "")])
            eqs = sum(isinstance(n, yax.Equation) for n in node.walk())
            traced = node.info.seconds
            rows.append(["equations inside", _n(eqs), "nested computations counted once" + (
                "" if traced is None else f"; traced in {traced:.3f} s, its calls included")])
        out = sum(_bytes(tuple(v.shape), v.dtype) for v in node.outputs)
        rows.append(["outputs", f"{_n(out)} bytes", "what one run returns"])
        compiled = session.costs.cached() if session is not None else None
        rows += self._compiled(idx, node, compiled)
        kind = "equation" if isinstance(node, yax.Equation) else node.kind
        name = node.name if isinstance(node, yax.Equation) else node.path or node.name
        note = "Counted from the traced program, before XLA compiles it (which may fuse or drop work)"
        if compiled is not None:
            note += (f"; the compiled rows from XLA's program ({compiled.devices} device"
                     f"{'s' if compiled.devices > 1 else ''}; per device, every run)")
        return Details(f"{kind} {name}", ["", "", ""], rows, note + ".")

    @staticmethod
    def _compiled(idx: Any, node: Any, cost: yax.Cost | None) -> list[list[str]]:
        """The compiled program's rows for a call (`yax.cost`), or how to get them."""
        if not isinstance(node, yax.Mox) or node.kind not in CALL_KINDS:
            return []
        if cost is None:
            return [["compiled (XLA)", "not compiled yet",
                     "colour the rows by FLOPs, bytes or collectives (compiled) to compile the model"]]
        c = cost.calls[idx.keys[id(node)]]
        why = c.why or "known only when it runs"
        rows = []
        for label, q in (("FLOPs (XLA)", "flops"), ("bytes accessed (XLA)", "bytes_accessed")):
            v, mine = c.total[q], c.own[q]
            if v is None:
                rows.append([label, "unknown", why])
                continue
            split = ("all its own" if mine == v else f"its own {'unknown' if mine is None else _n(round(mine))}, "
                     f"the rest in the calls it makes")
            rows.append([label, _n(round(v)), f"every run, as XLA counts{' (elementwise work included)' if q == 'flops' else ''}; {split}"])
        if c.parameters:
            rows.append(["parameters as compiled", " ".join(f"{k}={v}" for k, v in c.parameters.items()),
                         f"over {cost.devices} devices"])
        if c.collectives:
            kinds = ", ".join(f"{x.kind} ×{x.runs if x.runs is not None else '?'} ({_n(x.bytes)} bytes)"
                              for x in c.collectives)
            rows.append(["collectives", _n(len(c.collectives)), kinds])
        for r in cost.replicated:
            if r.path == node.path:
                rows.append(["replicated" if not r.gathered else "gathered whole", r.name, str(r)])
        return rows

    @staticmethod
    def _steps(idx: Any, node: Any) -> tuple[int, ...] | str:
        """The lengths of the scans around ``node``, outermost first; or why how often it
        runs is not known before it runs (inside a ``while`` loop or a ``cond``'s branch)."""
        steps: list[int] = []
        i = idx.parents[idx.ids[id(node)]]
        while i >= 0:
            holder = idx.nodes[i]
            if isinstance(holder, yax.Equation):
                if is_scan(holder):
                    steps.append(int(holder.params["length"]))
                elif is_loop(holder):
                    return "inside a `while` loop, whose body runs a number of times known only then"
                elif is_branch(holder):
                    return "inside one branch of a `cond`, which runs or not"
            i = idx.parents[i]
        return tuple(reversed(steps))

    @staticmethod
    def _how(node: Any, flops: int) -> str:
        if isinstance(node, yax.Equation) and node.name == "dot_general":
            (lc, _), _ = node.params["dimension_numbers"]
            k = math.prod(node.inputs[0].shape[d] for d in lc)
            return f"2·{'·'.join(map(str, node.outputs[0].shape))}·{k}: one run"
        return "one run" if flops else "none: no matrix product or convolution inside"


register(Cost())
