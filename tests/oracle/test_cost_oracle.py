"""The oracle for what yax counts of a model's cost: `summary`'s FLOPs and the
explorer's Cost tab (yax_widget/_providers.py), on every generated model
(gen.py: linen, nnx, Equinox, plain JAX; scans, remat, vmapped layers, a layer
called twice, under `jax.jit` or not), against the count written by hand from
the generated weights: each dense layer ``2·R·in·out`` FLOPs per run (``R``
the rows of the input, ``in × out`` its kernel), times its scan's steps.

(i)  The whole model's FLOPs (`summary`'s total) equal the hand count.
(ii) The Cost tab of each dense layer's call: its FLOPs of every run, summed
     over the layers, equal the hand count; its variables' bytes are its
     kernel's and bias's, every layer of a scanned stack included.

Budget: ``YAX_ORACLE_EXAMPLES`` examples.
"""

from __future__ import annotations

import collections
import math
from typing import Any

import numpy as np
from hypothesis import given

import yax
from yax_widget import Session
from yax_widget._providers import PROVIDERS

from .gen import DENSE_TYPE, SETTINGS, Spec, build, reporting, sites, specs
from .test_core_oracle import trace

COUNTS: collections.Counter[str] = collections.Counter()
_report = reporting(COUNTS)


def _by_hand(spec: Spec, weights: list[Any]) -> tuple[int, list[int]]:
    """The model's FLOPs, and each dense block's variable bytes (a scan's: every layer)."""
    rows = math.prod(spec.shape[:-1])
    total, nbytes = 0, []
    for s in sites(spec):
        if s.kind != "dense":
            continue
        w = weights[s.block]
        i, o = np.shape(w["kernel"])[-2:]
        total += 2 * rows * i * o * (s.steps or 1)
        nbytes.append(sum(np.asarray(v).nbytes for v in w.values()))
    return total, nbytes


def _number(text: str) -> int:
    return int(text.split()[0].replace("_", ""))


@SETTINGS
@given(specs())
def test_flops_and_the_cost_tab_equal_the_count_by_hand(spec: Spec) -> None:
    b = build(spec)
    mox = trace(b)
    flops, nbytes = _by_hand(spec, b.weights(b.params))
    # (i) summary's total
    total = mox.summary().splitlines()[-1].split()[-1]
    assert _number(total) == flops, (mox.summary(), flops)
    COUNTS["models"] += 1
    dense = DENSE_TYPE.get(spec.frontend)
    if dense is None:
        return
    # (ii) the Cost tab of each dense layer's call, in call order as the sites are
    cost = PROVIDERS["Cost"]
    calls = yax.query(f'//module_call[@type="{dense}"]', mox)
    assert len(calls) == len(nbytes)
    tab_flops = 0
    for node, want in zip(calls, nbytes):
        rows = {r[0]: r[1:] for r in cost.details(mox, node).rows}
        every = rows.get("FLOPs, every run", rows["FLOPs (matrix products, convolutions)"])
        tab_flops += _number(every[0])
        assert _number(rows["variables"][1]) == want, (node.path, rows, want)
    assert tab_flops == flops
    COUNTS["dense calls"] += len(calls)


def test_the_cost_tab_is_what_the_explorer_shows() -> None:
    """The provider the oracle checks is the one the explorer's tab asks (`details`)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    m, x = nn.Dense(3), jnp.ones((2, 4))
    s = Session(m, m.init(jax.random.key(0), x), x, warm=False)
    try:
        assert "Cost" in s.state["panes"] and type(PROVIDERS["Cost"]).__name__ == "Cost"
    finally:
        s.close()
