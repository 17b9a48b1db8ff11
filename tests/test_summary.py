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
