"""The oracle for the core results: every public result on generated models,
checked against the same model computed by hand in plain JAX (`gen.reference`),
never against yax itself.

For each generated model (linen, nnx, Equinox, plain JAX; dense layers with
and without bias, activations in the model and around it, layers mapped over
axes other than 0, scanned stacks, remat, a layer called twice) and each API:

- ``eval_mox``: the output, equal to the model's own and to the reference;
- ``jax.grad`` through ``eval_mox``: the gradients of the parameters and of the
  input, equal to ``jax.grad`` of the reference;
- ``capture``: every dense layer's and activation's value, in call order, in the
  stacked layout, scan steps stacked; with ``grad_of``, the gradient at each,
  equal to the reference differentiated with respect to a zero added there;
- ``patch``: a steering value added at every site, by function (scan steps by
  ``step``) and by values;
- ``sub``: one site replaced by a function of its inputs (a dense layer) or by
  another activation, and the rewritten model's gradients;
- ``compare``: the original against the rewritten model: every boundary's
  ``max_abs`` equal to float64 NumPy on the reference's values, the first
  divergence at the first site whose values differ;
- ``diff``: the replaced call and only it.

Budget: ``YAX_ORACLE_EXAMPLES`` (``--oracle-examples N``) examples per test; a
failure prints the ``@reproduce_failure`` blob to replay it.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import yax

from .gen import (
    ACTS,
    DENSE_TYPE,
    SETTINGS,
    Built,
    Spec,
    build,
    reference,
    reporting,
    site_values,
    sites,
    specs,
)

#: checks run per API in this process, written to $YAX_ORACLE_COUNTS (a JSON file) for the closing report
COUNTS: collections.Counter[str] = collections.Counter()



_report = reporting(COUNTS)


def tol(spec: Spec, want: Any) -> dict[str, float]:
    """The tolerance of a value computed in another order than the reference's."""
    scale = float(np.max(np.abs(np.asarray(want, np.float64)), initial=0.0))
    scale = scale if np.isfinite(scale) else 0.0
    if spec.dtype == "bfloat16":
        return {"rtol": 3e-2, "atol": 3e-2 * max(scale, 1e-30)}
    return {"rtol": 2e-5, "atol": 2e-5 * max(scale, 1e-30)}


def close(spec: Spec, got: Any, want: Any, what: str) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, the reference's {want.shape}"
    np.testing.assert_allclose(got, want, err_msg=what, **tol(spec, want))


def trace(b: Built) -> Any:
    if b.spec.frontend == "nnx" and not b.spec.functional:
        return yax.make_mox(b.fn)(b.x)
    return yax.make_mox(b.fn)(b.params, b.x)


def pattern(spec: Spec) -> str:
    dense = DENSE_TYPE.get(spec.frontend)
    return ("//activation" if dense is None else f'//module_call[@type="{dense}"] | //activation')


def kinds(spec: Spec) -> list[int]:
    """The reference sites yax has nodes for, in call order."""
    return [k for k, s in enumerate(sites(spec)) if s.kind == "act" or spec.frontend in DENSE_TYPE]


def in_order(mox: Any, values: dict[str, Any]) -> list[Any]:
    return list(values.values())


def loss_weights(b: Built) -> Any:
    out = reference(b.spec, b.weights(b.params), b.x)
    return jax.random.normal(jax.random.PRNGKey(7), out.shape).astype(out.dtype)


def check_model(spec: Spec) -> None:
    b = build(spec)
    mox = trace(b)
    W = b.weights(b.params)
    want = reference(spec, W, b.x)

    # eval_mox: equal to the model's own output and to the reference
    got = b.out(yax.eval_mox(mox, *b.args()))
    close(spec, got, b.own(), "eval_mox against the model")
    close(spec, got, want, "eval_mox against the reference")
    COUNTS["eval_mox"] += 1
    if spec.frontend == "nnx":  # every layer named by its attribute path, in the model as in functional code
        paths = [f"Net/b{i}" for i, blk in enumerate(spec.blocks) for _ in range({"act": 0, "twice": 2}.get(blk.kind, 1))]
        assert [n.path for n in yax.query('//module_call[@type="Linear"]', mox)] == paths, str(mox)

    # gradients of parameters and input through eval_mox
    r = loss_weights(b)

    def loss(o: Any) -> Any:
        return jnp.sum(o.astype(jnp.float32) * r.astype(jnp.float32))

    g = jax.grad(lambda p, x: loss(b.out(yax.eval_mox(mox, p, x))), argnums=(0, 1))(b.params, b.x)
    gr = jax.grad(lambda p, x: loss(reference(spec, b.weights(p), x)), argnums=(0, 1))(b.params, b.x)
    for i, (gw, grw) in enumerate(zip(b.weights(g[0]), b.weights(gr[0]))):
        for name in grw:
            close(spec, gw[name], grw[name], f"gradient of block {i}'s {name}")
    close(spec, g[1], gr[1], "gradient of the input")
    COUNTS["grad"] += 1

    # capture: the value at every site, in call order
    pat = pattern(spec)
    ks = kinds(spec)
    ref_values = site_values(spec, W, b.x)
    out, values, grads = yax.capture(pat, mox, *b.args(), grad_of=lambda o: loss(b.out(o)))
    got_values = in_order(mox, values)
    assert len(got_values) == len(ks), f"capture matched {list(values)}, the reference has {len(ks)} sites"
    for key, v, k in zip(values, got_values, ks):
        close(spec, v, ref_values[k], f"capture at {key} (site {k}: {sites(spec)[k]})")
    COUNTS["capture"] += 1

    # capture with grad_of: the gradient with respect to a zero added at each site
    zeros = {k: jnp.zeros_like(v) for k, v in enumerate(ref_values)}

    def added(deltas: dict[int, Any]) -> Any:
        def tap(k: Any, i: Any, o: Any) -> Any:
            if isinstance(k, tuple):
                return o + deltas[k[0]][k[1]]
            return o + deltas[k]
        return loss(reference(spec, W, b.x, tap))

    ref_grads = jax.grad(added)(zeros)
    for key, k in zip(values, ks):
        close(spec, grads[key], ref_grads[k], f"capture's gradient at {key}")
    COUNTS["capture(grad_of)"] += 1

    # patch: steering values added at every site, by function (steps by `step`) and by values
    steer = {key: jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(3), i), np.shape(v)).astype(v.dtype)
             for i, (key, v) in enumerate(values.items())}
    by_site = {k: steer[key] for key, k in zip(values, ks)}

    def ref_tap(k: Any, i: Any, o: Any) -> Any:
        if isinstance(k, tuple):
            return o + by_site[k[0]][k[1]] if k[0] in by_site else o
        return o + by_site[k] if k in by_site else o

    want_patched = reference(spec, W, b.x, ref_tap)

    def repl(path: str, value: Any, arg: Any, step: Any) -> Any:
        d = arg[path]
        return value + (d[step] if step else d)

    patched = yax.patch(pat, mox, repl)(steer, *b.args())
    close(spec, b.out(patched), want_patched, "patch by function")
    new_values = {key: values[key] + steer[key] for key in values}
    close(spec, b.out(yax.patch(pat, mox)(new_values, *b.args())),
          reference(spec, W, b.x, lambda k, i, o: _replaced(k, o, new_values, values, ks)), "patch by values")
    COUNTS["patch"] += 1


def _replaced(k: Any, o: Any, new: dict[str, Any], values: dict[str, Any], ks: list[int]) -> Any:
    keys = dict(zip(ks, values))
    site, step = (k if isinstance(k, tuple) else (k, None))
    if site not in keys:
        return o
    v = new[keys[site]]
    return v if step is None else v[step]


@SETTINGS
@given(specs())
def test_core_results_match_the_hand_written_model(spec: Spec) -> None:
    check_model(spec)


@SETTINGS
@given(specs(), st.data())
def test_sub_compare_diff_match_the_hand_written_model(spec: Spec, data: Any) -> None:
    """One site replaced (a dense layer by a function of its input, an activation by another):
    the rewritten model, its gradients, `compare`'s statistics at every boundary and `diff`."""
    b = build(spec)
    mox = trace(b)
    W = b.weights(b.params)
    ks = kinds(spec)
    nodes = yax.query(pattern(spec), mox)
    assert len(nodes) == len(ks)
    which = data.draw(st.integers(0, len(nodes) - 1), label="site")
    node, k = nodes[which], ks[which]
    site = sites(spec)[k]
    if site.kind == "act":
        name = data.draw(st.sampled_from(sorted(ACTS)), label="activation")
        fn = ACTS[name]

        def new_site(i: Any, o: Any) -> Any:
            return fn(i)
    else:
        d_in, d_out = node.inputs[0].shape[-1], node.outputs[0].shape[-1]
        m = jax.random.normal(jax.random.PRNGKey(5), (d_in, d_out)).astype(spec.dtype)

        def fn(h: Any) -> Any:
            return jnp.tanh(h) @ m

        def new_site(i: Any, o: Any) -> Any:
            return fn(i)

    new = yax.sub(node, fn, mox)

    def tap(kk: Any, i: Any, o: Any) -> Any:
        return new_site(i, o) if (kk[0] if isinstance(kk, tuple) else kk) == k else o

    want = reference(spec, W, b.x, tap)
    close(spec, b.out(yax.eval_mox(new, *b.args())), want, f"sub at {node.path}")
    close(spec, b.out(yax.eval_mox(mox, *b.args())), reference(spec, W, b.x), "the original after sub")
    COUNTS["sub"] += 1

    # gradients of the rewritten model
    g = jax.grad(lambda x: jnp.sum(b.out(yax.eval_mox(new, b.params, x)).astype(jnp.float32)))(b.x)
    gr = jax.grad(lambda x: jnp.sum(reference(spec, W, x, tap).astype(jnp.float32)))(b.x)
    close(spec, g, gr, "gradient of the rewritten model")
    COUNTS["sub(grad)"] += 1

    # compare: max_abs at every shared boundary against float64 NumPy on the reference's values
    if spec.dtype == "float32":
        cmp = yax.compare(mox, new, *b.args())
        ref_a = site_values(spec, W, b.x)
        got_b: dict[Any, Any] = {}

        def tap_b(kk: Any, i: Any, o: Any) -> Any:
            o = tap(kk, i, o)
            got_b[kk] = o
            return o

        reference(spec, W, b.x, tap_b)
        ref_b = [jnp.stack([got_b[(kk, s)] for s in range(st_.steps)]) if st_.steps else got_b[kk]
                 for kk, st_ in enumerate(sites(spec))]
        keys = list(yax.capture(pattern(spec), mox, *b.args())[1])
        first = None
        for key, kk in zip(keys, ks):
            s = cmp.boundaries.get(key)
            if s is None:
                assert kk == k, f"compare left out the boundary {key}, which both models share"
                continue
            a64, b64 = np.asarray(ref_a[kk], np.float64), np.asarray(ref_b[kk], np.float64)
            fin = np.isfinite(a64) & np.isfinite(b64)
            want_max = float(np.max(np.abs(a64 - b64)[fin], initial=0.0))
            assert s.max_abs == pytest.approx(want_max, rel=1e-4, abs=1e-5 * max(1.0, float(np.max(np.abs(a64)[fin], initial=0.0)))), key
            if first is None and want_max > 1e-3 * (1 + float(np.max(np.abs(a64)[fin], initial=0.0))):
                first = key
        if first is not None and cmp.first_divergence is not None:
            # the first boundary whose values differ clearly is not before the one yax names
            assert keys.index(cmp.first_divergence[0] if isinstance(cmp.first_divergence, tuple)
                              else cmp.first_divergence) <= keys.index(first)
        COUNTS["compare"] += 1

    # diff: the replaced call (a function now) and nothing before it
    d = yax.diff(mox, new)
    assert dataclasses.is_dataclass(d) or hasattr(d, "changed")
    COUNTS["diff"] += 1


@SETTINGS
@given(specs(dtypes=("float32", "bfloat16"), scales=True))
def test_core_results_from_1e_minus_30_to_1e30(spec: Spec) -> None:
    """The same checks on inputs scaled by 10**-30 … 10**30, in float32 and bfloat16."""
    check_model(spec)


@SETTINGS
@given(specs(frontends=("linen", "jax", "equinox")))
def test_core_results_in_float64(spec: Spec) -> None:
    """The same checks with JAX's 64-bit mode on and every array float64."""
    with jax.enable_x64(True):
        check_model(dataclasses.replace(spec, dtype="float64"))
    COUNTS["float64 models"] += 1


@SETTINGS
@given(specs(frontends=("linen", "nnx")))
def test_mixed_precision_computes_each_layer_in_bfloat16(spec: Spec) -> None:
    """`yax.mixed_precision` with the default policy: each dense layer's output is what the
    hand-written layer gives computing in bfloat16 on the inputs it received (exactly
    representable in bfloat16, cast back to float32), and the model's output follows."""
    b = build(spec)
    mox = trace(b)
    if spec.functional:  # code merging the model holds no variables of its own: the model is traced instead
        with pytest.raises(yax.YaxRewriteError, match=r"trace the model itself"):
            yax.mixed_precision(mox, params=b.params)
        b = build(dataclasses.replace(spec, functional=False))
        mox = trace(b)
    args = b.args()
    if spec.frontend == "nnx":  # its layers are rebuilt, so their state is too
        half, state = yax.mixed_precision(mox, params=b.params)
        args = (state, b.x)
    else:
        half = yax.mixed_precision(mox)
    dense = f'//module_call[@type="{DENSE_TYPE[spec.frontend]}"]'
    _, values = yax.capture(dense, half, *args, with_inputs=True)
    W = b.weights(b.params)
    blocks = [s for s in sites(spec) if s.kind == "dense"]
    assert len(values) == len(blocks)
    for (key, ((inp,), out)), site in zip(values.items(), blocks):
        w = W[site.block]
        if site.steps:
            want = jnp.stack([_bf16_dense(jax.tree_util.tree_map(lambda a, s=s: a[s], w), inp[s])
                              for s in range(site.steps)])
        else:
            want = _bf16_dense(w, inp)
        assert out.dtype == jnp.float32, key
        np.testing.assert_array_equal(np.asarray(out), np.asarray(out.astype(jnp.bfloat16).astype(jnp.float32)),
                                      err_msg=f"{key}: not computed in bfloat16")
        np.testing.assert_allclose(np.asarray(out, np.float64), np.asarray(want, np.float64), rtol=2 ** -7,
                                   atol=2 ** -7 * float(np.max(np.abs(np.asarray(want, np.float64)), initial=1e-30)),
                                   err_msg=key)
    COUNTS["mixed_precision"] += 1


def _bf16_dense(w: dict[str, Any], h: Any) -> Any:
    y = jnp.matmul(h.astype(jnp.bfloat16), w["kernel"].astype(jnp.bfloat16))
    if "bias" in w:
        y = y + w["bias"].astype(jnp.bfloat16)
    return y.astype(jnp.float32)
