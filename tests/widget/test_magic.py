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
