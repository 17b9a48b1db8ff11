"""Copy as code: the code the explorer writes reproduces the current model."""

from __future__ import annotations

import keyword

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_the_opening_lines_name_every_input_they_read():
    """Keyword inputs: a plain Python value written as itself, an array by a name the comment lists
    (its keyword, unless the script has that name already); `%yax`'s expressions as typed."""
    from yax_widget._targets import opening_lines

    ids = jnp.ones((1, 4), jnp.int32)
    assert opening_lines("huggingface", None, 1, {"input_ids": ids, "output_hidden_states": False}, True) == [
        "# `model`, `input_ids`: what was given to Explorer(...); use your names",
        "mox = yax.make_mox(lambda params, *inputs, **kwargs: model(*inputs, params=params, **kwargs))"
        "(model.params, input_ids=input_ids, output_hidden_states=False)",
        "params = model.params"]
    assert opening_lines("jax", None, 1, {"x": ids, "params": ids, "shape": (2, 3)}, False) == [
        "# `fn`, `x`, `x_`, `params_`: what was given to Explorer(...); use your names",
        "mox = yax.make_mox(fn)(x, x=x_, params=params_, shape=(2, 3))"]
    assert opening_lines("nnx", ["net", "xs[:2]", "mask=jnp.ones(2)"], 2, {"mask": ids}, True) == [
        "# `net`, `xs`, `jnp`: the notebook's names given to %yax", "from flax import nnx",
        "mox = yax.make_mox(net)(xs[:2], mask=jnp.ones(2))", "params = nnx.state(net)"]
    assert opening_lines("mox", None, 2, {"train": False}, True) == [  # a MoX needs only its parameters
        "# `mox0`, `variables`: what was given to Explorer(...); use your names", "mox = mox0", "params = variables"]
    assert opening_lines("mox", ["m", "{'params': p}", "x"], 2, {}, True) == [
        "# `m`, `p`: the notebook's names given to %yax", "mox = m", "params = {'params': p}"]


def _evil_function():
    def f(x):
        return x

    f.__module__ = "evil"  # a public-looking home, so its `module.qualname` would be written
    f.__qualname__ = "f, mox)\nimport os\nmox = (mox"
    return f


class _Evil(nn.Module):
    @nn.compact
    def __call__(self, x):
        return x


def test_copy_as_code_writes_only_dotted_names_for_a_replacement():
    """A replacement's name is written only when it is a dotted Python name: a `__qualname__`
    holding a newline would put a statement of its own into the script (`import os`). Otherwise the
    script names a placeholder and says what to put there."""
    from yax_widget._code import replacement_code

    assert replacement_code(_evil_function()) is None
    # a class by its importable name, else its bare `__name__` when that is a Python name, else not at all
    evil_home = type("Evil", (_Evil,), {"__module__": "evil_models", "__qualname__": "E()\nimport os\nE"})
    assert replacement_code(evil_home()) == "Evil()"
    assert replacement_code(type("E()\nimport os\nE", (_Evil,), {"__module__": "evil_models"})()) is None
    assert replacement_code(jax.nn.gelu) == "jax.nn.gelu" and replacement_code(yax.LoRA(rank=2)) == "yax.LoRA(rank=2)"

    def f(x):
        return jax.nn.relu(x @ jnp.ones((3, 3))).sum(-1)

    x = jnp.arange(6.0).reshape(2, 3) - 2
    ex = Explorer(f, x)
    ex.add_replacement("evil", _evil_function())
    ex.substitute("//activation", "evil")
    code = ex.code()
    assert "import os" not in code and "\nimport jax\nimport yax\n" in "\n" + code
    assert "# `evil`: the replacement registered as 'evil'; define it first\nmox = yax.sub(" in code
    ns = {"fn": f, "f": f, "x": x, "evil": lambda x: x}
    exec(compile(code, "<copy as code>", "exec"), ns)
    assert str(ns["mox"]) == str(ex.mox)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30), st.text(max_size=12))
def test_a_replacement_is_written_as_a_dotted_name_or_not_at_all(qualname, module):
    from yax_widget._code import replacement_code

    def g(x):
        return x

    g.__qualname__, g.__module__ = qualname, module
    code = replacement_code(g)
    assert code is None or all(p.isidentifier() and not keyword.iskeyword(p) for p in code.split("."))
