"""`yax.mixed_precision` and the precision every call shows (`@policy`, `@compute`,
`summary`), against models written by hand in those dtypes: linen, nnx and GPT-2."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import yax

pytestmark = pytest.mark.core

F32, BF16 = jnp.float32, jnp.bfloat16
X = jnp.linspace(-2, 2, 24).reshape(2, 12)


class Net(nn.Module):
    """Dense layers computing in ``dtype`` (their outputs cast back to float32, as
    `mixed_precision` casts at a rewritten call's boundary), a float32 LayerNorm."""

    dtype: object = None
    param_dtype: object = F32

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(16, dtype=self.dtype, param_dtype=self.param_dtype)(x).astype(F32)
        h = nn.relu(nn.LayerNorm()(h))
        return nn.Dense(4, dtype=self.dtype, param_dtype=self.param_dtype)(h).astype(F32)


@pytest.fixture(scope="module")
def linen():
    v = Net().init(jax.random.key(0), X)
    return v, yax.make_mox(Net().apply)(v, X)


def test_a_float32_model_computes_in_float32_everywhere_and_summary_shows_no_column(linen):
    v, mox = linen
    assert set(yax.query("//module_call/@policy", mox)) == {"params=float32,compute=float32,output=float32"}
    assert "dtypes" not in yax.summary(mox)


def test_default_policy_equals_the_model_written_in_bfloat16(linen):
    v, mox = linen
    half = yax.mixed_precision(mox)  # PAX's default: dense-like layers half, norms full
    want = Net(dtype=BF16).apply(v, X)
    got = jax.jit(yax.to_function(half))(v, X)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert not np.allclose(got, Net().apply(v, X), rtol=1e-6, atol=1e-6)  # it did change
    # the gradient too
    g_want = jax.grad(lambda p: jnp.sum(Net(dtype=BF16).apply(p, X) ** 2))(v)
    g_got = jax.grad(lambda p: jnp.sum(yax.eval_mox(half, p, X) ** 2))(v)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), g_got, g_want)
    # what each call computes in is read from its equations, and queryable
    assert [n.path for n in yax.query('//module_call[@compute="bfloat16"]', half)] == ["Net", "Net/Dense_0", "Net/Dense_1"]
    assert yax.query('//module_call[@type="LayerNorm"]/@policy', half) == ["params=float32,compute=float32,output=float32"]
    assert yax.query('//module_call[@type="Dense"]/@policy', half) == ["params=float32,compute=bfloat16,output=float32"] * 2
    assert all(e.inputs[0].dtype == BF16 for e in yax.query("//dot_general", half))
    table = yax.summary(half)
    assert "dtypes p/c/o" in table
    shown = {line.split()[0]: line.split()[-1] for line in table.splitlines()[1:-1]}
    assert shown == {"Net": "f32/bf16/f32", "Dense_0": "f32/bf16/f32", "LayerNorm_0": "f32/f32/f32",
                     "relu": "-/f32/f32", "Dense_1": "f32/bf16/f32"}
    assert yax.query("//module_call/@compute", mox) == ["float32"] * 4  # the original is untouched


def test_a_params_dtype_casts_the_parameters_of_the_layers_it_matches(linen):
    v, mox = linen
    pol = {'//module_call[@type="Dense"]': "params=bfloat16,compute=bfloat16,output=float32"}
    half, hp = yax.mixed_precision(mox, pol, params=v)
    assert hp["params"]["Dense_0"]["kernel"].dtype == BF16 and hp["params"]["LayerNorm_0"]["scale"].dtype == F32
    assert v["params"]["Dense_0"]["kernel"].dtype == F32  # the input is not modified
    want = Net(dtype=BF16, param_dtype=BF16).apply(hp, X)
    np.testing.assert_allclose(yax.eval_mox(half, hp, X), want, rtol=1e-6, atol=1e-6)
    assert yax.query('//module_call[@type="Dense"]/@policy', half) == ["params=bfloat16,compute=bfloat16,output=float32"] * 2
    with pytest.raises(yax.errors.NeedsParams) as e:
        yax.mixed_precision(mox, pol)
    assert e.value.tool == "mixed_precision"


def test_short_forms_and_a_jmp_policy_are_the_same_policy(linen):
    jmp = pytest.importorskip("jmp")
    v, mox = linen
    q = '//module_call[@type="Dense"]'
    a = yax.mixed_precision(mox, {q: "params=float32,compute=bfloat16,output=float32"})
    b = yax.mixed_precision(mox, {q: "p=f32,c=bf16,o=full"})
    c = yax.mixed_precision(mox, {q: jmp.get_policy("params=float32,compute=bfloat16,output=float32")})
    outs = [yax.eval_mox(m, v, X) for m in (a, b, c)]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


class Outer(nn.Module):
    dtype: object = None
    norm_dtype: object = None

    @nn.compact
    def __call__(self, x):
        return Inner(dtype=self.dtype, norm_dtype=self.norm_dtype)(x)


class Inner(nn.Module):
    dtype: object = None
    norm_dtype: object = None

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(8, dtype=self.dtype)(x)
        n = nn.LayerNorm(dtype=self.norm_dtype or self.dtype)(h)
        if self.norm_dtype is not None:
            n = n.astype(self.dtype or F32)
        return nn.Dense(3, dtype=self.dtype)(n)


def test_a_policy_inside_a_matched_call_is_set_after_it():
    v = Outer().init(jax.random.key(1), X)
    mox = yax.make_mox(Outer().apply)(v, X)
    pol = {'//module_call[@type="Inner"]': "compute=bfloat16", '//module_call[@type="LayerNorm"]': "compute=float32"}
    new = yax.mixed_precision(mox, pol)
    want = Outer(dtype=BF16, norm_dtype=F32).apply(v, X).astype(F32)
    np.testing.assert_allclose(yax.eval_mox(new, v, X), want, rtol=1e-6, atol=1e-6)
    assert yax.query('//module_call[@type="LayerNorm"]/@compute', new) == ["float32"]
    assert set(yax.query('//module_call[@type="Dense"]/@compute', new)) == {"bfloat16"}
    # None leaves what a query matches as it is
    kept = yax.mixed_precision(mox, {**pol, '//module_call[@type="Inner"]': None})
    assert set(yax.query("//module_call/@compute", kept)) == {"float32"}


def test_refusals_say_what_to_do_and_change_nothing(linen):
    v, mox = linen
    with pytest.raises(yax.errors.PolicyNotApplied) as e:
        yax.mixed_precision(mox, {'//module_call[@type="Dense"]': "compute=bfloat16,output=bfloat16"})
    assert (e.value.problem, str(e.value.expected), str(e.value.found)) == ("output", "bfloat16", "float32")
    with pytest.raises(yax.errors.BadPolicy) as e:
        yax.mixed_precision(mox, {"//module_call": "compute=bf17"})
    assert (e.value.policy, e.value.part) == ("compute=bf17", "compute=bf17")
    with pytest.raises(yax.errors.BadPolicy) as e:
        yax.mixed_precision(mox, "compute=bfloat16")
    assert (e.value.policy, e.value.part) == ("compute=bfloat16", None)
    with pytest.raises(yax.errors.WrongNodeKind) as e:
        yax.mixed_precision(mox, {"//dot_general": "compute=bfloat16"})
    assert e.value.accepts == "applies to module calls" and e.value.node.name == "dot_general"

    class NoDtype(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(x)

    w = NoDtype().init(jax.random.key(0), X)
    m2 = yax.make_mox(NoDtype().apply)(w, X)
    with pytest.raises(yax.errors.PolicyNotApplied) as e:
        yax.mixed_precision(m2, {'//module_call[@type="NoDtype"]': "compute=bfloat16"})
    assert (e.value.problem, e.value.path) == ("dtype", "NoDtype")
    assert isinstance(e.value.cause, yax.errors.UnknownFields) and e.value.cause.unknown == ["dtype"]
    assert yax.query("//module_call/@compute", mox) == ["float32"] * 4


class NnxNet(nnx.Module):
    def __init__(self, rngs, dtype=None):
        self.a = nnx.Linear(12, 16, dtype=dtype, rngs=rngs)
        self.norm = nnx.LayerNorm(16, rngs=rngs)
        self.b = nnx.Linear(16, 4, dtype=dtype, rngs=rngs)

    def __call__(self, x):
        h = nnx.relu(self.norm(self.a(x).astype(F32)))
        return self.b(h).astype(F32)


def test_nnx_default_policy_equals_the_model_written_in_bfloat16():
    model = NnxNet(nnx.Rngs(0))
    state = nnx.state(model)
    mox = yax.make_mox(model)(X)
    with pytest.raises(yax.errors.NeedsParams) as e:
        yax.mixed_precision(mox)  # an nnx rewrite returns the new state
    assert e.value.tool == "mixed_precision" and "pass `params=state`" in str(e.value)
    half, hs = yax.mixed_precision(mox, params=state)
    hand = NnxNet(nnx.Rngs(5), dtype=BF16)
    nnx.update(hand, state)
    out, _ = yax.eval_mox(half, hs, X)
    np.testing.assert_allclose(out, hand(X), rtol=1e-6, atol=1e-6)
    assert [n.path for n in yax.query('//module_call[@type="Linear"][@compute="bfloat16"]', half)] == ["NnxNet/a", "NnxNet/b"]
    assert yax.query('//module_call[@type="LayerNorm"]/@compute', half) == ["float32"]
    # params=bfloat16 casts the nnx.Param variables of the layers it matches, not the others
    half2, hs2 = yax.mixed_precision(mox, {'//module_call[@type="Linear"]': "params=bfloat16,compute=bfloat16"},
                                     params=state)
    assert hs2["a"]["kernel"][...].dtype == BF16 and hs2["norm"]["scale"][...].dtype == F32
    hand2 = NnxNet(nnx.Rngs(5), dtype=BF16)
    nnx.update(hand2, hs2)
    np.testing.assert_allclose(yax.eval_mox(half2, hs2, X)[0], hand2(X), rtol=1e-6, atol=1e-6)


def test_nnx_module_of_rebuilds_from_the_constructor_and_refuses_what_it_cannot():
    class Renamed(nnx.Module):  # stores its argument under another name
        def __init__(self, width, rngs):
            self.features = width
            self.lin = nnx.Linear(12, width, rngs=rngs)

        def __call__(self, x):
            return self.lin(x)

    mox = yax.make_mox(Renamed(3, nnx.Rngs(0)))(X)
    lin = yax.query('//module_call[@type="Linear"]', mox)[0]
    new = yax.module_of(lin, dtype=BF16, use_bias=False)
    assert (type(new), new.in_features, new.out_features, new.dtype, new.use_bias) == (nnx.Linear, 12, 3, BF16, False)
    with pytest.raises(yax.errors.CannotRebuild) as e:
        yax.module_of(mox.calls[0])
    assert e.value.path == mox.calls[0].path and "`width`" in e.value.why
    with pytest.raises(yax.errors.UnknownFields) as e:
        yax.module_of(lin, features=3)
    assert e.value.unknown == ["features"] and {"in_features", "out_features"} <= set(e.value.known)
    masked = nnx.Conv(2, 2, (3,), mask=jnp.ones((3, 2, 2)), rngs=nnx.Rngs(0))  # an array field: not recorded
    node = yax.make_mox(masked)(jnp.ones((1, 5, 2))).calls[0]
    with pytest.raises(yax.errors.CannotRebuild) as e:
        yax.module_of(node, dtype=BF16)
    assert "come out different when rebuilt" in e.value.why and "`mask`" in e.value.why


def test_gpt2_default_policy_names_the_tied_head_and_runs_without_it():
    thirdparty = pytest.importorskip("thirdparty")
    c = thirdparty.case("gpt2-wrapper")
    mox = yax.make_mox(c.fn)(*c.args, **c.kwargs)
    with pytest.raises(yax.errors.PolicyNotApplied) as e:
        yax.mixed_precision(mox, params=c.args[0])
    assert e.value.problem == "rewrite" and isinstance(e.value.cause, yax.YaxRewriteError)
    assert "`FlaxGPT2LMHeadModule/lm_head`" in yax.errors.message(e.value.cause)
    pol = {**yax.default_policy, '//module_call[@name="lm_head"]': None}
    half, hp = yax.mixed_precision(mox, pol, params=c.args[0])
    assert set(yax.query('//module_call[@type="FlaxConv1D"]/@compute', half)) == {"bfloat16"}
    assert set(yax.query('//module_call[@type="LayerNorm"]/@compute', half)) == {"float32"}
    assert yax.query('//module_call[@name="lm_head"]/@compute', half) == ["float32"]
    # the first call that computes differently is the first projection; its output is
    # the float32 projection of the same input rounded through bfloat16 operands
    cmp = yax.compare(mox, half, *c.args, **c.kwargs)
    assert cmp.first_divergence.endswith("h/0/attn/c_attn")
    assert cmp.outputs["out"].cosine > 0.999


def test_a_float16_training_step_with_jmps_dynamic_loss_scale_skips_overflow(linen):
    """The recipe's loss scaling (notebooks/recipes.ipynb) on both JAX ends: gradients of the
    float16 model through a scaled loss equal the hand-written float16 model's; a scale that
    overflows float16 gives non-finite gradients, the step is skipped and the scale halves."""
    jmp = pytest.importorskip("jmp")
    v, mox = linen
    f16 = yax.mixed_precision(mox, {'//module_call[@type="Dense"]': "compute=float16"})

    def grads(scale, p=v):
        return scale.unscale(jax.grad(lambda p: scale.scale(jnp.sum(yax.eval_mox(f16, p, X) ** 2)))(p))

    want = jax.grad(lambda p: jnp.sum(Net(dtype=jnp.float16).apply(p, X) ** 2))(v)
    got = jax.jit(grads)(jmp.StaticLossScale(jnp.float32(2.0 ** 8)))
    # a power-of-two scale is exact: equal up to float32 rounding (jitted vs eager)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), got, want)
    assert bool(jmp.all_finite(got))

    @jax.jit
    def step(p, scale):
        g = grads(scale, p)
        finite = jmp.all_finite(g)
        new = jax.tree_util.tree_map(lambda a, b: a - 1e-3 * b, p, g)
        return jmp.select_tree(finite, new, p), scale.adjust(finite), finite

    p, scale, finite = step(v, jmp.DynamicLossScale(jnp.float32(2.0 ** 40)))
    assert not bool(finite) and float(scale.loss_scale) == 2.0 ** 39
    jax.tree_util.tree_map(np.testing.assert_array_equal, p, v)  # skipped: nothing changed
    p, scale, finite = step(v, jmp.DynamicLossScale(jnp.float32(2.0 ** 8)))
    assert bool(finite) and not np.allclose(p["params"]["Dense_0"]["kernel"], v["params"]["Dense_0"]["kernel"])
