"""Golden tests for the printer: str(mox), repr and IPython's pretty printing.

Regenerate on purpose with ``YAX_REGEN_GOLDEN=1 pytest tests/test_print.py``
and review the diff.
"""

import pytest
from helpers import check_golden, mox_of

pytestmark = pytest.mark.core


@pytest.mark.parametrize("name", ["mlp", "sequential", "transformer_scan", "control_flow"])
def test_print_golden(name):
    check_golden(f"{name}.txt", str(mox_of(name)))


def test_print_is_deterministic():
    assert str(mox_of("transformer")) == str(mox_of("transformer"))
    assert " at 0x" not in str(mox_of("transformer"))


def test_repr_is_short_and_pretty_delegates():
    mox = mox_of("mlp")
    assert repr(mox) == "Mox(root, 'root', children=1)"

    class P:
        def __init__(self):
            self.out = []

        def text(self, t):
            self.out.append(t)

    p = P()
    mox._repr_pretty_(p, False)
    assert p.out == [str(mox)]
