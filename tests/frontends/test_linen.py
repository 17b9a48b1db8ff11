"""The linen frontend's variables layouts (yax/frontends/linen.py): `sub`
takes the parameters as the MoX reads them and gives them back the same way."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import traced

import yax

pytestmark = pytest.mark.core
KEY = jax.random.key(0)
DENSE0 = '//module_call[@name="Dense_0"]'


def keys(tree):
    return sorted(jax.tree_util.keystr(kp) for kp, _ in jax.tree_util.tree_flatten_with_path(tree)[0])


def same_leaves(a, b):
    return jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, a, b))


def test_the_bare_params_collection_comes_back_bare():
    mox_apply, fn, (variables, x), _ = traced("mlp")
    model = fn.__self__
    bare = variables["params"]
    # a wrapper taking the bare collection, as Hugging Face's `model(ids, params=params)` does
    mox = yax.make_mox(lambda x, params: model.apply({"params": params}, x))(x, bare)
    new, p2 = yax.sub(DENSE0, yax.LoRA(rank=2), mox, params=bare, key=KEY)
    assert "params" not in p2 and set(p2) == set(bare)
    assert keys(p2) == sorted(keys(bare) + ["['Dense_0']['lora_a']", "['Dense_0']['lora_b']"])
    np.testing.assert_allclose(yax.eval_mox(new, x, p2), model.apply(variables, x), rtol=1e-6)
    # the bare collection of an apply-style MoX: the same layout comes back
    new, p3 = yax.sub(DENSE0, yax.LoRA(rank=2), mox_apply, params=bare, key=KEY)
    assert set(p3) == set(bare) and "lora_a" in p3["Dense_0"]
    # a same-type replacement keeps everything, in either layout
    for m, p in ((mox, bare), (mox_apply, variables)):
        node = yax.query(DENSE0, m)[0]
        new, p4 = yax.sub(DENSE0, yax.module_of(node), m, params=p)
        assert keys(p4) == keys(p) and same_leaves(p4, p)


def test_params_in_no_layout_of_the_mox_are_refused_naming_it():
    mox, fn, (variables, x), _ = traced("mlp")
    before = str(mox), jax.tree_util.tree_map(np.copy, variables)
    wrong = {"params": {"Dense_0": {"kernel": jnp.ones((3, 3))}}}
    with pytest.raises(yax.errors.ParamsDoNotFit) as e:
        yax.sub(DENSE0, yax.LoRA(rank=2), mox, params=wrong, key=KEY)
    assert (e.value.expected, e.value.found) == ((4, 16), (3, 3))
    with pytest.raises(yax.errors.ParamsDoNotFit) as e:
        yax.sub(DENSE0, yax.LoRA(rank=2), mox, params={"other": {"w": jnp.ones(3)}}, key=KEY)
    assert e.value.leaf == "['other']['w']"
    with pytest.raises(yax.errors.ParamsDoNotFit) as e:
        yax.sub(DENSE0, yax.LoRA(rank=2), mox, params=[1, 2], key=KEY)
    assert e.value.leaf is None and "`list`" in e.value.problem
    assert str(mox) == before[0] and same_leaves(variables, before[1])


class NoVars(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.relu(x) * 2


def test_a_model_without_variables_gains_some():
    model, x = NoVars(), jnp.ones((2, 4))
    mox = yax.make_mox(model.apply)({}, x)
    new, p = yax.sub('//activation[@name="relu"]', nn.Dense(4), mox, params={}, key=KEY)
    assert keys(p) == ["['params']['relu']['bias']", "['params']['relu']['kernel']"]
    dense = nn.Dense(4).apply({"params": p["params"]["relu"]}, x)
    np.testing.assert_allclose(yax.eval_mox(new, p, x), dense * 2, rtol=1e-6)
    lone = yax.make_mox(lambda x: jax.nn.relu(x))(x)
    with pytest.raises(yax.errors.ParamsDoNotFit):
        yax.sub("//activation", nn.Dense(4), lone, params={}, key=KEY)


def test_static_argnums_trace_python_numbers():
    f = lambda x, t: jax.nn.softmax(x / t)  # noqa: E731
    x = jnp.arange(4.0)
    default = yax.make_mox(f)(x, 2.0)
    assert len(default.invars) == 1  # a Python float is static by default, as before
    traced_t = yax.make_mox(f, static_argnums=())(x, 2.0)
    assert len(traced_t.invars) == 2
    np.testing.assert_allclose(yax.eval_mox(traced_t, x, 0.5), f(x, 0.5), rtol=1e-6)
    named = yax.make_mox(lambda x, *, t, train: x / t if train else x, static_argnames=("train",))(x, t=4.0, train=True)
    np.testing.assert_allclose(yax.eval_mox(named, x, t=2.0, train=True), x / 2)
    with pytest.raises(yax.errors.InputsDiffer) as e:
        yax.eval_mox(named, x, t=2.0, train=False)
    assert (e.value.argument, e.value.kind) == ("kwargs['train']", "static")


def test_prototype_names():
    mox, fn, (variables, x), _ = traced("mlp")
    assert yax.Expr is yax.Mox
    dense = yax.query(DENSE0, mox)[0]
    assert dense.module_ty is nn.Dense
    eqn = next(n for n in mox.walk() if isinstance(n, yax.Equation))
    assert eqn.prim is eqn.primitive
    import io

    four, two = io.StringIO(), io.StringIO()
    yax.dump_xml(mox, four, indent=4)
    yax.dump_xml(mox, two)
    assert "\n    <module_call" in four.getvalue() and "\n  <module_call" in two.getvalue()
    assert yax.load_xml(four.getvalue().encode()).tree.getroot().tag == "mox"


def test_a_module_name_holding_a_slash_is_its_name():
    """Flax allows ``name="a/b"``: the node's name is the whole name (not ``b``), so a query by
    name finds it and `sub` places the new variables under that name."""

    class M(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3, name="a/b")(x)

    x = jnp.ones((2, 4))
    variables = M().init(KEY, x)
    mox = yax.make_mox(M().apply)(variables, x)
    (node,) = yax.query('//module_call[@name="a/b"]', mox)
    assert node.path == "M/a/b" and node.scope == ("a/b",)
    new, params = yax.sub(node, yax.LoRA(rank=2), mox, params=variables, key=KEY)
    assert keys(params["params"]["a/b"]) == ["['bias']", "['kernel']", "['lora_a']", "['lora_b']"]
    np.testing.assert_allclose(yax.eval_mox(new, params, x), M().apply(variables, x), rtol=1e-6)
