"""The %yax magic."""

from __future__ import annotations

import pytest

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


def test_magic_arguments_are_python_expressions(shell, model):
    """Spaces split arguments only outside brackets and strings: a dict literal is one argument."""
    from yax_widget._magic import split_line

    assert split_line("model.module {'params': model.params} ids") == [
        "model.module", "{'params': model.params}", "ids"]
    assert split_line("fn x + 1 y[:, 0] f(a, b)") == ["fn", "x + 1", "y[:, 0]", "f(a, b)"]
    assert split_line("m v --query '//a[@b=\"c d\"]'") == ["m", "v", "--query", "'//a[@b=\"c d\"]'"]
    m, v = model
    shell.run_line_magic("load_ext", "yax_widget")
    shell.user_ns.update(model=m, params=v["params"], batch=IDS)
    ex = shell.run_line_magic("yax", "model {'params': params} batch --query=//activation")
    assert isinstance(ex, Explorer) and ex.params == {"params": v["params"]}
    assert ex._query_result["count"] == 4 and len(ex._matches) == 4  # the magic's query is counted too
