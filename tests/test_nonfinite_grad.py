"""yax.first_nonfinite(..., grad_of=loss): the first NaN or Inf of the backward pass
that reaches the gradients, on planted cases (the ``where`` trap around ``log``, a
division whose gradient overflows in float16/bfloat16, a NaN gradient at one step of
an ``nn.scan``), checked against ``jax_debug_nans``/``jax_debug_infs`` running
``jax.grad`` of the same function: both name the same primitive. A NaN or Inf that a
later rule drops (``sqrt`` at 0 under ``relu``, issue 37) leaves every gradient
finite: the result says so (``masked``), where it came from and what dropped it, and
a later one that does reach the gradients is the one named. The oracle for all of
it is tests/oracle/test_nonfinite_oracle.py."""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import CASES, KEY

import yax

pytestmark = pytest.mark.core


def debug_names(f, *args, flag="jax_debug_nans"):
    """The primitive ``jax_debug_nans`` (or ``_infs``) names running ``jax.grad(f)``, or ``None``."""
    with jax.debug_nans(flag == "jax_debug_nans"), jax.debug_infs(flag == "jax_debug_infs"):
        try:
            jax.block_until_ready(jax.grad(f)(*args))
        except FloatingPointError as e:
            return re.search(r"encountered in (\w+)", str(e)).group(1)
    return None


def trap(w, x):
    h = x * w
    y = jnp.where(h > 0, jnp.log(h), 0.0)  # the forward drops log(0); its gradient does not
    scale = jnp.sqrt(jnp.arange(x.shape[0], dtype=x.dtype))  # sqrt at 0, but no gradient reaches it
    return jnp.sum(y * scale + y)


def test_the_where_trap_names_log_and_agrees_with_jax_debug_nans():
    w, x = jnp.asarray(1.5), jnp.array([0.0, 1.0, 2.0])
    mox = yax.make_mox(trap)(w, x)
    assert bool(jnp.isfinite(trap(w, x))) and not bool(jnp.isfinite(jax.grad(trap)(w, x)))
    found = yax.first_nonfinite(mox, w, x, grad_of=lambda out: out)
    assert found.direction == "backward" and found.equation.name == "log" and found.input_index == 0
    assert found.backward == debug_names(trap, w, x) == "div"
    assert found.output.nan == 1 and found.cotangents[0].nonfinite == 0  # finite in, NaN out
    assert found.inputs[0].zeros == 1 and found.step == () and found.call is None
    text = str(found)
    assert text.startswith("The first non-finite gradient comes from the backward pass of `log`")
    assert "its `div`" in text and ">>>" in text and "direction='backward'" in repr(found)
    # the forward search, by contrast, names the -inf that `where` drops
    fwd = yax.first_nonfinite(mox, w, x)
    assert fwd.direction == "forward" and fwd.equation.name == "log" and fwd.output.neginf == 1
    # every gradient finite: nothing to report
    assert yax.first_nonfinite(mox, w, x + 1.0, grad_of=lambda out: out) is None


def all_finite(tree):
    return all(bool(jnp.isfinite(a).all()) for a in jax.tree_util.tree_leaves(tree))


class SqrtNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.relu(nn.Dense(4)(x))
        return nn.Dense(2)(jnp.sqrt(h))  # sqrt at the dead units' 0: an infinite derivative, which relu drops


def test_sqrt_at_zero_under_relu_is_masked_and_agrees_with_jax_debug_infs():
    m, x = SqrtNet(), jnp.linspace(-1, 1, 6).reshape(2, 3)
    params = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(params, x)

    def loss(out):
        return jnp.mean(out ** 2)

    assert all_finite(jax.grad(lambda p: loss(m.apply(p, x)))(params))
    found = yax.first_nonfinite(mox, params, x, grad_of=loss)
    assert (found.equation.name, found.path, found.call.path) == ("sqrt", "SqrtNet", "SqrtNet")
    assert found.masked and found.masked_by.name == "custom_jvp_call" and found.masked_call.path == "SqrtNet/relu"
    assert str(found).startswith("No non-finite gradient: every gradient is finite.")
    assert found.output.posinf + found.output.neginf > 0 and found.inputs[0].zeros > 0
    # JAX's infinity check stops where the rule's `0.5 / sqrt(x)` is computed, a `div`
    assert found.backward == debug_names(lambda p: loss(m.apply(p, x)), params, flag="jax_debug_infs") == "div"
    with jax.debug_nans(True):  # switched off while it runs: still an answer, not an exception
        assert yax.first_nonfinite(mox, params, x, grad_of=loss).equation is found.equation


class MaskedSqrt(nn.Module):
    """Issue 37, point 7: sqrt at 0 sends +Inf, relu's rule drops it; every gradient is finite."""

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(4)(x)
        h = h + jnp.sqrt(jnp.sum(nn.relu(h - 100.0) ** 2, -1, keepdims=True))
        return nn.Dense(2)(h)


def test_a_masked_infinite_cotangent_is_not_a_non_finite_gradient():
    m, x = MaskedSqrt(), jnp.ones((2, 3))
    params = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(params, x)

    def loss(out):
        return jnp.mean(out ** 2)

    assert all_finite(jax.grad(lambda p, x: loss(m.apply(p, x)), argnums=(0, 1))(params, x))
    for argnums in (0, (0, 1)):
        found = yax.first_nonfinite(mox, params, x, grad_of=loss, argnums=argnums)
        assert found.direction == "backward" and found.masked
        assert (found.equation.name, found.path, found.backward) == ("sqrt", "MaskedSqrt", "div")
        assert found.output.posinf == 2 and found.cotangents[0].nonfinite == 0
        assert (found.masked_by.name, found.masked_call.path, found.masked_step) == \
            ("custom_jvp_call", "MaskedSqrt/relu", ())
        first = str(found).split("\n")[0]
        assert first.startswith("No non-finite gradient: every gradient is finite. A non-finite cotangent comes "
                                "from the backward pass of `sqrt` in `MaskedSqrt`")
        assert "It is masked before it reaches the gradients: the backward pass of `custom_jvp_call` in " \
               "`MaskedSqrt/relu` (relu) received it and sent only finite cotangents." in first
        assert "first non-finite gradient" not in str(found) and "masked=True" in repr(found)


def masked_then_trap(w, x):
    h = x * w
    y = jnp.where(h > 0, jnp.log(h), 0.0)  # the where trap: a NaN that reaches `w`
    return jnp.sum(y + jnp.sqrt(jnp.sum(jax.nn.relu(y - 100.0) ** 2)))  # sqrt at 0, masked by relu: first


def test_the_first_non_finite_cotangent_that_reaches_the_gradient_is_reported_not_a_masked_one():
    w, x = jnp.asarray(1.5), jnp.array([0.0, 1.0, 2.0])
    mox = yax.make_mox(masked_then_trap)(w, x)
    assert not bool(jnp.isfinite(jax.grad(masked_then_trap)(w, x)))
    found = yax.first_nonfinite(mox, w, x, grad_of=lambda out: out)
    assert (found.equation.name, found.backward, found.masked, found.masked_by) == ("log", "div", False, None)
    assert str(found).startswith("The first non-finite gradient comes from the backward pass of `log`")
    # with `x` finite at 0 no longer, only the masked one is left
    found = yax.first_nonfinite(mox, w, x + 1.0, grad_of=lambda out: out)
    assert found.masked and found.equation.name == "sqrt" and found.masked_call.path == "relu"


def test_a_masked_non_finite_gradient_of_the_loss_itself():
    w, x = jnp.asarray(1.5), jnp.array([-1.0, 1.0, 2.0])
    mox = yax.make_mox(lambda w, x: {"y": jax.nn.relu(x * w)})(w, x)

    def loss(out):
        return jnp.sum(jnp.sqrt(out["y"]))  # +Inf at relu's 0, which relu's rule drops

    assert bool(jnp.isfinite(jax.grad(lambda w: loss({"y": jax.nn.relu(x * w)}))(w)))
    found = yax.first_nonfinite(mox, w, x, grad_of=loss)
    assert found.equation is None and found.path == "out['y']" and found.output.posinf == 1
    assert found.masked and found.masked_call.path == "relu"
    assert str(found).startswith("No non-finite gradient: every gradient is finite. A non-finite cotangent comes "
                                 "from the loss itself, its gradient with respect to the model's output `out['y']`.")


def test_a_gradient_that_overflows_as_its_finite_cotangents_are_added_up():
    def f(w, a):
        return (jnp.sum(w * a) + jnp.sum(w * a)).astype(jnp.float32)  # each sends 40000 to `w`: 80000 > f16's max

    w, a = jnp.asarray(1e-3, jnp.float16), jnp.array([40000.0], jnp.float16)
    assert bool(jnp.isfinite(f(w, a))) and not bool(jnp.isfinite(jax.grad(f)(w, a)))
    found = yax.first_nonfinite(yax.make_mox(f)(w, a), w, a, grad_of=lambda out: out)
    assert found.equation is None and found.path == "args[0]" and found.output.posinf == 1 and not found.masked
    assert str(found) == ("The gradient with respect to `args[0]` is f16[]  no finite values (1 +Inf), though every "
                          "cotangent sent to it is finite: adding them up overflowed.")


@pytest.mark.parametrize("dtype, tiny", [(jnp.float16, 1e-3), (jnp.bfloat16, 1e-20)])
def test_a_division_whose_gradient_overflows_in_low_precision(dtype, tiny):
    def f(w, x):
        return jnp.sum(1.0 / (x * w)).astype(jnp.float32)

    w, x = jnp.asarray(1.0, dtype), jnp.array([tiny, 1.0], dtype)
    mox = yax.make_mox(f)(w, x)
    assert bool(jnp.isfinite(f(w, x)))
    assert not bool(jnp.isfinite(jax.grad(f)(w, x)))
    found = yax.first_nonfinite(mox, w, x, grad_of=lambda out: out)
    assert found.equation.name == "div" and found.input_index == 1  # the denominator's cotangent
    assert found.output.neginf == 1 and found.output.type == ("f16[2]" if dtype == jnp.float16 else "bf16[2]")
    assert debug_names(f, w, x) is None  # -inf, no NaN: jax_debug_nans sees nothing
    assert found.backward == debug_names(f, w, x, flag="jax_debug_infs")
    if dtype == jnp.float16:  # in float32 the same gradient is finite (bfloat16 has float32's range)
        w32, x32 = w.astype(jnp.float32), x.astype(jnp.float32)
        assert yax.first_nonfinite(yax.make_mox(f)(w32, x32), w32, x32, grad_of=lambda out: out) is None


class Step(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        scale = self.param("scale", nn.initializers.ones, ())
        h = jnp.tanh(nn.Dense(x.shape[-1])(x)) ** 2 * scale  # 0 where scale is 0
        return x + jnp.where(h > 0, jnp.log(h), 0.0), None


class ScanTrap(nn.Module):
    @nn.compact
    def __call__(self, x):
        x, _ = nn.scan(Step, variable_axes={"params": 0}, split_rngs={"params": True}, length=4)(name="layers")(x, None)
        return nn.Dense(2)(x)


def test_the_trap_inside_an_nn_scan_names_the_step():
    m, x = ScanTrap(), jnp.linspace(-1, 1, 6).reshape(2, 3)
    params = m.init(KEY, x)
    params["params"]["layers"]["scale"] = jnp.array([1.0, 0.0, 0.0, 1.0])  # steps 1 and 2
    mox = yax.make_mox(m.apply)(params, x)

    def loss(out):
        return jnp.mean(out ** 2)

    assert bool(jnp.isfinite(loss(m.apply(params, x))))
    found = yax.first_nonfinite(mox, params, x, grad_of=loss)
    # the backward pass runs the steps from the last: step 2 is the first to go wrong
    assert (found.equation.name, found.path, found.step) == ("log", "ScanTrap/layers", (2,))
    assert found.backward == "div" and found.output.nan == 6 and found.inputs[0].zeros == 6
    assert "at scan step 2" in str(found)
    names = debug_names(lambda p: loss(m.apply(p, x)), params)
    assert names in ("scan", "while", found.backward)  # jax_debug_nans stops at the loop as a whole
    found_x = yax.first_nonfinite(mox, params, x, grad_of=loss, argnums=(0, 1))
    assert found_x.step == (2,)


class MaskedStep(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        scale = self.param("scale", nn.initializers.ones, ())
        h = jnp.tanh(nn.Dense(x.shape[-1])(x)) ** 2 * scale
        x = x + jnp.where(h > 0, jnp.log(h), 0.0)  # the trap where scale is 0
        return x + jnp.sqrt(nn.relu(x - 100.0)), None  # sqrt at 0 under relu at every step: masked


class ScanMasked(nn.Module):
    @nn.compact
    def __call__(self, x):
        x, _ = nn.scan(MaskedStep, variable_axes={"params": 0}, split_rngs={"params": True},
                       length=4)(name="layers")(x, None)
        return nn.Dense(2)(x)


def test_inside_an_nn_scan_a_masked_cotangent_and_the_step_whose_nan_reaches_the_gradient():
    m, x = ScanMasked(), jnp.linspace(-1, 1, 6).reshape(2, 3)
    params = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(params, x)

    def loss(out):
        return jnp.mean(out ** 2)

    found = yax.first_nonfinite(mox, params, x, grad_of=loss)
    assert found.masked and (found.equation.name, found.step) == ("sqrt", (3,))  # the last step runs first
    assert (found.masked_call.path, found.masked_step) == ("ScanMasked/layers/relu", (3,))
    assert "`ScanMasked/layers/relu` (relu) at scan step 3 received it" in str(found)
    # the trap at step 0 runs last in the backward pass, after every step's masked sqrt: it is the one reported
    params["params"]["layers"]["scale"] = jnp.array([0.0, 1.0, 1.0, 1.0])
    assert not all_finite(jax.grad(lambda p: loss(m.apply(p, x)))(params))
    found = yax.first_nonfinite(mox, params, x, grad_of=loss)
    assert (found.equation.name, found.path, found.step, found.masked) == ("log", "ScanMasked/layers", (0,), False)


def test_a_healthy_scanned_transformer_has_none_and_compiles_once():
    fn, (params, ids), kwargs = CASES["transformer_scan"]()
    mox = yax.make_mox(fn)(params, ids, **kwargs)

    def loss(out):
        return jnp.mean(out ** 2)

    for s in (1.0, 2.0):
        p = jax.tree_util.tree_map(lambda a, s=s: a * s, params)
        assert yax.first_nonfinite(mox, p, ids, grad_of=loss, **kwargs) is None
    from yax._calls import kept

    assert [s.traces for s in kept(mox, "backward.searches").values()] == [1]


def test_a_non_finite_gradient_of_the_loss_itself_and_refusals():
    w, x = jnp.asarray(1.5), jnp.array([0.0, 1.0, 2.0])
    mox = yax.make_mox(lambda w, x: {"y": x * w})(w, x)
    found = yax.first_nonfinite(mox, w, x, grad_of=lambda out: jnp.sum(jnp.sqrt(out["y"])))
    assert found.equation is None and found.path == "out['y']" and found.output.posinf == 1
    assert "the gradient of `grad_of` with respect to the model's output `out['y']`" in str(found)
    with pytest.raises(yax.errors.LossNotScalar) as e:
        yax.first_nonfinite(mox, w, x, grad_of=lambda out: out["y"])
    assert (e.value.tool, e.value.found) == ("first_nonfinite", "f32[3]")
    with pytest.raises(yax.errors.BadArgnums) as e:
        yax.first_nonfinite(yax.make_mox(lambda w, x: x * w)(1.5, x), 1.5, x, grad_of=jnp.sum)
    assert (e.value.problem, e.value.found) == ("not floating", [0])
    with pytest.raises(yax.errors.BadArgnums) as e:
        yax.first_nonfinite(mox, w, x, grad_of=lambda out: jnp.sum(out["y"]), argnums=2)
    assert (e.value.problem, e.value.found, e.value.count) == ("range", 2, 2)
    np.testing.assert_equal(yax.first_nonfinite(mox, w, x, grad_of=lambda out: jnp.sum(out["y"]), argnums=1), None)


def test_a_search_that_runs_out_of_device_memory_says_what_to_try(monkeypatch):
    """XLA's RESOURCE_EXHAUSTED (the flagging program of a large model) is a `YaxEvalError` saying what
    to try, forward and backward, with XLA's error chained; any other failure is left as it is."""
    from yax._capture import nonfinite

    def exhausted(*a, **k):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4.00GiB.")

    m = nn.Dense(3)
    x = jnp.ones((2, 4))
    params = m.init(KEY, x)
    mox = yax.make_mox(m.apply)(params, x)
    monkeypatch.setattr(nonfinite, "_forward", exhausted)
    monkeypatch.setattr(nonfinite, "first_backward", exhausted)
    for grad_of in (None, lambda out: out.sum()):
        with pytest.raises(yax.errors.OutOfMemory) as e:
            yax.first_nonfinite(mox, params, x, grad_of=grad_of)
        assert e.value.tool == "first_nonfinite" and e.value.backward == (grad_of is not None)
        assert "fewer rows" in str(e.value) and "4.00GiB" in str(e.value)
        assert isinstance(e.value.__cause__, jax.errors.JaxRuntimeError)

    def broken(*a, **k):
        raise ValueError("something else")

    monkeypatch.setattr(nonfinite, "_forward", broken)
    with pytest.raises(ValueError, match="something else"):
        yax.first_nonfinite(mox, params, x)
