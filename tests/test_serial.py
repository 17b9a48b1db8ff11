"""yax.to_dict / to_json and dump_yson: the MoX as plain data."""

import io
import json
import subprocess
import sys

import pytest
from helpers import mox_of

import yax

pytestmark = pytest.mark.core


def test_to_dict_and_json():
    mox = mox_of("mlp")
    d = mox.to_dict()
    assert d["kind"] == "root"
    mlp = d["children"][0]
    assert (mlp["kind"], mlp["type"], mlp["params"]) == ("module_call", "MLP", 216)
    dense = mlp["children"][0]
    assert dense["attrs"] == {"features": "16"} and dense["outputs"][0]["shape"] == [2, 16]
    assert json.loads(mox.to_json()) == json.loads(json.dumps(d))


def test_yson_round_trip_and_formats(tf):
    import yt.yson as yson  # the yson extra; both test environments install it

    for fmt in ["binary", "text", "pretty"]:
        buf = io.BytesIO()
        yax.dump_yson(tf, buf, format=fmt)
        back = yson.loads(buf.getvalue())
        assert back["children"][0]["path"] == "Transformer"
        assert [c["type"] for c in back["children"][0]["children"] if c["kind"] == "module_call"] == [
            "Embed", "Block", "Block", "LayerNorm", "Embed"]
    with pytest.raises(ValueError, match="format"):
        yax.dump_yson(tf, io.BytesIO(), format="xml")


def test_yson_without_extra_names_the_extra():
    code = (
        "import sys, io; sys.modules['yt'] = None\n"  # what Python does when a package is absent
        "import jax.numpy as jnp, yax\n"
        "try:\n"
        "    yax.dump_yson(yax.make_mox(jnp.sin)(jnp.ones(2)), io.BytesIO())\n"
        "except yax.YaxDependencyError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "pip install 'yax[yson]'" in out.stdout, out.stderr
