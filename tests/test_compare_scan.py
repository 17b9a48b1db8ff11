"""`compare` inside scanned stacks, checked against a hand-written forward pass.

The scanned Transformers (linen `nn.scan(nn.remat(layer))`, nnx `nnx.scan` over
`nnx.vmap`-made blocks) have their GELU swapped for ReLU inside the stack's body.
A plain JAX forward pass written here computes every call boundary of both
models, per layer; the comparison must agree with it at every boundary and step,
name the GELU at step 0 as the first divergence, and find every boundary before
it exactly equal.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import KEY, ScannedTransformer

import yax

pytestmark = pytest.mark.core


def _ln(x, p, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * p["scale"] + p["bias"]


def _linen_reference(params, ids, act):
    """Every call boundary of `ScannedTransformer` (by the key `compare` gives it), stacked per layer."""
    p = params["params"]
    emb = p["embed"]["embedding"]
    got = {"embed": emb[ids]}
    x = got["embed"]
    mask = (jnp.arange(8)[:, None] >= jnp.arange(8)[None, :])[None, None]
    steps = []
    for i in range(p["layers"]["wi"]["kernel"].shape[0]):
        lp = jax.tree_util.tree_map(lambda a, i=i: a[i], p["layers"])
        r = {}
        r["pre_attn_norm"] = h = _ln(x, lp["pre_attn_norm"])
        q, k, v = (jnp.einsum("bsd,dhk->bshk", h, lp["attn"][n]["kernel"]) + lp["attn"][n]["bias"]
                   for n in ("query", "key", "value"))
        r["attn/query"], r["attn/key"], r["attn/value"] = q, k, v
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(8.0)
        r["attn/softmax"] = w = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(jnp.float32).min), axis=-1)
        y = jnp.einsum("bhqk,bkhd->bqhd", w, v)
        r["attn/out"] = r["attn"] = a = jnp.einsum("bshk,hkd->bsd", y, lp["attn"]["out"]["kernel"]) + \
            lp["attn"]["out"]["bias"]
        x = x + a
        r["pre_mlp_norm"] = h = _ln(x, lp["pre_mlp_norm"])
        r["wi"] = h = h @ lp["wi"]["kernel"] + lp["wi"]["bias"]
        r["gelu"] = h = act(h)
        r["wo"] = h = h @ lp["wo"]["kernel"] + lp["wo"]["bias"]
        r[""] = x = x + h  # the layer's own boundary: `layers`
        steps.append(r)
    for k in steps[0]:
        got["layers" + (f"/{k}" if k else "")] = jnp.stack([s[k] for s in steps])
    got["final_norm"] = h = _ln(x, p["final_norm"])
    got["embed.attend"] = got[""] = h @ emb.T
    root = "ScannedTransformer"
    return {(f"{root}/{k}" if k and not k.startswith(".") else root + k.replace("embed.attend", "/embed.attend")): v
            for k, v in got.items()}


def _nnx_reference(state, ids, act):
    """Every call boundary of `nnx_models.ScanTransformer`, stacked per layer."""
    from flax import nnx

    p = nnx.to_pure_dict(state)
    emb = p["embed"]["embedding"]
    got = {"embed": emb[ids]}
    x = got["embed"]
    b = p["blocks"]
    steps = []
    for i in range(b["fc1"]["kernel"].shape[0]):
        lp = jax.tree_util.tree_map(lambda a, i=i: a[i], {k: b[k] for k in ("norm1", "norm2", "fc1", "fc2", "attn")})
        r = {}
        r["norm1"] = h = _ln(x, lp["norm1"])
        lin = {n: h @ lp["attn"][n]["kernel"] + lp["attn"][n]["bias"] for n in ("query", "key", "value")}
        r["attn/query"], r["attn/key"], r["attn/value"] = lin["query"], lin["key"], lin["value"]
        q, k, v = (lin[n].reshape(2, 8, 4, 8) for n in ("query", "key", "value"))
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(8.0)
        r["attn/softmax"] = w = jax.nn.softmax(logits, axis=-1)
        y = jnp.einsum("bhqk,bkhd->bqhd", w, v).reshape(2, 8, 32)
        r["attn/out"] = r["attn"] = r["drop1"] = a = y @ lp["attn"]["out"]["kernel"] + lp["attn"]["out"]["bias"]
        x = x + a
        r["norm2"] = h = _ln(x, lp["norm2"])
        r["fc1"] = h = h @ lp["fc1"]["kernel"] + lp["fc1"]["bias"]
        r["gelu"] = h = act(h)
        r["fc2"] = r["drop2"] = h = h @ lp["fc2"]["kernel"] + lp["fc2"]["bias"]
        r[""] = x = x + h
        steps.append(r)
    for k in steps[0]:
        got["blocks" + (f"/{k}" if k else "")] = jnp.stack([s[k] for s in steps])
    got["norm"] = h = _ln(x, p["norm"])
    got["embed.attend"] = got[""] = h @ emb.T
    root = "ScanTransformer"
    return {(f"{root}/{k}" if k else root): v for k, v in got.items()}


def _check(c, ref_a, ref_b, gelu, layers):
    # The hand-written reference has every boundary compare reports, and compare every one it has.
    assert set(c.boundaries) == set(ref_a), set(c.boundaries) ^ set(ref_a)
    for k, s in c.boundaries.items():
        x, y = np.asarray(ref_a[k], np.float32).ravel(), np.asarray(ref_b[k], np.float32).ravel()
        rel = np.linalg.norm(y - x) / np.linalg.norm(x)
        assert s.rel == pytest.approx(rel, rel=2e-3, abs=2e-6), k
        assert s.max_abs == pytest.approx(np.abs(y - x).max(), rel=2e-3, abs=2e-5), k
    # Inside the stack every call is compared at every step, against the reference's step.
    for k, per in c.steps.items():
        assert c.stacks[k] == (layers,) and len(per) == layers, k
        for i, s in enumerate(per):
            x, y = np.asarray(ref_a[k][i]).ravel(), np.asarray(ref_b[k][i]).ravel()
            rel = np.linalg.norm(y - x) / np.linalg.norm(x)
            assert s.rel == pytest.approx(rel, rel=2e-3, abs=2e-6), (k, i)
    # The first divergence is the swapped activation at step 0; everything before it is exactly equal.
    assert (c.first_divergence, c.first_divergence_step) == (gelu, (0,))
    assert c.label(gelu).endswith("(now relu)")
    keys = list(c.boundaries)
    before_stack = keys[: keys.index(next(k for k in keys if k in c.steps))]
    for k in before_stack:
        assert c.boundaries[k].max_abs == 0, k
    body = [k for k in keys if k in c.steps]
    for k in body[: body.index(gelu)]:
        assert c.steps[k][0].max_abs == 0, k
    assert not c.steps[gelu][0].allclose
    assert "first divergence" in c.verdict and "scan step 0" in c.verdict


def test_linen_scanned_stack_compared_at_every_boundary_and_step():
    m = ScannedTransformer(num_layers=4)
    ids = jnp.arange(16).reshape(2, 8) % 100
    params = m.init(KEY, ids)
    mox = yax.make_mox(m.apply)(params, ids)
    relu = yax.sub('//activation[@name="gelu"]', jax.nn.relu, mox)
    c = yax.compare(mox, relu, params, ids)
    ref_a = _linen_reference(params, ids, jax.nn.gelu)
    ref_b = _linen_reference(params, ids, jax.nn.relu)
    _check(c, ref_a, ref_b, "ScannedTransformer/layers/gelu", 4)
    # The reference is the model: its logits are the model's.
    np.testing.assert_allclose(ref_a["ScannedTransformer"], m.apply(params, ids), rtol=1e-4, atol=1e-4)


def test_nnx_scanned_stack_compared_at_every_boundary_and_step():
    from flax import nnx
    from nnx_models import ScanTransformer, rngs

    m = ScanTransformer(rngs=rngs())
    ids = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 64
    _, state = nnx.split(m)
    mox = yax.make_mox(m)(ids)
    relu = yax.sub('//activation[@name="gelu"]', jax.nn.relu, mox)
    c = yax.compare(mox, relu, state, ids)
    ref_a = _nnx_reference(state, ids, jax.nn.gelu)
    ref_b = _nnx_reference(state, ids, jax.nn.relu)
    _check(c, ref_a, ref_b, "ScanTransformer/blocks/gelu", 3)
    np.testing.assert_allclose(ref_a["ScanTransformer"], m(ids), rtol=1e-4, atol=1e-4)


def test_calls_inside_while_and_cond_say_they_are_not_compared():
    import flax.linen as nn

    class Loop(nn.Module):
        @nn.compact
        def __call__(self, x):
            dense = nn.Dense(3)
            x = dense(x)
            return jax.lax.fori_loop(0, jnp.asarray(2) + 0 * x.shape[0], lambda i, h: nn.relu(h) * 0.5, x)

    x = jnp.ones((2, 3))
    m = Loop()
    p = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(p, x)
    c = yax.compare(mox, yax.sub('//activation[@name="relu"]', jax.nn.gelu, mox), p, x)
    assert "Loop/relu" in c.unavailable and "`while`" in c.unavailable["Loop/relu"]
    assert "not compared" in repr(c)
    assert "Loop/Dense_0" in c.boundaries


def test_nested_and_reversed_lax_scans_name_the_first_step_evaluated():
    """A plain function: an outer scan of 3 steps around an inner reversed scan of 4. The
    replacement differs from ReLU only above 5, which the activation's input reaches at outer
    step 1 and inner steps 1 and 2; the reversed inner scan runs step 2 before step 1, so the
    first divergence is (1, 2), and every step evaluated before it is exactly equal."""
    def f(x):
        def outer(c, i):
            def inner(h, j):
                y = jax.nn.relu(h + j + 10.0 * (i == 1) * ((j == 1) | (j == 2)))
                return h, y
            h, ys = jax.lax.scan(inner, c, jnp.arange(4.0), reverse=True)
            return h, ys.sum()
        return jax.lax.scan(outer, x, jnp.arange(3.0))

    x = jnp.linspace(-1.0, 1.0, 5)
    mox = yax.make_mox(f)(x)
    g = yax.sub('//activation[@name="relu"]', lambda h: jnp.where(h > 5, 0.0, jax.nn.relu(h)), mox)
    c = yax.compare(mox, g, x)
    assert c.stacks["relu"] == (3, 4)
    assert (c.first_divergence, c.first_divergence_step) == ("relu", (1, 2))
    per = c.steps["relu"]  # row-major: outer step * 4 + inner step
    assert [s.allclose for s in per] == [True] * 4 + [True, False, False, True] + [True] * 4
