"""Requests from the front-end and their replies (docs/widget.md, "Requests").

A request is ``{"type": ..., "rid": int, ...}``; its reply is ``{"type":
"ok", "rid", ...}`` or ``{"type": "error", "rid", "message"}``, exactly one
per request. The front-end is never trusted: each request type is a frozen
dataclass whose `parse` checks the message's fields (no field it does not
name, each of its type) before anything runs; node ids must name a node of
the current model and replacements are chosen by the name Python
registered. `answer` runs a parsed request on a `Session` through the
session's public commands, one request at a time (`Session.lock`); a request
that fails changes nothing. What one request may cost is bounded: an XPath's
length, how many ids one names (repeated ones are answered once), and the files
the Save HTML and Export buttons write (`MAX_WRITES`; a repeated request writes
nothing).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import yax
from yax.internal import CALL_KINDS, view

from ._palette import PartialFit
from ._payloads import EQUATION_NAMES, equation_rows, source
from ._providers import PROVIDERS
from ._values import SCALARS, STATS

if TYPE_CHECKING:
    from ._session import Session

MAX_QUERY = 4000  # characters of an XPath the front-end may send
MAX_IDS = 100_000  # ids one request may name (`equations`, `graph`'s `open`, `substitute`); repeated ones count once
#: The snapshots, and the exports, one explorer's buttons may write (each): the front-end is not trusted, so
#: what it can make the kernel write is bounded. `Explorer.save_html` and `Explorer.export` are not.
MAX_WRITES = 20
_log = logging.getLogger("yax_widget")


class RequestError(yax.YaxInputError):
    """A malformed or refused request from the front-end: replied to, nothing changes."""


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclasses.dataclass(frozen=True)
class Request:
    """A request the front-end sends; subclasses name their fields and check them."""

    type: ClassVar[str]

    @classmethod
    def parse(cls, content: dict) -> Request:
        names = {f.name for f in dataclasses.fields(cls)}
        extra = sorted(set(content) - names - {"type", "rid"}, key=str)
        if extra:
            raise RequestError(f"A `{cls.type}` request has no field `{str(extra[0])[:40]}`; its fields are "
                               f"{', '.join(f'`{n}`' for n in sorted(names)) or 'none'}.")
        # a missing field is None (refused by the check naming it), unless the field has a default
        req = cls(**{f.name: content.get(f.name) for f in dataclasses.fields(cls)
                     if f.name in content or f.default is dataclasses.MISSING})
        req.check()
        return req

    def check(self) -> None:
        """Refuse fields of the wrong type or range (`RequestError`)."""

    def run(self, s: Session) -> dict:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Query(Request):
    type = "query"
    xpath: Any

    def check(self) -> None:
        if not isinstance(self.xpath, str) or len(self.xpath) > MAX_QUERY:
            raise RequestError(f"`xpath` must be a string of at most {MAX_QUERY} characters.")

    def run(self, s: Session) -> dict:
        res = s.query(self.xpath)
        return {"count": len(s.state["matches"]) if isinstance(res, list) else _plain(res)}


@dataclasses.dataclass(frozen=True)
class Expand(Request):
    type = "expand"
    id: Any

    def run(self, s: Session) -> dict:
        node = s.node(self.id, CALL_KINDS)
        ids = view(s.mox).ids
        return {"id": ids[id(node)], "columns": list(EQUATION_NAMES), "rows": equation_rows(node, ids)}


@dataclasses.dataclass(frozen=True)
class Equations(Request):
    """The equations of several calls in one reply: "expand all" opens every call of a 70B
    model's tree (1,300 calls running 10,000 equations), which one `expand` each would
    answer in as many round trips."""

    type = "equations"
    ids: Any

    def check(self) -> None:
        if not isinstance(self.ids, list) or len(self.ids) > MAX_IDS or not all(map(_int, self.ids)):
            raise RequestError(f"`ids` must be a list of at most {MAX_IDS} call row ids, not {str(self.ids)[:40]!r}.")

    def run(self, s: Session) -> dict:
        # each call once, in the order first named: 100,000 of one id cost 27 s and a 140 MB reply
        asked = list(dict.fromkeys(self.ids))
        nodes = [s.node(i, CALL_KINDS, "ids") for i in asked]  # every id checked before any row is built
        ids = view(s.mox).ids
        return {"columns": list(EQUATION_NAMES), "calls": [[i, equation_rows(n, ids)] for i, n in zip(asked, nodes)]}


@dataclasses.dataclass(frozen=True)
class Fits(Request):
    type = "fits"
    id: Any

    def run(self, s: Session) -> dict:
        fits, refused = s.fits(s.node(self.id))
        return {"id": self.id, "fits": fits, "refused": refused}


@dataclasses.dataclass(frozen=True)
class Substitute(Request):
    """A drop of palette item ``name`` on row ``target``, or on the query box
    (``target="query"``; ``xpath``: the text the box shows, which must be the
    query whose matches are highlighted). ``ids``, with ``target="query"``:
    only those matches, the ones a refused drop's reply said it fits (its
    ``fits``), in one change; each is checked again."""

    type = "substitute"
    target: Any
    name: Any
    xpath: Any = None
    ids: Any = None

    def check(self) -> None:
        if not isinstance(self.name, str):
            raise RequestError(f"`name` must be the name of a registered replacement, not {str(self.name)[:40]!r}.")
        if self.target != "query" and not _int(self.target):
            raise RequestError(f"`target` must be a row id or \"query\", not {str(self.target)[:40]!r}.")
        if self.xpath is not None and not isinstance(self.xpath, str):
            raise RequestError("`xpath` must be the query box's text.")
        if self.ids is not None and (self.target != "query" or not isinstance(self.ids, list) or not self.ids
                                     or len(self.ids) > MAX_IDS or not all(map(_int, self.ids))
                                     or len(set(self.ids)) != len(self.ids)):
            raise RequestError(f"`ids` must go with `target` \"query\" and be a list of 1 to {MAX_IDS} distinct "
                               f"ids of the query's matches, not {str(self.ids)[:40]!r}.")

    def run(self, s: Session) -> dict:
        if self.name not in s.items:
            raise RequestError(f"`name` must be a registered replacement ({', '.join(s.items)}), "
                               f"not {self.name[:40]!r}.")
        if self.target == "query":
            if self.xpath is not None and self.xpath != s.state["query"]:
                raise RequestError(f"The query box holds `{self.xpath[:200]}`, which did not run, so nothing is "
                                   f"highlighted for it. Correct the query, then drop again.")
            target: Any = "query"
            if self.ids is not None:
                matches = set(s.state["matches"])
                stray = next((i for i in self.ids if i not in matches), None)
                if stray is not None:
                    raise RequestError(f"Node {stray} is not among the matches of `{s.state['query'][:200]}` in the "
                                       "current model (it changed since the offer was made). Drop again.")
                target = [s.node(i, field="ids") for i in self.ids]
        else:
            target = s.node(self.target, field="target")
        # a refusal changes nothing: the front-end shows the reply's message at the row it was dropped on
        return {"description": s.substitute(target, self.name)}


@dataclasses.dataclass(frozen=True)
class Undo(Request):
    type = "undo"

    def run(self, s: Session) -> dict:
        s.undo()
        return {}


@dataclasses.dataclass(frozen=True)
class Redo(Request):
    type = "redo"

    def run(self, s: Session) -> dict:
        s.redo()
        return {}


@dataclasses.dataclass(frozen=True)
class Goto(Request):
    type = "goto"
    index: Any

    def run(self, s: Session) -> dict:
        if not _int(self.index) or not 0 <= self.index < len(s.states):
            raise RequestError(f"`index` must be a state of the history, 0 to {len(s.states) - 1}, "
                               f"not {str(self.index)[:40]!r}.")
        s.goto(self.index)
        return {}


@dataclasses.dataclass(frozen=True)
class CompareBase(Request):
    type = "compare_base"
    base: Any

    def check(self) -> None:  # a reference's name is checked by the session, which knows them
        if not isinstance(self.base, str):
            raise RequestError(f"`base` must be \"original\", \"previous\" or a reference's name, not "
                               f"{str(self.base)[:40]!r}.")

    def run(self, s: Session) -> dict:
        s.compare_with(self.base)
        return {}


@dataclasses.dataclass(frozen=True)
class Export(Request):
    """The Export button. The front-end names no path: the files go next to the
    notebook as ``yax_model_step{K}``, never replacing a file (`Session.export_next`)."""

    type = "export"

    def run(self, s: Session) -> dict:
        return _write_once(s, "export", (s.batch_key,), s.export_next)


@dataclasses.dataclass(frozen=True)
class Snapshot(Request):
    """The Save HTML button: the explorer as it is, with what the front-end shows
    (``view``: open rows, selection, tab; `_snapshot.View`), as one HTML file next to
    the notebook, ``{model}_snapshot.html``, never replacing a file (`_snapshot.save_next`)."""

    type = "snapshot"
    view: Any = None

    def check(self) -> None:
        from ._snapshot import View

        View.parse(self.view)

    def run(self, s: Session) -> dict:
        from ._snapshot import View, save_next

        # the page shows the state (`Session.version` counts its changes) and the view the front-end reports
        return _write_once(s, "snapshot", (s.version, s.batch_key, View.parse(self.view)),
                           lambda: save_next(s, self.view))


@dataclasses.dataclass(frozen=True)
class Code(Request):
    type = "code"

    def run(self, s: Session) -> dict:
        return {"code": s.code()}


@dataclasses.dataclass(frozen=True)
class Source(Request):
    """The lines of the user's code around the line that made node ``id`` (the Source tab)."""

    type = "source"
    id: Any

    def run(self, s: Session) -> dict:
        return source(s.node(self.id), self.id)


@dataclasses.dataclass(frozen=True)
class Details(Request):
    """What the row data provider titled ``provider`` shows for node ``id`` (its tab)."""

    type = "details"
    provider: Any
    id: Any

    def check(self) -> None:
        if not isinstance(self.provider, str) or self.provider not in PROVIDERS:
            raise RequestError(f"`provider` must be one of {', '.join(map(repr, PROVIDERS))}, "
                               f"not {str(self.provider)[:40]!r}.")

    def run(self, s: Session) -> dict:
        details = PROVIDERS[self.provider].details(s.mox, s.node(self.id), s)
        return {"id": self.id, "provider": self.provider, **details.payload()}


@dataclasses.dataclass(frozen=True)
class Graph(Request):
    """`yax.to_dot` of a call (``id``; None: the whole model) from ``depth``, repeated layers
    folded (``fold``), and the calls ``open`` (the boxes double-clicked) opened whatever the depth."""

    type = "graph"
    id: Any = None
    depth: Any = 1
    fold: Any = True
    open: Any = ()

    def check(self) -> None:
        if not _int(self.depth) or not 0 <= self.depth <= 8:
            raise RequestError("`depth` must be an integer from 0 to 8.")
        if not isinstance(self.fold, bool):
            raise RequestError("`fold` must be true or false.")
        if not isinstance(self.open, list | tuple) or len(self.open) > MAX_IDS or not all(map(_int, self.open)):
            raise RequestError(f"`open` must be a list of at most {MAX_IDS} call row ids, not {str(self.open)[:40]!r}.")

    def run(self, s: Session) -> dict:
        root = None if self.id is None else s.node(self.id, CALL_KINDS)
        opened = [s.node(i, CALL_KINDS, "open") for i in dict.fromkeys(self.open)]
        return {"id": self.id, "dot": yax.to_dot(s.mox, depth=self.depth, root=root, fold=self.fold, expand=opened)}


@dataclasses.dataclass(frozen=True)
class Values(Request):
    type = "values"
    id: Any

    def run(self, s: Session) -> dict:
        entry = s.inspector.show(s.node(self.id))
        return {"id": entry["id"], "seconds": entry["seconds"]}


def _check_scalar(scalar: Any, index: Any) -> None:
    """``scalar``/``index`` of a request naming the scalar a gradient is taken of (`_values.Scalar`)."""
    if scalar is not None and (not isinstance(scalar, str) or scalar not in SCALARS):
        raise RequestError(f"`scalar` must be one of {', '.join(SCALARS)}, not {str(scalar)[:40]!r}.")
    if index is not None and (scalar != "logit" or not _int(index) or not 0 <= index < 2 ** 31):
        raise RequestError(f"`index` must go with `scalar` \"logit\" and be a whole number from 0, "
                           f"not {str(index)[:40]!r}.")


@dataclasses.dataclass(frozen=True)
class Overlay(Request):
    """Colour the rows by ``stat``; a gradient statistic (``grad``, ``gxa``) by the gradient
    of ``scalar`` (``loss``, ``logit``, ``sum``; its default when None) with ``index`` (a logit's)."""

    type = "overlay"
    stat: Any
    scalar: Any = None
    index: Any = None

    def check(self) -> None:
        if self.stat not in ("off", *STATS):
            raise RequestError(f"`stat` must be one of off, {', '.join(STATS)}; not {str(self.stat)[:40]!r}.")
        _check_scalar(self.scalar, self.index)

    def run(self, s: Session) -> dict:
        s.inspector.paint(self.stat, self.scalar, self.index)
        return {"stat": self.stat}


@dataclasses.dataclass(frozen=True)
class Batch(Request):
    type = "batch"
    name: Any

    def run(self, s: Session) -> dict:
        if not isinstance(self.name, str) or self.name not in s.batches:
            raise RequestError(f"`name` must name a batch ({', '.join(s.batches)}), not {str(self.name)[:40]!r}.")
        s.use_batch(self.name)
        return {"name": self.name}


@dataclasses.dataclass(frozen=True)
class NonFinite(Request):
    """The first NaN or Inf of the forward pass, or (``scalar`` given) of the backward pass
    of that scalar's gradient (with ``index``, as for `Overlay`)."""

    type = "nonfinite"
    scalar: Any = None
    index: Any = None

    def check(self) -> None:
        _check_scalar(self.scalar, self.index)

    def run(self, s: Session) -> dict:
        scalar = None if self.scalar is None else s.inspector.scalar(self.scalar, self.index)
        return s.inspector.nonfinite(scalar)


REQUESTS: dict[str, type[Request]] = {r.type: r for r in (
    Query, Expand, Equations, Fits, Substitute, Undo, Redo, Goto, CompareBase, Export, Snapshot, Code, Graph,
    Values, Overlay, Batch, NonFinite, Source, Details)}

# What a closed session still answers: reading its history changes nothing.
_READ_ONLY = {"code", "expand", "equations", "graph", "source", "details"}


def parse(content: Any) -> Request:
    """The typed request a message holds (`RequestError` when it holds none)."""
    if not isinstance(content, dict) or not _int(content.get("rid")):
        raise RequestError("A request must be an object with an integer `rid`.")
    kind = content.get("type")
    cls = REQUESTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise RequestError(f"Unknown request type {str(kind)[:40]!r}.")
    return cls.parse(content)


def answer(s: Session, content: Any) -> dict:
    """The one reply to one message from the front-end. Requests reaching one session
    from several threads run one at a time (`Session.lock`): each reads and changes the
    session as a whole (a `values` request once met a model half-changed by a drop)."""
    rid = content.get("rid") if isinstance(content, dict) else None
    rid = rid if _int(rid) else None
    with s.lock:
        try:
            request = parse(content)
            if request.type not in _READ_ONLY:
                s.check_open()
            reply = request.run(s)
        except PartialFit as e:  # the offer: the matches it fits, by id (a `substitute` with `ids` takes it)
            ids = view(s.mox).ids
            return {"type": "error", "rid": rid, "message": str(e), "fits": [ids[id(n)] for n in e.fitting],
                    "matches": len(e.fitting) + len(e.refused)}
        except yax.YaxError as e:
            return {"type": "error", "rid": rid, "message": str(e)}
        except Exception as e:  # a bug or a failure below yax (XLA): the front-end still gets its reply
            _log.exception("The explorer's request %r failed", str(content.get("type"))[:40])
            if not s.closed:
                s.status("failed")
            return {"type": "error", "rid": rid, "message": f"The request failed with {type(e).__name__}: "
                                                            f"{str(e)[:500]} (the kernel's log has the traceback)."}
    return {"type": "ok", "rid": rid, **reply}


@dataclasses.dataclass
class _Written:
    """What one explorer's Save HTML or Export button wrote: how many times, and the last
    reply with what it was written of (the key, and the model, held weakly)."""

    count: int = 0
    last: tuple[Any, Any, dict] | None = None  # (key, weakref to the model, reply)


_written: weakref.WeakKeyDictionary[Session, dict[str, _Written]] = weakref.WeakKeyDictionary()
_BUTTONS = {"snapshot": ("Save HTML", "snapshots", "`explorer.save_html(path)`"),
            "export": ("Export", "exports", "`explorer.export(stem)`")}


def _write_once(s: Session, kind: str, key: Any, write: Callable[[], dict]) -> dict:
    """``write()``'s reply (the files a button wrote), unless the button wrote last of the
    same ``key`` and the same model and its files are still there as written: then that
    reply again, and nothing is written. An explorer's button writes at most `MAX_WRITES`
    times. (Requests run one at a time, so no two writes of one explorer are in flight.)"""
    book = _written.setdefault(s, {}).setdefault(kind, _Written())
    if book.last is not None and book.last[0] == key and book.last[1]() is s.mox and _still_there(book.last[2]):
        reply = book.last[2]
        s.status(f"already {'saved as' if kind == 'snapshot' else 'exported to'} "
                 f"{reply.get('file') or reply['files'][0]}: nothing changed since")
        return reply
    button, things, python = _BUTTONS[kind]
    if book.count >= MAX_WRITES:
        raise RequestError(f"This explorer's {button} button has written {book.count} {things}, as many as one "
                           f"explorer's buttons may write (the front-end is not trusted with the kernel's disk). "
                           f"Write more from Python with {python}, or open a new explorer.")
    reply = write()
    book.count += 1
    book.last = (key, weakref.ref(s.mox), reply)
    return reply


def _still_there(reply: dict) -> bool:
    """Whether the files of a button's ``reply`` are there, each of the size written."""
    files = reply.get("files") or [reply.get("file")]
    sizes = reply.get("bytes")
    sizes = sizes if isinstance(sizes, list) else [sizes]
    try:
        return all(isinstance(f, str) and os.path.getsize(f) == b for f, b in zip(files, sizes, strict=True))
    except (OSError, ValueError):
        return False


def _plain(v: Any) -> Any:
    """A query's non-node result (a number, string or boolean) as JSON."""
    return v if isinstance(v, (str, bool, int)) else float(v) if isinstance(v, float) and math.isfinite(v) else str(v)
