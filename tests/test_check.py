"""`yax.check_mox` (yax/_check.py): every test model passes; hand-corrupted MoXes fail with a
message naming the node and the printed IR around it; `YAX_ENABLE_CHECKS` makes `make_mox` and
the rewrites check what they return (tests/conftest.py sets it for the whole suite)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from frontends.test_equinox import MODELS as EQX_MODELS
from models import CASES
from nnx_models import NNX_CASES

import yax
from yax import Var
from yax.internal import Kind

pytestmark = pytest.mark.core

F32, I32 = jnp.dtype("float32"), jnp.dtype("int32")


def fresh(mox):
    """A new root object with the same tree: `check_mox` remembers the roots that passed."""
    return dataclasses.replace(mox)


def refused(mox, *fragments):
    with pytest.raises(yax.YaxCheckError) as e:
        yax.check_mox(mox)
    text = str(e.value)
    assert text.startswith("The MoX is not well formed: "), text
    assert ">>> " in text, text  # the window around the node
    for f in fragments:
        assert f in text, (f, text)
    return text


# -- what passes -------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CASES))
def test_every_linen_and_plain_test_model_passes(name):
    fn, args, kwargs = CASES[name]()
    yax.check_mox(fresh(yax.make_mox(fn)(*args, **kwargs)))


@pytest.mark.parametrize("name", sorted(NNX_CASES))
def test_every_nnx_test_model_passes(name):
    model, args, kwargs = NNX_CASES[name]()
    yax.check_mox(fresh(yax.make_mox(model)(*args, **kwargs)))


@pytest.mark.parametrize("name", sorted(EQX_MODELS))
def test_every_equinox_test_model_passes(name):
    model, x = EQX_MODELS[name]()
    yax.check_mox(fresh(yax.make_mox(model)(x)))


def test_calls_at_one_path_pass():
    """A module called three times gives three calls at one path, a helper method its
    module's, a second method of a module the same path again: paths are not unique."""
    for name in ("shared", "transformer", "two_methods"):
        fn, args, kwargs = CASES[name]()
        mox = yax.make_mox(fn)(*args, **kwargs)
        paths = [n.path for n in mox.modules()]
        assert len(paths) > len(set(paths))
        yax.check_mox(fresh(mox))


def test_a_call_checks_alone_reading_its_caller_values():
    fn, args, kwargs = CASES["mlp"]()
    mox = yax.make_mox(fn)(*args, **kwargs)
    dense = yax.query('//module_call[@name="Dense_0"]', mox)[0]
    yax.check_mox(dense)  # its kernel and bias are its caller's values


# -- scopes ------------------------------------------------------------------------------

def _sin_mul():
    return yax.make_mox(lambda x: jnp.sin(x) * 2)(jnp.ones(3))


def test_a_value_nothing_binds():
    mox = _sin_mul()
    sin, mul = mox.children
    stray = Var((3,), F32)
    bad = dataclasses.replace(mox, children=(sin, dataclasses.replace(mul, inputs=(stray, mul.inputs[1]))))
    refused(bad, "the equation `mul` at `the root` reads `", "which nothing in the MoX binds")


def test_a_value_read_before_it_is_bound():
    mox = _sin_mul()
    sin, mul = mox.children
    refused(dataclasses.replace(mox, children=(mul, sin)),
            "the equation `mul` at `the root` reads `b` (f32[3]), which is bound only after it, by the equation "
            "`sin`")


def test_a_value_bound_twice():
    mox = _sin_mul()
    sin, mul = mox.children
    twice = dataclasses.replace(mul, outputs=sin.outputs)
    bad = dataclasses.replace(mox, children=(sin, twice), outvars=sin.outputs, outputs=sin.outputs)
    refused(bad, "the equation `mul` at `the root` binds `", "which the equation `sin` at `the root` already bound "
                 "in this scope")


def test_a_parameter_bound_twice():
    mox = _sin_mul()
    (x,) = mox.invars
    sin, mul = mox.children
    bad = dataclasses.replace(mox, children=(dataclasses.replace(sin, outputs=(x,)), mul))
    refused(bad, "binds `a`", "which the root already bound")


def test_a_nested_computation_sees_nothing_around_it():
    mox = yax.make_mox(jax.jit(lambda x: jnp.sin(x) * 2))(jnp.ones(3))
    (jit,) = mox.children
    body = jit.params["jaxpr"]
    sin, mul = body.children
    outer = mox.invars[0]  # the root's parameter, read inside the jit's body
    bad_body = dataclasses.replace(body, children=(dataclasses.replace(sin, inputs=(outer,)), mul))
    bad = dataclasses.replace(mox, children=(dataclasses.replace(jit, params={**jit.params, "jaxpr": bad_body},
                                                                 _jaxprs={}),))
    refused(bad, "the equation `sin`", "which is bound in another scope, by the root")


def test_a_call_result_read_inside_is_bound_after():
    """A call's results are bound in its caller when it is done; values it binds inside stay
    bound after it (a BatchNorm's statistics leave its call as root outputs)."""
    fn, args, kwargs = CASES["cnn_train"]()
    mox = yax.make_mox(fn)(*args, **kwargs)
    inner = {v for n in mox.walk() if isinstance(n, yax.Equation) and n.path.endswith("BatchNorm_0") for v in n.outputs}
    assert inner & set(mox.outvars)  # the updated statistics
    yax.check_mox(fresh(mox))


# -- types -------------------------------------------------------------------------------

def test_an_equation_output_of_the_wrong_shape():
    mox = yax.make_mox(jnp.sin)(jnp.ones(3))
    (sin,) = mox.children
    wrong = Var((4,), F32)
    bad = dataclasses.replace(mox, children=(dataclasses.replace(sin, outputs=(wrong,)),), outvars=(wrong,),
                              outputs=(wrong,))
    refused(bad, "output 0 of the equation `sin` at `the root`, `b`, is f32[4], but `sin` on its inputs (f32[3]) "
                 "gives f32[3].")


def test_an_equation_output_of_the_wrong_dtype():
    mox = yax.make_mox(jnp.sin)(jnp.ones(3))
    (sin,) = mox.children
    wrong = Var((3,), I32)
    bad = dataclasses.replace(mox, children=(dataclasses.replace(sin, outputs=(wrong,)),), outvars=(wrong,),
                              outputs=(wrong,))
    refused(bad, "is i32[3], but `sin` on its inputs (f32[3]) gives f32[3].")


def test_an_equation_jax_rejects():
    mox = yax.make_mox(lambda x, y: x + y)(jnp.ones(3), jnp.ones(3))
    (add,) = mox.children
    y4 = Var((4,), F32)
    bad = dataclasses.replace(mox, invars=(mox.invars[0], y4), inputs=(mox.invars[0], y4),
                              children=(dataclasses.replace(add, inputs=(add.inputs[0], y4)),))
    refused(bad, "JAX's abstract evaluation of the equation `add` at `the root` on its inputs (f32[3], f32[4]) fails: "
                 "TypeError")


def test_a_nested_computation_that_disagrees_with_its_equation():
    """A `jit` whose body now computes something else: the equation's outputs are re-derived
    from the body (and JAX checks the body against the equation)."""
    mox = yax.make_mox(jax.jit(jnp.sin))(jnp.ones(3))
    other = yax.make_mox(jax.jit(jnp.sum))(jnp.ones(3))
    (jit,) = mox.children
    body = other.children[0].params["jaxpr"]
    bad = dataclasses.replace(mox, children=(dataclasses.replace(jit, params={**jit.params, "jaxpr": body},
                                                                 _jaxprs={}),))
    refused(bad, "output 0 of the equation `jit` at `the root`", "is f32[3], but `jit` on its inputs (f32[3]) "
                 "gives f32[].")


def test_a_scan_body_that_takes_another_carry():
    def scanned(n):
        def f(c, xs):
            return jax.lax.scan(lambda c, x: (c + x, c * x), c, xs)
        return yax.make_mox(f)(jnp.ones(n), jnp.ones((5, n)))

    mox, other = scanned(3), scanned(4)
    (scan,) = [n for n in mox.walk() if isinstance(n, yax.Equation) and n.name == "scan"]
    (body,) = [n.params["jaxpr"] for n in other.walk() if isinstance(n, yax.Equation) and n.name == "scan"]
    swapped = dataclasses.replace(scan, params={**scan.params, "jaxpr": body}, _jaxprs={})
    bad = dataclasses.replace(mox, children=tuple(swapped if c is scan else c for c in mox.children))
    refused(bad, "the computation in parameter `jaxpr` of the equation `scan` at `the root` has the parameters "
                 "(f32[4], f32[4]), but `scan` is passed (f32[3], f32[3]).")


def test_any_depth_checks():
    """Calls and nested computations thousands deep (tests/deep.py) check without recursion."""
    from deep import nested_calls, nested_jits

    yax.check_mox(nested_calls(2100))
    yax.check_mox(nested_jits(1200))


def test_a_nested_computation_changed_under_the_jaxpr_kept_for_it():
    """Equations keep the JAX jaxpr of a nested computation with no call in it, to evaluate
    it by; one changed by hand without dropping that jaxpr would not be what runs."""
    mox = yax.make_mox(jax.jit(jnp.sin))(jnp.ones(3))
    other = yax.make_mox(jax.jit(jnp.sum))(jnp.ones(3))
    (jit,) = mox.children
    assert "jaxpr" in jit._jaxprs
    body = other.children[0].params["jaxpr"]
    bad = dataclasses.replace(mox, children=(dataclasses.replace(jit, params={**jit.params, "jaxpr": body}),))
    refused(bad, "the computation in parameter `jaxpr` of the equation `jit` at `the root` has the results (f32[]), "
                 "but the jaxpr it keeps to be evaluated by has (f32[3])")


def test_equations_are_typed_once():
    """What a check derived is kept: a second root sharing the equations re-derives nothing."""
    from yax import _check

    fn, args, kwargs = CASES["mlp"]()
    mox = yax.make_mox(fn)(*args, **kwargs)
    eqns = [n for n in mox.walk() if isinstance(n, yax.Equation)]
    assert all(e in _check._typed for e in eqns)  # checked by `make_mox` under YAX_ENABLE_CHECKS


# -- call boundaries ---------------------------------------------------------------------

def _relu():
    return yax.make_mox(lambda x: jax.nn.relu(x))(jnp.ones(3))


def test_a_call_whose_outputs_differ_from_its_results():
    mox = _relu()
    (call,) = mox.children
    assert call.kind == Kind.ACTIVATION
    wrong = Var((9,), F32)
    bad = dataclasses.replace(mox, children=(dataclasses.replace(call, outputs=(wrong,)),), outvars=(wrong,),
                              outputs=(wrong,))
    refused(bad, "output 0 of the activation `relu` at `relu`, `b`, is f32[9], but the result bound to it, `",
            "is f32[3].")


def test_a_call_whose_inputs_differ_from_its_parameters():
    mox = _relu()
    (call,) = mox.children
    wrong = Var((3,), I32)
    bad = dataclasses.replace(mox, invars=(wrong,), inputs=(wrong,),
                              children=(dataclasses.replace(call, inputs=(wrong,)),))
    refused(bad, "input 0 of the activation `relu` at `relu`, `a`, is i32[3], but the parameter it binds, `c`, is "
                 "f32[3].")


def test_a_call_with_an_output_too_many():
    mox = _relu()
    (call,) = mox.children
    extra = Var((3,), F32)
    bad = dataclasses.replace(mox, children=(dataclasses.replace(call, outputs=(*call.outputs, extra)),))
    refused(bad, "the activation `relu` at `relu` has 2 outputs but 1 result (`outvars`)")


def test_a_call_and_its_signature_disagree():
    mox = _relu()
    (call,) = mox.children
    sig = dataclasses.replace(call.sig, outs=dataclasses.replace(call.sig.outs, dyn=()))
    refused(dataclasses.replace(mox, children=(dataclasses.replace(call, sig=sig),)),
            "the activation `relu` at `relu` has 1 output, but its signature traces 0 leaves of its result")


def test_constants_and_their_values_disagree():
    mox = _relu()
    (call,) = mox.children
    bad = dataclasses.replace(mox, children=(dataclasses.replace(call, constvars=(Var((2,), F32),),
                                                                 consts=(jnp.ones(3),)),))
    refused(bad, "constant 0 of the activation `relu` at `relu`", "is f32[2], but its value is f32[3].")


def test_a_root_or_nested_computation_among_children():
    mox = _sin_mul()
    inner = yax.make_mox(jnp.cos)(jnp.ones(3))
    refused(dataclasses.replace(mox, children=(*mox.children, inner)),
            "the root has a `root` node among its children, where calls")


# -- paths -------------------------------------------------------------------------------

def _mlp():
    fn, args, kwargs = CASES["mlp"]()
    return yax.make_mox(fn)(*args, **kwargs)


def _in_dense(mox, change):
    """``mox`` with ``change`` applied to the `Dense_0` call (the MLP's module's first child)."""
    (top,) = mox.calls
    kids = tuple(change(c) if isinstance(c, yax.Mox) and c.name == "Dense_0" else c for c in top.children)
    return dataclasses.replace(mox, children=(dataclasses.replace(top, children=kids),))


def test_an_equation_at_another_path():
    def moved(dense):
        first, *rest = dense.children
        return dataclasses.replace(dense, children=(dataclasses.replace(first, path="MLP/Dense_1"), *rest))

    refused(_in_dense(_mlp(), moved), "runs at `MLP/Dense_1`, but the node it is in is at `MLP/Dense_0`")


def test_a_call_moved_without_its_equations():
    refused(_in_dense(_mlp(), lambda d: dataclasses.replace(d, path="MLP/Other")),
            "runs at `MLP/Dense_0`, but the node it is in is at `MLP/Other`")


def test_a_call_without_a_path():
    mox = _relu()
    (call,) = mox.children
    refused(dataclasses.replace(mox, children=(dataclasses.replace(call, path=""),)), "has no path")


def test_a_helper_method_away_from_its_module(monkeypatch):
    fn, args, kwargs = CASES["transformer"]()
    mox = yax.make_mox(fn)(*args, **kwargs)
    helper = yax.query("//method_call", mox)[0]
    monkeypatch.setenv("YAX_ENABLE_CHECKS", "0")  # `map_mox` would refuse to build it
    bad = yax.map_mox(lambda n: dataclasses.replace(n, path="Transformer/elsewhere") if n is helper else n, mox)
    refused(bad, "the method_call `SelfAttention_0` at `Transformer/elsewhere` calls a helper method of the module "
                 "its caller runs, but its path is not its caller's (`Transformer/Block_0/SelfAttention_0`)")


# -- the root and its signature ----------------------------------------------------------

def test_a_root_with_a_result_its_signature_does_not_have():
    fn, args, kwargs = CASES["pytree_io"]()
    mox = yax.make_mox(fn)(*args, **kwargs)
    assert len(mox.outvars) > 1
    refused(dataclasses.replace(mox, outvars=mox.outvars[:-1]),
            f"the root has {len(mox.outvars) - 1} result", f"but its signature traces {len(mox.outvars)} leaves of "
                                                           "its result")


def test_a_root_with_a_parameter_its_signature_does_not_have():
    mox = _sin_mul()
    extra = Var((2,), F32)
    refused(dataclasses.replace(mox, invars=(*mox.invars, extra), inputs=(*mox.invars, extra)),
            "the root has 2 parameters, but its signature traces 1 leaf of its arguments")


def test_a_signature_that_loses_a_leaf():
    mox = _sin_mul()
    ins = dataclasses.replace(mox.sig.ins, dyn=())
    refused(dataclasses.replace(mox, sig=dataclasses.replace(mox.sig, ins=ins)),
            "does not account for each leaf of its arguments once")


# -- YAX_ENABLE_CHECKS -------------------------------------------------------------------

def _breaks(n):
    """Swap a root's two equations (for `map_mox`)."""
    if isinstance(n, yax.Mox) and n.kind == Kind.ROOT:
        return dataclasses.replace(n, children=n.children[::-1])
    return n


def test_map_mox_checks_its_result_when_asked(monkeypatch):
    mox = _sin_mul()
    monkeypatch.setenv("YAX_ENABLE_CHECKS", "1")
    with pytest.raises(yax.YaxCheckError, match="bound only after it"):
        yax.map_mox(_breaks, mox)
    monkeypatch.setenv("YAX_ENABLE_CHECKS", "0")
    bad = yax.map_mox(_breaks, mox)  # unchecked: the user's own business
    with pytest.raises(yax.YaxCheckError):
        yax.check_mox(bad)


def test_rewrites_return_through_the_check(monkeypatch):
    """`sub` checks its result: what it returns passed (remembered as passed)."""
    from yax import _check

    monkeypatch.setenv("YAX_ENABLE_CHECKS", "1")
    new = yax.sub('//*[@name="relu"]', jax.nn.gelu, _mlp())
    assert new in _check._passed
    monkeypatch.setenv("YAX_ENABLE_CHECKS", "0")
    assert yax.sub('//*[@name="relu"]', jax.nn.gelu, _mlp()) not in _check._passed


def test_the_error_is_refused_input():
    with pytest.raises(yax.errors.WrongType) as e:
        yax.check_mox(3)
    assert (e.value.argument, e.value.found) == ("mox", "int")
