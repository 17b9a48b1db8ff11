"""The explorer takes ``static_argnums``/``static_argnames`` as `yax.make_mox` does: a vision
tower that reads a grid size with ``int(grid[0, 1])`` opens, compares and copies as code (the
script runs as written); without them the trace error says what to pass."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import yax
from yax_widget import Explorer, Session

X = jnp.linspace(-1.0, 1.0, 24).reshape(6, 4)
GRID = np.array([[1, 3]])


class Tower(nnx.Module):
    def __init__(self, rngs):
        self.proj = nnx.Linear(4, 4, rngs=rngs)

    def __call__(self, pixels, grid, *, scale=1.0):
        n = int(grid[0, 1])  # a Python value: the grid must be static
        return nnx.gelu(self.proj(pixels[:n])) * scale


@pytest.fixture
def model():
    return Tower(nnx.Rngs(0))


@pytest.mark.parametrize("static", [{"static_argnums": (1,)}, {"static_argnames": ("grid",)}],
                         ids=["argnums", "argnames"])
def test_a_session_opens_compares_and_copies_as_code_with_static_arguments(model, static):
    args = (X, GRID) if "static_argnums" in static else (X,)
    kwargs = {} if "static_argnums" in static else {"grid": GRID}
    s = Session(model, *args, **static, **kwargs)
    try:
        assert [n.path for n in s.query("//module_call")] == ["Tower", "Tower/proj"]
        s.substitute("//activation", "tanh")
        want = jnp.tanh(model.proj(X[:3]))
        got = yax.eval_mox(s.mox, nnx.state(model), *args, **kwargs)[0]
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert s.comparison is not None and s.comparison.label(s.comparison.first_divergence) == "Tower/gelu (now tanh)"
        code = s.code()
        assert f"yax.make_mox(net, {', '.join(f'{k}={v!r}' for k, v in static.items())})" in code, code
        # the script runs as written, with the names it asks for
        names = {"net": model, "batch": X, "input2": GRID, "grid": GRID}
        exec(compile(code, "<copy as code>", "exec"), names)  # noqa: S102
        np.testing.assert_allclose(yax.eval_mox(names["mox"], names["params"], *args, **kwargs)[0], want, rtol=1e-6)
    finally:
        s.close()


def test_the_explorer_passes_them_on_and_refuses_them_with_a_mox(model):
    ex = Explorer(model, X, GRID, static_argnums=(1,), warm=False)
    try:
        assert len(ex.query("//module_call")) == 2
    finally:
        ex.close()
    mox = yax.make_mox(model, static_argnums=(1,))(X, GRID)
    with pytest.raises(yax.YaxInputError, match="traced already"):
        Session(mox, nnx.state(model), X, GRID, static_argnums=(1,))


def test_without_them_the_error_says_what_to_pass(model):
    with pytest.raises(yax.errors.CouldNotTrace) as info:
        Session(model, X, GRID)
    assert isinstance(info.value.__cause__, jax.errors.ConcretizationTypeError) and info.value.static


def test_the_magic_takes_them_and_copy_as_code_uses_the_names_typed(model, shell):
    shell.run_line_magic("load_ext", "yax_widget")
    shell.user_ns.update(tower=model, pix=X, grid=GRID)
    ex = shell.run_line_magic("yax", "tower pix grid static_argnums=(1,)")
    try:
        ex.substitute("//activation", "tanh")
        code = ex.session.code()
        assert "mox = yax.make_mox(tower, static_argnums=(1,))(pix, grid)" in code, code
        names = {"tower": model, "pix": X, "grid": GRID}
        exec(compile(code, "<copy as code>", "exec"), names)  # noqa: S102
        np.testing.assert_allclose(yax.eval_mox(names["mox"], names["params"], X, GRID)[0],
                                   jnp.tanh(model.proj(X[:3])), rtol=1e-6)
    finally:
        ex.close()
