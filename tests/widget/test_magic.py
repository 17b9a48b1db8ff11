"""The %yax magic."""

from __future__ import annotations

import ast
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yax_widget import Explorer

from .helpers import IDS


def test_magic(shell, model):
    from IPython.core.error import UsageError

    shell.run_line_magic("load_ext", "yax_widget")
    shell.run_line_magic("reload_ext", "yax_widget")  # loading twice is harmless
    m, v = model
    shell.user_ns.update(model=m, variables=v, batch=IDS)
    ex = shell.run_line_magic("yax", "model variables batch --query '//module_call[@type=\"Dense\"]'")
    assert isinstance(ex, Explorer) and len(ex.selection) == 12
    assert shell.run_line_magic("yax", "model variables batch[:1]").mox.invars[-1].shape == (1, 8)
    for line, msg in [("", "needs a model"), ("nope", "could not evaluate `nope`"), ("model --query", "needs an XPath"),
                      ("model variables batch --depth 3", "no option --depth"), ("model 'x", "quotes"),
                      ("model variables batch --query '//['", "XPath")]:
        with pytest.raises(UsageError, match=msg):
            shell.run_line_magic("yax", line)


def _words(line: str) -> tuple[list[str], list[str]]:
    from yax_widget._magic import split_line

    arguments, options = split_line(line)
    return [a.text for a in arguments], options


def test_magic_arguments_are_python_expressions(shell, model):
    """Spaces split arguments only outside brackets and strings and away from operators: a dict
    literal is one argument, `x + 1` too; Python reads them as the arguments of a call."""
    assert _words("model.module {'params': model.params} ids") == (
        ["model.module", "{'params': model.params}", "ids"], [])
    assert _words("fn x + 1 y[:, 0] f(a, b) -z") == (["fn", "x + 1", "y[:, 0]", "f(a, b)", "-z"], [])
    assert _words("fn x if c else y not z a not in b lambda v: v * 2") == (
        ["fn", "x if c else y", "not z", "a not in b", "lambda v: v * 2"], [])
    assert _words("model, variables, batch") == (["model", "variables", "batch"], [])  # commas as in a call
    assert _words("m v --query '//a[@b=\"c d\"]'") == (["m", "v"], ["--query", '//a[@b="c d"]'])
    assert _words("m '--query' --query=//x") == (["m", "'--query'"], ["--query=//x"])  # in a string: no option
    assert _words("model input_ids=ids decoder_input_ids = dec[:, :4] *more **kw") == (
        ["model", "input_ids=ids", "decoder_input_ids=dec[:, :4]", "*more", "**kw"], [])
    m, v = model
    shell.run_line_magic("load_ext", "yax_widget")
    shell.user_ns.update(model=m, params=v["params"], batch=IDS)
    ex = shell.run_line_magic("yax", "model {'params': params} batch --query=//activation")
    assert isinstance(ex, Explorer) and ex.params == {"params": v["params"]}
    assert ex._query_result["count"] == 4 and len(ex._matches) == 4  # the magic's query is counted too
    ex = shell.run_line_magic("yax", "model *[{'params': params}, batch]")  # unpacked: the script's usual names
    assert ex.session.names is None and "mox = yax.make_mox(model)(variables, batch)" in _changed(ex).code()


def _changed(ex: Explorer) -> Explorer:
    ex.substitute("//activation", "ReLU")
    return ex


def test_magic_refuses_lines_that_are_no_call_saying_why(shell, model):
    from IPython.core.error import UsageError

    m, v = model
    shell.run_line_magic("load_ext", "yax_widget")
    shell.user_ns.update(model=m, variables=v, batch=IDS)
    for line, msg in [("model variables=variables batch", "positional argument follows keyword argument"),
                      ("model variables batch)", "`\\)` closes no bracket"),
                      ("model (variables batch", "bracket is not closed"), ("model $ batch", "`\\$` is no Python"),
                      ("--query //x model", "before its options, but found `model`"),
                      ("input_ids=batch", "needs a model"), ("model variables **batch", "could not unpack `\\*\\*batch`")]:
        with pytest.raises(UsageError, match=msg):
            shell.run_line_magic("yax", line)


def test_magic_keyword_arguments_open_a_hugging_face_model_as_explorer_does(shell):
    """`%yax bart input_ids=ids decoder_input_ids=dec` opens what `Explorer(bart, input_ids=ids,
    decoder_input_ids=dec)` opens; its script passes the keywords as typed. (That the script makes
    the same numbers in a fresh kernel: test_script_runs.py.)"""
    import transformers

    bart = transformers.FlaxBartForConditionalGeneration(transformers.BartConfig(
        vocab_size=50, d_model=16, max_position_embeddings=8, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32), seed=0)
    ids = IDS % 50
    shell.run_line_magic("load_ext", "yax_widget")
    shell.user_ns.update(bart=bart, ids=ids, dec=ids[:, ::-1])
    ex = shell.run_line_magic("yax", "bart input_ids=ids decoder_input_ids=dec[:, :6]")
    same = Explorer(bart, input_ids=ids, decoder_input_ids=ids[:, ::-1][:, :6])
    assert ex.session.args == (bart.params,) and str(ex.mox) == str(same.mox)
    np.testing.assert_array_equal(ex.session.kwargs["decoder_input_ids"], same.session.kwargs["decoder_input_ids"])
    ex.substitute("//activation", "ReLU")
    code = ex.code()
    assert "(bart.params, input_ids=ids, decoder_input_ids=dec[:, :6])" in code
    assert "# `bart`, `ids`, `dec`: the notebook's names given to %yax" in code
    ns = {"bart": bart, "ids": ids, "dec": ids[:, ::-1]}
    exec(code, ns)  # noqa: S102 - the script the user would paste
    assert str(ns["mox"]) == str(ex.mox)
    ex.close()
    same.close()


def test_magic_text_after_a_comment_sign_is_a_comment_never_options(shell, model):
    """`#` outside strings starts a comment, in the arguments and among the options; inside a
    string (Python's, the shell's, an XPath's) it is a character."""
    assert _words("m p x  # --query //activation") == (["m", "p", "x"], [])
    assert _words("m p x --query //activation  # the gelus --query //x") == (["m", "p", "x"], ["--query", "//activation"])
    assert _words("m p x --query \"//a[@x='#']\"") == (["m", "p", "x"], ["--query", "//a[@x='#']"])
    assert _words("m p x --query '//a[@x=\"#\"]' # c") == (["m", "p", "x"], ["--query", '//a[@x="#"]'])
    assert _words("m '# --query //x' y") == (["m", "'# --query //x'", "y"], [])
    assert _words("m x # '--query //a'") == (["m", "x"], [])
    assert _words("m x#--query //a") == (["m", "x"], [])
    m, v = model
    shell.run_line_magic("load_ext", "yax_widget")
    shell.user_ns.update(model=m, variables=v, batch=IDS)
    ex = shell.run_line_magic("yax", "model variables batch  # --query //activation")
    assert isinstance(ex, Explorer) and ex._query == "" and ex._matches == [] and ex.selection == []
    ex = shell.run_line_magic("yax", "model variables batch --query \"//module_call[@name='#']\" # --query //x")
    assert ex._query == "//module_call[@name='#']"


def test_magic_bad_keywords_and_lines_are_usage_errors_saying_why(shell, model):
    from IPython.core.error import UsageError

    m, v = model
    shell.run_line_magic("load_ext", "yax_widget")
    shell.user_ns.update(model=m, variables=v, batch=IDS)
    for line, msg in [("model variables batch **{1: batch}", r"keyword arguments are named by strings, but `\*\*\{1: batch\}` "
                                                              r"holds the key `1`"),
                      ("model variables batch=batch **{'batch': batch}", "keyword `batch` is given twice"),
                      ("model variables batch static_argnames=1", "`static_argnames` must be"),
                      ("model variables batch static_argnums='a'", "`static_argnums` must be"),
                      ("model variables\nimport os", "one line"),
                      ("model variables batch; import os", "no list of Python arguments")]:
        with pytest.raises(UsageError, match=msg):
            shell.run_line_magic("yax", line)
    from ipywidgets.widgets import widget as registry

    before = set(registry._instances)
    with pytest.raises(UsageError, match="XPath"):  # opened, then refused: closed, not left behind
        shell.run_line_magic("yax", "model variables batch --query '//['")
    assert set(registry._instances) - before == set()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("mx =*#'\"-[](){}:,.\\q1@/\t") + ["--query ", "lambda ", " in ", "\n", "é"]),
                max_size=30).map("".join))
def test_split_line_splits_or_says_why(line):
    """Any line is split into arguments and options, or refused with a `ValueError` the magic turns
    into a `UsageError`; never another exception."""
    from yax_widget._magic import split_line

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # `'\)'`: an invalid escape, still Python
        try:
            arguments, options = split_line(line)
        except ValueError as e:
            assert str(e)
            return
        for a in arguments:  # each argument is a Python expression as typed (a line break once shifted them)
            assert a.expr in line and ast.parse(a.expr, mode="eval")
    assert all(isinstance(o, str) for o in options)
