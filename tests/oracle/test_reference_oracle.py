"""The oracle for `yax.Reference` and `compare` against one: each generated model
(gen.py: linen, nnx, Equinox, plain JAX; scans, remat, vmapped layers, a layer
called twice) compared with its own hand-written JAX values (`gen.site_values`,
`gen.reference`), recorded as another implementation records them: names in
another layout (dots, lower case, a wrapper's prefix, a scan's steps as numbered
modules ``model.net.b2.0``, ``model.net.b2.1``), never yax's values.

(i)  Faithful: every site is matched automatically, every boundary and the
     output are allclose, there is no first divergence.
(ii) One site's recorded values (one step of a scan) offset by a known delta:
     the first divergence is that site at that step, its ``max_abs`` is float64
     NumPy's ``max|delta|`` to float32 rounding, and every other site stays allclose.
(iii) The same, saved to a file and loaded back (npz and safetensors, chosen at random).

Budget: ``YAX_ORACLE_EXAMPLES`` examples.
"""

from __future__ import annotations

import collections
from typing import Any

import jax
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import yax

from .gen import SETTINGS, Spec, build, reference, reporting, site_values, sites, specs
from .test_core_oracle import kinds, pattern, trace

COUNTS: collections.Counter[str] = collections.Counter()
_report = reporting(COUNTS)


def other_name(key: str) -> str:
    """A yax key as another implementation names the module: dots, lower case, under a wrapper of its
    own (``Net/b0#2`` -> ``model.net.b0#2``)."""
    base, hash_, n = key.partition("#")
    return "model." + base.replace("/", ".").lower() + hash_ + n


@SETTINGS
@given(specs(), st.data())
def test_compare_with_a_recorded_hand_written_run(tmp_path_factory: Any, spec: Spec, data: Any) -> None:
    b = build(spec)
    mox = trace(b)
    W = b.weights(b.params)
    values = site_values(spec, W, b.x)
    ks = kinds(spec)
    keys = list(yax.capture(pattern(spec), mox, *b.args())[1])  # the sites' names only
    assert len(keys) == len(ks)
    site = sites(spec)

    def recorded(offset: dict[tuple[int, int | None], Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"": np.asarray(reference(spec, W, b.x))}
        for key, k in zip(keys, ks):
            v = np.asarray(values[k])
            if site[k].steps:  # each step a module of its own: b2.0, b2.1, …
                for s in range(site[k].steps):
                    d = (offset or {}).get((k, s), 0)
                    out[f"{other_name(key)}.{s}"] = v[s] + d
            else:
                out[other_name(key)] = v + (offset or {}).get((k, None), 0)
        return out

    # (i) faithful
    ref = yax.Reference(recorded(), source="hand-written JAX")
    c = yax.compare(ref, mox, *b.args())
    assert set(c.matching.calls) == set(keys), (c.matching, keys)
    assert c.first_divergence is None and not c.unavailable, c
    assert all(s.allclose for s in c.boundaries.values()), c
    assert c.outputs and c.allclose, c
    for key, k in zip(keys, ks):
        if site[k].steps:
            assert len(c.steps[key]) == site[k].steps and c.stacks[key] == (site[k].steps,)
    COUNTS["faithful"] += 1

    # (ii) one site (one step) offset by a known delta
    which = data.draw(st.integers(0, len(keys) - 1), label="site")
    key, k = keys[which], ks[which]
    step = data.draw(st.integers(0, site[k].steps - 1), label="step") if site[k].steps else None
    v = np.asarray(values[k])[step] if step is not None else np.asarray(values[k])
    scale = float(np.max(np.abs(v), initial=0.0))
    delta = (np.asarray(jax.random.normal(jax.random.key(which), v.shape), np.float32) * 1e-2 * max(scale, 1.0))
    delta.flat[0] = 0.5 * max(scale, 1.0)  # at least one entry far off
    planted = yax.Reference(recorded({(k, step): delta}), source="hand-written JAX, planted")
    if data.draw(st.booleans(), label="through a file"):
        path = tmp_path_factory.mktemp("ref") / data.draw(st.sampled_from(["r.npz", "r.safetensors"]), label="file")
        planted.save(path)
        planted = yax.Reference.load(path)
        COUNTS["through a file"] += 1
    c = yax.compare(planted, mox, *b.args())
    assert c.first_divergence == key, (c.first_divergence, key)
    assert c.first_divergence_step == (() if step is None else (step,))
    want = float(np.max(np.abs(delta.astype(np.float64))))
    got = c.steps[key][step].max_abs if step is not None else c.boundaries[key].max_abs
    assert abs(got - want) <= 1e-5 * max(scale, want, 1.0), (got, want)
    for other, s in c.boundaries.items():
        if other != key:
            assert s.allclose, other
    COUNTS["planted"] += 1
