"""yax.diff: what was added and removed, by path, between MoXes and XML documents."""

import io

import pytest
from models import CASES

import yax

pytestmark = pytest.mark.core


def test_diff_by_path_for_mox_and_documents(tf):
    assert not yax.diff(tf, tf) and repr(yax.diff(tf, tf)) == "no differences"
    fn, args, kwargs = CASES["transformer_remat"]()
    remat = yax.make_mox(fn)(*args, **kwargs)
    d = yax.diff(tf, remat)
    assert ("Transformer/Block_0", "module_call", "__call__", 0) in d.removed
    assert ("Transformer/CheckpointBlock_0/Dense_0", "module_call", "__call__", 0) in d.added
    buf = io.BytesIO()
    yax.dump_xml(remat, buf)
    assert yax.diff(tf, yax.load_xml(io.BytesIO(buf.getvalue()))) == d
    assert d.to_dict()["removed"][0] == {"path": "Transformer/Block_0", "kind": "module_call",
                                         "method": "__call__", "index": 0}
