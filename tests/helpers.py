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


def check_compiled_cost(mox, *args, **kwargs):
    """`yax.cost` on a model nobody here wrote: each instruction's recount by XLA's rules adds
    up to XLA's own ``cost_analysis()`` (or XLA itself does not know, and yax lists why); every
    call's total is its own plus its calls'; the view's ``@flops`` are the table's."""
    import yax
    from yax.internal import call_keys

    c = yax.cost(mox, *args, **kwargs)
    if c.counted is None:
        assert c.unknown and "does not know" in c.table()
    else:
        assert c.counted["flops"] == c.xla.get("flops", 0.0)
        assert c.counted["transcendentals"] == c.xla.get("transcendentals", 0.0)
        assert c.counted["bytes_accessed"] == c.xla.get("bytes accessed", 0.0)
    keys = {id(n): k for k, n in call_keys(mox).items()}
    children: dict[str, list[str]] = {k: [] for k in c.calls}
    for k, n in call_keys(mox).items():
        up = next((keys[id(a)] for a in calls_around(mox, n)), "")
        children[up].append(k)
    for k, cc in c.calls.items():
        parts = [cc.own["flops"], *(c.calls[x].total["flops"] for x in children[k])]
        if k == "":
            parts.append(c.unattributed.own["flops"])
        want = None if None in parts else sum(parts)
        assert cc.total["flops"] == want, (cc.path, cc.total, want)
    shown = {n.path for n in c.query("//module_call[@flops > 0] | //activation[@flops > 0]")}
    assert shown == {cc.path for k, cc in c.calls.items() if k and cc.total["flops"]}
    return c


def calls_around(mox, node):
    """The calls around ``node``, innermost first."""
    from yax._calls import index

    idx = index(mox)
    i = idx.callers[idx.ids[id(node)]]
    while i >= 0:
        yield idx.nodes[i]
        i = idx.callers[i]
