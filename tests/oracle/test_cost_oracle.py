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
from helpers import calls_around
from hypothesis import given

import yax
from yax.internal import call_keys
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


# -- the compiled cost (`yax.cost`) ----------------------------------------------------------


def _xla(fn: Any, *args: Any) -> dict[str, float]:
    """XLA's cost of ``fn`` compiled, and the FLOPs of its floating-point instructions
    (every run of a loop's: `_float_flops`)."""
    import jax

    compiled = jax.jit(fn).lower(*args).compile()
    got = compiled.cost_analysis()
    got = got[0] if isinstance(got, list) else got
    return {"flops": float(got.get("flops", 0.0)), "transcendentals": float(got.get("transcendentals", 0.0)),
            "float flops": _float_flops(compiled.as_text())}


def _float_flops(text: str) -> float:
    """FLOPs of the instructions computing floating-point values, each run counted: a scan's
    loop also counts its step (integer adds and compares), which a hand-unrolled model has not."""
    from yax._hlo import Program, arrays

    program = Program(text)
    total = 0.0
    for p in program.costs():
        shapes = [p.instr.shape, *(program.by_name[o].shape for o in p.instr.operands)]
        if p.cost is not None and p.cost.flops and any(d in ("f16", "bf16", "f32", "f64") for s in shapes for d, _ in arrays(s)):
            assert p.runs is not None
            total += p.cost.flops * p.runs
    return total


@SETTINGS
@given(specs())
def test_compiled_cost_per_call_equals_xla_on_the_hand_written_model(spec: Spec) -> None:
    """(iii) `yax.cost`: (a) its instructions, recounted by XLA's rules, add up to XLA's own
    ``cost_analysis()`` of the program; (b) the whole model's FLOPs and transcendentals per run
    equal XLA's for the hand-written model (`reference`: plain JAX, its scans unrolled, so XLA
    counts every step; FLOPs of floating-point values, as a scan's loop also counts its steps);
    (c) each dense call's FLOPs per run are XLA's for the hand-written dense layer on the same
    shapes, times its scan's steps: exactly, or more where XLA computes the product again in
    several fusions; less only by what yax gave a call around it (XLA made the product without
    metadata) or said it did not attribute, never by what went to another call."""
    from .gen import _dense, reference

    b = build(spec)
    mox = trace(b)
    c = yax.cost(mox, *b.args())
    assert c.counted is not None and not c.unknown
    for q, k in (("flops", "flops"), ("transcendentals", "transcendentals"), ("bytes_accessed", "bytes accessed")):
        assert c.counted[q] == c.xla.get(k, 0.0), (q, c.counted, c.xla)
    W = b.weights(b.params)
    want = _xla(lambda ws, x: reference(spec, ws, x), W, b.x)
    assert want["float flops"] == want["flops"]  # the hand-written model has no loop
    root = c.calls[""].total
    assert (_float_flops(c.text), root["transcendentals"]) == (want["flops"], want["transcendentals"]), (
        c.table(), want)
    if not any(s.steps for s in sites(spec)):
        assert root["flops"] == want["flops"], (c.table(), want)
    COUNTS["compiled models"] += 1
    dense = DENSE_TYPE.get(spec.frontend)
    if dense is None:
        return
    calls = yax.query(f'//module_call[@type="{dense}"]', mox)
    dense_sites = [s for s in sites(spec) if s.kind == "dense"]
    assert len(calls) == len(dense_sites)
    unattributed = c.unattributed.own["flops"] if c.unattributed is not None else 0.0
    if unattributed:  # XLA made a product without metadata (rewriting a tiny one): said, never guessed
        assert "not attributed" in c.table()
        COUNTS["compiled models with unattributed FLOPs"] += 1
    rows = math.prod(spec.shape[:-1])
    keys = {id(n): k for k, n in call_keys(mox).items()}
    short, above = 0.0, {""}
    for node, site in zip(calls, dense_sites):
        w = W[site.block]
        one = w if not site.steps else {k: v[0] for k, v in w.items()}
        h = np.zeros((rows, np.shape(one["kernel"])[0]), np.float32)
        want = _xla(_dense, one, h)["flops"] * (site.steps or 1)
        got = c.calls[keys[id(node)]].own["flops"]
        # XLA may compute a product again in each fusion that reads it (more, never less); what
        # XLA made without metadata goes to the innermost call around what it reads and what reads
        # it (an enclosing call: coarser, still true) or is "not attributed"; never to another call
        if got < want:
            short += want - got
            above |= {keys[id(a)] for a in calls_around(mox, node)}
        COUNTS["compiled dense calls exact" if got == want else "compiled dense calls recomputed by XLA"
               if got > want else "compiled dense calls named coarsely by XLA"] += 1
    assert short <= unattributed + sum(c.calls[k].own["flops"] for k in above), (short, unattributed, c.table())
    COUNTS["compiled dense calls"] += len(calls)
