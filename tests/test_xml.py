"""yax.to_xml (golden), dump_xml/load_xml: the document queries run on, and
load_xml's refusals of hostile input.

Regenerate the golden on purpose with ``YAX_REGEN_GOLDEN=1`` and review the diff.
"""

import io

import pytest
from helpers import check_golden, mox_of, traced
from lxml import etree

import yax
import yax.internal

pytestmark = pytest.mark.core


def test_xml_golden():
    check_golden("mlp.xml", yax.to_xml(mox_of("mlp")).rstrip("\n"))


def test_xml_has_jaxpr_text_once_per_leaf_computation():
    tree = etree.fromstring(yax.to_xml(mox_of("mlp")))
    commented = [c.getparent().get("path") + ":" + c.getparent().tag for c in tree.iter(etree.Comment)]
    # the two Dense bodies and the relu activation; not the jaxprs nested inside relu again
    assert commented == ["MLP/Dense_0:module_call", "MLP/relu:activation", "MLP/Dense_1:module_call"]
    assert "dot_general[dimension_numbers=(((1,), (0,)), ((), ()))]" in tree.xpath("//comment()")[0].text
    # comments are not elements: queries over elements are unaffected
    assert yax.query("count(//*)", mox_of("mlp")) == 16.0


def test_dump_xml_is_the_queried_document(tf):
    buf = io.BytesIO()
    yax.dump_xml(tf, buf)
    doc = yax.load_xml(io.BytesIO(buf.getvalue()))
    for q in ['//module_call[@type="Dense"][@features=64]', '//*[@name="gelu"]', "//dot_general"]:
        assert [e.get("path") for e in yax.query(q, doc)] == [n.path for n in yax.query(q, tf)]
    assert str(doc) == yax.to_xml(tf)


def test_load_xml_refuses_billion_laughs_and_external_entities(tmp_path):
    laughs = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
              + "".join(f'<!ENTITY lol{i} "{"&lol%s;" % (i - 1 if i > 1 else "")}' * 10 + '">' for i in range(1, 10))
              + ']><mox>&lol9;</mox>')
    with pytest.raises(yax.errors.DeclaresDTD):
        yax.load_xml(laughs.encode())
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    xxe = f'<?xml version="1.0"?><!DOCTYPE m [<!ENTITY x SYSTEM "file://{secret}">]><mox>&x;</mox>'
    with pytest.raises(yax.errors.DeclaresDTD):
        yax.load_xml(io.BytesIO(xxe.encode()))
    with pytest.raises(yax.errors.DocumentTooLarge) as e:
        yax.load_xml(io.BytesIO(b"<mox>" + b" " * 2000 + b"</mox>"), max_bytes=1000)
    assert (e.value.limit_name, e.value.limit) == ("max_bytes", 1000)
    with pytest.raises(yax.errors.NotWellFormed) as e:
        yax.load_xml(b"<mox><unclosed></mox>")
    assert "line 1" in e.value.detail
    with pytest.raises(yax.errors.CannotRead) as e:  # a str is a path
        yax.load_xml("<mox/>")
    assert (e.value.problem, e.value.path, e.value.looks_like_xml) == ("open", "<mox/>", True)


def test_dump_of_rewritten_mox_roundtrips():
    mox, *_ = traced("mlp")
    new = yax.sub('//*[@name="relu"]', lambda x: x * 2, mox)
    buf = io.BytesIO()
    yax.dump_xml(new, buf)
    doc = yax.load_xml(io.BytesIO(buf.getvalue()))
    assert [e.get("path") for e in yax.query("//function", doc)] == ["MLP/relu"]
    d = yax.diff(mox, new)
    assert "MLP/relu" in repr(d)


@pytest.mark.parametrize("name", ["mlp", "transformer_scan", "transformer_remat", "control_flow", "custom_grads",
                                  "lifted", "shared"])
def test_element_ids_number_nodes_as_the_document_does_without_building_it(name):
    mox = mox_of(name)
    ids = yax.internal.node_ids(mox)  # before the view exists: the walk
    assert ids == yax.internal.view(mox).ids and len(ids) == len(yax.internal.view(mox).nodes)
