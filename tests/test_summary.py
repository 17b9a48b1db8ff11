"""mox.summary(): golden tables, and the parameter and FLOP counts they show.

Regenerate on purpose with ``YAX_REGEN_GOLDEN=1 pytest tests/test_summary.py``
and review the diff.
"""

import pytest
from helpers import check_golden, mox_of

pytestmark = pytest.mark.core


@pytest.mark.parametrize("name", ["cnn_eval", "transformer"])
def test_summary_golden(name):
    check_golden(f"{name}.summary.txt", mox_of(name).summary())


def test_summary_counts_flops_and_params():
    mox = mox_of("mlp")
    # MLP(16, 8) on f32[2,4]: Dense 4->16 and 16->8
    rows = {line.split()[0]: line.split() for line in mox.summary().splitlines()[1:]}
    assert rows["total"][1:] == [str(4 * 16 + 16 + 16 * 8 + 8), str(2 * 2 * 4 * 16 + 2 * 2 * 16 * 8)]


def test_flops_that_cannot_be_known_before_running_say_so():
    """A `while` loop's body runs a number of times known only when it runs; one branch of a `cond`
    runs: their FLOPs are no number (before, a loop's body was counted once and a cond's larger
    branch shown, as if known). A scan's body counts `length` times; a cond whose branches cost the
    same counts once."""
    import jax
    import jax.numpy as jnp

    import yax

    w = jnp.ones((4, 4))

    def loop(x):
        return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] @ w), (0, x))[1]

    def branches(x, p):
        return jax.lax.cond(p, lambda h: h @ w, lambda h: h, x)

    def same(x, p):
        return jax.lax.cond(p, lambda h: h @ w, lambda h: (h @ w) * 2, x)

    def scanned(x):
        return jax.lax.scan(lambda h, _: (h @ w, None), x, None, length=5)[0]

    x = jnp.ones((2, 4))
    for fn, args, why in ((loop, (x,), "`while` loop"), (branches, (x, True), "branch of a `cond`")):
        text = yax.make_mox(fn)(*args).summary()
        assert text.splitlines()[-2].split()[-1] == "unknown*", text
        assert why in text.splitlines()[-1], text
    assert yax.make_mox(same)(x, True).summary().splitlines()[-1].split()[-1] == str(2 * 2 * 4 * 4)
    assert yax.make_mox(scanned)(x).summary().splitlines()[-1].split()[-1] == str(5 * 2 * 2 * 4 * 4)
