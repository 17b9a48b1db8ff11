"""Copy as code: the code the explorer writes reproduces the current model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import yax
from yax_widget import Explorer

from .helpers import IDS, ask, explorer


def test_copy_as_code_reproduces_the_current_model(model):
    m, v = model
    ex = explorer(model)
    ex.add_replacement("LoRA", yax.LoRA(rank=2, alpha=2.0))
    ex.substitute(yax.query('//module_call[@name="Dense_1"]', ex.mox)[1], "LoRA")
    ex.substitute("//activation[@name='gelu']", "SiLU")
    code = ask(ex, rid=1, type="code")["code"]
    assert "yax.LoRA(rank=2, alpha=2.0)" in code and "jax.nn.silu" in code
    ns = {"model": m, "variables": v, "batch": IDS}  # the names the script makes `mox` and `params` from
    exec(code, ns)
    np.testing.assert_array_equal(yax.eval_mox(ns["mox"], ns["params"], IDS), yax.eval_mox(ex.mox, ex.params, IDS))
    assert str(ns["mox"]) == str(ex.mox)
    # functions create no variables: no key in their code
    fn_only = explorer(model)
    fn_only.substitute("//activation[@name='gelu']", "SiLU")
    assert "KEY" not in fn_only.code() and "jax.nn.silu, mox, params=params)" in fn_only.code()


def test_plain_function_explorer():
    def f(x):
        return jax.nn.relu(x @ jnp.ones((3, 3))).sum(-1)

    x = jnp.arange(6.0).reshape(2, 3) - 2
    ex = Explorer(f, x)
    assert [r[3] for r in ex._tree["rows"]] == ["relu"]
    ex.substitute("//activation", "identity")
    assert ex.params is None and ex.code().endswith("mox = yax.sub('//activation', jax.nn.identity, mox)")
    np.testing.assert_allclose(yax.eval_mox(ex.mox, x), (x @ jnp.ones((3, 3))).sum(-1))
    ex.add_replacement("Double it!", lambda x: 2 * x)
    ex.substitute(ex.mox.modules().__next__(), "Double it!")
    assert "# `double_it`: the replacement registered as 'Double it!'; define it first\nmox = yax.sub(" in ex.code()
    assert ex.code().endswith(", double_it, mox)")
    assert "mox = yax.make_mox(fn)(x)" in ex.code()
    ns = {"fn": f, "x": x, "double_it": lambda x: 2 * x}
    exec(ex.code(), ns)
    np.testing.assert_array_equal(yax.eval_mox(ns["mox"], x), yax.eval_mox(ex.mox, x))
    assert not ex.comparison.allclose
