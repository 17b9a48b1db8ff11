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
    "CouldNotTrace": lambda: errors.CouldNotTrace("f", TypeError("cannot reshape"), static=True),
    "InvalidXPath": lambda: errors.InvalidXPath("//x[", "syntax", "XPathSyntaxError: Invalid expression",
                                                "Check the brackets."),
    "Timeout": lambda: errors.Timeout("The layout", 0.5, "Draw less."),
    "QueryTimeout": lambda: errors.QueryTimeout("//*[count(//*) > 1]", 0.5),
    "RenderTimeout": lambda: errors.RenderTimeout(0.001),
    "MissingDependency": lambda: errors.MissingDependency("`save_weights` and `load_weights`",
                                                          "the `safetensors` package", "`pip install safetensors`"),
    "CannotRead": lambda: errors.CannotRead("open", "No such file or directory", "<mox/>", looks_like_xml=True),
    "BadLimit": lambda: errors.BadLimit("max_bytes", -1),
    "CannotSaveLeaves": lambda: errors.CannotSaveLeaves("params", "not arrays", ["n"], "`n` is not an array."),
    "BadWeightsFile": lambda: errors.BadWeightsFile("w.safetensors", "changed", "", "`w.safetensors` changed."),
    "CannotCompare": lambda: errors.CannotCompare("compare", "two references", "Two references were given."),
    "NnxCannotReplace": lambda: errors.NnxCannotReplace("stacked", "It runs inside `nnx.scan`.", NODE),
    "PolicyNotApplied": lambda: errors.PolicyNotApplied("output", "The policy asks for bfloat16.", "Model/Dense_0",
                                                        "output=bfloat16", "bfloat16", "float32"),
    "BadValue": lambda: errors.BadValue("timeout", "a positive number of seconds", 0),
    "BadArgument": lambda: errors.BadArgument("name", "a non-empty string of at most 80 characters", "",
                                              "A batch name"),
    "BadQueryArgument": lambda: errors.BadQueryArgument("timeout", "a positive number of seconds", 0),
    "NotInMox": lambda: errors.NotInMox(NODE, "sub", hint="Query the MoX you rewrite."),
    "NotNodes": lambda: errors.NotNodes("sub", "count(//*)", 19.0),
    "NotOneNode": lambda: errors.NotOneNode("to_dot", '//module_call[@type="Block"]', 2),
    "ParamDtypeDiffers": lambda: errors.ParamDtypeDiffers("keep", "Dense", "params/kernel", "float32", "bfloat16",
                                                          NODE),
    "AbstractParams": lambda: errors.AbstractParams("export"),
    "Unmappable": lambda: errors.Unmappable(NODE, "with variables stacked along axis 1", "nn.vmap", 1),
    "CannotComeOut": lambda: errors.CannotComeOut("capture", "//while//add", NODE, "while", "Model",
                                                  "a `while` loop keeps no values of its steps"),
    "BadArgnums": lambda: errors.BadArgnums("range", 2, 2),
    "NotQueryable": lambda: errors.NotQueryable("query", 3),
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


def test_the_wording_of_the_families_of_issue_42():
    e = BUILT["CouldNotTrace"]()
    assert str(e).startswith("JAX could not trace `f`: TypeError: cannot reshape\n") and "static_argnums=(i,)" in str(e)
    assert (e.function, e.static) == ("f", True) and isinstance(e.error, TypeError)
    e = BUILT["InvalidXPath"]()
    assert errors.message(e) == ("The XPath `//x[` is invalid: lxml reported XPathSyntaxError: Invalid expression. "
                                 "Check the brackets.")
    assert (e.xpath, e.kind, e.hint) == ("//x[", "syntax", "Check the brackets.")
    assert errors.message(errors.InvalidXPath("re:test(a, '(')", "regex", "missing )")).startswith(
        "A regular expression in the XPath `re:test(a, '(')` is invalid: missing ). ")
    e = BUILT["QueryTimeout"]()
    assert isinstance(e, errors.Timeout) and isinstance(e, yax.YaxQueryError) and not isinstance(e, yax.YaxRenderError)
    assert errors.message(e).startswith("The XPath `//*[count(//*) > 1]` took longer than 0.5 s and was stopped. ")
    assert (e.xpath, e.seconds) == ("//*[count(//*) > 1]", 0.5)
    e = BUILT["RenderTimeout"]()
    assert isinstance(e, errors.Timeout) and isinstance(e, yax.YaxRenderError) and e.seconds == 0.001
    assert errors.message(e).startswith("Graphviz's layout of the graph took longer than 0.001 s and was stopped. ")
    e = BUILT["MissingDependency"]()
    assert isinstance(e, yax.YaxDependencyError) and isinstance(e, ImportError)
    assert errors.message(e) == ("`save_weights` and `load_weights` need the `safetensors` package, which is not "
                                 "installed. Install it with `pip install safetensors`.")
    e = BUILT["CannotRead"]()
    assert errors.message(e) == ("`load_xml` could not open the file `<mox/>`: No such file or directory. The string "
                                 "looks like XML text rather than a path: pass `text.encode()` or `io.StringIO(text)`.")
    assert errors.message(BUILT["BadLimit"]()) == "`max_bytes` must be a non-negative number of bytes, but got -1."
    for name in ("CannotSaveLeaves", "BadWeightsFile", "CannotCompare"):
        assert isinstance(BUILT[name](), yax.YaxInputError)
    for name in ("NnxCannotReplace", "PolicyNotApplied"):
        assert isinstance(BUILT[name](), yax.YaxRewriteError)


def test_the_wording_of_the_families_of_issue_42_continued():
    e = BUILT["BadQueryArgument"]()
    assert isinstance(e, errors.BadValue) and isinstance(e, yax.YaxQueryError) and not isinstance(e, yax.YaxInputError)
    assert errors.message(e) == "`timeout` must be a positive number of seconds, but got 0."
    assert (e.argument, e.expected, e.value) == ("timeout", "a positive number of seconds", 0)
    e = BUILT["BadArgument"]()
    assert isinstance(e, errors.BadValue) and isinstance(e, yax.YaxInputError)
    assert errors.message(e) == "A batch name must be a non-empty string of at most 80 characters, but got ''."
    e = BUILT["BadLimit"]()
    assert isinstance(e, errors.BadValue) and isinstance(e, yax.YaxXMLError) and e.expected.endswith("bytes")
    e = errors.BadLimit("indent", 65, "a number of spaces from 0 to 64")
    assert errors.message(e) == "`indent` must be a number of spaces from 0 to 64, but got 65."
    e = BUILT["NotInMox"]()
    assert all(isinstance(e, c) for c in (yax.YaxRewriteError, yax.YaxCaptureError, yax.YaxInputError))
    assert (e.node, e.tool) == (NODE, "sub")
    assert errors.said(e) == errors.where(NODE, start=True) + (" is not a node of this MoX, so `sub` cannot use it. "
                                                               "Query the MoX you rewrite.")
    e = BUILT["NotNodes"]()
    assert (e.tool, e.xpath, e.found) == ("sub", "count(//*)", 19.0)
    assert errors.said(e).startswith("The XPath `count(//*)` gives the float 19.0, not nodes, so `sub` has nothing ")
    assert errors.said(errors.NotNodes("the ReLU replacement", "", [])) == (
        "There are no nodes for the ReLU replacement to work on; give at least one.")
    e = BUILT["NotOneNode"]()
    assert isinstance(e, yax.YaxQueryError) and isinstance(e, yax.YaxInputError)
    assert errors.message(e).startswith("`to_dot` expected `root` to select exactly one module call, but "
                                        '`//module_call[@type="Block"]` selected 2 nodes. ')
    assert "selected no module call" in str(errors.NotOneNode("to_dot", "//x", 0))
    assert errors.message(errors.NotOneNode("values", "//x", 3)).startswith("`values` shows one node, but `//x` "
                                                                           "selects 3. ")
    e = BUILT["ParamDtypeDiffers"]()
    assert "would keep the model's `params/kernel`, a float32 array, but declares it bfloat16" in str(e)
    assert "(`param_dtype=`)" in str(e) and "without `params=`" not in str(e)
    e = errors.ParamDtypeDiffers("merge", "gemma.Einsum", "T/q", "bfloat16")
    assert "holds its parameters as bfloat16 and its class has no field for their dtype" in str(e)
    assert e.declared is None
    assert errors.message(errors.AbstractParams("values")) == errors.NO_VALUES
    assert errors.message(BUILT["AbstractParams"]()).startswith("Export writes the model's parameters")
    e = BUILT["Unmappable"]()
    assert errors.message(e).startswith("The module_call `Dense_0` at `Model/Dense_0` runs inside `nn.vmap`, with "
                                        "variables stacked along axis 1. ")
    e = BUILT["CannotComeOut"]()
    assert isinstance(e, yax.YaxCaptureError) and "(`//while`), whose outputs `capture` can use" in str(e)
    assert errors.message(BUILT["BadArgnums"]()).startswith(
        "`argnums` names positional arguments to differentiate, like `jax.grad`'s, but 2 is not one of the 2 given.")
    assert "`args[0]`, `args[2]` (`argnums`)" in str(errors.BadArgnums("not floating", [0, 2]))
    e = errors.LossNotScalar("compare", "f32[3]")
    assert isinstance(e, yax.YaxInputError) and isinstance(e, yax.YaxCaptureError)
    e = BUILT["NotQueryable"]()
    assert errors.message(e) == "`query` expected a MoX or a Document from `yax.load_xml`, but got a `int`."
    assert (e.tool, e.found) == ("query", "int")
    e = errors.DoesNotFit("f", NODE, 0, "f32[2]", "bf16[2]", "Pass `cast=True`.")
    assert e.hint == "Pass `cast=True`." and str(e).count("Pass `cast=True`.") == 1
