"""Turning a marked jaxpr (see `_trace`) into a MoX tree."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

import jax
import jax.extend.core as jcore
import numpy as np

from ._ir import Equation, Kind, Literal, ModuleInfo, Mox, Packing, Signature, Symbol, Var
from ._record import LAYOUT_SCOPE, MARKER_RE, CallInfo, Recorder
from .errors import YaxTraceError


def _layout(eqn: Any) -> str | None:
    """``"unit"`` for the unit axis `_record._canonical` adds, ``"squeeze"`` for its removal, else ``None``."""
    name: str = eqn.primitive.name
    if name not in ("broadcast_in_dim", "squeeze") or LAYOUT_SCOPE not in str(eqn.source_info.name_stack):
        return None
    if name == "squeeze":
        return name
    (x,), (y,) = eqn.invars, eqn.outvars
    shape = tuple(getattr(x.aval, "shape", ()))
    # only a unit axis added, the others kept in order (under vmap, after the mapped ones)
    dims = tuple(eqn.params["broadcast_dimensions"])
    out = tuple(y.aval.shape)
    added = set(range(len(out))) - set(dims)
    if (isinstance(x, jcore.Literal) or len(out) != len(shape) + 1 or list(dims) != sorted(dims)
            or tuple(out[d] for d in dims) != shape or len(added) != 1 or out[added.pop()] != 1):
        return None
    return "unit"


def _marker(eqn: Any) -> tuple[str, int] | None:
    if eqn.primitive.name != "optimization_barrier":
        return None
    found = MARKER_RE.findall(str(eqn.source_info.name_stack))
    if not found:
        return None
    kind, cid = found[-1]
    return kind, int(cid)


class _SharedConsts:
    """Equal constant arrays as one object.

    Models build constant tables per layer (Hugging Face Llama's rotary
    sin/cos tables: 4 MB in each of 32 layers at 7B); the jaxpr holds every
    copy, the MoX holds one. Arrays are equal when type, shape, dtype, weak
    type and every byte are (so ``-0.0`` and NaN payloads stay apart); a sample
    of bytes spread over the array picks the candidates, so distinct arrays
    of one shape are rarely compared in full. Arrays on devices other than
    the CPU are left alone (comparing them would copy them to the host).
    """

    MIN_BYTES = 1024  # smaller ones cost more to compare than they hold

    def __init__(self) -> None:
        self.seen: dict[tuple[Any, ...], list[tuple[Any, np.ndarray]]] = {}

    def __call__(self, c: Any) -> Any:
        host = _host_bytes(c, self.MIN_BYTES)
        if host is None:
            return c
        step = max(1, host.size // 256)
        key = (type(c), np.shape(c), str(c.dtype), getattr(c, "weak_type", None), host[::step].tobytes())
        kept = self.seen.setdefault(key, [])
        for d, d_host in kept:
            if np.array_equal(host, d_host):
                return d
        kept.append((c, host))
        return c


def _host_bytes(c: Any, min_bytes: int) -> np.ndarray | None:
    """``c``'s bytes as a flat uint8 array without copying, or ``None`` for
    what is not compared (small, object or extended dtype such as PRNG keys,
    not on the CPU)."""
    if not hasattr(c, "__array__") or not isinstance(getattr(c, "dtype", None), np.dtype):
        return None
    if isinstance(c, jax.Array) and (
            not c.is_fully_addressable or any(d.platform != "cpu" for d in c.devices())):
        return None
    c = np.asarray(c)  # the plain ndarray in JAX's typed constants (a subclass or a wrapper)
    if c.nbytes < min_bytes or c.dtype.hasobject or not c.flags.c_contiguous:
        return None
    flat: np.ndarray = c.reshape(-1).view(np.uint8)
    return flat


_JAXPRS = (jcore.Jaxpr, jcore.ClosedJaxpr)
_NO_JAXPRS: Mapping[str, Any] = types.MappingProxyType({})


class _Converter:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.vars: dict[Any, Var] = {}
        self.shared = _SharedConsts()

    def var(self, v: Any) -> Var:
        out = self.vars.get(v)
        if out is None:
            a = v.aval
            out = self.vars[v] = Var(getattr(a, "shape", ()), getattr(a, "dtype", None), getattr(a, "weak_type", False))
        return out

    def atom(self, a: Any) -> Symbol:
        if isinstance(a, jcore.Literal):
            av = a.aval
            return Literal(a.val, getattr(av, "shape", ()), getattr(av, "dtype", None), getattr(av, "weak_type", False))
        return self.var(a)

    def jaxpr(self, jaxpr: Any, consts: tuple[Any, ...] = (), path: str = "") -> tuple[tuple[Any, ...], tuple[Any, ...], list[Any], tuple[Any, ...], bool]:
        """Convert one (open) jaxpr. Returns constvars, invars, children,
        outvars, and whether any marker was found (so the original jaxpr
        cannot be reused for evaluation)."""
        constvars = tuple(self.var(v) for v in jaxpr.constvars)
        invars = tuple(self.var(v) for v in jaxpr.invars)
        # Each frame: (call id, info, children, pending node fields, path)
        frames: list[list[Any]] = [[None, None, [], None, path]]
        marked = False
        # The unit axes `_record._canonical` adds, held back until their removal: the pair is dropped
        # (the removal's result is the added axis's operand). One used otherwise is emitted where it is used.
        held: dict[Any, Any] = {}

        def emit(e: Any) -> None:
            for v in e.invars:
                if held and not isinstance(v, jcore.Literal) and v in held:
                    emit(held.pop(v))
            frames[-1][2].append(self.equation(e, frames[-1][4]))

        for eqn in jaxpr.eqns:
            layout = _layout(eqn)
            if layout == "unit":
                held[eqn.outvars[0]] = eqn
                continue
            if layout == "squeeze" and not isinstance(eqn.invars[0], jcore.Literal) and eqn.invars[0] in held:
                unit = held[eqn.invars[0]]
                if tuple(unit.invars[0].aval.shape) == tuple(eqn.outvars[0].aval.shape):
                    del held[eqn.invars[0]]
                    self.vars[eqn.outvars[0]] = self.var(unit.invars[0])
                    continue
            m = _marker(eqn)
            if m is None:
                emit(eqn)
                continue
            while held:  # none, unless a transform moved an added axis's use past a marker
                emit(held.pop(next(iter(held))))
            marked = True
            kind, cid = m
            info: CallInfo | None = self.rec.calls.get(cid)
            if info is None:
                if cid in self.rec.raised:
                    # the entry of a call that ended by an exception the model caught: no call, and
                    # the barrier is the identity, so its results are its operands
                    for o, a in zip(eqn.outvars, eqn.invars):
                        self.vars[o] = self.atom(a)  # type: ignore[assignment]
                else:  # an earlier trace's, in a jaxpr JAX had cached (`_record._IDS`): no call of ours
                    emit(eqn)
                continue
            if kind == "in":
                n = len(info.sig.ins.dyn)
                inputs = tuple(self.atom(a) for a in eqn.invars[:n])
                formals = tuple(self.var(v) for v in eqn.outvars[:n])
                frames.append([cid, info, [], (inputs, formals, eqn.source_info), info.path])
            else:
                if len(frames) <= 1 or frames[-1][0] != cid:
                    raise YaxTraceError(
                        f"Internal error: the call of `{info.path}` ended inside another call. Please report this."
                    )
                _, _, children, (inputs, formals, entry), _ = frames.pop()
                n = len(info.sig.outs.dyn)
                frames[-1][2].append(
                    Mox(
                        kind=info.kind,
                        children=tuple(children),
                        inputs=inputs,
                        invars=formals,
                        outvars=tuple(self.atom(a) for a in eqn.invars[:n]),
                        outputs=tuple(self.var(v) for v in eqn.outvars[:n]),
                        path=info.path,
                        name=info.name,
                        info=_timed(info),
                        sig=info.sig,
                        source_info=entry,  # its traceback runs through the caller's line (`yax._source`)
                    )
                )
        while held:
            emit(held.pop(next(iter(held))))
        if len(frames) != 1:
            raise YaxTraceError(
                f"Internal error: the call of `{frames[-1][1].path}` never returned in the trace. Please report this."
            )
        outvars = tuple(self.atom(a) for a in jaxpr.outvars)
        return constvars, invars, frames[0][2], outvars, marked

    def sub(self, value: Any, path: str) -> tuple[Mox, bool]:
        if isinstance(value, jcore.ClosedJaxpr):
            jaxpr, consts = value.jaxpr, tuple(map(self.shared, value.consts))
        else:
            jaxpr, consts = value, ()
        constvars, invars, children, outvars, marked = self.jaxpr(jaxpr, consts, path)
        mox = _block(Kind.JAXPR, constvars, invars, children, outvars, consts, path=path,
                     info=ModuleInfo(attrs={"closed": isinstance(value, jcore.ClosedJaxpr)}))
        return mox, marked

    def equation(self, eqn: Any, path: str) -> Equation:
        # Most equations hold no jaxpr: they share JAX's params dict (never changed) and one empty `_jaxprs`.
        params: dict[str, Any] = eqn.params
        originals: dict[str, Any] = {}
        sub: Mox | tuple[Mox, ...]
        for k, v in eqn.params.items():
            if isinstance(v, _JAXPRS):
                sub, marked = self.sub(v, path)
            elif isinstance(v, tuple) and v and all(isinstance(x, _JAXPRS) for x in v):
                subs = [self.sub(x, path) for x in v]
                sub, marked = tuple(s for s, _ in subs), any(m for _, m in subs)
            else:
                continue
            if params is eqn.params:
                params = dict(params)
            params[k] = sub
            if not marked:
                originals[k] = v
        return Equation(
            primitive=eqn.primitive,
            params=params,
            inputs=tuple(map(self.atom, eqn.invars)),
            outputs=tuple(map(self.var, eqn.outvars)),
            path=path,
            source_info=eqn.source_info,
            ctx=getattr(eqn, "ctx", None),
            _jaxprs=originals if params is not eqn.params else _NO_JAXPRS,
        )


def build(closed: Any, rec: Recorder, ins: Packing, outs: Packing, *, name: str, frontend: str,
          origin: Any = None) -> Mox:
    """The root MoX of a traced function."""
    conv = _Converter(rec)
    consts = tuple(map(conv.shared, closed.consts))
    constvars, invars, children, outvars, _ = conv.jaxpr(closed.jaxpr, consts, "")
    return _block(Kind.ROOT, constvars, invars, children, outvars, consts, name=name,
                  sig=Signature(ins, outs), frontend=frontend, origin=origin)


def _block(kind: Kind, constvars: tuple[Any, ...], invars: tuple[Any, ...], children: list[Any], outvars: tuple[Any, ...], consts: tuple[Any, ...],
           **fields: Any) -> Mox:
    """A root or nested computation: its own inputs are its formal parameters."""
    return Mox(kind=kind, children=tuple(children), inputs=invars, invars=invars, outvars=outvars,
               outputs=tuple(a for a in outvars if isinstance(a, Var)), constvars=constvars, consts=consts,
               **fields)


def _timed(call: CallInfo) -> ModuleInfo:
    """The call's `ModuleInfo` with the seconds its trace took. The call keeps the very object
    the node holds (a frontend's `settle` finds a node's call by it)."""
    if call.seconds is not None and call.info.seconds != call.seconds:
        call.info = dataclasses.replace(call.info, seconds=call.seconds)
    return call.info
