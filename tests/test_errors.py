"""The error catalogue (`yax.errors`): every class is documented in docs/errors.md, and every
specific class formats a message of full sentences ending with the pointer to its section.

The wording of each message is checked here, once; the tests of the code that raises them match
on classes and fields."""

from __future__ import annotations

import pathlib
import re
import types

import pytest

import yax
from yax import errors

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "errors.md"

NODE = types.SimpleNamespace(kind="module_call", name="Dense_0", path="Model/Dense_0", type="Dense", scope=("Dense_0",))
RULE = types.SimpleNamespace(name="custom_jvp_call", path="Model/relu")

#: One instance of every specific class, built the way yax builds it.
BUILT = {
    "NeedsParams": lambda: errors.NeedsParams("The replacement has variables; pass `params=`.", "sub"),
    "NotTraceable": lambda: errors.NotTraceable("f", NODE, "f32[2,4]", ValueError("bad shape"), "Try another."),
    "DoesNotFit": lambda: errors.DoesNotFit("Dense", NODE, 0, "f32[2,8]", "f32[2,16]"),
    "WrongCount": lambda: errors.WrongCount("f", NODE, "outputs", 2, 1, "f32[2,16]"),
    "TracedOnOtherInputs": lambda: errors.TracedOnOtherInputs("Block", NODE, 0, "f32[5,4]", "f32[2,4]"),
    "NothingMatched": lambda: errors.NothingMatched("//x", "", "tool", "would do nothing", "."),
    "NothingToRewrite": lambda: errors.NothingToRewrite("//x"),
    "LossNotScalar": lambda: errors.LossNotScalar("capture", "f32[4,2]"),
    "NothingToCapture": lambda: errors.NothingToCapture("//x", "", "capture"),
    "PartlyMatchedModule": lambda: errors.PartlyMatchedModule("Model/shared", 3, 1, "nnx", "one object"),
    "SharedVariables": lambda: errors.SharedVariables("Model/shared"),
    "Dangling": lambda: errors.Dangling("the equation `dot_general` at `Model/attend`"),
    "OutOfMemory": lambda: errors.OutOfMemory("first_nonfinite", RuntimeError("RESOURCE_EXHAUSTED: 4.00GiB")),
    "DeciderMutated": lambda: errors.DeciderMutated("choose", NODE, ["attrs"]),
    "InsideCustomRule": lambda: errors.InsideCustomRule(NODE, RULE),
    "MoxSideResults": lambda: errors.MoxSideResults(NODE, "f32[4]"),
    "MoxReadsUnnamed": lambda: errors.MoxReadsUnnamed(NODE, "f32[4]", "constants of a bound module"),
    "MoxCutFromUnknown": lambda: errors.MoxCutFromUnknown(NODE),
    "MoxNoValues": lambda: errors.MoxNoValues("Block", NODE, "`params/a` f32[4,2] where the MoX reads f32[4,3]"),
    "MoxNoPlace": lambda: errors.MoxNoPlace("Wider", NODE, "gate", "f32[4], which that module does not have"),
    "BroadcastNewVariables": lambda: errors.BroadcastNewVariables("LoRA", NODE, ["params/lora_a"]),
    "WeightsDoNotFit": lambda: errors.WeightsDoNotFit("w.safetensors", ["a"], [], []),
    "InputsDiffer": lambda: errors.InputsDiffer("args[1]", "type", "f32[2,4]", "f32[3,4]"),
    "BatchDoesNotFit": lambda: errors.BatchDoesNotFit("long", "type", "i32[2,8]", "i32[2,9]", "args[1]"),
    "NotARootMox": lambda: errors.NotARootMox("eval_mox", "a `module_call` node", "Evaluate the whole MoX."),
    "WrongType": lambda: errors.WrongType("xpath", "an XPath string", 3),
    "UnknownName": lambda: errors.UnknownName("batch", "dirty", ["clean"], "Add one with `add_batch`."),
    "LossNotAFunction": lambda: errors.LossNotAFunction("capture", 3.0),
    "PatchDoesNotFit": lambda: errors.PatchDoesNotFit("Model/Block_0", "type", "f32[2,8,32]", "f32[2,8,16]"),
    "WrongNodeKind": lambda: errors.WrongNodeKind("`sub`", "replaces module calls", "a `root` node", "Narrow it."),
    "ForeignModule": lambda: errors.ForeignModule("Dense", NODE, "linen", "nnx", "an nnx state", "Use nnx."),
    "MixedReplacements": lambda: errors.MixedReplacements("nnx", NODE, "a `function` "),
    "KeepsNothing": lambda: errors.KeepsNothing("Renamed", NODE, ["params/w"], "initialised afresh", "Use `keep=`."),
    "CannotAdapt": lambda: errors.CannotAdapt(NODE, "a layer linear in one weight", "has a grouped convolution"),
    "UnknownFields": lambda: errors.UnknownFields("Dense", "Model/Dense_0", ["width"], ["features", "use_bias"]),
    "CannotRebuild": lambda: errors.CannotRebuild("Block", "Model/Block", "it has a field of no known type", "Build it."),
    "ParamsDoNotFit": lambda: errors.ParamsDoNotFit("`params` is empty.", "Pass the variables.", None),
    "DeclaresDTD": lambda: errors.DeclaresDTD(),
    "DocumentTooLarge": lambda: errors.DocumentTooLarge("max_bytes", 1000, 2000, unread=True),
    "NotWellFormed": lambda: errors.NotWellFormed("mismatched tag: line 1, column 17"),
    "BadPolicy": lambda: errors.BadPolicy("compute=bf17", "compute=bf17", "The policy has 'compute=bf17'."),
}


def catalogue() -> list[type]:
    return [v for v in vars(errors).values()
            if isinstance(v, type) and issubclass(v, yax.YaxError) and v.__module__ == "yax.errors"]


def specific() -> list[type]:
    return [c for c in catalogue() if c.__name__ not in errors.CATEGORIES]


def test_every_specific_class_is_built_here():
    assert sorted(BUILT) == sorted(c.__name__ for c in specific())


@pytest.mark.parametrize("name", sorted(BUILT))
def test_a_message_is_full_sentences_ending_with_its_docs_pointer(name):
    e = BUILT[name]()
    assert type(e).__name__ == name
    text = str(e)
    pointer = f" (docs/errors.md#{name.lower()})"
    assert text.endswith(pointer) and text.count("docs/errors.md") == 1, text
    sentences = text.removesuffix(pointer)
    assert sentences[0].isupper() or sentences[0] == "`", text
    assert sentences.endswith((".", ".)", "`.")), text
    if isinstance(e, yax.YaxRewriteError):
        assert sentences.endswith("Nothing was changed.") and sentences.count("Nothing was changed.") == 1
    assert errors.said(e) == sentences.removesuffix(" Nothing was changed.")
    assert errors.message(e) == sentences


def test_a_category_message_is_left_as_written():
    assert str(yax.YaxInputError("As written.")) == "As written."
    assert str(yax.YaxRewriteError("Refused.")) == "Refused. Nothing was changed."


def test_a_class_defined_elsewhere_points_to_its_nearest_documented_base():
    class Local(errors.DoesNotFit):
        pass

    assert str(Local("f", NODE, 0, "a", "b")).endswith("(docs/errors.md#doesnotfit)")


def test_every_class_has_a_docstring_with_an_example_and_a_section_in_the_docs():
    text = DOCS.read_text(encoding="utf-8")
    headings = set(re.findall(r"^#+ (\w+)$", text, re.M))
    for c in catalogue():
        assert c.__doc__ and "Example::" in c.__doc__, c.__name__
        assert c.__name__ in headings, f"docs/errors.md has no section for {c.__name__}"
    assert headings - {c.__name__ for c in catalogue()} <= {"Errors", "Categories"}, "a section for no class"


def test_fields_are_set():
    e = BUILT["InputsDiffer"]()
    assert (e.argument, e.kind, e.expected, e.found) == ("args[1]", "type", "f32[2,4]", "f32[3,4]")
    e = BUILT["WrongType"]()
    assert (e.argument, e.expected, e.found) == ("xpath", "an XPath string", "int")
    e = BUILT["UnknownName"]()
    assert (e.kind, e.name, e.known) == ("batch", "dirty", ["clean"])
    e = BUILT["DoesNotFit"]()
    assert (e.node, e.index, e.found, e.expected) == (NODE, 0, "f32[2,8]", "f32[2,16]")
