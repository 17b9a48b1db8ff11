"""A compiled XLA program as data: its HLO text parsed into instructions, and
XLA's own cost rules applied to each of them.

``jax.stages.Compiled.cost_analysis()`` gives a program's FLOPs,
transcendentals and bytes accessed as totals only; ``Compiled.as_text()`` gives
every instruction of the optimised program with the name scopes it was traced
under (``metadata={op_name=...}``). This module reads that text (public
output, no private API) and applies, per instruction, the rules of XLA's
``HloCostAnalysis`` (xla/service/hlo_cost_analysis.cc): elementwise ops one
FLOP (or one transcendental) per output element, ``dot`` two per multiply-add,
a ``reduce`` its reducer once per reduced element, a fusion what its fused
instructions cost with the bytes of its operands as read and its output, a
``while`` body counted once. `Program.totals` added up the way XLA adds them
equals ``cost_analysis()`` (tested); `Program.costs` gives each instruction
with how many times it runs (a ``while`` loop's known trip count), which XLA's
totals leave out. An instruction whose cost XLA does not know (a custom call)
is listed in `Program.unknown`, never counted as zero.

It knows nothing of MoX: `yax._cost` names each instruction's module.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator

_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][a-z0-9\-]*)\((.*)$")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_CALLED = re.compile(
    r"\b(calls|to_apply|body|condition|branch_computations|true_computation|false_computation"
    r"|called_computations|select|scatter)=(\{[^}]*\}|%?[\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_DIMS = r"=\{([0-9,]*)\}"

#: Bytes of one element of an HLO element type (sub-byte types as XLA:CPU stores them: one byte).
_BITS = {"pred": 8, "bf16": 16, "f16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128, "token": 0}

#: Elementwise opcodes XLA counts as transcendentals (one per output element), not FLOPs.
TRANSCENDENTAL = frozenset({
    "exponential", "log", "logistic", "power", "sqrt", "cbrt", "rsqrt", "tanh", "sine", "cosine",
    "exponential-minus-one", "log-plus-one", "atan2", "tan", "erf",
})
#: Elementwise opcodes XLA counts one FLOP per output element.
ELEMENTWISE = frozenset({
    "abs", "add", "and", "bitcast-convert", "ceil", "clamp", "compare", "complex", "convert",
    "count-leading-zeros", "divide", "floor", "imag", "is-finite", "maximum", "minimum", "multiply",
    "negate", "not", "or", "popcnt", "real", "reduce-precision", "remainder", "round-nearest-afz",
    "round-nearest-even", "select", "shift-left", "shift-right-arithmetic", "shift-right-logical",
    "sign", "stochastic-convert", "subtract", "xor",
})
#: Opcodes that run other computations: what they cost is what those cost.
_CALLING = frozenset({"fusion", "call", "while", "conditional", "async-start"})
#: Opcodes that apply a computation element by element: its cost is theirs.
_APPLYING = frozenset({"reduce", "reduce-window", "map", "scatter", "sort", "select-and-scatter"})
#: Opcodes that move no bytes in XLA's count.
_NO_BYTES = frozenset({"parameter", "constant", "get-tuple-element", "bitcast", "after-all",
                       "add-dependency", "domain"})
#: Collective opcodes (and their asynchronous starts).
COLLECTIVES = frozenset({
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
    "collective-broadcast", "ragged-all-to-all",
    "all-reduce-start", "all-gather-start", "collective-permute-start",
})


def _element_bytes(dtype: str) -> int:
    if dtype in _BITS:
        return _BITS[dtype] // 8
    m = re.fullmatch(r"[suf](\d+)", dtype)
    if m:
        return max(1, int(m.group(1)) // 8)
    if dtype.startswith(("f8", "f4", "f6")):
        return 1
    raise ValueError(f"unknown HLO element type {dtype!r}")


def arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """The (element type, dimensions) of every array in an HLO shape text (a tuple's, in order)."""
    return [(d, tuple(int(x) for x in dims.split(",") if x)) for d, dims in _SHAPE.findall(shape)]


def nbytes(shape: str) -> int:
    """Bytes of an HLO shape (a tuple's arrays added up)."""
    return sum(_element_bytes(d) * math.prod(s) for d, s in arrays(shape))


def elements(shape: str) -> int:
    """Elements of an HLO array shape (of a tuple's first array, as XLA counts a variadic op)."""
    found = arrays(shape)
    return math.prod(found[0][1]) if found else 0


@dataclasses.dataclass
class Instruction:
    """One HLO instruction, as the text shows it."""

    name: str
    shape: str
    opcode: str
    operands: list[str]
    attrs: str
    op_name: str
    called: list[str]
    computation: str
    root: bool = False
    number: int = -1  # a parameter's

    def dims(self, key: str) -> list[int]:
        m = re.search(key + _DIMS, self.attrs)
        return [int(x) for x in m.group(1).split(",") if x] if m else []


@dataclasses.dataclass
class Counts:
    """What one instruction costs each time it runs, by XLA's rules."""

    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_accessed: float = 0.0

    def __add__(self, o: Counts) -> Counts:
        return Counts(self.flops + o.flops, self.transcendentals + o.transcendentals, self.bytes_accessed + o.bytes_accessed)

    def __mul__(self, k: float) -> Counts:
        return Counts(self.flops * k, self.transcendentals * k, self.bytes_accessed * k)

    def without_bytes(self) -> Counts:
        return Counts(self.flops, self.transcendentals, 0.0)

    def max(self, o: Counts) -> Counts:
        return Counts(max(self.flops, o.flops), max(self.transcendentals, o.transcendentals),
                    max(self.bytes_accessed, o.bytes_accessed))


@dataclasses.dataclass
class Placed:
    """An instruction with its own cost (the cost of the instructions it runs not
    included; ``None`` where XLA does not know it) and how many times it runs per run of
    the program: ``None`` where that is known only when it runs (a ``while`` without a
    known trip count, a ``conditional``'s branch), with ``why``."""

    instr: Instruction
    cost: Counts | None
    runs: int | None
    why: str = ""


class Program:
    """A compiled program's instructions and XLA's cost of each (module docstring)."""

    def __init__(self, text: str):
        self.computations: dict[str, list[Instruction]] = {}
        self.entry = ""
        self.by_name: dict[str, Instruction] = {}
        current: list[Instruction] | None = None
        name = ""
        for line in text.splitlines():
            h = _HEADER.match(line)
            if h:
                name = h.group(2)
                current = self.computations.setdefault(name, [])
                if h.group(1):
                    self.entry = name
                continue
            if line.strip() == "}":
                current = None
                continue
            if current is None:
                continue
            i = _parse(line, name)
            if i is not None:
                current.append(i)
                self.by_name[i.name] = i
        if not self.entry:
            raise ValueError("no ENTRY computation in the HLO text")
        #: instruction name -> the instructions with it among their operands (each once), and
        #: computation -> the instructions that run it (names are unique in a module)
        self._readers: dict[str, list[Instruction]] = {}
        self._callers: dict[str, list[Instruction]] = {}
        for instrs in self.computations.values():
            for j in instrs:
                for o in dict.fromkeys(j.operands):
                    self._readers.setdefault(o, []).append(j)
                for c in j.called:
                    self._callers.setdefault(c, []).append(j)

    def users(self, i: Instruction) -> list[Instruction]:
        """The instructions that read ``i``: in its computation (where a fusion, a call or a loop
        reads it, the parameter of the computation it runs that receives it), and, for the root of
        a computation, the instructions that run that computation."""
        out: list[Instruction] = []
        for j in self._readers.get(i.name, []):
            if j.opcode in ("fusion", "call", "while"):
                ks = [k for k, o in enumerate(j.operands) if o == i.name]
                out += [p for c in j.called for p in self.computations[c] if p.opcode == "parameter" and p.number in ks]
            else:
                out.append(j)
        return out + (self._callers.get(i.computation, []) if i.root else [])

    def producer(self, i: Instruction) -> Instruction:
        """What a fused computation's parameter receives (the operand of the fusion running it),
        followed out of nested fusions; any other instruction itself."""
        while i.opcode == "parameter" and i.computation != self.entry:
            callers = [c for c in self._callers.get(i.computation, []) if c.opcode == "fusion"]
            if len(callers) != 1 or i.number >= len(callers[0].operands):
                return i
            i = self.by_name[callers[0].operands[i.number]]
        return i

    def operand_shape(self, i: Instruction, k: int) -> str:
        return self.by_name[i.operands[k]].shape

    # -- XLA's rules, one instruction ------------------------------------------------------

    def own(self, i: Instruction) -> Counts | None:
        """What ``i`` itself costs each time it runs, by `HloCostAnalysis`'s rules, not
        counting the computations it runs (see `totals`); ``None`` where XLA does not know."""
        op = i.opcode
        if op in ("custom-call", "select-and-scatter"):
            return None  # XLA: unknown (-1); select-and-scatter's window cost is not modelled here
        flops = trans = 0.0
        if op in TRANSCENDENTAL:
            trans = elements(i.shape)
        elif op in ELEMENTWISE:
            flops = elements(i.shape)
        elif op == "dot":
            lhs = arrays(self.operand_shape(i, 0))[0][1]
            flops = 2 * elements(i.shape) * math.prod(lhs[d] for d in i.dims("lhs_contracting_dims"))
        elif op == "convolution":
            flops = _conv_flops(arrays(self.operand_shape(i, 0))[0][1], arrays(self.operand_shape(i, 1))[0][1],
                                arrays(i.shape)[0][1], i.attrs)
        elif op in ("all-reduce", "all-reduce-start"):
            flops = sum(math.prod(s) for _, s in arrays(i.shape))
        elif op == "sort":
            n = elements(self.operand_shape(i, 0))
            flops = n * max(0, (n - 1).bit_length())
        elif op in ("rng", "rng-bit-generator"):
            trans = sum(math.prod(s) for _, s in arrays(i.shape)) if op == "rng-bit-generator" else elements(i.shape)
        return Counts(flops, trans, self._bytes(i))

    def repeats(self, i: Instruction) -> float:
        """How many times a computation ``i`` calls is applied per run of ``i`` (a reducer,
        a mapped function), as XLA multiplies its cost; 1 for fusions, calls and loops."""
        op = i.opcode
        if op == "reduce":
            return elements(self.operand_shape(i, 0)) - elements(i.shape)
        if op == "reduce-window":
            window = [int(x) for x in re.findall(r"size=([0-9x]+)", i.attrs)[0].split("x")] if "size=" in i.attrs else [1]
            return (math.prod(window) - 1) * elements(i.shape)
        if op == "map":
            return elements(i.shape)
        if op == "scatter":
            n = (len(i.operands) - 1) // 2
            return elements(self.operand_shape(i, n + 1))
        return 1

    def _bytes(self, i: Instruction) -> float:
        op = i.opcode
        if op in _NO_BYTES:
            return 0
        if op == "tuple":
            return 8 * len(i.operands)  # the index table of pointers
        if op in ("while", "call", "conditional", "async-start"):
            return 0  # what the called computations access is theirs
        if op == "fusion":
            return self._fusion_bytes(i)
        if op == "slice":
            return 2 * nbytes(i.shape)
        if op == "dynamic-slice":
            return 2 * nbytes(i.shape) + nbytes(self.operand_shape(i, 1))
        if op == "dynamic-update-slice":
            return 2 * nbytes(self.operand_shape(i, 1)) + nbytes(self.operand_shape(i, 2))
        if op == "gather":
            return 2 * nbytes(i.shape) + nbytes(self.operand_shape(i, 1))
        if op == "scatter":
            n = (len(i.operands) - 1) // 2
            updates = sum(nbytes(self.operand_shape(i, n + 1 + k)) for k in range(n))
            return 3 * updates + nbytes(self.operand_shape(i, n))
        return nbytes(i.shape) + sum(nbytes(self.operand_shape(i, k)) for k in range(len(i.operands)))

    def _fusion_bytes(self, i: Instruction) -> float:
        instrs = self.computations[i.called[0]]
        root = next((j for j in instrs if j.root), instrs[-1])
        if root.opcode == "dynamic-update-slice":
            out = nbytes(self.operand_shape(root, 1))
        elif root.opcode == "tuple":
            out = 0
            for o in root.operands:
                j = self.by_name[o]
                out += nbytes(self.operand_shape(j, 1)) if j.opcode == "dynamic-update-slice" else nbytes(j.shape)
        else:
            out = nbytes(i.shape)
        read = sum(self._param_read(j) for j in instrs if j.opcode == "parameter")
        return out + read

    def _param_read(self, p: Instruction) -> float:
        """XLA's ``FusionParameterReadBytes``: what a fused computation reads of a parameter."""
        size = 0.0
        seen = False
        for u in self._readers.get(p.name, []):
            op = u.opcode
            if op == "slice":
                size += nbytes(u.shape)
            elif op == "dynamic-slice":
                if u.operands[0] == p.name:
                    size += nbytes(u.shape)
                elif not seen:
                    seen, size = True, size + nbytes(p.shape)
            elif op == "dynamic-update-slice":
                if u.operands[0] != p.name and not seen:
                    seen, size = True, size + nbytes(p.shape)
            elif op in ("broadcast", "reshape"):
                size += nbytes(p.shape)
            elif not seen:
                seen, size = True, size + nbytes(p.shape)
        return size

    # -- the whole program -------------------------------------------------------------------

    def totals(self) -> Counts | None:
        """The program's cost added up as XLA's ``cost_analysis()`` adds it (a ``while``
        body once, the costliest branch of a ``conditional``); ``None`` where an
        instruction's cost is unknown to XLA."""
        return self._computation_total(self.entry)

    def _computation_total(self, comp: str) -> Counts | None:
        total = Counts()
        for i in self.computations[comp]:
            c = self._instruction_total(i)
            if c is None:
                return None
            total = total + c
        return total

    def _instruction_total(self, i: Instruction) -> Counts | None:
        own = self.own(i)
        if own is None:
            return None
        if i.opcode not in _CALLING | _APPLYING or i.opcode in ("sort", "select-and-scatter"):
            return own  # XLA counts no reducer of an all-reduce, no comparator of a sort
        held = Counts()
        for c in i.called:
            sub = self._computation_total(c)
            if sub is None:
                return None
            held = held.max(sub) if i.opcode == "conditional" else held + sub  # the costliest branch
        held = held * self.repeats(i)
        return own + (held.without_bytes() if i.opcode == "fusion" or i.opcode in _APPLYING else held)

    def costs(self) -> Iterator[Placed]:
        """Every instruction that costs something, with its own cost and how many times it
        runs per run of the program (loops by their known trip counts)."""
        yield from self._placed(self.entry, 1, "", False)

    def _placed(self, comp: str, runs: int | None, why: str, fused: bool) -> Iterator[Placed]:
        for i in self.computations[comp]:
            own = self.own(i)
            if own is not None and fused:
                own = own.without_bytes()  # what a fusion reads and writes is the fusion's
            if own is None:
                yield Placed(i, None, runs, why)
                continue
            if i.opcode in _APPLYING:
                # the applied computation's cost belongs to this instruction
                sub = self._computation_total(i.called[0]) if i.opcode != "sort" else Counts()
                extra = Counts() if sub is None else sub.without_bytes() * self.repeats(i)
                yield Placed(i, own + extra, runs, why)
                continue
            yield Placed(i, own, runs, why)
            if i.opcode == "while":
                m = _TRIP.search(i.attrs)
                body, cond = _while_parts(i)
                inner = None if runs is None or m is None else runs * int(m.group(1))
                w = why or ("" if m else "inside a `while` loop whose trip count XLA does not know")
                yield from self._placed(body, inner, w, fused)
                yield from self._placed(cond, None if inner is None else inner + runs, w, fused)  # type: ignore[operator]
            elif i.opcode == "conditional":
                for c in i.called:
                    yield from self._placed(c, None, why or "in one branch of a `conditional`, chosen when it runs", fused)
            elif i.opcode in _CALLING:
                for c in i.called:
                    yield from self._placed(c, runs, why, fused or i.opcode == "fusion")


def _while_parts(i: Instruction) -> tuple[str, str]:
    body = re.search(r"\bbody=%?([\w.\-]+)", i.attrs)
    cond = re.search(r"\bcondition=%?([\w.\-]+)", i.attrs)
    assert body and cond
    return body.group(1), cond.group(1)


def _parse(line: str, computation: str) -> Instruction | None:
    m = _INSTR.match(line)
    if not m:
        return None
    root, name, shape, opcode, rest = m.groups()
    depth, k = 1, 0
    while depth and k < len(rest):
        if rest[k] == "(":
            depth += 1
        elif rest[k] == ")":
            depth -= 1
        k += 1
    operands = re.findall(r"%([\w.\-]+)", rest[:k - 1]) if opcode != "constant" else []
    attrs = rest[k:]
    meta = _OP_NAME.search(attrs)
    called: list[str] = []
    for _, v in _CALLED.findall(attrs):
        called += re.findall(r"%?([\w.\-]+)", v.strip("{}"))
    number = int(rest[:k - 1]) if opcode == "parameter" and rest[:k - 1].isdigit() else -1
    return Instruction(name, shape, opcode, operands, attrs, meta.group(1) if meta else "", called, computation,
                       bool(root), number)


def _conv_flops(lhs: tuple[int, ...], rhs: tuple[int, ...], out: tuple[int, ...], attrs: str) -> float:
    """XLA's ``GetConvolutionFlops``: two per multiply-add over the window positions that
    fall inside the input (padding and dilation skipped)."""
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", attrs)
    assert labels, attrs
    ll, rl, ol = labels.groups()
    spatial = sorted(c for c in ll if c.isdigit())
    window = re.search(r"window=\{([^}]*)\}", attrs)
    fields = dict(f.split("=") for f in window.group(1).split()) if window else {}
    n = len(spatial)

    def per_dim(key: str, default: str) -> list[str]:
        return fields[key].split("x") if key in fields else [default] * n

    stride, pad = per_dim("stride", "1"), per_dim("pad", "0_0")
    lhs_dilate, rhs_dilate = per_dim("lhs_dilate", "1"), per_dim("rhs_dilate", "1")
    positions = 1
    for k, d in enumerate(spatial):
        i_n, k_n, o_n = lhs[ll.index(d)], rhs[rl.index(d)], out[ol.index(d)]
        s, bd, wd = int(stride[k]), int(lhs_dilate[k]), int(rhs_dilate[k])
        lo, hi = (int(x) for x in pad[k].split("_"))
        if i_n == o_n == k_n == bd and wd == 1 and max(1, i_n - 1) == s and lo == hi == 0:
            positions *= i_n
            continue
        if i_n == 1 and k_n == o_n and wd == bd == s == 1 and lo == hi == o_n - 1:
            positions *= o_n
            continue
        count = 0
        for ki in range(k_n):
            for oi in range(o_n):
                u = oi * s - lo + ki * wd
                li = u // bd if bd > 1 else u
                if u == li * bd and 0 <= li < i_n:
                    count += 1
        positions *= count
    fgc = re.search(r"feature_group_count=(\d+)", attrs)
    bgc = re.search(r"batch_group_count=(\d+)", attrs)
    in_f, out_f, batch = lhs[ll.index("f")], out[ol.index("f")], lhs[ll.index("b")]
    fma = (in_f // int(fgc.group(1) if fgc else 1)) * out_f * (batch // int(bgc.group(1) if bgc else 1)) * positions
    return 2.0 * fma
