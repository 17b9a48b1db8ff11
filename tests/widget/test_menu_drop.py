"""Menu == drop: in every state reachable by one palette drop
from the original, and for every (node, palette item) pair in it and in the
original, the fits menu (the ``fits`` request the front-end sends) offers the
item exactly when a drop of it on that node (what `Explorer.substitute` does)
is accepted, and every refusal says why, in the words the drop refuses with.
Checking the drops of the states one drop away makes every state two drops
away too. Over linen, nnx and Hugging Face models, with the default palette.

Before the fix, after a function replacement in an nnx model the menu still
offered LoRA on its `Linear` layers, which the drop refused ("already holds
replacements that are not nnx modules")."""

from __future__ import annotations

import collections
import time

import jax.numpy as jnp
import pytest

import yax
from yax.internal import CALL_KINDS, view
from yax_widget import Explorer

from .helpers import ask

pytestmark = pytest.mark.slow  # every zoo model's menu

TALLY: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def linen_mlp():
    from models import KEY, MLP

    m, x = MLP(), jnp.linspace(-1, 1, 8).reshape(2, 4)
    return Explorer(m, m.init(KEY, x), x, warm=False)


def nnx_mlp():
    from nnx_models import case_mlp

    m, args, _ = case_mlp()
    return Explorer(m, *args, warm=False)


def nnx_classifier():  # `nnx.Sequential` with an activation in it, and an RMSNorm
    from nnx_models import case_sequential

    m, args, _ = case_sequential()
    return Explorer(m, *args, warm=False)


def gpt2():
    from thirdparty import IDS, _hf

    return Explorer(_hf("gpt2"), IDS, warm=False)


def wire(ex: Explorer) -> Explorer:
    ex.sent = []
    ex.send = lambda content, buffers=None: ex.sent.append(content)
    return ex


def rows(ex: Explorer, equations: bool) -> list[tuple[int, object]]:
    """The nodes a menu opens on: call rows, and (expanded) equation rows."""
    return [(i, n) for i, n in enumerate(view(ex.mox).nodes)
            if (isinstance(n, yax.Mox) and n.kind in CALL_KINDS) or (equations and isinstance(n, yax.Equation))]


def check_state(ex: Explorer, tally: collections.Counter, equations: bool, both_ways: bool) -> list[tuple[int, str]]:
    """Menu == drop for every (node, item) pair of the current state; the pairs offered.
    ``both_ways``: also drop every refused pair, which must be refused with the menu's reason."""
    offered = []
    for i, node in rows(ex, equations):
        menu = ask(ex, rid=i, type="fits", id=i)
        assert menu["type"] == "ok", menu
        assert set(menu["fits"]) | set(menu["refused"]) == set(ex.session.items)
        where = f"on {node.path or node.name} ({ex.history[-1].description if ex.history else 'original'})"
        for name in menu["fits"]:
            try:
                ex.session.change(node, name)  # what the drop does, without applying it
            except yax.YaxError as e:
                raise AssertionError(f"the menu offers {name} {where}, but the drop refuses it: {e}") from e
            tally["accepted"] += 1
            offered.append((i, name))
        for name, reason in menu["refused"].items():
            assert reason.endswith(".") and len(reason.split()) >= 6, reason  # a sentence saying why
            tally["refused"] += 1
            if both_ways:
                with pytest.raises(yax.YaxError) as e:
                    ex.session.change(node, name)
                assert yax.errors.message(e.value) == reason, (name, where)  # the drop's words, less its docs entry
    return offered


@pytest.mark.parametrize("make, equations, per_kind", [
    (linen_mlp, True, False), (nnx_mlp, True, False), (nnx_classifier, True, False), (gpt2, False, True),
], ids=["linen-mlp", "nnx-mlp", "nnx-classifier", "hf-gpt2"])
def test_the_menu_offers_exactly_what_a_drop_accepts(make, equations, per_kind):
    """The original, both ways; then every state one drop on a call row away (``per_kind``: the
    Hugging Face model, whose states are many: the first state of each kind of palette item, a
    function and LoRA), each offered pair dropped there (reaching every state two drops away)."""
    t = time.perf_counter()
    ex = wire(make())
    tally = TALLY[make.__name__]
    calls = {i for i, _ in rows(ex, False)}
    offered = [(i, name) for i, name in check_state(ex, tally, equations, True) if i in calls]
    assert offered
    if per_kind:
        first: dict[str, tuple[int, str]] = {}
        for i, name in offered:
            first.setdefault(ex.session.items[name].kind, (i, name))
        offered = list(first.values())
    for i, name in offered:
        ex.substitute(view(ex.mox).nodes[i], name)  # the drop, for real: the next state
        assert len(ex.history) == 1
        tally["states"] += 1
        check_state(ex, tally, equations, False)
        ex.undo()
    tally["seconds"] = round(time.perf_counter() - t, 1)
    print(f"\n{make.__name__}: {dict(tally)}")
    assert tally["accepted"] and tally["refused"]
