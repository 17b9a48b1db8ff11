"""Helpers shared by several test files: the traced test models, golden files.

Regenerate goldens on purpose with ``YAX_REGEN_GOLDEN=1 pytest tests/test_print.py
tests/test_summary.py tests/test_xml.py tests/test_dot.py`` and review the diff.
"""

import os
import pathlib

from models import CASES

import yax

# The same goldens hold for the oldest and the newest supported JAX: the
# printer leaves out private and placement parameters that differ between them.
GOLDEN = pathlib.Path(__file__).parent / "golden"

# The MLP halves of the Transformer's blocks, where LoRA adapters go.
DENSE_MLP = '//module_call[@type="Dense"][re:test(@path, "Block_\\d+/Dense_")]'


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("YAX_REGEN_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    assert text + "\n" == path.read_text(), f"{name} changed; regenerate with YAX_REGEN_GOLDEN=1 if intended"


def traced(name):
    """The MoX of a test model of `models.CASES`, with the function and the arguments it was traced on."""
    fn, args, kwargs = CASES[name]()
    return yax.make_mox(fn)(*args, **kwargs), fn, args, kwargs


def mox_of(name):
    return traced(name)[0]
