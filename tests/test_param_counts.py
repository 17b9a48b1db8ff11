"""Parameter counts tell the truth about scanned stacks and helper methods: a call inside
a scan that slices its variables per step holds ×N sets of them (summary, explorer rows,
graph boxes); one whose variables the scan broadcasts holds one; a helper method owns none."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from models import KEY, ScannedTransformer

import yax
from yax.internal import param_copies

pytestmark = pytest.mark.core


class Cell(nn.Module):
    @nn.compact
    def __call__(self, c, x):
        return nn.Dense(4)(c) + x, None


def _stack(**lift):
    class Stack(nn.Module):
        @nn.compact
        def __call__(self, x):
            c, _ = nn.scan(Cell, length=3, in_axes=0, **lift)()(x[0], x)
            return c

    x = jnp.ones((3, 2, 4))
    m = Stack()
    p = m.init(KEY, x)
    return yax.make_mox(m.apply)(p, x), p


def test_scanned_layers_count_every_layer():
    m = ScannedTransformer(num_layers=4)
    ids = jnp.arange(16).reshape(2, 8) % 100
    p = m.init(KEY, ids)
    mox = yax.make_mox(m.apply)(p, ids)
    layers = yax.query('//module_call[@path="ScannedTransformer/layers"]', mox)[0]
    assert param_copies(mox, layers) == 4
    # the four sets are what the variables hold
    held = sum(a.size for a in jax.tree_util.tree_leaves(p["params"]["layers"]))
    assert layers.num_params * 4 == held
    line = next(r for r in mox.summary().splitlines() if r.strip().startswith("layers"))
    assert "8_544 ×4" in line
    from yax_widget._payloads import tree

    row = next(r for r in tree(mox, 0)["rows"] if r[3] == "layers")
    assert (row[8], row[11]) == (8544, 4)
    assert "8,544 params ×4" in yax.to_dot(mox, depth=1)


def test_broadcast_variables_are_one_set_and_sliced_ones_are_n():
    sliced, p = _stack(variable_axes={"params": 0}, split_rngs={"params": True})
    dense = yax.query('//module_call[@type="Dense"]', sliced)[0]
    assert param_copies(sliced, dense) == 3 and p["params"]["ScanCell_0"]["Dense_0"]["kernel"].shape == (3, 4, 4)
    shared, p = _stack(variable_broadcast="params", split_rngs={"params": False})
    dense = yax.query('//module_call[@type="Dense"]', shared)[0]
    assert param_copies(shared, dense) == 1 and p["params"]["ScanCell_0"]["Dense_0"]["kernel"].shape == (4, 4)
    assert "20 ×3" in sliced.summary() and "20 ×3" not in shared.summary()


def test_helper_method_boxes_have_no_parameters_of_their_own(tf):
    dot = yax.to_dot(tf, root='//module_call[@path="Transformer/Block_0/SelfAttention_0"]')
    helpers = [line for line in dot.splitlines() if "_split_heads" in line]
    assert helpers and not any("params" in line for line in helpers)
