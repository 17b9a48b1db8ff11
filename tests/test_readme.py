"""The README's tour runs as written."""

import pathlib
import re

import numpy as np
import pytest

pytestmark = pytest.mark.core

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_tour_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README has no tour"
    scope = {}
    for block in blocks:  # later blocks go on from the earlier ones
        exec(compile(block, "README.md", "exec"), scope)
    assert scope["svg"].lstrip().startswith("<?xml") and "Dense_0 : Dense" in scope["svg"]
    assert scope["lora_params"]["params"]["Dense_0"]["lora_a"].shape == (8, 2)
    out = capsys.readouterr().out
    assert "module_call[path=MLP/Dense_0 type=Dense features=16 params=144]" in out
    assert "['MLP/Dense_0', 'MLP/Dense_1'] [144, 34]" in out
    assert "\n1.0\n" in out
    assert "<- stops matching here" in out
    assert "first_divergence='MLP/gelu'" in out
    assert "{'MLP/Dense_0': (4, 16), 'MLP/gelu': (4, 16), 'MLP/Dense_1': (4, 2)}\nNone\n" in out
    np.testing.assert_allclose(scope["y0"], np.broadcast_to(scope["params"]["params"]["Dense_1"]["bias"], (4, 2)))
    assert [r[3] for r in scope["ex"]._tree["rows"]] == ["MLP", "Dense_0", "gelu", "Dropout_0", "Dense_1"]
    assert "['Net/fc1', 'Net/fc2']" in out
    assert type(scope["lora_net"].fc2).__name__ == "LoRALinear" and type(scope["net"].fc2).__name__ == "Linear"
    assert scope["lora_state"]["fc1"]["lora"]["lora_a"].shape == (8, 2)
