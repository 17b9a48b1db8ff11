"""Golden tests for the printer, the summary and to_dict/to_json.

Regenerate on purpose with ``YAX_REGEN_GOLDEN=1 pytest tests/test_print.py``
and review the diff.
"""

import json
import os
import pathlib

import pytest
from models import CASES

import yax

pytestmark = pytest.mark.core

# The same goldens hold for the oldest and the newest supported JAX: the
# printer leaves out private and placement parameters that differ between them.
GOLDEN = pathlib.Path(__file__).parent / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("YAX_REGEN_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    assert text + "\n" == path.read_text(), f"{name} changed; regenerate with YAX_REGEN_GOLDEN=1 if intended"


def mox_of(name):
    fn, args, kwargs = CASES[name]()
    return yax.make_mox(fn)(*args, **kwargs)


@pytest.mark.parametrize("name", ["mlp", "sequential", "transformer_scan", "control_flow"])
def test_print_golden(name):
    check_golden(f"{name}.txt", str(mox_of(name)))


@pytest.mark.parametrize("name", ["cnn_eval", "transformer"])
def test_summary_golden(name):
    check_golden(f"{name}.summary.txt", mox_of(name).summary())


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


def test_summary_counts_flops_and_params():
    mox = mox_of("mlp")
    # MLP(16, 8) on f32[2,4]: Dense 4->16 and 16->8
    rows = {line.split()[0]: line.split() for line in mox.summary().splitlines()[1:]}
    assert rows["total"][1:] == [str(4 * 16 + 16 + 16 * 8 + 8), str(2 * 2 * 4 * 16 + 2 * 2 * 16 * 8)]


def test_to_dict_and_json():
    mox = mox_of("mlp")
    d = mox.to_dict()
    assert d["kind"] == "root"
    mlp = d["children"][0]
    assert (mlp["kind"], mlp["type"], mlp["params"]) == ("module_call", "MLP", 216)
    dense = mlp["children"][0]
    assert dense["attrs"] == {"features": "16"} and dense["outputs"][0]["shape"] == [2, 16]
    assert json.loads(mox.to_json()) == json.loads(json.dumps(d))
