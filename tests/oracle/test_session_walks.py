"""The oracle for the explorer's `Session`: random walks of requests, each step's
result checked against yax run fresh, without the session.

A walk opens a session on one of two small models (a linen MLP, an Equinox MLP,
both with ReLU) and sends what the front-end sends: drops of replacements (an
activation swap, a LoRA, a function replacing a layer) on random rows, undo, redo,
a click on the history, batches added under new and existing names, the batch
switch, "compare with" the previous state or the original, a row's values and the
colouring by a statistic. Some steps are interrupted: a function the session calls
(the measurement on the worker, the payload builders, the values' reductions, the
state's setter) raises KeyboardInterrupt on its n-th call.

After each step, what the UI is shown is read off the session's state as the
front-end gets it (after the requests the front-end makes itself when the tree
changes: the selected row's values, the colouring) and checked against
`yax.compare` and `yax.capture` run fresh on the session's current and compared
(mox, params) and on the inputs the walk itself added under the current batch's
name; an interrupted step must leave everything as it was, and no step may leave
the status busy.

Budget: ``YAX_ORACLE_EXAMPLES`` walks (25 by default) of about 10 steps; a failure
prints the ``@reproduce_failure`` blob to replay it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
from collections.abc import Iterator
from typing import Any

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

import yax
from yax.internal import CALL_KINDS, call_keys, capturable_calls, capture_keys, node_ids, view
from yax_widget import Session, _payloads, _reduce
from yax_widget import _worker as worker_module
from yax_widget._protocol import answer

from .gen import EXAMPLES

#: SiLU, not GELU: GELU's far negative tail is 0 op by op and a tiny negative number compiled, so its
#: count of zeros depends on how it ran (the session's compiled measurement, the op-by-op reference)
REPLACEMENTS = ("SiLU", "tanh", "LoRA r=4", "halve")
STATS = ("off", "norm", "zeros", "nonfinite")  # the colourings by a statistic of the values (numbers to check)
BATCH_NAMES = ("example", "b", "c")


class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(6, name="up")(x))
        x = nn.relu(nn.Dense(6, name="mid")(x))
        return nn.Dense(3, name="out")(x)


def halve(x):
    """A function replacing a layer (it fits the 6 -> 6 one)."""
    return 0.5 * x


@functools.cache
def opened(model: str) -> tuple[yax.Mox, Any, Any]:
    """The model's MoX (traced once per process), its variables and example input."""
    if model == "linen":
        m, x = LinenMLP(), jnp.linspace(-1, 1, 12).reshape(3, 4)
        v = m.init(jax.random.key(0), x)
        return yax.make_mox(m.apply)(v, x), v, x
    e, x = eqx.nn.MLP(4, 3, 6, 2, key=jax.random.key(1)), jnp.linspace(-1, 1, 4)
    return yax.make_mox(e)(x), e, x


# -- interrupting a step ------------------------------------------------------------------

#: the functions a KeyboardInterrupt is raised in, by the thread calling them (so the n-th call is
#: the same on every run): the worker's measurement, and on the caller's thread the payload builders,
#: the values' reductions, the state's setter ("session": the walk's session) and the batch switch's
#: repaint ("inspector": its inspector)
POINTS = {
    "worker": [(worker_module, "measure"), (worker_module, "compare_measured")],
    "caller": [(_payloads, "comparison_state"), (_payloads, "tree"), (_payloads, "diff_marks"),
               (_reduce, "_summarize"), ("session", "_set"), ("inspector", "batch_changed")],
}


@contextlib.contextmanager
def interrupting(s: Session, at: tuple[str, int] | None) -> Iterator[None]:
    """Raise KeyboardInterrupt in the ``n``-th call of any of the functions `POINTS` lists for
    ``thread`` (``at = (thread, n)``)."""
    if at is None:
        yield
        return
    thread, n = at
    left = [n]

    def raising(real: Any, name: str) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            left[0] -= 1
            if left[0] == 0:
                raise KeyboardInterrupt(f"injected in {name} (call {n} on the {thread}'s thread)")
            return real(*a, **k)
        return wrapper

    patched = []
    for owner, name in POINTS[thread]:
        owner = s if owner == "session" else s.inspector if owner == "inspector" else owner
        patched.append((owner, name, getattr(owner, name)))
        setattr(owner, name, raising(getattr(owner, name), name))
    try:
        yield
    finally:
        for owner, name, real in reversed(patched):
            if owner is s or owner is s.inspector:
                delattr(owner, name)  # the class's method again
            else:
                setattr(owner, name, real)


def frozen(s: Session) -> tuple:
    """Everything a step that was interrupted must leave as it was."""
    return (copy.deepcopy(s.state), id(s.mox), id(s.params), s.index, len(s.states), [id(n) for n in s.selection],
            s.batch, s.batches, id(s.args), id(s.comparison), s.inspector.active)


# -- the references: yax run fresh, without the session --------------------------------------

def close(got: Any, want: Any) -> bool:
    """Two statistics equal up to float32 rounding (None: NaN, as the payloads send it)."""
    if got is None or want is None or (isinstance(want, float) and math.isnan(want)):
        return (got is None or math.isnan(got)) and (want is None or math.isnan(want))
    return abs(got - want) <= 1e-5 + 1e-4 * abs(want)


def eager_capture(nodes: Any, mox: yax.Mox, *args: Any) -> dict:
    """`yax.capture` op by op: no compile per model (the walk makes dozens of models)."""
    with jax.disable_jit():
        return yax.capture(nodes, mox, *args)[1]


def arrays(value: Any) -> list[tuple[str, np.ndarray]]:
    """The array outputs in a captured value, named as the values pane names them."""
    return [("out" + jax.tree_util.keystr(p), np.asarray(x, np.float64))
            for p, x in jax.tree_util.tree_flatten_with_path(value)[0] if hasattr(x, "dtype")]


class Walk(RuleBasedStateMachine):
    """The session and what the walk did to it: its own record of the batches (name -> input, in
    order), the batch in use, what is compared with, the index it expects, the row selected."""

    @initialize(model=st.sampled_from(["linen", "equinox"]), other=st.booleans(), changes=st.integers(0, 2),
                base=st.sampled_from(["original", "previous"]))
    def open(self, model: str, other: bool, changes: int, base: str) -> None:
        """A session on ``model``, with a second batch when ``other``, after ``changes`` activation swaps,
        compared with ``base``: a walk of ten steps starts where several changes and batches lead."""
        mox, params, x = opened(model)
        self.batches: dict[str, Any] = {"example": x}
        if other:
            self.batches["b"] = -2 * x
        self.s = Session(mox, params, x, batches=dict(self.batches))
        self.s.add_replacement("halve", halve)
        for k in range(changes):
            self.s.substitute(self.s.node(self.fitting("SiLU")[k % 2]), ("SiLU", "tanh")[k % 2])
        self.s.compare_with(base)
        self.current, self.base, self.index, self.length = "example", base, changes, changes + 1
        self.selected: int | None = None
        self.check()

    def teardown(self) -> None:
        if hasattr(self, "s"):
            self.s.close()

    # -- the steps ---------------------------------------------------------------------------

    def step(self, what: str, do: Any, at: tuple[str, int] | None) -> Any:
        """``do()`` interrupted ``at``: the reply, or None when it was interrupted (then nothing changed)."""
        s = self.s
        before, tree = frozen(s), s.state["tree"]
        try:
            with interrupting(s, at):
                got = do()
        except KeyboardInterrupt:
            s.worker.run(lambda: None)  # a measurement left running ends before the next step
            assert frozen(s) == before, f"{what}, interrupted at {at}, left the session half-changed"
            got = None
        s.worker.run(lambda: None)
        event(f"{what.split()[0]}: " + ("interrupted" if got is None else got.get("type", "ok")))
        if isinstance(got, dict) and got.get("type") == "error":
            assert not got["message"].startswith("The request failed with"), got["message"]  # a bug, not a refusal
            assert frozen(s) == before, f"the refused {what} changed the session"
        if s.state["tree"] is not tree:
            self.ui_follows()
        return got

    def ui_follows(self) -> None:
        """What the front-end asks when the tree changes: the selected row's values, the colouring."""
        s = self.s
        if self.selected is not None:
            if self.selected not in self.rows():
                self.selected = None
            elif answer(s, {"rid": 1, "type": "values", "id": self.selected})["type"] != "ok":
                self.selected = None
        stat = s.state["overlay"].get("stat")
        if stat:
            assert answer(s, {"rid": 1, "type": "overlay", "stat": stat})["type"] == "ok"

    def rows(self) -> list[int]:
        """The call rows of the current model below its top call (the drop and values targets)."""
        nodes = view(self.s.mox).nodes
        return [i for i, n in enumerate(nodes) if isinstance(n, yax.Mox) and n.kind in CALL_KINDS and "/" in n.path]

    interrupt = st.one_of(st.none(), st.tuples(st.sampled_from(sorted(POINTS)), st.integers(1, 6)))

    def fitting(self, name: str) -> list[int]:
        """The rows ``name`` is meant for (a drop there may still be refused, after a change)."""
        nodes = view(self.s.mox).nodes
        rows = self.rows()
        if name in ("SiLU", "tanh"):
            return [i for i in rows if nodes[i].kind == "activation"]
        if name == "halve":  # a layer whose output is shaped as its input
            return [i for i in rows if nodes[i].kind == "module_call" and nodes[i].in_shapes == nodes[i].out_shapes]
        return [i for i in rows if getattr(nodes[i], "type", None) in ("Dense", "Linear")]

    @rule(row=st.integers(0, 20), name=st.sampled_from(REPLACEMENTS), aim=st.integers(0, 3), at=interrupt)
    def substitute(self, row: int, name: str, aim: int, at: Any) -> None:
        """A drop of ``name`` on a row it is meant for, or (``aim`` 0) on any row: refusals are checked too."""
        rows = (self.fitting(name) if aim else []) or self.rows()
        got = self.step(f"substitute {name}", lambda: answer(
            self.s, {"rid": 1, "type": "substitute", "target": rows[row % len(rows)], "name": name}), at)
        if got is not None and got["type"] == "ok":
            self.index += 1
            self.length = self.index + 1
        self.check()

    @precondition(lambda self: self.length > 1)
    @rule(how=st.sampled_from(["undo", "redo", "goto"]), k=st.integers(0, 5), at=interrupt)
    def move(self, how: str, k: int, at: Any) -> None:
        """Undo, redo, or a click on the history's item ``k``."""
        k = {"undo": max(0, self.index - 1), "redo": min(self.length - 1, self.index + 1)}.get(how, k % self.length)
        ask = {"rid": 1, "type": how, **({"index": k} if how == "goto" else {})}
        if self.step(f"{how} to {k}", lambda: answer(self.s, ask), at) is not None:
            self.index = k
        self.check()

    @precondition(lambda self: self.index > 0)
    @rule(base=st.sampled_from(["original", "previous"]), at=interrupt)
    def compare_with(self, base: str, at: Any) -> None:
        if self.step(f"compare with {base}",
                     lambda: answer(self.s, {"rid": 1, "type": "compare_base", "base": base}), at) is not None:
            self.base = base
        self.check()

    @rule(name=st.sampled_from(BATCH_NAMES), seed=st.integers(0, 3), at=interrupt)
    def add_batch(self, name: str, seed: int, at: Any) -> None:
        x = self.batches["example"]
        new = (seed + 1) * jax.random.normal(jax.random.key(seed), x.shape, x.dtype)
        if self.step(f"add_batch {name}", lambda: self.s.add_batch(name, new) or {}, at) is not None:
            self.batches[name] = new
        self.check()

    @rule(k=st.integers(0, 2), at=interrupt)
    def use_batch(self, k: int, at: Any) -> None:
        others = [n for n in self.batches if n != self.current] or [self.current]
        name = others[k % len(others)]
        if self.step(f"use_batch {name}", lambda: answer(self.s, {"rid": 1, "type": "batch", "name": name}),
                     at) is not None:
            self.current = name
        self.check()

    @rule(row=st.integers(0, 20), at=interrupt)
    def values(self, row: int, at: Any) -> None:
        rows = self.rows()
        rid = rows[row % len(rows)]
        got = self.step(f"values of row {rid}", lambda: answer(self.s, {"rid": 1, "type": "values", "id": rid}), at)
        if got is not None:
            assert got["type"] == "ok", got
            self.selected = rid
        self.check()

    @rule(stat=st.sampled_from(STATS), at=interrupt)
    def overlay(self, stat: str, at: Any) -> None:
        got = self.step(f"colour by {stat}", lambda: answer(self.s, {"rid": 1, "type": "overlay", "stat": stat}), at)
        assert got is None or got["type"] == "ok", got
        self.check()

    # -- what the UI shows, against yax run fresh --------------------------------------------

    def check(self) -> None:
        s = self.s
        assert not s.state["status"]["busy"], s.state["status"]
        assert (s.index, len(s.states)) == (self.index, self.length)
        assert s.state["history"]["index"] == s.index and s.state["tree"]["version"] == s.index
        x = self.batches[self.current]
        assert str(x.dtype) == "float32"  # the input the top row shows, as passed: written by hand
        shown = {"name": s.input_names[0], "type": f"f32[{','.join(map(str, x.shape))}]", "sharding": ""}
        assert s.state["batches"] == {"names": list(self.batches), "current": self.current, "inputs": [shown]}
        assert s.batch == self.current and s.args[-1] is self.batches[self.current]
        assert s.state["compare_base"] == self.base
        x = self.batches[self.current]
        self.check_comparison(x)
        if self.selected is not None:
            self.check_values(x)
        if s.state["overlay"].get("stat"):
            self.check_overlay(x)

    def check_comparison(self, x: Any) -> None:
        s = self.s
        shown = s.state["comparison"]
        if s.index == 0:
            assert shown == {} and s.comparison is None
            return
        previous = self.base == "previous" and s.index >= 2
        base = s.states[s.index - 1] if previous else s.states[0]
        want = yax.compare(base.mox, s.mox, base.params, x, new_params=s.params)
        assert "message" not in shown, shown["message"]
        assert shown["base"] == ("previous" if previous else "original")
        assert shown["allclose"] == want.allclose
        first = want.first_divergence
        assert shown["first_divergence"] == (None if first is None else want.label(first)), (
            shown["first_divergence"], first)
        got_out = {o["name"]: o for o in shown["outputs"]}
        assert set(got_out) == set(want.outputs)
        for name, st_ in want.outputs.items():
            for k in ("max_abs", "mean_abs", "rel", "cosine"):
                assert close(got_out[name][k], getattr(st_, k)), (name, k, got_out[name][k], getattr(st_, k))
        ids, keys = node_ids(s.mox), call_keys(s.mox)
        bounds = {str(ids[id(keys[k])]): b for k, b in want.boundaries.items() if k in keys}
        assert set(shown["boundaries"]) == set(bounds)
        for rid, b in bounds.items():
            got = shown["boundaries"][rid]
            assert got["allclose"] == b.allclose and close(got["max_abs"], b.max_abs) and close(got["rel"], b.rel), (
                rid, got, b)
        assert s.comparison is not None and s.comparison.first_divergence == first

    def check_values(self, x: Any) -> None:
        s = self.s
        shown = s.state["values"]
        assert shown["id"] == self.selected and shown["batch"] == self.current
        node = s.node(self.selected)
        got = eager_capture(node, s.mox, s.params, x)[capture_keys(s.mox)[id(node)]]
        want = arrays(got)
        assert [e["name"] for e in shown["outputs"]] == [n for n, _ in want][:_reduce.MAX_OUTPUTS]
        for e, (_, a) in zip(shown["outputs"], want):
            fin = a[np.isfinite(a)]
            assert e["size"] == a.size and e["finite"] == fin.size and e["zeros"] == int((a == 0).sum())
            if fin.size:
                for k, v in (("min", fin.min()), ("max", fin.max()), ("mean", fin.mean()), ("std", fin.std()),
                             ("norm", np.sqrt((fin ** 2).sum()))):
                    assert close(e[k], float(v)), (self.selected, e["name"], k, e[k], float(v))

    def check_overlay(self, x: Any) -> None:
        s = self.s
        shown = s.state["overlay"]
        assert shown["batch"] == self.current
        calls = capturable_calls(s.mox)
        got = eager_capture(calls, s.mox, s.params, x)
        ids, keys = node_ids(s.mox), capture_keys(s.mox)
        want = {}
        for c in calls:
            outs = [a for _, a in arrays(got[keys[id(c)]])][:_reduce.MAX_OUTPUTS]
            size = sum(a.size for a in outs)
            finite = [a[np.isfinite(a)] for a in outs]
            if shown["stat"] == "norm":
                n_fin = sum(f.size for f in finite)
                want[str(ids[id(c)])] = math.sqrt(sum(float((f ** 2).sum()) for f in finite)) if n_fin else None
            elif shown["stat"] == "zeros":
                want[str(ids[id(c)])] = sum(int((a == 0).sum()) for a in outs) / size if size else None
            else:
                want[str(ids[id(c)])] = sum(a.size - f.size for a, f in zip(outs, finite)) / size if size else None
        assert set(shown["values"]) == set(want)
        for rid, v in want.items():
            assert close(shown["values"][rid], v), (shown["stat"], rid, shown["values"][rid], v)


def test_session_walks():
    run_state_machine_as_test(Walk, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=10, deadline=None, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]))
