"""Rewrites on models nobody here wrote (tests/thirdparty.py): Hugging Face Flax
classes and a scanned, rematerialised Transformer, each called through its
wrapper with ``params=`` and through ``module.apply``, checked against the
models themselves; refusals change nothing.

Every test is parametrized over all cases with module scope, so pytest runs a
case's tests one after another (and pytest-xdist mostly on one worker), and
each model is built and traced once per worker."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import check_compiled_cost
from thirdparty import CASES, case

import yax

pytestmark = pytest.mark.slow  # the third-party zoo: the full command runs it

# On the oldest supported JAX (``-m core``) every family runs through its wrapper, and two through
# ``module.apply`` too: both styles reach JAX the same way, only yax's handling of the variables
# differs, and that does not depend on JAX's version. The newest JAX runs every case.
OLDEST = {c for c in CASES if c.endswith("-wrapper")} | {"bert-module", "scanned-module"}
by_case = pytest.mark.parametrize(
    "name", [pytest.param(c, marks=[pytest.mark.core] if c in OLDEST else []) for c in CASES], scope="module")


@functools.cache
def traced(name):
    """The zoo case and its MoX, traced once per process."""
    c = case(name)
    return c, yax.make_mox(c.fn)(*c.args, **c.kwargs)


def flat(tree):
    return {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def assert_close(got, want, rtol=1e-5, atol=1e-5):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=rtol, atol=atol), got, want)


def assert_same_leaves(got, want):
    got, want = flat(got), flat(want)
    assert got.keys() == want.keys()
    assert all(np.array_equal(got[k], want[k]) for k in want)


def loss(out):
    return sum(jnp.mean(jnp.square(x)) for x in jax.tree_util.tree_leaves(out))


def _snapshot(mox, params):
    return str(mox), yax.to_xml(mox), jax.tree_util.tree_map(np.asarray, params)


def assert_unchanged(before, mox, params):
    after = _snapshot(mox, params)
    assert before[:2] == after[:2]
    assert jax.tree_util.tree_structure(before[2]) == jax.tree_util.tree_structure(after[2])
    assert_same_leaves(after[2], before[2])


@by_case
def test_eval_eagerly_jitted_and_differentiated(name):
    c, mox = traced(name)
    params, *inputs = c.args
    want = c.fn(*c.args, **c.kwargs)
    assert_close(yax.eval_mox(mox, *c.args, **c.kwargs), want)
    assert_close(jax.jit(lambda *a: yax.eval_mox(mox, *a, **c.kwargs))(*c.args), want)
    grad = jax.jit(jax.grad(lambda p: loss(yax.eval_mox(mox, p, *inputs, **c.kwargs))))(params)
    grad_want = jax.jit(jax.grad(lambda p: loss(c.fn(p, *inputs, **c.kwargs))))(params)
    assert_close(grad, grad_want, rtol=1e-4, atol=1e-6)


@pytest.mark.core
@pytest.mark.parametrize("name", ["bert-module", "gpt2-module"])
def test_model_configs_show_in_short(name):
    """A Hugging Face config field is shown by its type, not its whole
    (costly, pages-long) repr: rows keep room for shapes, views build fast."""
    _, mox = traced(name)
    shown = {str(v) for v in yax.query("//module_call/@config", mox)}
    assert shown and all(v.endswith("Config(…)") for v in shown), shown
    assert "Config(…)" in str(mox)


@pytest.mark.core
@pytest.mark.parametrize("name", ["llama-wrapper", "scanned-module"])
def test_lora_on_abstract_parameters_allocates_nothing(name):
    """Parameters given as `jax.ShapeDtypeStruct`s (a 7B model planned
    without memory): the new adapters come back abstract too, stacked per
    layer in a scan, and the rewritten function lowers on them."""
    c, mox = traced(name)
    params, *inputs = c.args
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    new, p2 = yax.sub(c.row.qv, yax.LoRA(rank=2), mox, params=abstract)
    leaves = jax.tree_util.tree_leaves_with_path(p2)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for _, x in leaves)
    assert any("lora_a" in jax.tree_util.keystr(kp) for kp, _ in leaves)
    real = yax.sub(c.row.qv, yax.LoRA(rank=2), mox, params=params, key=jax.random.key(0))[1]
    assert jax.tree_util.tree_structure(real) == jax.tree_util.tree_structure(p2)  # as if initialised
    assert [(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(real)] == [
        (x.shape, x.dtype) for x in jax.tree_util.tree_leaves(p2)]
    lowered = jax.jit(yax.to_function(new)).lower(p2, *inputs, **c.kwargs)
    assert "dot_general" in lowered.as_text()


@pytest.mark.core
@pytest.mark.parametrize("name", ["gpt2-module", "bert-wrapper", "scanned-module"])
def test_what_fits_is_exactly_what_sub_does(name):
    """`misfit` with the parameters (the explorer's "what fits" menu) refuses
    exactly what `sub` refuses, on every module call: GPT-2's `lm_head`, whose
    kernel is the tied embedding handed to it, included."""
    import yax.internal

    c, mox = traced(name)
    params = c.args[0]
    verdicts = []
    for node in yax.query("//module_call", mox):
        why = yax.internal.misfit(yax.LoRA(rank=2), node, mox, params=params)
        try:
            yax.sub([node], yax.LoRA(rank=2), mox, params=params, key=jax.random.key(0))
            done = None
        except yax.YaxRewriteError as e:
            done = str(e)
        assert (why is None) == (done is None), (node.path, why, done)
        verdicts.append(why is None)
    assert not all(verdicts) and any(verdicts)
    if name == "gpt2-module":
        head = yax.query('//module_call[@name="lm_head"]', mox)[0]
        assert "not among the model's" in yax.internal.misfit(yax.LoRA(rank=2), head, mox, params=params)


@by_case
def test_resubstituting_the_same_modules_changes_nothing(name):
    c, mox = traced(name)
    params, *inputs = c.args
    n = len(yax.query(c.row.qv, mox))
    assert n >= 1
    new, p2 = yax.sub(c.row.qv, lambda path, node: yax.module_of(node), mox, params=params)
    assert len(yax.query(c.row.qv, new)) == n
    assert jax.tree_util.tree_structure(p2) == jax.tree_util.tree_structure(params)
    assert_same_leaves(p2, params)
    assert_close(yax.eval_mox(new, p2, *inputs, **c.kwargs), yax.eval_mox(mox, *c.args, **c.kwargs),
                 rtol=1e-6, atol=1e-6)


@by_case
def test_lora_on_the_attention_projections_trains_and_merges(name):
    """Only the adapters train and the merge computes the trained model, on every
    family's attention projections: GPT-2's ``FlaxConv1D`` (a kernel stored
    (out, in) and transposed in the layer) included, since LoRA reads which axes
    meet the input from the layer's own jaxpr."""
    c, mox = traced(name)
    params, *inputs = c.args
    target = c.row.lora or c.row.qv
    n = len(yax.query(target, mox))
    assert n >= 1
    new, p2 = yax.sub(target, yax.LoRA(rank=2), mox, params=params, key=jax.random.key(1))
    assert len(yax.query('//module_call[@type="LoRA"]', new)) == n

    def run(p):
        return yax.eval_mox(new, p, *inputs, **c.kwargs)

    assert_close(run(p2), c.fn(*c.args, **c.kwargs))  # lora_b starts at zero
    orig, start = flat(params), flat(p2)
    added = start.keys() - orig.keys()
    assert orig.keys() <= start.keys() and added
    assert all(k.endswith(("['lora_a']", "['lora_b']")) for k in added), sorted(added)
    assert all(np.array_equal(start[k], orig[k]) for k in orig)

    opt = optax.multi_transform({True: optax.adam(1e-2), False: optax.set_to_zero()}, yax.lora_mask(p2))

    @jax.jit
    def step(p, s):
        g = jax.grad(lambda p: loss(run(p)))(p)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    p3, state = p2, opt.init(p2)
    for _ in range(3):
        p3, state = step(p3, state)
    assert float(loss(run(p3))) < float(loss(run(p2)))
    trained = flat(p3)
    assert all(np.array_equal(trained[k], orig[k]) for k in orig)  # bit-identical: only adapters moved
    assert all(not np.array_equal(trained[k], start[k]) for k in added)

    merged, mp = yax.merge_lora(new, p3)
    assert yax.query('count(//module_call[@type="LoRA"])', merged) == 0.0
    assert jax.tree_util.tree_structure(mp) == jax.tree_util.tree_structure(params)
    assert_close(yax.eval_mox(merged, mp, *inputs, **c.kwargs), run(p3))
    assert_close(c.fn(mp, *inputs, **c.kwargs), run(p3))  # the merged parameters run the model itself


@by_case
def test_activation_swap_matches_the_model_patched_by_hand(name):
    c, mox = traced(name)
    act, to = c.row.act, c.row.swap
    n = yax.query(f'count(//*[@name="{act}"])', mox)
    assert n >= 1
    new = yax.sub(f'//*[@name="{act}"]', getattr(jax.nn, to), mox)
    assert yax.query(f'count(//*[@name="{act}"])', new) == 0.0
    want = c.swapped(*c.args, **c.kwargs)
    assert not np.allclose(jax.tree_util.tree_leaves(want)[0], jax.tree_util.tree_leaves(c.fn(*c.args, **c.kwargs))[0])
    assert_close(yax.eval_mox(new, *c.args, **c.kwargs), want)
    assert yax.query(f'count(//*[@name="{act}"])', mox) == n  # the original is untouched


@by_case
def test_compiled_cost_is_xlas_and_names_every_call(name):
    c, mox = traced(name)
    cost = check_compiled_cost(mox, *c.args, **c.kwargs)
    want = jax.jit(lambda *a: c.fn(*a, **c.kwargs)).lower(*c.args).compile().cost_analysis()
    assert cost.xla["flops"] == want["flops"]  # the program yax compiled is the model's own
