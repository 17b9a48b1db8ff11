"""`cost`: what every module call costs in the compiled program.

The MoX is evaluated under ``jax.jit`` with each call inside a
``jax.named_scope`` naming its node (``__yax12__``: its number in the node
index), nested computations included (their bodies traced again with the
same scopes). XLA keeps those names in every instruction's metadata through
optimisation and fusion, so reading the compiled program's text (`_hlo`)
names each instruction's module exactly. Each instruction's cost is XLA's
own rule for it (`_hlo.Program.own`); added up XLA's way they equal
``compiled.cost_analysis()``, which `Cost.xla` keeps beside them.

Numbers are per device (the program one device runs under SPMD) and per run
of the program: an instruction in a loop counts as many times as the loop
runs (XLA's totals count a loop body once; `Cost.counted` adds up that way).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import math
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from . import _calls, _hlo
from ._eval import Hooks, bind, flatten_inputs, run
from ._fold import runs, structure_keys
from ._ir import CALL_KINDS, Equation, Kind, Mox
from ._sharding import _labels, _reads, spec_text
from ._view import View, view
from ._xpath import query
from .errors import NotARootMox

_SCOPE = re.compile(r"__yax(\d+)__")
_NOBODY = -2  # the owner of instructions without metadata

#: The quantities `cost` adds up per call.
QUANTITIES = ("flops", "transcendentals", "bytes_accessed", "collective_bytes")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective XLA put into the program: its opcode, the bytes of its result (and
    its shape), its replica groups as lists of devices (``{{0,1,2,3},{4,5,6,7}}``), and how
    many times it runs per run of the program (``None``: known only when it runs)."""

    kind: str
    bytes: int
    groups: str
    runs: int | None
    instruction: str
    shape: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Replicated:
    """A parameter the compiled program holds whole along mesh ``axes`` along which
    the same parameter of most calls alike (``peers``: paths differing in their
    numbers only) is split: a layer left out of a sharding rule. Or (``gathered``)
    a parameter an all-gather assembles whole every run."""

    path: str
    name: str
    spec: str
    axes: tuple[str, ...]
    bytes: int  # per device, as compiled
    split: int  # per device, were it split along ``axes`` too (the gathered one: its whole size)
    gathered: bool = False
    peers: tuple[str, ...] = ()  # the calls alike whose same parameter is split

    def __str__(self) -> str:
        where = f"`{self.path}`" if self.path else "the root"
        if self.gathered:
            return (f"{where} all-gathers the whole of its parameter `{self.name}` ({_fmt(self.bytes)}B) "
                    f"every run.")
        axes = ", ".join(f"`{a}`" for a in self.axes)
        alike = f"`{self.peers[0]}`" + (f" and {len(self.peers) - 1} more" if len(self.peers) > 1 else "")
        return (f"{where}: its parameter `{self.name}` is laid out {self.spec}, held whole along {axes}, along "
                f"which the same parameter of the calls alike ({alike}) is split: {_fmt(self.bytes)}B per device "
                f"where split it would be {_fmt(self.split)}B.")


@dataclasses.dataclass
class CallCost:
    """The compiled cost of one call (or of the root's own equations, ``path == ""``).

    ``own`` counts the instructions that came from the call's own equations, ``total``
    those of the calls under it too; each maps a quantity of `QUANTITIES` to its value
    per run of the program, or to ``None`` where it is known only when the program runs,
    with ``why``."""

    path: str
    type: str
    own: dict[str, float | None]
    total: dict[str, float | None]
    collectives: list[Collective]
    instructions: int
    why: str = ""
    equations: int = 0  #: of the traced program under it (a nested computation's once): what XLA compiles
    #: the parameters its own equations read, laid out as compiled (on a mesh): name -> ``P(None,'model')``
    parameters: dict[str, str] = dataclasses.field(default_factory=dict)
    #: the seconds `make_mox` spent tracing it, its calls included (``None``: a rewrite made it)
    trace_seconds: float | None = None

    @property
    def flops(self) -> float | None:
        return self.total["flops"]

    @property
    def collective_runs(self) -> int | None:
        """How many collectives it runs itself per run (``None``: known only when it runs)."""
        runs = [x.runs for x in self.collectives]
        return None if None in runs else sum(runs)  # type: ignore[arg-type]

    @property
    def bytes_accessed(self) -> float | None:
        return self.total["bytes_accessed"]


@dataclasses.dataclass
class Cost:
    """What `cost` found.

    ``calls``: call key (as `yax.capture` names calls) -> `CallCost`, in program order, ``""``
    the root (all of the program). ``xla``: ``compiled.cost_analysis()`` as XLA gives it (a loop
    body once). ``counted``: the instructions added up XLA's way, recounted (`agrees`), or None
    where XLA does not know an instruction's cost; ``unknown``: those, by call path and opcode.
    ``unattributed``: what XLA made without saying from what. ``replicated``: parameters held
    whole along a mesh axis where their alike are split, or gathered whole. ``memory``: XLA's
    memory analysis; ``unrolled``: identical layers not scanned; ``seconds``: trace, lower and
    compile; ``devices``: how many the program runs on (numbers are per device)."""

    calls: dict[str, CallCost]
    xla: dict[str, float]
    counted: dict[str, float] | None
    unknown: list[tuple[str, str]]
    seconds: dict[str, float]
    devices: int
    replicated: list[Replicated] = dataclasses.field(default_factory=list)
    #: instructions XLA made without saying from what (no metadata): in the root's total, in no call's
    unattributed: CallCost | None = None
    #: ``compiled.memory_analysis()`` per device (arguments, outputs, temporaries, code), when XLA gives it;
    #: what each module holds live at the peak is not attributed (XLA's buffer assignment is not public)
    memory: dict[str, int] | None = None
    #: runs of identical sibling calls that are not scanned: ``(first path, last path, how many)``
    unrolled: list[tuple[str, str, int]] = dataclasses.field(default_factory=list)
    text: str = dataclasses.field(repr=False, default="")

    mox: Mox | None = dataclasses.field(default=None, repr=False)

    def node(self, key: str) -> Mox:
        """The call node of ``key`` in `calls` (``""``: the MoX itself)."""
        assert self.mox is not None
        return self.mox if key == "" else _calls.calls(self.mox)[key]

    @functools.cached_property
    def view(self) -> View:
        """The MoX's XML view with each call's cost as attributes, per run and per device: ``flops``,
        ``transcendentals``, ``bytes`` (accessed) and ``collective_bytes`` with the calls under it,
        ``own_flops`` and ``own_bytes`` without them, ``collectives`` (how many it runs itself); for
        `yax.query`: ``yax.query("//module_call[@collectives > 0]", cost.view)``. A quantity
        not known before the program runs has no attribute; ``cost_unknown`` says why."""
        assert self.mox is not None
        base = view(self.mox)
        tree = copy.deepcopy(base.tree)
        by_id = {id(n): i for i, n in enumerate(base.nodes)}
        elements = {int(el.get("id")): el for el in tree.getroot().iter() if isinstance(el.tag, str)}
        for key, c in self.calls.items():
            el = elements[by_id[id(self.node(key))]]
            for attr, v in (("flops", c.total["flops"]), ("own_flops", c.own["flops"]),
                            ("transcendentals", c.total["transcendentals"]), ("bytes", c.total["bytes_accessed"]),
                            ("own_bytes", c.own["bytes_accessed"])):
                if v is not None:
                    el.set(attr, f"{v:.0f}")
            if c.collective_runs is not None:
                el.set("collectives", str(c.collective_runs))
            if c.total["collective_bytes"] is not None:
                el.set("collective_bytes", f"{c.total['collective_bytes']:.0f}")
            if c.why:
                el.set("cost_unknown", c.why)
        return View(tree, base.nodes, base.sourced, base.own_source_names)

    @property
    def agrees(self) -> bool:
        """Whether the per-instruction recount adds up to XLA's own ``cost_analysis()`` (up to
        XLA's float32 rounding of large totals); False where XLA does not know a cost."""
        return _equal(self)

    def query(self, xpath: str) -> Any:
        """`yax.query` over `view`: ``cost.query("//module_call[@flops > 1e9]")``."""
        return query(xpath, self.view)  # type: ignore[arg-type]  # a view is what `query` runs on

    def __getitem__(self, path: str) -> CallCost:
        """The first call at ``path`` (``cost["Net/Dense_0"]``; a module called twice: its first
        call, `calls` has both), or the call of key ``path``."""
        for c in self.calls.values():
            if c.path == path:
                return c
        return self.calls[path]

    def table(self, depth: int | None = None) -> str:
        """A plain-text table: per call its FLOPs, transcendentals and bytes accessed
        (with the calls under it) and its collectives, then XLA's totals."""
        return _table(self, depth)

    def __str__(self) -> str:
        return self.table()


class _Scopes(Hooks):
    """Evaluates each call inside a name scope carrying its node number."""

    def __init__(self, numbers: dict[int, int], nested: set[int]):
        self.numbers, self.nested = numbers, nested
        self.open: list[Any] = []

    def enter(self, call: Mox, values: list[Any]) -> None:
        scope = jax.named_scope(f"__yax{self.numbers[id(call)]}__")
        scope.__enter__()
        self.open.append(scope)

    def leave(self, call: Mox, values: list[Any]) -> list[Any]:
        self.open.pop().__exit__(None, None, None)
        return values

    def equation(self, eqn: Equation, values: list[Any]) -> list[Any]:
        return bind(eqn, values, self) if id(eqn) in self.nested else bind(eqn, values)


def cost(mox: Mox, *args: Any, **kwargs: Any) -> Cost:
    """Compile ``mox`` as ``jax.jit`` would and give every call's FLOPs,
    transcendentals, bytes accessed and collectives, from XLA's compiled program.

    Args:
      mox: a root MoX.
      *args, **kwargs: arguments as for `eval_mox`; arrays, or
        ``jax.ShapeDtypeStruct`` (with a ``sharding`` to compile for a mesh) so
        that nothing is allocated: a model too big for memory costs nothing to
        look at.

    Returns:
      A `Cost`: ``cost["Net/Dense_0"].flops``, ``print(cost)``.

    Example:
      >>> import jax, jax.numpy as jnp, flax.linen as nn, yax
      >>> m = nn.Dense(3)
      >>> v = m.init(jax.random.key(0), jnp.ones((2, 4)))
      >>> c = yax.cost(yax.make_mox(m.apply)(v, jnp.ones((2, 4))), v, jnp.ones((2, 4)))
      >>> c["Dense"].flops  # 2*m*n*k for the product, m*n for the bias
      54.0
    """
    if not isinstance(mox, Mox) or mox.kind != Kind.ROOT:
        what = f"a `{mox.kind}` node" if isinstance(mox, Mox) else f"a `{type(mox).__name__}`"
        raise NotARootMox("cost", what, "Give it the whole MoX from `yax.make_mox` or `yax.sub`.")
    flat = flatten_inputs(mox, args, kwargs)
    index = _calls.index(mox)
    hooks = _Scopes(index.ids, _holding_calls(index))

    def program(xs: list[Any]) -> list[Any]:
        return run(mox, xs, hooks=hooks)

    # JAX's persistent compilation cache keys a program without its metadata: under one name, a
    # program laid out in other calls would come back with their names (tests/test_cost.py)
    program.__name__ = program.__qualname__ = _program_name(index)

    t0 = time.perf_counter()
    traced = jax.jit(program).trace(flat)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    xla = compiled.cost_analysis()
    if isinstance(xla, Sequence):  # older JAX: one dict per program
        xla = xla[0] if xla else {}
    text = compiled.as_text()
    shardings = jax.tree_util.tree_leaves(compiled.input_shardings)
    devices = len(shardings[0].device_set) if shardings else 1
    found = _attribute(mox, index, _hlo.Program(text), dict(xla or {}), text,
                       {"trace": t1 - t0, "lower": t2 - t1, "compile": t3 - t2}, devices)
    in_shardings = jax.tree_util.tree_leaves(compiled.input_shardings[0])
    if len(in_shardings) == len(flat):
        found.replicated = _replicated(mox, in_shardings, found)
    found.memory = _memory(compiled)
    found.unrolled = _unrolled(mox)
    return found


def _memory(compiled: Any) -> dict[str, int] | None:
    try:
        m = compiled.memory_analysis()
    except Exception:  # a backend without it
        return None
    if m is None:
        return None
    names = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
             "generated_code_size_in_bytes")
    return {n.removesuffix("_size_in_bytes"): int(getattr(m, n)) for n in names if hasattr(m, n)}


#: Identical sibling calls from this many on, not scanned, get a note (`Cost.unrolled`).
UNROLLED = 4


def _unrolled(mox: Mox) -> list[tuple[str, str, int]]:
    """Runs of `UNROLLED` or more identical sibling calls (`yax._fold`): each is compiled on its
    own, where a scan over them compiles one."""
    keys = structure_keys(mox)
    out = []
    for n in _calls.index(mox).nodes:
        if isinstance(n, Mox) and n.calls:
            out += [(r[0].path, r[-1].path, len(r)) for r in runs(n.calls, keys) if len(r) >= UNROLLED]
    return out


def _replicated(mox: Mox, shardings: list[Any], found: Cost) -> list[Replicated]:
    """Parameters held whole along a mesh axis along which the same parameter (its name and
    shape) of most calls alike is split (the calls whose paths differ in their numbers only:
    ``Block_2/Dense_0`` and ``Block_0/Dense_0``), and parameters all-gathered whole every run
    (see `Replicated`)."""
    paths = dict(zip(mox.invars, mox.in_paths))
    params = {v: s for v, s in zip(mox.invars, shardings)
              if paths.get(v, "").startswith("[0][0]") and isinstance(s, NamedSharding) and s.mesh.size > 1}
    if not params:
        return []
    read: list[tuple[Mox, Any, str]] = []  # (call, parameter, its label)
    for call, vs in _reads(mox, params).items():
        read += [(call, v, label) for v, label in zip(vs, _labels([paths[v] for v in vs]))]
    alike: dict[tuple[str, str, tuple[int, ...]], list[tuple[Mox, Any]]] = {}
    for call, v, label in read:
        alike.setdefault((_alike(call.path), label, tuple(v.shape)), []).append((call, v))
    out: list[Replicated] = []
    seen: set[tuple[str, str, bool]] = set()
    by_path = {c.path: c for c in found.calls.values() if c.path}
    for call, v, label in read:
        s = params[v]
        if call.path in by_path:
            by_path[call.path].parameters[label] = spec_text(s.spec)
        whole = math.prod(v.shape) * np.dtype(v.dtype).itemsize
        mine = set(_axes(s.spec))
        per_device = whole // math.prod(s.mesh.shape[a] for a in mine)
        peers = [(c, params[w]) for c, w in alike[(_alike(call.path), label, tuple(v.shape))] if w is not v]
        split = {a for _, p in peers for a in _axes(p.spec)}
        missing = tuple(sorted(a for a in split if a not in mine and s.mesh.shape[a] > 1
                               and 2 * sum(a in _axes(p.spec) for _, p in peers) > len(peers)))
        if missing and (call.path, label, False) not in seen:
            seen.add((call.path, label, False))
            out.append(Replicated(call.path, label, spec_text(s.spec), missing, per_device,
                                  per_device // math.prod(s.mesh.shape[a] for a in missing),
                                  peers=tuple(c.path for c, _ in peers)))
        cc = by_path.get(call.path)
        if (mine and cc is not None and (call.path, label, True) not in seen
                and any(c.kind.startswith("all-gather") and c.shape == v.shape for c in cc.collectives)):
            seen.add((call.path, label, True))
            out.append(Replicated(call.path, label, spec_text(s.spec), tuple(sorted(mine)), per_device, whole, True))
    return out


def _alike(path: str) -> str:
    """What calls alike share: their paths but for the numbers in them (``Block_2/Dense_0`` ->
    ``Block_#/Dense_#``, ``layers/3/mlp`` -> ``layers/#/mlp``); with a parameter of the same
    name and shape, they are calls alike (`_replicated`)."""
    return re.sub(r"\d+", "#", path)


def _axes(spec: Any) -> list[str]:
    out: list[str] = []
    for e in spec:
        if e is None:
            continue
        out += list(e) if isinstance(e, tuple) else [e]
    return out


def _program_name(index: _calls.Index) -> str:
    """A name for the compiled program that differs wherever the scopes do: a digest of every
    node's kind and place (what decides which scope each instruction gets)."""
    h = hashlib.sha256()
    for num, n in enumerate(index.nodes):
        what = n.name if isinstance(n, Equation) else n.kind
        h.update(f"{index.parents[num]}:{index.callers[num]}:{what};".encode())
    return "yax_cost_" + h.hexdigest()[:20]


def _holding_calls(index: _calls.Index) -> set[int]:
    """``id`` of every equation with a call somewhere in its nested computations."""
    out: set[int] = set()
    for num, n in enumerate(index.nodes):
        if isinstance(n, Mox) and n.kind in CALL_KINDS:
            p = index.parents[num]
            while p >= 0:
                node = index.nodes[p]
                if isinstance(node, Equation):
                    if id(node) in out:
                        break
                    out.add(id(node))
                p = index.parents[p]
    return out


def _owners(program: _hlo.Program, index: _calls.Index) -> dict[str, int]:
    """Instruction name -> the number of the call it came from: its innermost scope (-1: the
    root), or `_NOBODY` (not attributed). XLA's passes make some instructions without metadata,
    or give them their loop's. Such an instruction is named after its readers in two cases only:
    it moves or converts data (a conversion, a copy, a broadcast: XLA adds these for their
    reader), and the calls of all its readers agree; or it computes a value whose readers all
    pass it on unchanged (a bitcast, a reshape) under one call's metadata, which XLA kept there
    when it rewrote that call's operation (a product rewritten as another and reshaped back).
    The rest goes to the call around what it reads and what reads it (`_around`), or stays
    unattributed: never guessed."""
    named: dict[str, int] = {}
    loops: set[str] = set()  # with a loop's metadata: the loop's plumbing, or moved out of it by XLA
    for instrs in program.computations.values():
        for i in instrs:
            if i.op_name:
                found = _SCOPE.findall(i.op_name)
                named[i.name] = int(found[-1]) if found else -1
                if i.op_name.rsplit("/", 1)[-1] in _LOOPS:
                    loops.add(i.name)
    vague = {n for n in loops if program.by_name[n].opcode not in _PLUMBING}  # what is not the loop's plumbing
    out: dict[str, int] = {k: v for k, v in named.items() if k not in vague}

    def feeding(i: _hlo.Instruction) -> bool:
        """Whether ``i`` only moves or converts data (a fusion: of such instructions only)."""
        if i.opcode == "fusion":
            return all(feeding(j) for c in i.called for j in program.computations[c])
        return i.opcode in _FEEDING

    def carried(u: _hlo.Instruction, seen: set[str]) -> set[int] | None:
        """The calls whose metadata the readers passing a value on unchanged (or converted)
        carry; None when a reader computes something else. A fusion or call among the readers
        is the one running the computation whose result the value is: it passes it on."""
        if u.opcode not in _CARRIERS:
            return None
        if u.name in named and u.name not in loops:
            return {named[u.name]}
        if u.name in seen or u.opcode == "convert":  # an unnamed conversion carries no name
            return set() if u.name in seen else None
        seen.add(u.name)
        found: set[int] = set()
        for w in program.users(u):
            got = carried(w, seen)
            if got is None:
                return None
            found |= got
        return found

    def resolve(i: _hlo.Instruction, seen: set[str]) -> int:
        if i.name in out:
            return out[i.name]
        seen.add(i.name)
        owners: set[int] | None
        moves = feeding(i)
        if i.opcode in ("fusion", "call") and not moves:  # as its result's instruction is named
            roots = [j for c in i.called for j in program.computations[c] if j.root]
            owners = {resolve(j, seen) for j in roots if j.name not in seen}
        elif moves:
            owners = {resolve(u, seen) for u in program.users(i) if u.name not in seen}
        else:
            owners = set()
            for u in program.users(i):
                got = carried(u, set(seen))
                if got is None:
                    owners = None
                    break
                owners |= got
        owners = None if owners is None else owners - {_NOBODY}
        out[i.name] = k = owners.pop() if owners and len(owners) == 1 else named.get(i.name, _NOBODY)
        return k

    for instrs in program.computations.values():
        for i in instrs:
            resolve(i, set())
    _around(program, index, out)
    return out


def _around(program: _hlo.Program, index: _calls.Index, out: dict[str, int]) -> None:
    """Name the instructions still unnamed after what is around them. Unnamed instructions that
    read one another form a region; what the region computes runs after everything it reads and
    before everything that reads it, and calls run one inside another: so inside the innermost
    call around all of those (maybe in a call within it). A region reading or read by something
    itself unknown stays unnamed."""
    unknown = {n for n, k in out.items() if k == _NOBODY}
    done: set[str] = set()
    for start in sorted(unknown):
        if start in done:
            continue
        region, todo, ends = {start}, [start], set()
        while todo:
            i = program.by_name[todo.pop()]
            for e in [program.producer(program.by_name[o]) for o in i.operands] + program.users(i):
                if _input(program, e):
                    continue  # the program's inputs: no call computes them
                if e.name in unknown:
                    if e.name not in region:
                        region.add(e.name)
                        todo.append(e.name)
                else:
                    ends.add(out[e.name])
        done |= region
        if ends:
            k = _innermost(index, ends)
            for n in region:
                out[n] = k


def _input(program: _hlo.Program, e: _hlo.Instruction) -> bool:
    """Whether ``e`` is the program's input as it came (a parameter, a constant, or a view of
    one, which XLA names after the argument: ``xs[2]``)."""
    if e.opcode in ("parameter", "constant", "iota") and e.computation == program.entry:
        return True
    return bool(e.op_name) and "/" not in e.op_name and e.opcode in _FEEDING


def _innermost(index: _calls.Index, calls: set[int]) -> int:
    """The innermost call (a number; -1: the root) holding every call of ``calls``."""
    chains = []
    for k in calls:
        chain = [k]
        while chain[-1] >= 0:
            chain.append(index.callers[chain[-1]])
        chains.append(chain[::-1])  # from the root
    common = -1
    for level in zip(*chains):
        if len(set(level)) != 1:
            break
        common = level[0]
    return common


#: Instructions that pass a value on unchanged (a fused computation's parameter included).
_LAYOUT = frozenset({"bitcast", "reshape", "transpose", "copy", "tuple", "get-tuple-element", "parameter"})
#: Readers that pass a value on: unchanged, converted, or as the result of the fusion or call computing it.
_CARRIERS = _LAYOUT | {"convert", "fusion", "call"}
#: Instructions that move or convert data, which XLA adds for their reader.
_FEEDING = _LAYOUT | {"convert", "broadcast", "bitcast-convert", "slice", "dynamic-slice", "pad", "concatenate",
                      "reverse", "constant", "iota"}


#: The last name of a loop's op_name (``jit(f)/__yax3__/while``), and what a loop carries its values in.
_LOOPS = frozenset({"while", "cond", "scan", "closed_call"})
_PLUMBING = frozenset({"while", "conditional", "call", "tuple", "get-tuple-element", "parameter", "copy",
                       "constant", "bitcast"})


def _attribute(mox: Mox, index: _calls.Index, program: _hlo.Program, xla: dict[str, float], text: str,
               seconds: dict[str, float], devices: int) -> Cost:
    numbers = [-1] + [num for num, n in enumerate(index.nodes) if isinstance(n, Mox) and n.kind in CALL_KINDS and n is not mox]
    own: dict[int, dict[str, float | None]] = {k: dict.fromkeys(QUANTITIES, 0.0) for k in (*numbers, _NOBODY)}
    whys: dict[int, str] = {}
    counts: dict[int, int] = dict.fromkeys((*numbers, _NOBODY), 0)
    colls: dict[int, list[Collective]] = {k: [] for k in (*numbers, _NOBODY)}
    unknown: list[tuple[str, str]] = []
    known_total = program.totals()
    owners = _owners(program, index)
    for placed in program.costs():
        i = placed.instr
        k = owners[i.name]
        if k not in own:
            k = -1
        counts[k] += 1
        mine = own[k]
        if placed.cost is None:
            unknown.append((_path(index, k), i.opcode))
            for q in QUANTITIES:
                mine[q] = None
            whys[k] = f"XLA does not know what a `{i.opcode}` costs"
            continue
        if i.opcode in _hlo.COLLECTIVES:
            dims = _hlo.arrays(i.shape)
            colls[k].append(Collective(i.opcode, _hlo.nbytes(i.shape), _groups(i.attrs), placed.runs, i.name,
                                       dims[-1][1] if dims else ()))
        sent = _hlo.nbytes(i.shape) if i.opcode in _hlo.COLLECTIVES else 0
        for q in QUANTITIES:
            v = sent if q == "collective_bytes" else getattr(placed.cost, q)
            if not v:
                continue
            if placed.runs is None:
                mine[q] = None
                whys.setdefault(k, placed.why)
            elif (m := mine[q]) is not None:
                mine[q] = m + v * placed.runs
    totals: dict[int, dict[str, float | None]] = {k: dict(v) for k, v in own.items()}
    for k in (*numbers[1:], _NOBODY):
        c = -1 if k == _NOBODY else index.callers[k]
        while True:
            up = c if c in totals else -1
            for q in QUANTITIES:
                a, b = totals[up][q], own[k][q]
                totals[up][q] = None if a is None or b is None else a + b
            if k in whys:
                whys.setdefault(up, whys[k])
            if up == -1:
                break
            c = index.callers[up]
    equations: dict[int, int] = dict.fromkeys(numbers, 0)
    for num, n in enumerate(index.nodes):
        if isinstance(n, Equation):
            c = index.callers[num]
            while c >= 0:
                equations[c] += 1
                c = index.callers[c]
            equations[-1] += 1
    calls: dict[str, CallCost] = {}
    for k in numbers:
        node = mox if k < 0 else index.nodes[k]
        assert isinstance(node, Mox)
        key = "" if k < 0 else index.keys[id(node)]
        calls[key] = CallCost(_path(index, k), _type(node) if k >= 0 else mox.name or "root",
                              own[k], totals[k], colls[k], counts[k], whys.get(k, ""), equations[k],
                              trace_seconds=node.info.seconds if k >= 0 else None)
    counted = None if known_total is None else {q: getattr(known_total, q) for q in QUANTITIES[:3]}
    nobody = CallCost("", "", own[_NOBODY], own[_NOBODY], colls[_NOBODY], counts[_NOBODY], whys.get(_NOBODY, ""))
    return Cost(calls, {k: float(v) for k, v in xla.items() if not re.search(r"\d|\{", k)}, counted, unknown,
                seconds, devices, unattributed=nobody, text=text, mox=mox)


def _path(index: _calls.Index, k: int) -> str:
    return "" if k < 0 else getattr(index.nodes[k], "path", "") or ""


_IOTA = re.compile(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")


def _groups(attrs: str) -> str:
    """The replica groups of a collective, as lists of devices (``{{0,1,2,3},{4,5,6,7}}``),
    whichever of its two forms XLA prints (``[2,4]<=[8]``: an iota reshaped, maybe transposed)."""
    m = re.search(r"replica_groups=(\{\{[^=]*?\}\}|\[[^\]]*\]<=\[[^\]]*\](?:T\([\d,]+\))?|\{\})", attrs)
    if not m:
        return ""
    iota = _IOTA.fullmatch(m.group(1))
    if iota is None:
        return m.group(1)
    shape, dims, perm = ([int(x) for x in g.split(",")] if g else None for g in iota.groups())
    ids = np.arange(math.prod(dims)).reshape(dims)  # type: ignore[arg-type]
    if perm is not None:
        ids = ids.transpose(perm)
    groups = ids.reshape(shape).reshape(-1, shape[-1])  # type: ignore[index]
    return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"


def _fmt(v: float | None) -> str:
    if v is None:
        return "unknown*"
    for unit, k in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(v) >= k:
            return f"{v / k:.3g}{unit}"
    return f"{v:g}"


def _rows(cost: Cost, depth: int | None) -> Iterator[CallCost]:
    return (c for c in cost.calls.values() if depth is None or c.path.count("/") < depth)


def _table(cost: Cost, depth: int | None) -> str:
    rows = [("call", "type", "FLOPs", "transc.", "bytes", "own FLOPs", "coll. bytes", "own collectives")]
    u = cost.unattributed
    extra = [("(not attributed†)", u)] if u is not None and any(v != 0 for v in u.own.values()) else []
    for label, c in [*((c.path or "(root)", c) for c in _rows(cost, depth)), *extra]:
        coll = ", ".join(f"{x.kind}×{x.runs if x.runs is not None else '?'} {_fmt(x.bytes)}B" for x in c.collectives)
        rows.append((label, c.type, _fmt(c.total["flops"]), _fmt(c.total["transcendentals"]),
                     _fmt(c.total["bytes_accessed"]), _fmt(c.own["flops"]), _fmt(c.total["collective_bytes"]), coll))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    x = cost.xla
    lines.append("")
    lines.append(f"XLA's totals (a loop body once): {_fmt(x.get('flops', 0.0))} FLOPs, "
                 f"{_fmt(x.get('transcendentals', 0.0))} transcendentals, "
                 f"{_fmt(x.get('bytes accessed', 0.0))} bytes accessed"
                 + ("" if cost.counted is None else " (recounted per instruction: equal)" if _equal(cost) else
                    " (recounted per instruction: DIFFERENT, please report)"))
    whys = sorted({c.why for c in cost.calls.values() if c.why})
    lines += [f"* {w}" for w in whys]
    lines += [f"! {r}" for r in cost.replicated]
    if extra:
        lines.append(f"† {cost.unattributed.instructions} instruction(s) XLA made without naming what they came "  # type: ignore[union-attr]
                     "from (no metadata): in the root's total, in no call's.")
    for first, last, n in cost.unrolled:
        lines.append(f"i `{first}` … `{last}`: {n} identical calls, unrolled: XLA compiles each one; a scan over "
                     f"them (`nn.scan`, `jax.lax.scan`) compiles one, and compiles faster")
    if cost.memory:
        m = cost.memory
        lines.append(f"memory per device (XLA): arguments {_fmt(m.get('argument'))}B, outputs {_fmt(m.get('output'))}B, "
                     f"temporaries {_fmt(m.get('temp'))}B; what each module holds at the peak is not attributed "
                     "(XLA's buffer assignment is not public)")
    s = cost.seconds
    lines.append(f"per device, {cost.devices} device(s); trace {s['trace']:.2f} s, lower {s['lower']:.2f} s, "
                 f"compile {s['compile']:.2f} s")
    return "\n".join(lines)


def _equal(cost: Cost) -> bool:
    """Whether the recount is XLA's total, up to XLA's rounding: it adds its counts in float32
    (exact to 2**24), an instruction at a time, so ``n`` instructions round by ``n·2**-24`` at most."""
    if cost.counted is None:
        return False
    n = sum(c.instructions for c in cost.calls.values()) + (cost.unattributed.instructions if cost.unattributed else 0)
    pairs = [("flops", "flops"), ("transcendentals", "transcendentals"), ("bytes_accessed", "bytes accessed")]
    return all(abs(cost.counted[a] - cost.xla.get(b, 0.0)) <= n * 2.0 ** -24 * abs(cost.xla.get(b, 0.0))
               for a, b in pairs)


def _type(node: Mox) -> str:
    t = node.info.type
    name = t.__name__ if isinstance(t, type) else node.name
    method = node.info.method
    return name + (f"·{method}" if method not in (None, "__call__", node.name) else "")
